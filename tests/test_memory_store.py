"""MemoryStore on a real redis-server: writes, dedup, idempotent ids, caps, TTL, the change feed."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from colony.blackboard import Blackboard, TagFilter
from colony.config import ColonySettings
from colony.errors import InvalidArgument
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import MaintenanceConfig, MemoryQuery, NewMemory


@pytest.fixture
def scope() -> str:
    return MemoryScope.agent_working(f"a{uuid.uuid4().hex[:10]}")


@pytest.fixture
def store(bb: Blackboard) -> MemoryStore:
    return MemoryStore(bb, ColonySettings())


async def test_write_read_and_exact_dedup(store: MemoryStore, scope: str) -> None:
    first = await store.write(scope, NewMemory(content="The deploy key is in vault A", tags={"fact"}))
    assert first.created and first.entry.scope_id == scope
    again = await store.write(scope, NewMemory(content="  the DEPLOY key is in   vault a "))
    assert not again.created and again.duplicate_of == first.entry.entry_id
    assert await store.count(scope) == 1
    got = await store.get(scope, first.entry.entry_id)
    assert got is not None and got.tags == frozenset({"fact"})


async def test_explicit_id_is_idempotent_and_concurrent_same_content_is_one_entry(
    store: MemoryStore, scope: str
) -> None:
    a = await store.write(scope, NewMemory(content="x1", entry_id="step-1"))
    b = await store.write(scope, NewMemory(content="x1 changed", entry_id="step-1"))
    assert a.created and not b.created and b.entry.content == "x1"
    outcomes = await asyncio.gather(*(store.write(scope, NewMemory(content="same text")) for _ in range(8)))
    assert sum(o.created for o in outcomes) == 1
    assert await store.count(scope) == 2


async def test_bounds_refused_with_the_field(store: MemoryStore, scope: str) -> None:
    with pytest.raises(InvalidArgument, match="content"):
        await store.write(scope, NewMemory(content="x" * 9000))
    with pytest.raises(InvalidArgument, match="tags"):
        await store.write(scope, NewMemory(content="y", tags={f"t{i}" for i in range(40)}))
    # `data` and `metadata` are bounded too (900,000 characters of `data` were stored before)
    with pytest.raises(InvalidArgument, match=r"data and metadata: \d+ bytes .*max_payload_bytes"):
        await store.write(scope, NewMemory(content="z", data="d" * 900_000))
    with pytest.raises(InvalidArgument, match="data and metadata"):
        await store.write(scope, NewMemory(content="z", metadata={"k": "é" * 40_000}))  # 80,000 bytes
    with pytest.raises(InvalidArgument, match="only whitespace"):
        await store.write(scope, NewMemory(content=" \n\t "))
    with pytest.raises(InvalidArgument, match="invisible"):  # found by review: a zero-width space passed
        await store.write(scope, NewMemory(content=" \u200b\u2060 \ufeff"))
    assert await store.count(scope) == 0  # nothing refused was stored
    kept = await store.write(scope, NewMemory(content="fits", data={"k": "d" * 60_000}))
    assert kept.created


async def test_cap_keeps_max_entries_by_relevance(store: MemoryStore, scope: str) -> None:
    memories = [NewMemory(content=f"fact number {i}", importance=0.9 if i % 2 else 0.1) for i in range(600)]
    await store.write_many(scope, memories)
    assert await store.count(scope) == 600
    pruned = await store.enforce_cap(scope, 500, MaintenanceConfig())
    assert pruned == 100 and await store.count(scope) == 500
    kept = await store.entries(scope)
    assert sum(e.importance < 0.5 for e in kept) == 200  # the 100 pruned were low-importance ones


async def test_ttl_entry_is_gone_and_not_counted(store: MemoryStore, scope: str) -> None:
    await store.write(scope, NewMemory(content="short lived", ttl_seconds=1.0, tags={"tmp"}))
    await store.write(scope, NewMemory(content="long lived", tags={"tmp"}))
    assert await store.count(scope) == 2
    await asyncio.sleep(1.6)
    assert await store.count(scope) == 1
    assert [e.content for e in await store.entries(scope)] == ["long lived"]


async def test_query_filters(store: MemoryStore, scope: str) -> None:
    await store.write(scope, NewMemory(content="a", tags={"action", "success"}, entry_id="e-a"))
    await store.write(scope, NewMemory(content="b", tags={"action", "failure"}, entry_id="e-b"))
    await store.write(scope, NewMemory(content="c", tags={"note"}, entry_id="n-c"))
    q = MemoryQuery(tag_filter=TagFilter(all_of={"action"}, none_of={"failure"}))
    assert [e.entry_id for e in await store.entries(scope, query=q)] == ["e-a"]
    q = MemoryQuery(key_pattern="e-*")
    assert sorted(e.entry_id for e in await store.entries(scope, query=q)) == ["e-a", "e-b"]
    assert (await store.tag_counts(scope))["action"] == 2


async def test_change_feed_and_delete(store: MemoryStore, scope: str) -> None:
    start = await store.latest_position(scope)
    w = await store.write(scope, NewMemory(content="one"))
    await store.write(scope, NewMemory(content="two"))
    assert await store.delete(scope, [w.entry.entry_id]) == 1
    batch = await store.changes(scope, start)
    assert batch.upserted[0] == w.entry.entry_id and len(batch.upserted) == 2
    assert batch.deleted == [w.entry.entry_id] and not batch.truncated
    again = await store.changes(scope, batch.position)
    assert again.upserted == [] and again.position == batch.position
    # the deleted entry's content can be stored again (its hash key went with it)
    assert (await store.write(scope, NewMemory(content="one"))).created


async def test_without_dedup_the_same_text_is_stored_again(store: MemoryStore, scope: str) -> None:
    """Producers write without dedup: an action repeated with the same outcome is two memories."""
    first = await store.write(scope, NewMemory(content="Action ping() succeeded: pong"), dedup=False)
    second = await store.write(scope, NewMemory(content="Action ping() succeeded: pong"), dedup=False)
    assert first.created and second.created and first.entry.entry_id != second.entry.entry_id
    assert await store.count(scope) == 2
    third = await store.write(scope, NewMemory(content="action PING() succeeded: pong"))
    assert not third.created and third.duplicate_of == first.entry.entry_id


async def test_cap_pruning_order_is_rebuilt_when_lost_and_skips_gone_entries(
    store: MemoryStore, scope: str
) -> None:
    """The pruning order is derived: lost (or left over by entries that went), it is rebuilt, and
    the entries pruned are still the least relevant live ones."""
    from colony.memory.pruning import ORDER_RING

    memories = [NewMemory(content=f"note {i}", importance=0.2 if i < 10 else 0.8) for i in range(40)]
    written = await store.write_many(scope, memories)
    board = store.board(scope)
    await board.redis.delete(board.keyspace.ring_key(ORDER_RING))  # the derived order is lost
    low = [o.entry.entry_id for o in written[:10]]
    await store.delete(scope, low[:4])  # some low ones are gone already
    assert await store.enforce_cap(scope, 30, MaintenanceConfig()) == 6
    kept = await store.entries(scope)
    assert len(kept) == 30 and all(e.importance == 0.8 for e in kept)
    assert await board.redis.zcard(board.keyspace.ring_key(ORDER_RING)) == 30


async def test_concurrent_batches_store_each_text_and_id_once(store: MemoryStore, scope: str) -> None:
    texts = [NewMemory(content=f"shared fact {n}") for n in range(20)]
    results = await asyncio.gather(*(store.write_many(scope, texts) for _ in range(6)))
    assert await store.count(scope) == 20
    assert sum(o.created for batch in results for o in batch) == 20
    same_id = [[NewMemory(content=f"version {v}", entry_id="fixed-id")] for v in range(6)]
    results = await asyncio.gather(*(store.write_many(scope, batch) for batch in same_id))
    assert sum(o.created for batch in results for o in batch) == 1
    stored = await store.get(scope, "fixed-id")
    winner = next(o.entry.content for batch in results for o in batch if o.created)
    assert stored is not None and stored.content == winner
    assert await store.count(scope) == 21
    loser = next(f"version {v}" for v in range(6) if f"version {v}" != winner)
    assert (await store.write(scope, NewMemory(content=loser))).created  # no stale hash key claims it


async def test_writers_on_several_clients_keep_a_cap_exactly(redis_url: str) -> None:
    """Found by review: writers on several connections (as replicas are) each counted the same
    overshoot and each deleted it, so the scope fell below its cap and lost entries it should have
    kept. One enforcement of a scope's cap at a time."""
    import asyncio

    from colony.blackboard import Blackboard, create_redis
    from colony.config import BlackboardSettings, ColonySettings
    from colony.memory.types import MemoryScopeConfig

    root = f"test:{uuid.uuid4().hex[:12]}"
    clients = [create_redis(redis_url, BlackboardSettings()) for _ in range(8)]
    stores = [
        MemoryStore(Blackboard(c, root, settings=BlackboardSettings()), ColonySettings()) for c in clients
    ]
    capped = MemoryScope.agent_working(f"a{uuid.uuid4().hex[:10]}")
    await stores[0].configure(MemoryScopeConfig(scope_id=capped, scope_type="working", max_entries=30))
    counts = []
    try:
        for round_ in range(12):

            async def write(store: MemoryStore, n: int, round_: int = round_) -> None:
                notes = [
                    NewMemory(content=f"round {round_} writer {n} note {k} {uuid.uuid4().hex}")
                    for k in range(3)
                ]
                await store.write_many(capped, notes)

            await asyncio.gather(*(write(store, n) for n, store in enumerate(stores)))
            counts.append(await stores[0].count(capped))
    finally:
        for client in clients:
            await client.aclose()
    assert all(count == 30 for count in counts[1:]), counts
