"""Calls with no valid token, paced when they come as a flood: this process answers the first
STRANGERS_PER_SECOND 401s of a second at once and holds each further one until the second ends
(at most MAX_HELD of them at once; beyond, answered at once). A client that retries a wrong token
at once, or guesses tokens, then waits instead of spinning the API's CPU; a mistyped token now and
then is answered at once. (A tenant over its rate is paced the same way: tenant_quota.hold_refused.)
"""

from __future__ import annotations

import asyncio
import time

STRANGERS_PER_SECOND = 50
MAX_HELD = 16


class StrangerPacing:
    """The 401s of one API process: counted per second of its monotonic clock, the excess held."""

    def __init__(self, per_second: int | None = None, max_held: int | None = None) -> None:
        self.per_second = STRANGERS_PER_SECOND if per_second is None else per_second
        self.max_held = MAX_HELD if max_held is None else max_held
        self.second, self.count, self.held = 0, 0, 0

    async def pace(self) -> bool:
        """Count one 401 and hold it until its second ends when the second already had its share
        and fewer than `max_held` are held; whether it was held."""
        now = time.monotonic()
        second = int(now)
        if second != self.second:
            self.second, self.count = second, 0
        self.count += 1
        if self.count <= self.per_second or self.held >= self.max_held:
            return False
        self.held += 1
        try:
            await asyncio.sleep(second + 1 - now)
        finally:
            self.held -= 1
        return True
