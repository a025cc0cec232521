"""asyncio helpers used across layers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object]], *, retry_every: float = 0.05) -> None:
    """Cancel `tasks` and wait until each has finished.

    A single `cancel()` is not always enough on Python 3.11: `asyncio.wait_for` (which redis-py
    uses to send commands) can swallow a cancellation that lands just as its inner operation
    completes. So the cancel is repeated until the task is really done.
    """
    pending = {t for t in tasks if not t.done()}
    current = asyncio.current_task()
    pending.discard(current)  # type: ignore[arg-type]
    while pending:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=retry_every)
