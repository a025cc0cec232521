"""Entries: write/read/delete, versions, optimistic concurrency, batches, TTL, update() under contention."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from colony.blackboard import Blackboard, WriteRequest
from colony.errors import BatchConflictError, ConcurrentModificationError, InvalidArgument, InvalidKey


class Finding(BaseModel):
    title: str
    score: float


async def test_write_read_roundtrip_with_bookkeeping(bb: Blackboard) -> None:
    first = await bb.write("result:a", {"x": 1}, tags={"t1", "t2"}, created_by="agent-1")
    assert first.version == 1
    assert first.tags == {"t1", "t2"}
    assert first.created_by == "agent-1" and first.updated_by == "agent-1"
    second = await bb.write("result:a", [1, 2, 3], created_by="agent-2")
    assert second.version == 2
    assert second.created_by == "agent-1" and second.updated_by == "agent-2"
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at
    read = await bb.read("result:a")
    assert read == second
    assert read.value == [1, 2, 3] and read.tags == frozenset()
    assert await bb.read("result:missing") is None


async def test_pydantic_values_are_stored_as_json(bb: Blackboard) -> None:
    entry = await bb.write("finding:1", Finding(title="leak", score=0.5))
    assert entry.value == {"title": "leak", "score": 0.5}
    assert (await bb.read("finding:1")).value_as(Finding) == Finding(title="leak", score=0.5)


async def test_unserialisable_value_is_a_typed_invalid_argument(bb: Blackboard) -> None:
    with pytest.raises(InvalidArgument, match="JSON-serialisable"):
        await bb.write("k", object())
    assert await bb.read("k") is None


async def test_stale_expected_version_always_conflicts_and_changes_nothing(bb: Blackboard) -> None:
    await bb.write("counter", 10)
    await bb.write("counter", 11)
    for stale in (0, 1, 3, 99):
        with pytest.raises(ConcurrentModificationError) as info:
            await bb.write("counter", -1, expected_version=stale)
        assert (info.value.key, info.value.expected, info.value.actual) == ("counter", stale, 2)
    entry = await bb.read("counter")
    assert (entry.value, entry.version) == (11, 2)
    assert (await bb.write("counter", 12, expected_version=2)).version == 3
    # expected_version=0 means "create only"
    assert (await bb.write("fresh", 1, expected_version=0)).version == 1
    with pytest.raises(ConcurrentModificationError):
        await bb.write("fresh", 2, expected_version=0)


async def test_delete_with_and_without_version(bb: Blackboard) -> None:
    await bb.write("k", 1, tags={"x"})
    with pytest.raises(ConcurrentModificationError):
        await bb.delete("k", expected_version=5)
    assert await bb.read("k") is not None
    assert await bb.delete("k", expected_version=1) is True
    assert await bb.read("k") is None
    assert await bb.delete("k") is False
    assert (await bb.query(tags={"all_of": ["x"]})).entries == []
    # a re-created key starts again at version 1
    assert (await bb.write("k", 2)).version == 1


async def test_eight_writers_thousand_updates_each(bb: Blackboard) -> None:
    async def writer() -> None:
        for _ in range(1000):
            await bb.update("counter", lambda v: (v or 0) + 1)

    await asyncio.gather(*(writer() for _ in range(8)))
    entry = await bb.read("counter")
    assert entry.value == 8000
    assert entry.version == 8000


async def test_update_keeps_tags_and_accepts_async_fn(bb: Blackboard) -> None:
    await bb.write("doc", {"n": 1}, tags={"keep"})

    async def bump(value: dict) -> dict:
        await asyncio.sleep(0)
        return {"n": value["n"] + 1}

    entry = await bb.update("doc", bump)
    assert entry.value == {"n": 2} and entry.tags == {"keep"}
    entry = await bb.update("doc", lambda v: v, tags={"other"})
    assert entry.tags == {"other"}


async def test_update_gives_up_after_retries(bb: Blackboard) -> None:
    await bb.write("hot", 0)

    async def meddle(value: int) -> int:
        await bb.write("hot", value + 100)  # someone else always wins the race
        return value + 1

    with pytest.raises(ConcurrentModificationError, match="lost the race 3 times"):
        await bb.update("hot", meddle, retries=2)


async def test_write_many_pipelines_atomic_writes(bb: Blackboard) -> None:
    entries = await bb.write_many([{"key": f"item:{i}", "value": i, "tags": ["batch"]} for i in range(100)])
    assert [e.version for e in entries] == [1] * 100
    assert [e.value for e in await bb.read_many([f"item:{i}" for i in range(100)])] == list(range(100))
    await bb.write("item:5", "changed")
    with pytest.raises(BatchConflictError) as info:
        await bb.write_many(
            [
                WriteRequest(key="item:4", value="a", expected_version=1),
                WriteRequest(key="item:5", value="b", expected_version=1),
                WriteRequest(key="item:6", value="c"),
            ]
        )
    assert info.value.conflicts == [("item:5", 1, 2)]
    assert [e.key for e in info.value.applied] == ["item:4", "item:6"]
    assert (await bb.read("item:5")).value == "changed"
    assert (await bb.read("item:4")).value == "a"


async def test_read_many_keeps_order_and_gaps(bb: Blackboard) -> None:
    await bb.write("a", 1)
    await bb.write("c", 3)
    result = await bb.read_many(["c", "b", "a"])
    assert [e.value if e else None for e in result] == [3, None, 1]


async def test_ttl_expiry_and_persist_on_rewrite(bb: Blackboard) -> None:
    entry = await bb.write("short", "x", ttl_seconds=0.3, tags={"tmp"})
    assert entry.expires_at is not None and entry.ttl_seconds == pytest.approx(0.3, abs=0.01)
    await bb.write("long", "y", ttl_seconds=0.3)
    rewritten = await bb.write("long", "y2")  # a write without TTL makes the entry permanent
    assert rewritten.expires_at is None
    await asyncio.sleep(0.6)
    assert await bb.read("short") is None
    assert (await bb.read("long")).value == "y2"
    # the expired entry no longer shows in tag queries, and its index member is pruned
    assert (await bb.query(tags={"all_of": ["tmp"]})).entries == []
    assert await bb.redis.scard(bb.keyspace.tag_key("tmp")) == 0


@pytest.mark.parametrize(
    "key", ["", "a:*", "a?", "a[1]", "has space", "a::b", ":lead", "trail:", "x{y}", "a\nb", "k" * 1025]
)
async def test_bad_keys_are_rejected(bb: Blackboard, key: str) -> None:
    with pytest.raises(InvalidKey):
        await bb.write(key, 1)
    with pytest.raises(InvalidKey):
        await bb.read(key)


async def test_bad_tags_are_rejected(bb: Blackboard) -> None:
    with pytest.raises(InvalidKey):
        await bb.write("k", 1, tags={"bad tag"})
    with pytest.raises(InvalidKey):
        await bb.write("k", 1, tags={""})


async def test_scopes_never_share_keys(bb: Blackboard) -> None:
    other = bb.scoped(bb.scope_id + ":other")
    await bb.write("shared:name", "mine")
    await other.write("shared:name", "theirs")
    assert (await bb.read("shared:name")).value == "mine"
    assert (await other.read("shared:name")).value == "theirs"
    assert [e.key async for e in bb.iter_query()] == ["shared:name"]  # every page, not just the first


async def test_update_keeps_the_entry_expiry(bb: Blackboard) -> None:
    await bb.write("lease", 1, ttl_seconds=30)
    entry = await bb.update("lease", lambda v: v + 1)
    assert entry.expires_at is not None and 25 < entry.ttl_seconds <= 30
    assert 25 < await bb.redis.pttl(bb.keyspace.entry_key("lease")) / 1000 <= 30
