"""MemoryCapability on a real Redis and a local runtime: producers write action memories (the
agent's code writes none), ingestion is exactly once across suspend/resume, caps and TTLs hold."""

from __future__ import annotations

import asyncio
import time
import uuid

from colony.agents import LocalAgentRuntime
from colony.blackboard import Blackboard, TagFilter, create_redis
from colony.blackboard.protocol import MemoryProtocol
from colony.config import BlackboardSettings, ColonySettings
from colony.memory.capability import MemoryCapability
from colony.memory.introspection import agent_memory_map, pending_ingestion
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import MemoryIngestPolicy, MemoryQuery, MemorySubscription, NewMemory
from tests.memory_kit import scripted_memory_agent

STEPS = [
    {"action": "lookup", "parameters": {"topic": "$input"}},
    {"action": "weigh", "parameters": {"options": ["a", "bbb"]}},
    {"action": "explode"},
]


def _scope(runtime: LocalAgentRuntime, agent_id: str, level: str) -> str:
    return MemoryScope.agent(agent_id, level, colony_id=runtime.colony_id)


async def _wait_count(store: MemoryStore, scope: str, want: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    count = await store.count(scope)
    while count != want and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        count = await store.count(scope)
    return count


async def test_producers_record_each_action_with_type_and_outcome(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(scripted_memory_agent("producing", STEPS))
    run = await agent.run("memory")
    assert run.steps == 3
    store = MemoryStore(runtime.blackboard, ColonySettings())
    working = _scope(runtime, "producing", "working")
    entries = await store.entries(working, query=MemoryQuery(tag_filter=TagFilter(all_of={"action"})))
    by_action = {e.data["action"]: e for e in entries}
    assert set(by_action) == {"lookup", "weigh", "explode"}
    assert {"action_type:context_fetch", "success"} <= by_action["lookup"].tags
    assert {"action_type:analyze", "success"} <= by_action["weigh"].tags
    assert {"action_type:tool_use", "failure"} <= by_action["explode"].tags
    assert "boom" in by_action["explode"].content
    # the entries were made by the producer hook, under ids derived from run and step
    assert all(e.entry_id.startswith("p-") for e in entries)
    # ...and flow on to STM by ingestion, each once, with provenance
    stm = _scope(runtime, "producing", "stm")
    assert await _wait_count(store, stm, 3) == 3
    derived = await store.entries(stm)
    assert sorted(s for e in derived for s in e.sources) == sorted(e.ref for e in entries)


async def test_ingestion_is_exactly_once_across_suspend_and_resume(runtime: LocalAgentRuntime) -> None:
    await runtime.spawn(scripted_memory_agent("ingesting", []))
    store = MemoryStore(runtime.blackboard, ColonySettings())
    working, stm = _scope(runtime, "ingesting", "working"), _scope(runtime, "ingesting", "stm")
    for n in range(2):
        await store.write(working, NewMemory(content=f"observation {n}"))
    assert await _wait_count(store, stm, 2) == 2
    await runtime.suspend("ingesting")
    for n in range(2, 5):
        await store.write(working, NewMemory(content=f"observation {n}"))
    await asyncio.sleep(1.5)
    assert await store.count(stm) == 2  # nobody ingests while the agent is suspended
    memory_map = await agent_memory_map(store, "ingesting", colony_id=runtime.colony_id)
    assert memory_map.scopes[stm].pending_ingestion == 3
    assert memory_map.dataflow_edges == [(working, stm)]
    await runtime.resume("ingesting")
    assert await _wait_count(store, stm, 5) == 5
    await asyncio.sleep(1.5)  # nothing is ingested twice afterwards
    assert await store.count(stm) == 5
    contents = sorted(e.content for e in await store.entries(stm))
    assert contents == [f"observation {n}" for n in range(5)]
    memory_map = await agent_memory_map(store, "ingesting", colony_id=runtime.colony_id)
    assert memory_map.scopes[stm].pending_ingestion == 0 and memory_map.total_entries == 10


async def test_a_second_copy_ingesting_the_same_batch_applies_it_once(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(scripted_memory_agent("racing", []))
    await runtime.suspend("racing")
    store = MemoryStore(runtime.blackboard, ColonySettings())
    working, stm = _scope(runtime, "racing", "working"), _scope(runtime, "racing", "stm")
    await store.write_many(working, [NewMemory(content=f"item {n}") for n in range(20)])
    capability = next(
        c for c in agent.capabilities.values() if isinstance(c, MemoryCapability) and c.scope_type == "stm"
    )
    twin = MemoryCapability(
        agent,
        level="stm",
        ingestion_policy=capability.ingestion_policy,
        capability_key="twin",
        settings=ColonySettings(),
    )
    for _ in range(10):
        await asyncio.gather(capability.ingest_once(), twin.ingest_once())
    assert await store.count(stm) == 20


async def test_cap_and_ttl_of_a_scope_hold_for_every_writer(runtime: LocalAgentRuntime) -> None:
    await runtime.spawn(scripted_memory_agent("capped", [], stm_max=500, working_ttl=2.0))
    store = MemoryStore(runtime.blackboard, ColonySettings())
    working, stm = _scope(runtime, "capped", "working"), _scope(runtime, "capped", "stm")
    await runtime.suspend("capped")  # no ingestion: the writes below are the only writers
    await store.write_many(stm, [NewMemory(content=f"fact {n}") for n in range(600)])
    assert await store.count(stm) == 500
    await store.write(working, NewMemory(content="fleeting"))  # the scope's TTL applies: 2 s
    assert await store.count(working) == 1
    await asyncio.sleep(3.0)
    assert await store.count(working) == 0


async def test_ingestion_catches_up_from_entries_when_the_stream_was_trimmed(
    redis_url: str,
) -> None:
    """A new subscription takes in every live source entry, though the source's event stream was
    capped long ago; a subscription whose position the stream was trimmed past takes in the entries
    written since then, and nothing it had taken in and forgotten comes back."""
    small = BlackboardSettings(events_maxlen=100)
    client = create_redis(redis_url, small)
    board = Blackboard(client, "test:memory-trim", settings=small)
    try:
        store = MemoryStore(board, ColonySettings())
        agent = f"t{uuid.uuid4().hex[:8]}"
        working, stm = MemoryScope.agent_working(agent), MemoryScope.agent_stm(agent)
        await store.write_many(working, [NewMemory(content=f"reading {n}") for n in range(300)])
        assert await board.scoped(working).redis.xlen(board.scoped(working).keyspace.events_key) < 600
        stm_memory = MemoryCapability(
            None,
            stm,
            blackboard=board,
            ingestion_policy=MemoryIngestPolicy(subscriptions=[MemorySubscription(source_scope_id=working)]),
            settings=ColonySettings(),
        )
        assert await pending_ingestion(store, stm, [working]) == 300
        while await stm_memory.ingest_once():
            pass
        assert await store.count(stm) == 300
        assert await pending_ingestion(store, stm, [working]) == 0
        forgotten = (await store.entries(stm))[0]
        await store.delete(stm, [forgotten.entry_id])
        await asyncio.sleep(0.01)  # the next writes are at least a millisecond after the position
        await store.write_many(working, [NewMemory(content=f"later reading {n}") for n in range(300)])
        position = await store.board(stm).read(MemoryProtocol.position_key(working))
        assert position is not None
        assert (await store.changes(working, position.value["position"])).truncated  # the case at hand
        while await stm_memory.ingest_once():
            pass
        assert await store.count(stm) == 599  # 300 new; the forgotten one stays forgotten
        assert await store.get(stm, forgotten.entry_id) is None
    finally:
        await client.aclose()


async def test_an_entry_over_the_bounds_is_left_out_of_ingestion_not_retried_forever(
    runtime: LocalAgentRuntime,
) -> None:
    """An entry written under a larger bound (before `memory.max_payload_bytes` was lowered, say)
    is left out of the scopes that ingest it, with a warning; the entries after it go through."""
    await runtime.spawn(scripted_memory_agent("bounded", []))
    store = MemoryStore(runtime.blackboard, ColonySettings())
    roomy = MemoryStore(runtime.blackboard, ColonySettings(memory={"max_payload_bytes": 1_000_000}))
    working, stm = _scope(runtime, "bounded", "working"), _scope(runtime, "bounded", "stm")
    await roomy.write(working, NewMemory(content="a large payload", data="d" * 200_000))
    await store.write(working, NewMemory(content="a small one"))
    assert await _wait_count(store, stm, 1) == 1
    await asyncio.sleep(1.0)
    assert [e.content for e in await store.entries(stm)] == ["a small one"]
