"""The shared event reader (colony/blackboard/event_reader.py): one XREAD per lane over many
subscriptions, on a real redis-server. Delivery to the right subscribers (one stream, many
streams), a new subscription served while the read blocks, bounded connections with many idle
agents, an outage that pauses delivery and loses nothing, close releasing the stream, bounded
buffers."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid

import pytest
import redis

from colony.agents import AgentHandle, AgentMetadata, LocalAgentRuntime, RunStatus
from colony.agents.base import Agent
from colony.blackboard import Blackboard, BlackboardEvent, EventSubscription, create_redis
from colony.blackboard import event_reader as er
from colony.blackboard.event_reader import existing_reader, reader_for
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, load_settings
from colony.errors import BlackboardUnavailable, InvalidArgument
from colony.system.builtin import RUNS_NAMESPACE, echo_blueprint


def scope() -> str:
    return f"test:reader:{uuid.uuid4().hex[:10]}"


async def drain(sub: EventSubscription, count: int, timeout: float = 5.0) -> list[BlackboardEvent]:
    got = []
    async with asyncio.timeout(timeout):
        while len(got) < count:
            event = await sub.next(timeout=timeout)
            assert event is not None, f"only {len(got)} of {count} events arrived"
            got.append(event)
    return got


def blocked_clients(url: str) -> int:
    admin = redis.Redis.from_url(url)
    try:
        return int(admin.info("clients")["blocked_clients"])
    finally:
        admin.close()


async def test_many_subscribers_of_one_stream_share_one_read_and_get_their_own_keys(bb: Blackboard) -> None:
    subs = [await bb.subscribe(f"job:{i % 10}:*").start() for i in range(200)]
    everything = await bb.subscribe().start()
    reader = existing_reader(bb.redis)
    assert reader is not None
    assert reader.stats() == {"lanes": 1, "streams": 1, "subscriptions": 201}
    await bb.write_many({"key": f"job:{i % 10}:{i:03d}", "value": i} for i in range(100))
    for n, sub in enumerate(subs):
        got = await drain(sub, 10)
        assert [e.key for e in got] == [f"job:{n % 10}:{i:03d}" for i in range(n % 10, 100, 10)]
        assert await sub.next(timeout=0.05) is None  # nothing else, nothing twice
    assert [e.key for e in await drain(everything, 100)] == [f"job:{i % 10}:{i:03d}" for i in range(100)]
    for sub in [*subs, everything]:
        sub.close()


async def test_subscribers_of_many_streams_each_get_their_scope_only(bb: Blackboard) -> None:
    boards = [bb.scoped(scope()) for _ in range(300)]
    subs = [await b.subscribe().start() for b in boards]
    reader = existing_reader(bb.redis)
    assert reader is not None and reader.stats()["streams"] == 300 and reader.stats()["lanes"] == 1
    await asyncio.gather(*(b.write("k", n) for n, b in enumerate(boards)))
    for n, (board, sub) in enumerate(zip(boards, subs, strict=True)):
        (event,) = await drain(sub, 1)
        assert (event.scope_id, event.key) == (board.scope_id, "k")
        assert (await board.read("k")).value == n
    for sub in subs:
        sub.close()


async def test_resumed_and_live_subscribers_of_one_stream_each_get_every_event_once(bb: Blackboard) -> None:
    live = await bb.subscribe().start()
    await bb.write_many({"key": f"a:{i}", "value": i} for i in range(20))
    first = await drain(live, 20)
    late = bb.subscribe(from_id="0")  # joins the same stream, at an older position
    middle = bb.subscribe(from_id=first[9].id)
    await bb.write_many({"key": f"b:{i}", "value": i} for i in range(5))
    assert [e.key for e in await drain(late, 25)] == [f"a:{i}" for i in range(20)] + [
        f"b:{i}" for i in range(5)
    ]
    assert [e.key for e in await drain(middle, 15)] == [f"a:{i}" for i in range(10, 20)] + [
        f"b:{i}" for i in range(5)
    ]
    assert [e.key for e in await drain(live, 5)] == [f"b:{i}" for i in range(5)]
    for sub in (live, late, middle):
        assert await sub.next(timeout=0.05) is None
        sub.close()


async def test_a_new_subscription_is_served_without_waiting_out_the_block(redis_url: str) -> None:
    settings = BlackboardSettings(op_timeout_seconds=16)  # a lane blocks 8 s
    client = create_redis(redis_url, settings)
    try:
        board = Blackboard(client, scope(), settings=settings)
        first = await board.subscribe().start()
        await asyncio.sleep(0.3)  # the lane is blocked in its XREAD (8 s) over the first stream only
        other = board.scoped(scope())
        started = time.monotonic()
        second = await other.subscribe().start()
        await other.write("new", 1)
        event = await second.next(timeout=5)
        elapsed = time.monotonic() - started
        assert event is not None and event.key == "new"
        assert elapsed < 2.0, f"the new subscription waited {elapsed:.1f}s (the block is 8 s)"
        await board.write("old", 1)
        assert (await first.next(timeout=5)).key == "old"
        first.close()
        second.close()
    finally:
        await Blackboard(client, "x", settings=settings).close()


async def test_close_releases_the_stream_and_an_idle_reader_holds_no_blocked_read(redis_url: str) -> None:
    settings = BlackboardSettings(op_timeout_seconds=0.6)  # a lane blocks 300 ms
    client = create_redis(redis_url, settings)
    board_a, board_b = (
        Blackboard(client, scope(), settings=settings),
        Blackboard(client, scope(), settings=settings),
    )
    try:
        a = await board_a.subscribe().start()
        b = await board_b.subscribe().start()
        reader = reader_for(client, board_a.url, settings)
        await asyncio.sleep(0.1)
        lane = reader.lanes[0]
        assert set(lane.requested) >= {board_a.keyspace.events_key, board_b.keyspace.events_key}
        a.close()
        assert reader.stats()["streams"] == 1
        await asyncio.sleep(0.8)  # past one block: the next XREAD no longer carries the closed stream
        assert board_a.keyspace.events_key not in lane.requested
        assert board_b.keyspace.events_key in lane.requested
        await board_a.write("after-close", 1)
        assert await a.next(timeout=0.2) is None
        dropped = await board_b.scoped(scope()).subscribe().start()
        assert reader.stats()["subscriptions"] == 2
        del dropped  # never closed: the reader lets go of it when it is collected
        gc.collect()
        await asyncio.sleep(0)  # the finalizer hands the removal to the reader's loop
        assert reader.stats()["subscriptions"] == 1
        b.close()
        await asyncio.sleep(1.0)
        assert reader.stats() == {"lanes": 0, "streams": 0, "subscriptions": 0}
        assert lane.task is not None and lane.task.done()  # the lane ended: no XREAD left blocked
    finally:
        await board_a.close()


async def test_a_full_subscription_stops_being_read_for_and_loses_nothing(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(er, "BUFFER_ROWS", 8)
    slow = await bb.subscribe().start()
    fast = await bb.subscribe().start()
    await bb.write_many({"key": f"k:{i:03d}", "value": i} for i in range(100))
    assert [e.key for e in await drain(fast, 100)] == [f"k:{i:03d}" for i in range(100)]
    assert slow._slot is not None and len(slow._slot.buffer) <= 8 + er.READ_COUNT  # bounded meanwhile
    assert [e.key for e in await drain(slow, 100)] == [f"k:{i:03d}" for i in range(100)]
    assert await slow.next(timeout=0.05) is None
    slow.close()
    fast.close()


async def test_an_outage_pauses_delivery_and_it_resumes_with_nothing_lost(
    private_redis: EmbeddedRedis,
) -> None:
    info = private_redis.start()
    settings = BlackboardSettings(subscribe_block_ms=200, op_timeout_seconds=1.0, connect_timeout_seconds=0.5)
    client = create_redis(info.url, settings)
    board = Blackboard(client, scope(), settings=settings)
    try:
        sub = await board.subscribe().start()
        await board.write_many({"key": f"before:{i}", "value": i} for i in range(5))
        assert [e.key for e in await drain(sub, 3)] == ["before:0", "before:1", "before:2"]
        await asyncio.sleep(0.3)  # the last two are buffered already
        private_redis.stop()
        assert [e.key for e in await drain(sub, 2)] == ["before:3", "before:4"]
        with pytest.raises(BlackboardUnavailable):
            await sub.next(timeout=10)
        private_redis.start(port=info.port)  # data kept (stopped cleanly)
        async with asyncio.timeout(20):
            while True:  # the caller's own retry, as event_delivery / stream_events_to_queue do
                try:
                    await board.write_many({"key": f"after:{i}", "value": i} for i in range(3))
                    break
                except BlackboardUnavailable:
                    await asyncio.sleep(0.2)
        got = []
        async with asyncio.timeout(20):
            while len(got) < 3:
                try:
                    event = await sub.next(timeout=5)
                except BlackboardUnavailable:
                    continue
                assert event is not None
                got.append(event.key)
        assert got == ["after:0", "after:1", "after:2"]
        assert await sub.next(timeout=0.3) is None
        sub.close()
    finally:
        await board.close()


async def test_an_invalid_position_is_refused_before_it_reaches_the_shared_read(bb: Blackboard) -> None:
    with pytest.raises(InvalidArgument):
        bb.subscribe(from_id="1-2-3")
    with pytest.raises(InvalidArgument):
        bb.subscribe(from_id="latest")
    assert bb.subscribe(from_id="5").last_id == "5-0"


async def _hold_idle_agents(url: str, count: int, shared: bool) -> tuple[int, LocalAgentRuntime, Blackboard]:
    settings = BlackboardSettings(max_connections=count + 64)
    client = create_redis(url, settings)
    board = Blackboard(client, "colony:density-test", settings=settings, shared_events=shared)
    runtime = LocalAgentRuntime(board, colony_id=f"c{uuid.uuid4().hex[:8]}", settings=load_settings())
    for i in range(count):
        await runtime.spawn(echo_blueprint(f"idle-{i}"))
    await asyncio.sleep(1.5)  # every agent's subscription joined, its read issued
    admin = redis.Redis.from_url(url, decode_responses=True)
    try:
        connections = len(admin.client_list()) - 1
    finally:
        admin.close()
    return connections, runtime, board


async def test_500_idle_agents_share_a_bounded_number_of_connections_and_still_serve(
    private_redis: EmbeddedRedis,
) -> None:
    url = private_redis.start().url
    # the per-subscription baseline really holds one connection per idle agent (the measurement works)
    connections, runtime, board = await _hold_idle_agents(url, 60, shared=False)
    await runtime.shutdown()
    await board.close()
    assert connections >= 60
    connections, runtime, board = await _hold_idle_agents(url, 500, shared=True)
    try:
        assert connections < 50, f"{connections} Redis connections for 500 idle agents"
        reader = existing_reader(board.redis)
        assert reader is not None and reader.stats()["streams"] == 500
        assert blocked_clients(url) == reader.stats()["lanes"] == 1
        caller = Agent(AgentMetadata(agent_id="caller", colony_id=runtime.colony_id), board)
        for i in (0, 250, 499):  # any of them still hears its requests through the shared read
            handle = AgentHandle(f"idle-{i}", owner=caller)
            run = await handle.run({"n": i}, namespace=RUNS_NAMESPACE, timeout=20)
            assert run.status is RunStatus.SUCCEEDED and run.output == {"n": i}
    finally:
        await runtime.shutdown()
        await board.close()


async def test_a_subscriber_joining_behind_a_read_in_flight_skips_nothing(bb: Blackboard) -> None:
    """B joins at an older position while the lane's XREAD (from A's newer position) is in flight
    and a row arrives before the wake: that read's rows must not carry B past the rows between."""
    a = await bb.subscribe().start()
    await bb.write_many({"key": f"e:{i:02d}", "value": i} for i in range(10))
    seen = await drain(a, 10)
    await asyncio.sleep(0.1)  # the lane blocks again, reading from A's position (after e:09)
    b = bb.subscribe(from_id=seen[4].id)
    await b.start()
    await bb.write("e:10", 10)  # lands before the wake (50 ms): answers the read in flight
    assert [e.key for e in await drain(b, 6)] == [f"e:{i:02d}" for i in range(5, 11)]
    assert [e.key for e in await drain(a, 1)] == ["e:10"]
    a.close()
    b.close()


def test_a_lanes_packed_xread_is_the_command_redis_py_would_send() -> None:
    """The lane packs its XREAD from cached pieces; the bytes are what redis-py packs for the same
    arguments (keys and positions with any character a scope id or an event id may hold)."""
    from redis.asyncio.connection import Connection

    packer = er.XreadPacker()
    request = {"colony:bb:{tenant:t:colony:c:agent:é-1}:events": "0-0", "k:2": "1795434959064-17"}
    for _ in range(2):  # the second time from the cache
        packed = packer.xread(request, "wake:abc", "5-1", 2500)
        args = ["XREAD", "COUNT", er.READ_COUNT, "BLOCK", 2500, "STREAMS", *request, "wake:abc"]
        assert packed == b"".join(Connection().pack_command(*args, *request.values(), "5-1"))
    packer.forget("k:2")
    assert "k:2" not in packer.keys


async def test_a_packed_read_cut_off_leaves_no_reply_behind_on_the_pool(redis_url: str) -> None:
    """An XREAD cancelled while it blocks: its connection is closed before it goes back to the
    pool (not handed out with the reply still to come), and the pool serves the next commands."""
    client = create_redis(redis_url, BlackboardSettings())
    used = []
    handed_out = client.connection_pool.get_connection

    async def spy() -> object:
        conn = await handed_out()
        used.append(conn)
        return conn

    client.connection_pool.get_connection = spy  # type: ignore[method-assign]
    try:
        key = f"test:packed:{uuid.uuid4().hex[:8]}"
        command = er.XreadPacker().xread({key: "$"}, f"{key}:wake", "0-0", 400)
        read = asyncio.create_task(er.send_packed(client, command, "XREAD"))
        await asyncio.sleep(0.1)
        read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
        assert len(used) == 1 and not used[0].is_connected  # closed, so its late reply is dropped
        await client.set(key + ":probe", "mine")
        await asyncio.sleep(0.5)  # past the XREAD's block
        assert await client.get(key + ":probe") == "mine"
        await client.xadd(key, {"f": "v"})
        again = er.XreadPacker().xread({key: "0-0"}, f"{key}:w", "0-0", 10)
        reply = await er.send_packed(client, again, "XREAD")
        assert [(k, [fields for _id, fields in rows]) for k, rows in reply] == [(key, [{"f": "v"}])]
    finally:
        await client.aclose()


async def test_the_read_position_never_runs_ahead_of_the_stream(bb: Blackboard) -> None:
    """`Blackboard.read_event_position` (where a new run's events may start) is only known while
    the reader has read rows of the stream, and never later than the newest of them: a replay
    that asked for an id past the stream's end does not carry that id to later subscriptions."""
    board = bb.scoped(scope())
    assert board.read_event_position() is None  # nobody reads it
    ahead = board.subscribe("*", from_id="99999999999999-0")  # a replay asking past the end
    await ahead.start()
    await board.write("a", 1)
    await asyncio.sleep(0.2)
    assert board.read_event_position() is None  # nothing read: no position vouched for
    live = board.subscribe("*", from_id="0")
    await drain(live, 1)
    position = board.read_event_position()
    newest = await board.latest_event_id()
    assert position is not None and er.parse_id(position) <= er.parse_id(newest)
    late = board.subscribe("*", from_id=position)  # what a run submitted now would use
    await board.write("b", 2)
    assert [e.key for e in await drain(late, 1)] == ["b"]
    for sub in (ahead, live, late):
        sub.close()
