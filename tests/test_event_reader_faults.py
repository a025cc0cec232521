"""Faults of the shared event reader (colony/blackboard/event_reader.py) found in review, on a real
redis-server: a dropped subscription finalized by a garbage collection in the middle of the lane's
work, an unexpected error in a read round, a stream Redis refuses to read, an id beyond 64 bits, an
outage told to a wait that was cancelled, closed clients kept alive by module registries, and the
per-class capability cache keeping the first instance (and its agent) alive."""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
import weakref
from typing import Any

import pytest

from colony.agents import AgentMetadata, LocalAgentRuntime
from colony.agents.actions import action_executor
from colony.agents.base import Agent
from colony.agents.capability import AgentCapability, capability_parts
from colony.blackboard import Blackboard, EventSubscription, create_redis
from colony.blackboard import event_reader as er
from colony.blackboard.event_reader import existing_reader
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, load_settings
from colony.errors import BlackboardUnavailable, EventStreamRefused, InvalidArgument
from colony.system.builtin import echo_blueprint
from colony.system.runs import parse_event_id


def scope() -> str:
    return f"test:faults:{uuid.uuid4().hex[:10]}"


async def _write_when_back(board: Blackboard, key: str) -> None:
    async with asyncio.timeout(20):
        while True:
            try:
                await board.write(key, 1)
                return
            except BlackboardUnavailable:
                await asyncio.sleep(0.2)


async def test_a_dropped_subscription_finalized_inside_the_lanes_loop_does_not_end_the_lane(
    private_redis: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscription dropped in a reference cycle is freed by whichever garbage collection comes
    next, here one run while the lane tells its waiting subscriptions of an outage: its finalizer
    must not change the slots the lane iterates, and every other waiter hears the later events."""
    info = private_redis.start()
    settings = BlackboardSettings(op_timeout_seconds=1.0, connect_timeout_seconds=0.5)
    board = Blackboard(create_redis(info.url, settings), scope(), settings=settings)
    waiters = [await board.subscribe().start() for _ in range(3)]
    gc.disable()
    try:
        dropped = await board.subscribe().start()
        dropped.cycle = dropped  # type: ignore[attr-defined]  # only the cyclic collector frees it
        del dropped
        tasks = [asyncio.create_task(w.next()) for w in waiters]  # no timeout, as _feed waits
        await asyncio.sleep(0.3)
        wake = er.Slot.wake
        collected: list[int] = []

        def wake_and_collect(slot: er.Slot) -> None:
            wake(slot)
            if not collected:  # a collection at this allocation, inside _fail_waiting's loop
                collected.append(gc.collect())

        monkeypatch.setattr(er.Slot, "wake", wake_and_collect)
        private_redis.stop()
        await asyncio.sleep(1.5)
        monkeypatch.setattr(er.Slot, "wake", wake)
    finally:
        gc.enable()
    try:
        assert collected, "the outage reached no waiting subscription"
        lane = existing_reader(board.redis).lanes[0]  # type: ignore[union-attr]
        assert lane.task is not None and not lane.task.done()
        for task in tasks:
            assert isinstance(task.exception(), BlackboardUnavailable)
        private_redis.start(port=info.port)
        again = [asyncio.create_task(w.next(timeout=15)) for w in waiters]
        await _write_when_back(board, "after")
        results = await asyncio.gather(*again, return_exceptions=True)
        assert [getattr(r, "key", r) for r in results] == ["after"] * 3
    finally:
        await board.close()


async def test_an_unexpected_error_in_a_read_round_restarts_the_lane(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = await bb.subscribe().start()
    dispatch = er.Lane._dispatch
    failed: list[int] = []

    def fail_once(lane: er.Lane, reply: Any) -> None:
        if not failed:
            failed.append(1)
            raise RuntimeError("a bug in one round")
        dispatch(lane, reply)

    monkeypatch.setattr(er.Lane, "_dispatch", fail_once)
    await bb.write_many({"key": f"k:{i}", "value": i} for i in range(3))
    got = [await sub.next(timeout=10) for _ in range(3)]
    assert failed and [e.key for e in got if e is not None] == ["k:0", "k:1", "k:2"]
    assert await sub.next(timeout=0.2) is None  # nothing twice after the restart
    sub.close()


async def test_a_stream_redis_refuses_ends_only_its_own_subscriptions(bb: Blackboard) -> None:
    bad = bb.scoped(scope())
    good = await bb.subscribe().start()
    refused = await bad.subscribe().start()
    await bb.redis.delete(bad.keyspace.events_key)
    await bb.redis.set(bad.keyspace.events_key, "not a stream")  # the lane's XREAD now fails: WRONGTYPE
    waiting = asyncio.create_task(refused.next(timeout=10))
    await bb.write("k", 1)
    await asyncio.sleep(0.3)
    await bb.write("k2", 2)
    assert [(await good.next(timeout=10)).key for _ in range(2)] == ["k", "k2"]  # type: ignore[union-attr]
    with pytest.raises(EventStreamRefused):
        await waiting
    assert await refused.next(timeout=0.5) is None  # ended, not failing forever
    assert existing_reader(bb.redis).stats()["streams"] == 1  # type: ignore[union-attr]
    await bb.write("k3", 3)
    assert (await good.next(timeout=10)).key == "k3"  # type: ignore[union-attr]
    good.close()


async def test_an_id_beyond_64_bits_is_refused_before_it_reaches_the_shared_read(bb: Blackboard) -> None:
    for text in ("18446744073709551616-0", "0-18446744073709551616", "99999999999999999999"):
        with pytest.raises(InvalidArgument):
            bb.subscribe(from_id=text)
        with pytest.raises(InvalidArgument):  # the API's Last-Event-ID check
            parse_event_id(text)
    assert bb.subscribe(from_id="18446744073709551615-18446744073709551615").last_id == (
        "18446744073709551615-18446744073709551615"
    )
    assert parse_event_id("18446744073709551615-0") == (2**64 - 1, 0)


async def test_an_outage_told_to_a_cancelled_wait_is_not_raised_later(bb: Blackboard) -> None:
    sub = await bb.subscribe().start()
    waiting = asyncio.create_task(sub.next())
    await asyncio.sleep(0.2)
    lane = existing_reader(bb.redis).lanes[0]  # type: ignore[union-attr]
    lane._fail_waiting(BlackboardUnavailable("xread", bb.url, ConnectionError("simulated")))
    waiting.cancel()  # its caller gives up in the same turn (a timeout around next(), a disconnect)
    await asyncio.gather(waiting, return_exceptions=True)
    assert await sub.next(timeout=0.3) is None  # Redis is fine: nothing to raise, nothing arrived
    await bb.write("k", 1)
    event = await sub.next(timeout=5)
    assert event is not None and event.key == "k"
    sub.close()


async def test_a_subscription_dropped_on_another_thread_is_released_on_the_readers_loop(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub: EventSubscription | None = await bb.subscribe().start()
    reader = existing_reader(bb.redis)
    assert reader is not None and reader.stats()["subscriptions"] == 1
    remove = er.Lane.remove
    threads: list[int] = []

    def recorded(lane: er.Lane, slot: er.Slot) -> None:
        threads.append(threading.get_ident())
        remove(lane, slot)

    monkeypatch.setattr(er.Lane, "remove", recorded)
    ref = weakref.ref(sub)
    holder = [sub]
    sub = None

    def drop() -> None:
        holder.clear()
        gc.collect()

    await asyncio.to_thread(drop)
    assert ref() is None
    await asyncio.sleep(0.05)  # the removal was handed to this loop
    assert reader.stats()["subscriptions"] == 0
    assert threads == [threading.get_ident()]  # the lane's state is touched by its loop only


async def test_closed_clients_are_freed(redis_url: str) -> None:
    refs = []
    for i in range(5):
        client = create_redis(redis_url, BlackboardSettings())
        board = Blackboard(client, scope())
        if i % 2 == 0:
            sub = await board.subscribe().start()
            await board.write("k", i)
            assert await sub.next(timeout=5) is not None
            sub.close()
            del sub
        else:
            await board.write("k", i)
        await board.close()
        refs.append(weakref.ref(client))
        del client, board
    gc.collect()
    assert [r() for r in refs] == [None] * 5


def _capability_class() -> type[AgentCapability]:
    class Fresh(AgentCapability):  # made anew, as a class unpickled by value is on every spawn
        @action_executor()
        async def go(self, x: int) -> int:
            return x

    return Fresh


async def test_the_capability_cache_keeps_no_instance_nor_its_agent_alive(bb: Blackboard) -> None:
    refs = []
    for i in range(3):
        agent = Agent(AgentMetadata(agent_id=f"a{i}-{uuid.uuid4().hex[:6]}"), bb)
        cls = _capability_class()
        capability = cls(agent=agent)
        agent.add_capability(capability)
        assert [a.name for a in agent.dispatcher.all_actions()] == ["go"]  # bound through the cache
        refs.append((weakref.ref(agent), weakref.ref(capability), weakref.ref(cls)))
        del agent, capability, cls
    gc.collect()
    assert [tuple(r() for r in three) for three in refs] == [(None, None, None)] * 3


async def test_a_stopped_and_dropped_agent_is_freed_with_its_capabilities(redis_url: str) -> None:
    settings = BlackboardSettings()
    board = Blackboard(create_redis(redis_url, settings), "colony:freed-test", settings=settings)
    runtime = LocalAgentRuntime(board, colony_id=f"c{uuid.uuid4().hex[:8]}", settings=load_settings())
    refs = []
    try:
        for i in range(3):
            agent = await runtime.spawn(echo_blueprint(f"freed-{i}"))
            refs.append([weakref.ref(agent), *(weakref.ref(c) for c in agent.capabilities.values())])
            await runtime.stop(agent.agent_id)
            del agent
        await asyncio.sleep(0.3)
        gc.collect()
        assert [[r() is None for r in agent_refs] for agent_refs in refs] == [
            [True] * len(agent_refs) for agent_refs in refs
        ]
    finally:
        await runtime.shutdown()
        await board.close()


class _Static(AgentCapability):
    @staticmethod
    @action_executor()
    async def twice(x: int) -> int:
        return 2 * x

    @classmethod
    @action_executor()
    async def named(cls, x: int) -> str:
        return f"{cls.__name__}:{x}"


async def test_static_and_class_method_actions_are_added_and_bound(bb: Blackboard) -> None:
    agent = Agent(AgentMetadata(agent_id=f"s-{uuid.uuid4().hex[:6]}"), bb)
    capability = _Static(agent=agent)
    assert sorted(attr for attr, _spec in capability_parts(capability).actions) == ["named", "twice"]
    agent.add_capability(capability)
    twice, named = agent.dispatcher.get("twice"), agent.dispatcher.get("named")
    assert twice is not None and named is not None
    assert await twice.method(2) == 4
    assert await named.method(1) == "_Static:1"
