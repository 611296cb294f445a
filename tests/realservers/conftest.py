"""One real Postfix for the tests in this folder (started once, stopped at the end), and one
real Dovecot serving its journal maildir over IMAP for the SMTP witness's tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realservers.dovecot import Dovecot
from tests.realservers.postfix import Postfix
from tests.support import require_binary


@pytest.fixture(scope="session")
def postfix() -> Iterator[Postfix]:
    require_binary("postfix", "postfix")
    require_binary("saslpasswd2", "sasl2-bin")
    if os.geteuid() != 0:
        # Postfix's master binds as root and drops to the postfix user; there is no
        # unprivileged mode. Under CI (root in the container) this never skips.
        if os.environ.get("CI") == "true":
            pytest.fail("the real-Postfix tests need root", pytrace=False)
        pytest.skip("the real-Postfix tests need root")
    server = Postfix()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def dovecot(postfix: Postfix) -> Iterator[Dovecot]:
    """Dovecot serving ``mail/journal/`` of the Postfix above (where JOURNAL's copies land)."""
    require_binary("dovecot", "dovecot-imapd")
    server = Dovecot(maildir=postfix.root / "mail/journal", ca=postfix.ca)
    server.start()
    try:
        yield server
    finally:
        server.remove()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (--dist loadgroup) this folder's tests run on one worker, so the run
    starts one Postfix, not one per worker. They are end to end against real servers: marked
    slow (`-m "not slow"` leaves them out; the full run and CI keep them)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("postfix"))
            item.add_marker(pytest.mark.slow)
