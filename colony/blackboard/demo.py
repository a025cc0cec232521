"""A short, real walk through the blackboard, run by `colony demo` against the configured Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from colony.blackboard.blackboard import Blackboard
from colony.blackboard.protocol import AgentRunProtocol
from colony.blackboard.scopes import BlackboardScope, scope_id
from colony.config import ColonySettings


async def run_demo(settings: ColonySettings, echo: Callable[[str], None] = print) -> dict[str, object]:
    """Concurrent updates, a transaction, a request/result exchange and its events; returns what it saw."""
    session = uuid.uuid4().hex[:8]
    board = Blackboard.connect(
        scope_id(
            BlackboardScope.SESSION,
            tenant_id=settings.tenant_id,
            colony_id=settings.colony_id,
            session_id=f"demo-{session}",
        ),
        settings,
    )
    try:
        echo(f"blackboard scope {board.scope_id} on {board.url}")
        events = await board.subscribe().start()

        async def worker(n: int) -> None:
            for _ in range(250):
                await board.update("counter", lambda v: (v or 0) + 1, created_by=f"worker-{n}")

        await asyncio.gather(*(worker(n) for n in range(4)))
        counter = await board.read("counter")
        assert counter is not None
        echo(f"4 workers x 250 optimistic increments -> counter={counter.value} (version {counter.version})")

        async with board.transaction() as tx:
            current = await tx.read("counter")
            assert current is not None
            tx.write("counter", 0, created_by="demo")
            tx.write("archive:counter", current.value, tags={"archive"}, created_by="demo")
        echo("transaction: counter archived and reset atomically")

        request_id = uuid.uuid4().hex[:8]
        await board.write(AgentRunProtocol.request_key(request_id), {"query": "say hello"}, created_by="demo")
        await board.write(AgentRunProtocol.result_key(request_id), {"output": "hello"}, created_by="demo")
        result = await board.read(AgentRunProtocol.result_key(request_id))
        assert result is not None
        echo(f"request/result via {AgentRunProtocol.__name__}: {result.key} = {result.value}")

        seen = 0
        while await events.next(timeout=0.5) is not None:
            seen += 1
        echo(f"{seen} events recorded on the scope's stream (last id {events.last_id})")
        return {"counter": counter.value, "events": seen, "result": result.value}
    finally:
        await board.close()
