"""Expiring a group of entries by tag is paged (bounded work per script call), and `refresh` moves
an expiry either way where `expire` only ever brings it closer."""

from __future__ import annotations

from typing import Any

from colony.blackboard import Blackboard, retention
from colony.blackboard.retention import EXPIRE_CHUNK


async def evalsha_calls(bb: Blackboard) -> int:
    stats = await bb.redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_expire_by_tag_pages_through_the_tag_set(bb: Blackboard) -> None:
    members = 2 * EXPIRE_CHUNK + 200  # more than two chunks
    for start in range(0, members, 500):
        await bb.write_many(
            [
                {"key": f"event:run:r1:{i:05d}", "value": {"i": i}, "tags": {"run:r1", "other"}}
                for i in range(start, min(members, start + 500))
            ]
        )
    await bb.write("unrelated", 1, tags={"other"})
    await bb.redis.config_resetstat()
    assert await bb.expire([], 60, tag="run:r1") == members
    calls = await evalsha_calls(bb)
    # one script call per chunk of the tag set (SSCAN may hand out a little more or less per page)
    assert calls >= members // EXPIRE_CHUNK + 1, calls
    keys = [bb.keyspace.entry_key(f"event:run:r1:{i:05d}") for i in range(members)]
    ttls = [await bb.redis.pttl(k) for k in keys]
    assert all(0 < t <= 60_000 for t in ttls)
    assert 0 < await bb.redis.pttl(bb.keyspace.tag_key("run:r1")) <= 60_000
    assert await bb.redis.pttl(bb.keyspace.entry_key("unrelated")) == -1
    # the other tag's memberships are in the expiry index (dropped when the entries expire)
    assert await bb.redis.zcard(bb.keyspace.expiry_key) == members
    # calling it again never extends; the count says none got a (later) expiry
    assert await bb.expire([], 120, tag="run:r1") == 0


async def test_refresh_moves_an_expiry_both_ways_expire_only_closer(bb: Blackboard) -> None:
    await bb.write("page", "text", ttl_seconds=5)
    assert await bb.expire(["page"], 50) == 0  # expire never extends
    assert await bb.redis.pttl(bb.keyspace.entry_key("page")) <= 5_000
    assert await bb.refresh(["page", "missing"], 50) == 1  # a refresh does; missing ones skipped
    assert 5_000 < await bb.redis.pttl(bb.keyspace.entry_key("page")) <= 50_000
    assert (await bb.read("page")).expires_at is not None
    assert await bb.read("missing") is None
    assert await bb.refresh(["page"], 2) == 1
    assert await bb.redis.pttl(bb.keyspace.entry_key("page")) <= 2_000


async def test_expire_tag_bounds_the_tag_set_alone(bb: Blackboard) -> None:
    await bb.write("request:run:r2", {"x": 1}, tags={"run:r2"}, ttl_seconds=30)
    assert await retention.expire_tag(bb, "run:r2", 20) is True
    assert 0 < await bb.redis.pttl(bb.keyspace.tag_key("run:r2")) <= 20_000
    assert await retention.expire_tag(bb, "run:r2", 60) is True  # never extends
    assert await bb.redis.pttl(bb.keyspace.tag_key("run:r2")) <= 20_000
    assert 20_000 < await bb.redis.pttl(bb.keyspace.entry_key("request:run:r2")) <= 30_000
    assert await retention.expire_tag(bb, "run:none", 20) is False


async def test_a_small_group_expires_in_one_script_call(bb: Blackboard) -> None:
    """One run's keys (a handful, well under EXPIRE_CHUNK) with the listed names and the trim: one
    round trip, the same outcome as the paged path; a second call extends nothing."""
    await bb.write_many([{"key": f"event:run:r2:{i}", "value": i, "tags": {"run:r2"}} for i in range(7)])
    await bb.write("result:run:r2", "done")
    await bb.write("unrelated", 1)
    await bb.redis.config_resetstat()
    assert await bb.expire(["result:run:r2"], 60, tag="run:r2", trim_events=True) == 8
    stats = await bb.redis.info("commandstats")
    assert int(stats["cmdstat_evalsha"]["calls"]) == 1 and "cmdstat_sscan" not in stats
    for key in [*(f"event:run:r2:{i}" for i in range(7)), "result:run:r2"]:
        assert 0 < await bb.redis.pttl(bb.keyspace.entry_key(key)) <= 60_000
    assert 0 < await bb.redis.pttl(bb.keyspace.tag_key("run:r2")) <= 60_000
    assert await bb.redis.pttl(bb.keyspace.entry_key("unrelated")) == -1
    assert await bb.expire([], 120, tag="run:r2") == 0
    assert await bb.redis.pttl(bb.keyspace.tag_key("run:r2")) <= 60_000  # never extended


async def test_retire_group_writes_then_expires_in_one_round_trip(bb: Blackboard) -> None:
    """A finished request's retirement: its claim rewritten (untagged, expiring), its group of
    keys, the trim, and a key of another scope, in one pipelined round trip; a group larger
    than EXPIRE_CHUNK is paged after it with the same outcome."""
    other = bb.scoped(f"{bb.scope_id}-api")
    await bb.write("claim:run:r3", "agent-1", tags={"run:r3", "open-claims"})
    await bb.write_many([{"key": f"event:run:r3:{i}", "value": i, "tags": {"run:r3"}} for i in range(5)])
    await other.write("run:r3", {"status": "done"})
    sent: list[int] = []
    execute = type(bb.redis.pipeline()).execute

    async def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(len(self.command_stack))
        return await execute(self, *args, **kwargs)

    type(bb.redis.pipeline()).execute = counting  # type: ignore[method-assign]
    await bb.redis.config_resetstat()
    try:
        await bb.retire_group(
            "claim:run:r3",
            "agent-1",
            created_by="agent-1",
            ttl_seconds=60,
            tag="run:r3",
            trim_events=True,
            elsewhere=[(other, ["run:r3"])],
        )
    finally:
        type(bb.redis.pipeline()).execute = execute  # type: ignore[method-assign]
    assert sent == [3]  # one round trip: the write, the group's expiry, the other scope's key
    stats = await bb.redis.info("commandstats")
    assert "cmdstat_script" not in stats  # no SCRIPT EXISTS before it (redis-py's own pipeline asks)
    claim = await bb.read("claim:run:r3")
    assert claim is not None and claim.tags == frozenset() and claim.expires_at is not None
    for key in [*(f"event:run:r3:{i}" for i in range(5)), "claim:run:r3"]:
        assert 0 < await bb.redis.pttl(bb.keyspace.entry_key(key)) <= 60_000
    assert 0 < await bb.redis.pttl(bb.keyspace.tag_key("run:r3")) <= 60_000
    assert 0 < await bb.redis.pttl(other.keyspace.entry_key("run:r3")) <= 60_000
    assert await bb.redis.scard(bb.keyspace.tag_key("open-claims")) == 0

    members = EXPIRE_CHUNK + 3  # too many for one call: paged after the pipeline
    await bb.write_many(
        [{"key": f"event:run:r4:{i}", "value": i, "tags": {"run:r4"}} for i in range(members)]
    )
    await bb.retire_group("claim:run:r4", "a", created_by="a", ttl_seconds=60, tag="run:r4")
    ttls = [await bb.redis.pttl(bb.keyspace.entry_key(f"event:run:r4:{i}")) for i in range(members)]
    assert all(0 < t <= 60_000 for t in ttls)
    assert 0 < await bb.redis.pttl(bb.keyspace.tag_key("run:r4")) <= 60_000


async def test_pipelined_scripts_survive_a_script_flush_and_apply_once(bb: Blackboard) -> None:
    """After Redis forgot its scripts (a restart, a failover: SCRIPT FLUSH here), a batch and a
    retirement still go through, each write applied once (create-only writes would conflict if a
    NOSCRIPT retry ran anything twice)."""
    await bb.write("claim:run:r5", "a", tags={"run:r5"})
    await bb.redis.script_flush()
    written = await bb.write_many(
        [
            {"key": f"event:run:r5:{i}", "value": i, "tags": {"run:r5"}, "expected_version": 0}
            for i in range(3)
        ]
    )
    assert [e.version for e in written] == [1, 1, 1]
    await bb.redis.script_flush()
    await bb.retire_group("claim:run:r5", "a", created_by="a", ttl_seconds=60, tag="run:r5")
    claim = await bb.read("claim:run:r5")
    assert claim is not None and claim.version == 2 and claim.expires_at is not None
    assert 0 < await bb.redis.pttl(bb.keyspace.entry_key("event:run:r5:0")) <= 60_000


async def test_a_group_is_written_with_its_tag_set_expiry_in_one_round_trip(bb: Blackboard) -> None:
    """`write_group` (a submitted run's marker and request, and its tag set's expiry): the writes,
    in order, then the group's tag set given the expiry its members have, in one round trip (the
    two script calls pipelined)."""
    await bb.write_group([{"key": "warm", "value": 0}], tag="warm", ttl_seconds=5)
    events = await bb.subscribe("*").start()
    await bb.redis.config_resetstat()  # (the scripts loaded: a call answered NOSCRIPT counts too)
    written = await bb.write_group(
        [
            {"key": "pending:r3", "value": 1, "tags": {"run:r3", "pending"}, "ttl_seconds": 30},
            {"key": "request:run:r3", "value": {"x": 1}, "tags": {"run:r3"}, "ttl_seconds": 30},
        ],
        tag="run:r3",
        ttl_seconds=30,
    )
    stats = await bb.redis.info("commandstats")
    try:
        assert [e.key for e in written] == ["pending:r3", "request:run:r3"]
        assert 0 < await bb.redis.pttl(bb.keyspace.tag_key("run:r3")) <= 30_000
        assert await bb.redis.pttl(bb.keyspace.tag_key("pending")) == -1  # only the group's set
        assert stats["cmdstat_evalsha"]["calls"] == 2  # the writes and the expiry
        assert [(await events.next(5)).key for _ in range(2)] == ["pending:r3", "request:run:r3"]
    finally:
        events.close()


async def test_a_group_goes_after_another_scopes_first_writes_in_the_same_round_trip(
    bb: Blackboard, redis_url: str
) -> None:
    """`write_group(first=...)` (a submitted run's record, then its marker and request): the other
    scope's writes are applied first, in the same round trip; a conflict among them is raised
    once everything is applied; a board on another Redis client is refused."""
    import pytest

    from colony.blackboard import batches, create_redis
    from colony.errors import BatchConflictError, InvalidArgument

    api = bb.scoped(f"{bb.scope_id}-api")
    await bb.write_group([{"key": "warm", "value": 0}], tag="warm", ttl_seconds=5, first=(api, []))
    here, there = await bb.subscribe("*").start(), await api.subscribe("*").start()
    await bb.redis.config_resetstat()
    sent: list[Any] = []
    real_run_scripts = batches.run_scripts

    async def recording(redis: Any, calls: Any) -> Any:
        sent.extend(calls)
        return await real_run_scripts(redis, calls)

    tag_set = bb.keyspace.tag_key("run:r6")
    batches.run_scripts = recording  # type: ignore[assignment]
    try:
        written = await bb.write_group(
            [{"key": "request:run:r6", "value": {"x": 1}, "tags": {"run:r6"}, "ttl_seconds": 30}],
            tag="run:r6",
            ttl_seconds=30,
            first=(api, [{"key": "run:r6", "value": {"id": "r6"}, "ttl_seconds": 30}]),
        )
        stats = await bb.redis.info("commandstats")
        assert [e.key for e in written] == ["request:run:r6"]
        assert stats["cmdstat_evalsha"]["calls"] == 3  # the record, the group, the expiry: one pipeline
        record, request = (await there.next(5)), (await here.next(5))
        assert (record.key, request.key) == ("run:r6", "request:run:r6")
        # sent first in the pipeline (Redis applies it in order): the api scope's events stream
        assert [call[1][0] for call in sent] == [api.keyspace.events_key, bb.keyspace.events_key, tag_set]
        assert 0 < await bb.redis.pttl(api.keyspace.entry_key("run:r6")) <= 30_000
    finally:
        batches.run_scripts = real_run_scripts  # type: ignore[assignment]
        here.close()
        there.close()
    with pytest.raises(BatchConflictError):
        await bb.write_group(
            [{"key": "request:run:r7", "value": 1, "tags": {"run:r7"}}],
            tag="run:r7",
            ttl_seconds=30,
            first=(api, [{"key": "run:r6", "value": {"id": "again"}, "expected_version": 0}]),
        )
    assert await bb.read("request:run:r7") is not None  # applied all the same, as write_many's
    elsewhere = Blackboard(create_redis(redis_url, bb.settings), bb.scope_id, settings=bb.settings)
    try:
        with pytest.raises(InvalidArgument):
            await bb.write_group([], tag="run:r8", ttl_seconds=30, first=(elsewhere, []))
    finally:
        await elsewhere.redis.aclose()


async def test_a_group_written_after_a_restart_still_gets_its_tag_set_expiry(bb: Blackboard) -> None:
    """After a restart Redis has forgotten the scripts; if the expiry's script was loaded again (by
    another call) and the writes' was not, the expiry runs first (on no set) and the writes are
    run again after it once their script is loaded: the expiry is then given again."""
    from colony.blackboard import scripts

    await bb.redis.script_flush()
    await bb.redis.script_load(scripts.EXPIRE_KEY)
    await bb.write_group(
        [{"key": "request:run:r4", "value": 1, "tags": {"run:r4"}, "ttl_seconds": 30}],
        tag="run:r4",
        ttl_seconds=30,
    )
    assert 0 < await bb.redis.pttl(bb.keyspace.tag_key("run:r4")) <= 30_000
