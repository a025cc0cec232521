"""Transactions (all-or-nothing) and paged queries by pattern and tags."""

from __future__ import annotations

import asyncio

import pytest

from colony.blackboard import Blackboard, TagFilter
from colony.errors import BlackboardError, ConcurrentModificationError, InvalidKey


async def test_transaction_commits_all_writes_atomically(bb: Blackboard) -> None:
    await bb.write("acct:a", 100)
    await bb.write("acct:b", 0)
    async with bb.transaction() as tx:
        a = await tx.read("acct:a")
        b = await tx.read("acct:b")
        tx.write("acct:a", a.value - 30, tags={"acct"})
        tx.write("acct:b", b.value + 30, tags={"acct"})
        tx.write("log:1", "moved 30")
        tx.delete("acct:missing")
    assert [e.value if e else None for e in tx.results] == [70, 30, "moved 30", None]
    assert [e.version for e in tx.results[:3]] == [2, 2, 1]
    assert (await bb.read("acct:a")).value == 70
    assert (await bb.read("acct:b")).value == 30
    events = await bb.events()
    assert [(e.op, e.key) for e in events[-3:]] == [
        ("write", "acct:a"),
        ("write", "acct:b"),
        ("write", "log:1"),
    ]


async def test_transaction_whose_read_set_changed_applies_nothing(bb: Blackboard) -> None:
    await bb.write("acct:a", 100)
    await bb.write("acct:b", 0)
    events_before = len(await bb.events())
    with pytest.raises(ConcurrentModificationError) as info:
        async with bb.transaction() as tx:
            a = await tx.read("acct:a")
            await tx.read("acct:b")
            await bb.write("acct:b", 5)  # another writer changes the read set before commit
            tx.write("acct:a", a.value - 30)
            tx.write("acct:b", 30)
            tx.write("new:key", "should not exist")
    assert info.value.key == "acct:b" and info.value.expected == 1 and info.value.actual == 2
    assert (await bb.read("acct:a")).value == 100
    assert (await bb.read("acct:b")).value == 5
    assert await bb.read("new:key") is None
    assert len(await bb.events()) == events_before + 1  # only the interfering write


async def test_transaction_absent_read_conflicts_with_creation(bb: Blackboard) -> None:
    with pytest.raises(ConcurrentModificationError):
        async with bb.transaction() as tx:
            assert await tx.read("lock") is None
            await bb.write("lock", "someone else")
            tx.write("lock", "me")
    assert (await bb.read("lock")).value == "someone else"


async def test_transaction_with_exception_discards_writes(bb: Blackboard) -> None:
    with pytest.raises(RuntimeError):
        async with bb.transaction() as tx:
            tx.write("k", 1)
            raise RuntimeError("boom")
    assert await bb.read("k") is None


async def test_transaction_expected_version_and_delete(bb: Blackboard) -> None:
    await bb.write("a", 1, tags={"x"})
    await bb.write("b", 1)
    with pytest.raises(ConcurrentModificationError):
        async with bb.transaction() as tx:
            tx.delete("a")
            tx.write("b", 2, expected_version=7)
    assert await bb.read("a") is not None
    async with bb.transaction() as tx:
        tx.delete("a", expected_version=1)
        tx.write("b", 2, expected_version=1, ttl_seconds=60)
    assert await bb.read("a") is None
    assert (await bb.read("b")).expires_at is not None
    assert (await bb.query(tags={"all_of": ["x"]})).entries == []


async def test_calls_that_follow_a_commit_go_in_its_round_trip_whether_it_applies_or_not(
    bb: Blackboard,
) -> None:
    """`Transaction.followed_by` (a run's answer, then its retirement): the calls are sent after the
    commit in one pipeline; they run on a conflict too; their replies come back."""
    async with bb.transaction() as warm:  # (the scripts loaded: a call answered NOSCRIPT counts too)
        warm.write("warm", 0)
        warm.followed_by(bb.retire_calls(ttl_seconds=30, tag="warm"))
    await bb.write("group:a", 1, tags={"g"})
    await bb.redis.config_resetstat()
    async with bb.transaction() as tx:
        tx.write("answer", "yes", expected_version=0)
        tx.followed_by(bb.retire_calls(ttl_seconds=30, tag="g"))
    stats = await bb.redis.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 2  # the commit and its follower, pipelined
    assert [int(r) for r in tx.follower_replies] == [1] and bb.group_retired(tx.follower_replies[0])
    assert 0 < await bb.redis.pttl(bb.keyspace.entry_key("group:a")) <= 30_000
    await bb.write("group:b", 2, tags={"h"})
    with pytest.raises(ConcurrentModificationError):
        async with bb.transaction() as tx:
            tx.write("answer", "again", expected_version=0)  # there already: nothing applied
            tx.followed_by(bb.retire_calls(ttl_seconds=30, tag="h"))
    assert (await bb.read("answer")).value == "yes"
    assert 0 < await bb.redis.pttl(bb.keyspace.entry_key("group:b")) <= 30_000  # the follower ran
    with pytest.raises(BlackboardError):
        tx.followed_by([])  # a committed transaction takes no more


async def test_calls_that_follow_a_commit_still_follow_it_after_redis_forgot_its_script(
    bb: Blackboard,
) -> None:
    """After a restart Redis has forgotten the scripts; if the followers' was loaded again (by
    another call) and the commit's was not, the followers ran first: they are run again after
    the commit, so an entry the commit writes into the group still gets the group's expiry."""
    from colony.blackboard import scripts

    await bb.redis.script_flush()
    await bb.redis.script_load(scripts.EXPIRE)
    async with bb.transaction() as tx:
        tx.write("late", 1, tags={"g3"})
        tx.followed_by(bb.retire_calls(ttl_seconds=30, tag="g3"))
    assert 0 < await bb.redis.pttl(bb.keyspace.entry_key("late")) <= 30_000
    assert 0 < await bb.redis.pttl(bb.keyspace.tag_key("g3")) <= 30_000


async def test_pagination_over_ten_thousand_keys(bb: Blackboard) -> None:
    n = 10_000
    for start in range(0, n, 1000):
        await bb.write_many(
            {"key": f"doc:{i:05d}", "value": i, "tags": ["even" if i % 2 == 0 else "odd"]}
            for i in range(start, start + 1000)
        )
    await bb.write("other:1", "not a doc")
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await bb.query("doc:*", limit=250, cursor=cursor)
        pages += 1
        assert len(page.entries) <= 250
        if page.cursor is not None:
            assert len(page.entries) == 250  # every page but the last is full
        seen.extend(e.key for e in page.entries)
        cursor = page.cursor
        if cursor is None:
            break
    assert len(seen) == n and len(set(seen)) == n
    assert pages == n // 250 or pages == n // 250 + 1
    evens = [e.key async for e in bb.iter_query("doc:*", tags={"all_of": ["even"]}, page_size=300)]
    assert len(evens) == n // 2 and len(set(evens)) == n // 2
    assert all(int(k.split(":")[1]) % 2 == 0 for k in evens)


async def test_query_never_uses_keys_command(bb: Blackboard) -> None:
    await bb.write_many({"key": f"k:{i}", "value": i} for i in range(50))
    await bb.redis.config_resetstat()
    await bb.query("k:*", limit=10)
    await bb.query(tags={"any_of": ["a"]})
    stats = await bb.redis.info("commandstats")
    assert "cmdstat_keys" not in stats
    assert "cmdstat_scan" in stats and "cmdstat_sscan" in stats


async def test_tag_filters(bb: Blackboard) -> None:
    await bb.write("e:1", 1, tags={"red", "big"})
    await bb.write("e:2", 2, tags={"red"})
    await bb.write("e:3", 3, tags={"blue", "big"})
    await bb.write("e:4", 4, tags={"green"})
    await bb.write("e:5", 5)

    async def keys(**tag_filter: list[str]) -> list[str]:
        return sorted([e.key async for e in bb.iter_query("e:*", tags=tag_filter, page_size=2)])

    assert await keys(all_of=["red"]) == ["e:1", "e:2"]
    assert await keys(all_of=["red", "big"]) == ["e:1"]
    assert await keys(any_of=["red", "big"]) == ["e:1", "e:2", "e:3"]  # e:1 once, though in both sets
    assert await keys(any_of=["blue", "green"]) == ["e:3", "e:4"]
    assert await keys(none_of=["red", "green"]) == ["e:3", "e:5"]
    assert await keys(any_of=["big"], none_of=["blue"]) == ["e:1"]
    assert await keys(all_of=["red"], any_of=["big", "green"]) == ["e:1"]
    assert await keys(all_of=["nothing"]) == []
    assert TagFilter(all_of={"a"}).matches(frozenset({"a", "b"}))


async def test_query_pattern_and_retagging(bb: Blackboard) -> None:
    await bb.write("request:run:1", 1, tags={"pending"})
    await bb.write("request:run:2", 2, tags={"pending"})
    await bb.write("result:run:1", 1)
    # a SCAN-backed page may come back short with a cursor on a big shared database: follow it
    assert sorted([e.key async for e in bb.iter_query("request:run:*")]) == [
        "request:run:1",
        "request:run:2",
    ]
    await bb.write("request:run:1", 1, tags={"done"})
    pending = await bb.query(tags={"all_of": ["pending"]})
    assert [e.key for e in pending.entries] == ["request:run:2"]
    assert [e.key for e in (await bb.query(tags={"all_of": ["done"]})).entries] == ["request:run:1"]


async def test_query_rejects_bad_input(bb: Blackboard) -> None:
    with pytest.raises(InvalidKey):
        await bb.query(cursor="not-a-cursor")
    with pytest.raises(ValueError):
        await bb.query(limit=0)
    with pytest.raises(InvalidKey):
        await bb.query("has space")


async def test_expired_entry_recreated_with_other_tags_leaves_no_stale_index(bb: Blackboard) -> None:
    import asyncio

    await bb.write("k", 1, tags={"a"}, ttl_seconds=0.1)
    await asyncio.sleep(0.25)
    await bb.write("k", 2, tags={"b"})  # the old `a` membership could not be cleaned at write time
    keys = [e.key async for e in bb.iter_query(tags={"any_of": ["a", "b"]})]
    assert keys == ["k"]
    assert [e.key async for e in bb.iter_query(tags={"all_of": ["a"]})] == []
    assert await bb.redis.smembers(bb.keyspace.tag_key("a")) == set()  # pruned


async def test_page_size_may_change_between_pages(bb: Blackboard) -> None:
    await bb.write_many({"key": f"p:{i:04d}", "value": i} for i in range(2000))
    page = await bb.query("p:*", limit=10)
    seen = [e.key for e in page.entries]
    cursor = page.cursor
    while cursor is not None:
        page = await bb.query("p:*", limit=1000, cursor=cursor)
        seen.extend(e.key for e in page.entries)
        cursor = page.cursor
    assert len(seen) == len(set(seen)) == 2000


async def test_ring_truncate_applies_in_order_and_only_with_its_transaction(bb: Blackboard) -> None:
    """A ring cut back inside a transaction is cut only when the transaction applies, in the
    order of its operations (cut, then push: the ring holds the new items only)."""
    async with bb.transaction() as tx:
        tx.write("marker", 1)
        tx.ring_push("ring", list(range(6)), 100)
    assert await bb.ring("ring") == [0, 1, 2, 3, 4, 5]
    async with bb.transaction() as tx:
        tx.ring_truncate("ring", 4)
    assert await bb.ring("ring") == [0, 1, 2, 3]
    async with bb.transaction() as tx:
        tx.ring_truncate("ring", 0)
        tx.ring_push("ring", ["new"], 100)
    assert await bb.ring("ring") == ["new"]
    stale = (await bb.read("marker")).version  # type: ignore[union-attr]
    await bb.write("marker", 2)
    with pytest.raises(ConcurrentModificationError):
        async with bb.transaction() as tx:
            tx.write("marker", 3, expected_version=stale)
            tx.ring_truncate("ring", 0)
    assert await bb.ring("ring") == ["new"]  # the refused transaction cut nothing


async def test_oldest_tagged_gives_the_oldest_first_without_values_and_prunes_stale_members(
    bb: Blackboard,
) -> None:
    """What an idle pool member picks its next run from: creation order (not key order), at most
    `limit`, and never a member whose entry is gone or was rewritten without the tag."""
    for name in ("c", "a", "d", "b", "e"):  # written in this order: key order differs
        await bb.write(f"queue:{name}", {"big": "x" * 1000}, tags={"queued"})
        await asyncio.sleep(0.002)  # distinct creation times (ms)
    assert await bb.oldest_tagged("queued", 3) == ["queue:c", "queue:a", "queue:d"]
    await bb.write("queue:c", 1)  # rewritten without the tag: no longer queued
    await bb.delete("queue:a")
    await bb.write("queue:d", 2, tags={"queued"})  # rewritten with it: still its first creation time
    await bb.write("queue:f", 3, tags={"queued"}, ttl_seconds=0.05)
    await asyncio.sleep(0.2)  # expired: its member stays in the index until someone prunes it
    assert "queue:f" in await bb.redis.smembers(bb.keyspace.tag_key("queued"))
    assert await bb.oldest_tagged("queued", 10) == ["queue:d", "queue:b", "queue:e"]
    members = await bb.redis.smembers(bb.keyspace.tag_key("queued"))
    assert members == {"queue:d", "queue:b", "queue:e"}  # the stale ones pruned from the index
    assert await bb.oldest_tagged("nothing-tagged", 10) == []
    with pytest.raises(InvalidKey):
        await bb.oldest_tagged("bad tag\n", 10)


async def test_oldest_tagged_passes_no_member_over_for_good_in_a_backlog_larger_than_its_sample(
    bb: Blackboard,
) -> None:
    """A backlog above the sample, served one at a time with one new arrival per one served (a
    pool under steady overload): every one of the first arrivals is served, none starves because
    its hash bucket comes late in a scan."""
    first = 600
    async with bb.transaction() as tx:
        for i in range(first):
            tx.write(f"queue:old{i:05d}", 1, tags={"queued"})
    for n in range(3 * first):
        head = (await bb.oldest_tagged("queued", 32))[0]
        await bb.delete(head)
        await bb.write(f"queue:new{n:05d}", 1, tags={"queued"})
        if n % 100 == 99 and not [
            k async for k in bb.redis.sscan_iter(bb.keyspace.tag_key("queued"), "*old*")
        ]:
            break
    left = [k for k in await bb.redis.smembers(bb.keyspace.tag_key("queued")) if ":old" in k]
    assert left == []


async def test_a_write_can_carry_its_value_in_its_event_up_to_a_bound(bb: Blackboard) -> None:
    """`value_in_event`: a subscriber gets the value with the event (no read) when it is small;
    a large one is left to a read, so the stream does not hold copies of large values."""
    from colony.blackboard.blackboard import EVENT_VALUE_BYTES

    subscription = await bb.subscribe("v:*").start()
    try:
        await bb.write("v:small", {"n": 1}, value_in_event=True)
        await bb.write("v:large", "x" * (EVENT_VALUE_BYTES + 1), value_in_event=True)
        await bb.write("v:plain", {"n": 2})
        async with bb.transaction() as tx:  # per write in a transaction too
            tx.write("v:tx-small", {"n": 3}, value_in_event=True)
            tx.write("v:tx-large", "x" * (EVENT_VALUE_BYTES + 1), value_in_event=True)
            tx.write("v:tx-plain", {"n": 4})
        got = [await subscription.next(timeout=5) for _ in range(6)]
    finally:
        subscription.close()
    assert [(e.key, e.value) for e in got] == [
        ("v:small", {"n": 1}),
        ("v:large", None),
        ("v:plain", None),
        ("v:tx-small", {"n": 3}),
        ("v:tx-large", None),
        ("v:tx-plain", None),
    ]


async def test_an_event_value_too_deep_to_decode_still_delivers_the_event(bb: Blackboard) -> None:
    """A value nested deeper than the JSON parser goes rides in its write's event: the event comes
    without it (a subscriber reads the entry when it needs it), and the feed goes on."""
    deep: object = 1
    for _ in range(230):  # stored (the encoder goes deeper than the parser), not decodable
        deep = [deep]
    subscription = await bb.subscribe("d:*").start()
    try:
        with pytest.raises(ValueError):  # stored, but its answer cannot be decoded either
            await bb.write("d:deep", deep, value_in_event=True)
        await bb.write("d:next", {"n": 1}, value_in_event=True)
        got = [await subscription.next(timeout=5) for _ in range(2)]
    finally:
        subscription.close()
    assert [(e.key, e.value) for e in got] == [("d:deep", None), ("d:next", {"n": 1})]


async def test_oldest_tagged_reads_a_short_backlog_in_one_scan(bb: Blackboard) -> None:
    """An idle pool member looks at the pending index after every run it serves: an empty or short
    index (the usual case) costs one round trip (its size and one page together), not a second
    SSCAN from the set's start."""

    async def scans() -> int:
        stats = await bb.redis.info("commandstats")
        return int(stats.get("cmdstat_sscan", {}).get("calls", 0))

    for n in range(5):
        await bb.write(f"short:{n}", n, tags={"short"})
    before = await scans()
    assert await bb.oldest_tagged("short", 3) == ["short:0", "short:1", "short:2"]
    assert await bb.oldest_tagged("nothing-tagged", 3) == []
    assert await scans() - before == 2  # one per call


async def test_oldest_tagged_can_list_only_members_whose_companion_exists(bb: Blackboard) -> None:
    """An idle pool member lists pending requests whose request is written, in the round trip that
    dates them: a marker whose item is missing is passed over, not pruned (its item may come)."""
    for name in ("a", "b", "c"):
        await bb.write(f"mark:{name}", 1, tags={"marks"})
        await asyncio.sleep(0.002)
    await bb.write("item:a", 1)
    await bb.write("item:c", 1)

    def item_of(marker: str) -> str:
        return "item:" + marker.split(":", 1)[1]

    assert await bb.oldest_tagged("marks", 10, needs=item_of) == ["mark:a", "mark:c"]
    assert await bb.redis.smembers(bb.keyspace.tag_key("marks")) == {"mark:a", "mark:b", "mark:c"}
    await bb.write("item:b", 1)  # written now: listed in its place
    assert await bb.oldest_tagged("marks", 10, needs=item_of) == ["mark:a", "mark:b", "mark:c"]
    # a member whose companion is no valid key is left out, not a failure of every call
    assert await bb.oldest_tagged("marks", 10, needs=lambda key: "bad key\n" if key == "mark:b" else key) == [
        "mark:a",
        "mark:c",
    ]
