"""The operators' page at /ops: server-rendered (Jinja2, autoescaped, no script at all).

Overview, unknown rows oldest first (filters in the URL), held sends oldest first, one
step, a run's trace, closing rows one at a time or in bulk after a preview, and approving,
denying or cancelling a send, all through ops/app/service.py and ops/app/approvals.py.
Sign in with an API key: operator and admin keys may close rows and decide on held sends;
agent keys may look (a viewer's read-only session), since reading is what every key may do
elsewhere too.

One module per part of the page; they share one router (common.py), and importing them
here registers their routes on it in a fixed order.
"""

from evq.ops.web.page import (  # noqa: F401  (routes)
    assets,
    bulk,
    bulk_actions,
    decisions,
    lists,
    overview,
    queues,
    signin,
    step,
    zone,
)
from evq.ops.web.page.common import PageError, Redirect, render, router, shown_session, visitor_session

__all__ = ["PageError", "Redirect", "render", "router", "shown_session", "visitor_session"]
