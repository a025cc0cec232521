"""`LocalAgentRuntime.resume` makes one copy of an agent however many callers (the redo after an
outage, a monitor round, a placement) ask at once, also after one of them failed."""

from __future__ import annotations

import asyncio

from colony.agents.runtime import LocalAgentRuntime
from colony.errors import BlackboardUnavailable


async def test_two_restores_never_run_at_once_after_a_failed_one() -> None:
    rt = object.__new__(LocalAgentRuntime)
    rt._agents, rt._resuming = {}, {}
    active = 0
    peak = 0
    calls = 0

    async def restore(agent_id: str) -> object:
        nonlocal active, peak, calls
        calls += 1
        active += 1
        peak = max(peak, active)
        try:
            await asyncio.sleep(0.05)
            if calls == 1:
                raise BlackboardUnavailable("x", "redis")  # first restore fails (outage)
            obj = object()
            rt._agents[agent_id] = obj
            return obj
        finally:
            active -= 1

    rt._restore = restore  # type: ignore[method-assign]
    a = asyncio.create_task(rt.resume("ag"))  # e.g. the redo task
    await asyncio.sleep(0.01)
    b = asyncio.create_task(rt.resume("ag"))  # e.g. a monitor round, waits on the lock
    await asyncio.sleep(0.01)
    # let A fail and release; C arrives right after A's finally popped the lock
    while not a.done():  # noqa: ASYNC110 - stepping the loop until A has failed
        await asyncio.sleep(0)
    c = asyncio.create_task(rt.resume("ag"))  # e.g. a placement
    res = await asyncio.gather(a, b, c, return_exceptions=True)
    assert peak == 1, f"{peak} restores of one agent ran at once"
    assert isinstance(res[0], BlackboardUnavailable) and res[1] is res[2]  # one copy, for both
    assert rt._resuming == {}  # the lock went with its last user
