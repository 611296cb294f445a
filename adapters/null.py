"""The null adapter: accepts every request, optionally after a delay.

It goes through the same claim, attempt and outcome path as a real provider, so
``EVQ_ADAPTER=null`` measures evq itself (the benchmark's drain and latency modes).
It sends nothing anywhere.
"""

from __future__ import annotations

import asyncio

from evq.worker.options import Option
from evq.worker.outcomes import Accepted, Outcome
from evq.worker.ports import ProviderProfile, SendRequest

OPTIONS: tuple[Option, ...] = (
    Option("null_delay", float, 0.0, "Seconds the null (benchmark) adapter waits before accepting.", minimum=0),
)


# Nothing to settle a lost answer by: no key, no lookup, no webhook (docs/design.md,
# "Provider profiles"). It never loses one either: it answers every send itself.
PROFILE = ProviderProfile()


def profile() -> ProviderProfile:
    return PROFILE


class NullProvider:
    name = "null"
    dedupe_window: float | None = None
    profile: ProviderProfile = PROFILE

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    async def send(self, request: SendRequest) -> Outcome:
        if self.delay:
            await asyncio.sleep(self.delay)
        return Accepted(provider_message_id=f"null-{request.step_id}-{request.attempt}")

    async def close(self) -> None:
        return None
