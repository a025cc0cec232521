"""MemoryService: one per process and Redis client; a Chroma server that was away is used again once
it answers; recall across a hierarchy shows a copied fact once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from colony.blackboard import Blackboard
from colony.blackboard.redis_server import free_port
from colony.config import ChromaServerSettings, ColonySettings
from colony.memory import service as service_module
from colony.memory.chroma_server import EmbeddedChroma
from colony.memory.scopes import MemoryScope
from colony.memory.service import MemoryService, collection_name, memory_service
from colony.memory.types import MemoryQuery, NewMemory, WriteOutcome


def test_collection_names_are_safe_and_distinct() -> None:
    plain = collection_name(ColonySettings(colony_id="prod"))
    assert plain == "colony-default-prod-memory-v2"
    odd = collection_name(ColonySettings(colony_id="team.\u00e9t\u00e9"))
    assert odd.startswith("colony-default-") and "\u00e9" not in odd and odd != plain


async def test_one_service_per_client(bb: Blackboard) -> None:
    settings = ColonySettings()
    assert memory_service(bb, settings) is memory_service(bb.scoped("other"), settings)


async def test_chroma_coming_back_is_used_again(
    bb: Blackboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    settings = ColonySettings(
        data_dir=tmp_path,
        memory={"chroma_url": f"http://127.0.0.1:{port}", "chroma": ChromaServerSettings(port=port)},
    )
    service = MemoryService(bb, settings)
    scope = MemoryScope.agent_ltm_semantic(f"a{uuid.uuid4().hex[:8]}")
    await service.store.write(scope, NewMemory(content="The archive room key hangs behind the blue door."))
    found = await service.recall(MemoryQuery(query="where is the key for the archive room"), [scope])
    assert found and found[0].scores.get("vector", 0.0) == 0.0  # no Chroma yet: keywords only
    assert service.vector_error is not None
    chroma = EmbeddedChroma(tmp_path, ChromaServerSettings(port=port))
    chroma.start()
    try:
        monkeypatch.setattr(service_module, "VECTOR_RETRY_SECONDS", 0.0)
        await service.sync(scope)
        found = await service.recall(MemoryQuery(query="where does the archive key hang?"), [scope])
        assert found and found[0].scores["vector"] > 0.3
        assert service.vector_error is None
    finally:
        chroma.stop()


async def test_a_fact_copied_down_the_hierarchy_is_recalled_once(bb: Blackboard, tmp_path: Path) -> None:
    service = MemoryService(bb, ColonySettings(data_dir=tmp_path), vector=False)
    agent = f"a{uuid.uuid4().hex[:8]}"
    working, stm = MemoryScope.agent_working(agent), MemoryScope.agent_stm(agent)
    for scope in (working, stm):
        await service.store.write(scope, NewMemory(content="The parcel goes to the Lisbon office."))
    await service.store.write(stm, NewMemory(content="The Lisbon office opens at eight."))
    found = await service.recall(MemoryQuery(query="Lisbon office", max_results=5), [working, stm])
    assert sorted(r.entry.content for r in found) == [
        "The Lisbon office opens at eight.",
        "The parcel goes to the Lisbon office.",
    ]
    both = await service.recall(MemoryQuery(query="Lisbon office"), [working, stm], distinct=False)
    assert len(both) == 3


async def test_near_duplicates_are_one_entry_but_a_different_particular_is_kept(
    bb: Blackboard, tmp_path: Path
) -> None:
    """Dedup at write time by nearest neighbour: the same statement reworded slightly is held
    once; a statement that differs in a number or a name is a different fact and is stored."""
    service = MemoryService(bb, ColonySettings(data_dir=tmp_path))
    scope = MemoryScope.agent_ltm_semantic(f"a{uuid.uuid4().hex[:8]}")

    async def write(text: str) -> WriteOutcome:
        return await service.store.write(scope, NewMemory(content=text), similar=service.nearest)

    first = await write("The deploy key lives in vault A.")
    assert first.created
    again = await write("The deploy key lives in vault A!")
    assert not again.created and again.duplicate_of == first.entry.entry_id
    assert (await write("The deploy key lives in vault B.")).created
    code = await write("My locker code is 7291.")
    other = await write("My locker code is 7292.")
    assert code.created and other.created
    assert await service.store.count(scope) == 4


async def test_a_dead_embedded_server_is_not_replaced_by_a_private_index(
    bb: Blackboard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that starts while `colony up`'s Chroma server is down ranks by keywords and waits
    for the shared server; it never indexes into a private copy of its own (two indexes would
    each rebuild the scope on every recall, and recall would differ between replicas)."""
    import os
    import signal

    chroma = EmbeddedChroma(tmp_path, ChromaServerSettings())
    info = chroma.start()
    os.kill(info.pid, signal.SIGKILL)  # died: its state file is left, as after a crash
    settings = ColonySettings(data_dir=tmp_path)
    service = MemoryService(bb, settings)
    retriever = await service.retriever()
    assert retriever.vector is None and "not answering" in (service.vector_error or "")
    assert not (tmp_path / "chroma-local").exists()
    chroma.start()  # `colony up` brings it back
    try:
        monkeypatch.setattr(service_module, "VECTOR_RETRY_SECONDS", 0.0)
        assert (await service.retriever()).vector is not None
        assert not (tmp_path / "chroma-local").exists()
    finally:
        chroma.stop()
