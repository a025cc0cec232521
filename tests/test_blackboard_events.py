"""Durable events: resumable subscriptions and consumer groups with reclaim."""

from __future__ import annotations

import asyncio

from colony.blackboard import Blackboard
from colony.config import BlackboardSettings


async def test_resumed_subscriber_gets_all_events_once_in_order(bb: Blackboard) -> None:
    sub = await bb.subscribe("item:*").start()
    await bb.write_many({"key": f"item:{i:04d}", "value": i} for i in range(1000))
    received = []
    async for event in sub:
        received.append(event)
        if len(received) == 500:
            break
    sub.close()
    last_id = received[-1].id
    del sub  # the subscriber "disconnects"; more events arrive while it is away
    await bb.write("noise:x", 0)
    resumed = bb.subscribe("item:*", from_id=last_id)
    async for event in resumed:
        received.append(event)
        if len(received) == 1000:
            break
    keys = [e.key for e in received]
    assert keys == [f"item:{i:04d}" for i in range(1000)]
    assert len({e.id for e in received}) == 1000
    assert all(e.op == "write" and e.version == 1 for e in received)


async def test_subscription_from_now_sees_only_later_events(bb: Blackboard) -> None:
    await bb.write("old", 1)
    sub = await bb.subscribe().start()
    await bb.write("new", 2, tags={"t"}, created_by="me")
    await bb.delete("old", created_by="me")
    first = await sub.next(timeout=2)
    second = await sub.next(timeout=2)
    assert (first.op, first.key, first.version, first.tags, first.created_by) == (
        "write",
        "new",
        1,
        {"t"},
        "me",
    )
    assert (second.op, second.key, second.version) == ("delete", "old", 1)
    assert first.value is None  # values stay out of events by default
    assert await sub.next(timeout=0.2) is None


async def test_values_in_events_when_configured(redis_url: str) -> None:
    from colony.blackboard import create_redis

    settings = BlackboardSettings(include_values_in_events=True)
    client = create_redis(redis_url, settings)
    board = Blackboard(client, "test:values-in-events", settings=settings)
    try:
        sub = await board.subscribe().start()
        await board.write("k", {"a": 1})
        event = await sub.next(timeout=2)
        assert event.value == {"a": 1}
    finally:
        await client.aclose()


async def test_event_stream_is_bounded(redis_url: str) -> None:
    from colony.blackboard import create_redis

    settings = BlackboardSettings(events_maxlen=100)
    client = create_redis(redis_url, settings)
    board = Blackboard(client, "test:bounded-stream", settings=settings)
    try:
        await board.write_many({"key": f"k:{i}", "value": i} for i in range(2000))
        length = await client.xlen(board.keyspace.events_key)
        assert 100 <= length < 400  # MAXLEN ~ trims whole nodes
    finally:
        await client.aclose()


async def test_consumer_group_delivers_each_event_to_one_consumer(bb: Blackboard) -> None:
    a = await bb.consume("workers", "a", "job:*").start()
    b = await bb.consume("workers", "b", "job:*").start()
    await bb.write("unrelated", 1)  # not matching: acknowledged and skipped by whoever reads it
    await bb.write_many({"key": f"job:{i}", "value": i} for i in range(40))
    got: dict[str, list[str]] = {"a": [], "b": []}

    async def drain(consumer, name: str) -> None:
        while len(got["a"]) + len(got["b"]) < 40:
            try:
                item = await asyncio.wait_for(consumer.__anext__(), 0.5)
            except TimeoutError:
                continue
            got[name].append(item.event.key)
            await item.ack()

    await asyncio.wait_for(asyncio.gather(drain(a, "a"), drain(b, "b")), 10)
    all_keys = got["a"] + got["b"]
    assert sorted(all_keys) == sorted(f"job:{i}" for i in range(40))
    assert len(set(all_keys)) == 40
    pending = await bb.redis.xpending(bb.keyspace.events_key, "workers")
    assert pending["pending"] == 0


async def test_killed_consumer_pending_events_are_reclaimed(bb: Blackboard) -> None:
    dying = await bb.consume("g", "dying", min_idle_ms=200).start()
    await bb.write_many({"key": f"task:{i}", "value": i} for i in range(10))
    taken = []

    async def take_without_ack() -> None:
        async for item in dying:
            taken.append(item.event.key)
            if len(taken) == 10:
                await asyncio.sleep(3600)  # holds the events, never acks

    task = asyncio.create_task(take_without_ack())
    async with asyncio.timeout(5):
        while len(taken) < 10:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    task.cancel()  # the consumer dies holding 10 pending events
    survivor = bb.consume("g", "survivor", min_idle_ms=200)
    reclaimed = []
    async with asyncio.timeout(10):
        async for item in survivor:
            assert item.delivery == "reclaimed"
            reclaimed.append(item.event.key)
            await item.ack()
            if len(reclaimed) == 10:
                break
    assert sorted(reclaimed) == sorted(taken)
    assert (await bb.redis.xpending(bb.keyspace.events_key, "g"))["pending"] == 0


async def test_restarted_consumer_gets_its_own_pending_first(bb: Blackboard) -> None:
    first = await bb.consume("g2", "worker-1").start()
    await bb.write("a", 1)
    await bb.write("b", 2)
    item = await first.__anext__()
    assert item.event.key == "a"  # delivered, not acked: the worker "restarts"
    restarted = bb.consume("g2", "worker-1")
    again = await restarted.__anext__()
    assert (again.event.key, again.delivery) == ("a", "pending")
    await again.ack()
    nxt = await restarted.__anext__()
    assert nxt.event.key == "b"


async def test_unacked_own_pending_event_does_not_block_new_events(bb: Blackboard) -> None:
    await bb.write("a", 1)
    await bb.write("b", 2)
    first = await bb.consume("g3", "w1").start()
    await (await first.__anext__()).ack()  # a handled
    await first.__anext__()  # b delivered, its handler fails: never acked
    first.close()
    await bb.write("c", 3)
    restarted = bb.consume("g3", "w1")
    got = [await asyncio.wait_for(restarted.__anext__(), 3) for _ in range(2)]
    assert [(e.event.key, e.delivery) for e in got] == [("b", "pending"), ("c", "new")]


def test_key_globs_match_as_fnmatch_does_the_run_form_without_a_regex() -> None:
    """A run's stream subscribes with `*:run:<id>*`: matched by a substring test, not a regex
    compiled anew per run; every other glob by its regex, and all as fnmatch would."""
    import fnmatch

    from colony.blackboard.events import KeyContains, compile_pattern

    keys = ["event:run:run-1:00001.started", "result:run:run-1", "event:run:run-12:1", "x", "", "a\nb"]
    patterns = ["*:run:run-1*", "*:run:run-1:*", "*run*", "**", "*[r]un*", "*?*", "result:*", "*\n*", "*"]
    for pattern in patterns:
        matcher = compile_pattern(pattern)
        for key in keys:
            got = matcher is None or bool(matcher.match(key))
            assert got == fnmatch.fnmatchcase(key, pattern), (pattern, key)
    assert isinstance(compile_pattern("*:run:run-1*"), KeyContains)
    assert not isinstance(compile_pattern("*[r]un*"), KeyContains)
