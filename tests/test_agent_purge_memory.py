"""Deleting an agent drops its memory's rows from the vector index: its levels' and those of any
other memory scope of its own graph (found by review: a `memory-notes` scope kept its rows, which
name the agent, after its keys were gone). Real redis-server, the packaged embedder and an
in-process Chroma."""

from __future__ import annotations

import uuid
from pathlib import Path

from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.memory.scopes import MemoryScope
from colony.memory.service import memory_service
from colony.memory.types import MemoryQuery, NewMemory
from colony.system.agent_purge import purge_agent


async def test_a_purge_drops_the_rows_of_every_memory_scope_of_the_agent(
    bb: Blackboard, tmp_path: Path
) -> None:
    colony = f"c{uuid.uuid4().hex[:8]}"
    settings = ColonySettings(data_dir=tmp_path, colony_id=colony)
    agent = f"a{uuid.uuid4().hex[:8]}"
    working = MemoryScope.agent(agent, "working", tenant_id=settings.tenant_id, colony_id=colony)
    notes = working.replace("memory-working", "memory-notes")  # a scope of the agent's own graph
    service = memory_service(bb, settings)
    for scope in (working, notes):
        await service.store.write(scope, NewMemory(content=f"Dana's locker code is 7291 ({scope[-5:]})"))
        await service.recall(MemoryQuery(query="locker code"), [scope])  # indexes the scope
    collection = await (await service.retriever()).vector._coll()

    def rows(scope: str) -> int:
        return len(collection.get(where={"scope": scope})["ids"])

    assert rows(working) == 1 and rows(notes) == 1
    purged = await purge_agent(bb, agent, settings=settings)
    assert purged.keys and rows(working) == 0 and rows(notes) == 0
    assert not [k for k in await bb.redis.keys(f"*{agent}*")]
