"""Bounded Redis: finished runs, stopped agents, streams, tag indexes and agent context all have a
retention or a cap. Real redis-server; retention shortened to seconds through the settings' env."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from colony.agents import run_retention
from colony.agents.base import MAX_CONTEXT_ITEMS, Agent
from colony.agents.run_capability import AgentRunCapability
from colony.agents.run_retention import RequestRetention
from colony.agents.state.ring import ContextRing
from colony.blackboard import AgentRunProtocol, Blackboard, create_redis
from colony.blackboard.protocol import AgentStateProtocol, ApiRunProtocol
from colony.blackboard.retention import EXPIRE_CHUNK
from colony.config import BlackboardSettings, ColonySettings, load_settings
from colony.errors import BlackboardUnavailable, InvalidArgument
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import ask_blueprint, echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.runs import GAP, RunService

RETENTION = 2.0
ANSWER = " ".join(f"word{i}" for i in range(60))  # a long answer: one `token` event (key) per word


@pytest.fixture
async def colony(
    bb: Blackboard, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ReplicaHost, RunService]]:
    monkeypatch.setenv("COLONY_RUNS__RETENTION_SECONDS", str(RETENTION))
    settings = ColonySettings(redis_url=redis_url, colony_id=f"ret{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "replica-r", engine=ScriptedEngine([ANSWER] * 10))
    await host.start(bb)
    await host.ensure_agent(echo_blueprint())
    await host.ensure_agent(ask_blueprint())
    assert host.registry is not None
    runs = RunService(bb, host.registry, settings=settings)
    yield host, runs
    await host.close()


async def keys_named(bb: Blackboard, text: str) -> list[str]:
    """Every Redis key whose name holds `text` (a test may SCAN; hot paths may not), but a run's
    marker that it was submitted (`ApiRunProtocol.known_key`): it outlives the run on purpose
    (a retired run answers 410; tests/test_api_retention.py checks it)."""
    known = ApiRunProtocol.known_key(text)
    return [k async for k in bb.redis.scan_iter(match=f"*{text}*", count=1000) if not k.endswith(known)]


async def wait_status(runs: RunService, run_id: str, timeout: float = 15) -> str:
    async with asyncio.timeout(timeout):
        while True:
            view = await runs.get(run_id)
            if view.status in ("succeeded", "failed", "cancelled"):
                return view.status
            await asyncio.sleep(0.05)


async def collect(stream: AsyncIterator[tuple[str, dict[str, Any]]], timeout: float = 10) -> list[Any]:
    async with asyncio.timeout(timeout):
        return [pair async for pair in stream]


async def test_ask_run_leaves_no_key_after_retention(colony, bb: Blackboard) -> None:
    host, runs = colony
    record = await runs.submit("ask", {"question": "count to sixty"})
    assert await wait_status(runs, record.run_id) == "succeeded"
    events = await collect(runs.events(record.run_id))
    assert sum(e["event_type"] == "token" for _, e in events) == 60
    left = await keys_named(bb, record.run_id)
    # request, claim, result, one key per event, the run's tag index set and its API record
    assert len(left) >= 60 + 5
    for key in left:  # every one of them is already on its way out
        assert await bb.redis.pttl(key) > 0, key
    # the run's own tag set expires with them, so they need no expiry-index entry
    expiring = await bb.redis.zrange(runs.run_board(record).keyspace.expiry_key, 0, -1)
    assert not [m for m in expiring if record.run_id in m]
    await asyncio.sleep(RETENTION + 0.5)
    assert await keys_named(bb, record.run_id) == []
    # the agent's run record (keyed by its own run id) is gone too
    agent_board = host.runtime.agent_board("ask")
    assert await agent_board.read(AgentStateProtocol.key("current_run")) is not None
    current = (await agent_board.read(AgentStateProtocol.key("current_run"))).value
    assert await agent_board.read(AgentStateProtocol.run_key(current)) is None
    # a later run trims the old run's stream events (retention of the stream, beside its cap)
    later = await runs.submit("ask", {"question": "again"})
    assert await wait_status(runs, later.run_id) == "succeeded"
    await collect(runs.events(later.run_id))
    ask_runs = runs.run_board(record)

    async def old_events() -> list[Any]:
        stream = await bb.redis.xrange(ask_runs.keyspace.events_key)
        return [f for _, f in stream if record.run_id in f["key"]]

    async with asyncio.timeout(5):  # the agent retires the later run just after its terminal event
        while await old_events():  # noqa: ASYNC110 - polling Redis
            await asyncio.sleep(0.05)
    open_claims = ask_runs.keyspace.tag_key(AgentRunProtocol.open_claims_tag())
    assert not await bb.redis.sismember(open_claims, record.run_id)


async def test_cancelled_run_expires_too(colony, bb: Blackboard) -> None:
    _, runs = colony
    await runs.registry.get("echo")
    record = await runs.submit("echo", {"n": 1}, namespace="elsewhere")  # nobody serves this namespace
    view = await runs.cancel(record.run_id)
    assert view.status == "cancelled"
    assert await keys_named(bb, record.run_id)
    await asyncio.sleep(RETENTION + 0.5)
    assert await keys_named(bb, record.run_id) == []


async def test_stopped_agent_leaves_registry_and_redis(colony, bb: Blackboard) -> None:
    host, runs = colony
    name = f"tmp{uuid.uuid4().hex[:8]}"
    await host.ensure_agent(echo_blueprint(name))
    record = await runs.submit(name, "hello")
    assert await wait_status(runs, record.run_id) == "succeeded"
    assert await host.stop_agent(name)
    assert (await host.registry.get(name)).state == "stopped"
    assert name in {r.agent_id for r in await host.registry.list(state="stopped")}
    assert await keys_named(bb, name)
    await asyncio.sleep(RETENTION + 0.5)
    assert await host.registry.get(name) is None
    assert name not in {r.agent_id for r in await host.registry.list()}
    assert name not in {r.agent_id for r in await host.registry.list(state="stopped")}
    # the index of the agent's HTTP runs (GET /v1/runs?agent=) loses its expired member at the
    # next write to the API's scope (every submit is one: each sweeps due expiry-index members),
    # and goes once empty
    await runs.api_board.write("note:after-retention", 1, tags={"note"}, ttl_seconds=60)
    # but for a pool member's pick-up receipt, which lives as long as its call may be sent again
    # (the blackboard's op timeout) when the retention is shorter
    left = await keys_named(bb, name)
    receipts = [k for k in left if ":k:" in k]
    assert left == receipts
    for key in receipts:
        assert await bb.redis.pttl(key) <= (bb.settings.op_timeout_seconds - RETENTION) * 1000
    await asyncio.sleep(bb.settings.op_timeout_seconds - RETENTION)
    assert await keys_named(bb, name) == []


def without_retirement_in_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers whose commit carries no retirement (as when it conflicts, or the run's keys are too
    many for its round trip): the request is retired on its own after it (`retire`)."""
    monkeypatch.setattr(RequestRetention, "retire_with", lambda self, tx, request_id: None)
    monkeypatch.setattr(RequestRetention, "retired_with", lambda self, tx: False)


async def test_a_run_is_retired_in_its_answers_round_trip(
    colony, bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer's commit rewrites the claim (out of the open-claims index, expiring) and the
    run's keys and API record get their expiry in the same round trip: no retirement of its own
    follows, and nothing of the run outlives the retention."""
    _host, runs = colony
    apart: list[str] = []
    original = Blackboard.retire_group

    async def retire(self: Blackboard, key: str, *args: Any, **kwargs: Any) -> None:
        apart.append(key)
        await original(self, key, *args, **kwargs)

    monkeypatch.setattr(Blackboard, "retire_group", retire)
    record = await runs.submit("echo", "hello")
    assert await wait_status(runs, record.run_id) == "succeeded"
    board = runs.run_board(record)
    claim = await board.read(AgentRunProtocol.claim_key(record.run_id))
    assert claim is not None and claim.tags == frozenset() and claim.expires_at is not None
    assert AgentRunProtocol.claim_key(record.run_id) not in {
        e.key async for e in board.iter_query("*", tags={"all_of": [AgentRunProtocol.open_claims_tag()]})
    }
    left = await keys_named(bb, record.run_id)
    assert len(left) >= 5  # request, claim, result, events, API record
    for key in left:
        assert await bb.redis.pttl(key) > 0, key
    assert apart == []
    await asyncio.sleep(RETENTION + 0.5)
    assert await keys_named(bb, record.run_id) == []


async def test_a_run_with_more_keys_than_one_expiry_call_is_retired_after_its_answer(
    bb: Blackboard, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose keys are more than the answer's round trip retires (EXPIRE_CHUNK): the answer
    stands, and its keys are paged to their expiry after it all the same."""
    monkeypatch.setenv("COLONY_RUNS__RETENTION_SECONDS", str(RETENTION))
    settings = ColonySettings(redis_url=redis_url, colony_id=f"ret{uuid.uuid4().hex[:8]}")
    long_answer = " ".join(f"w{i}" for i in range(EXPIRE_CHUNK + 20))
    host = ReplicaHost(settings, "replica-big", engine=ScriptedEngine([long_answer]))
    await host.start(bb)
    try:
        await host.ensure_agent(ask_blueprint())
        assert host.registry is not None
        runs = RunService(bb, host.registry, settings=settings)
        record = await runs.submit("ask", {"question": "a long one"})
        assert await wait_status(runs, record.run_id, timeout=60) == "succeeded"
        left = await keys_named(bb, record.run_id)
        assert len(left) > EXPIRE_CHUNK
        async with asyncio.timeout(10):  # paged just after the answer
            while [k for k in left if await bb.redis.pttl(k) == -1]:  # noqa: ASYNC110 - Redis state
                await asyncio.sleep(0.05)
        await asyncio.sleep(RETENTION + 0.5)
        assert await keys_named(bb, record.run_id) == []
    finally:
        await host.close()


async def test_an_agent_stopped_as_its_run_is_answered_still_retires_the_run(
    colony, bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop lands while the answered run's keys are being given their expiry on their own (a
    retirement the answer's commit did not carry, see `without_retirement_in_the_answer`; slowed
    here): the retirement finishes anyway, so neither the keys nor the run's tag set stay for good
    (CI once found the tag set left when a loaded box stopped the agent between the two)."""
    host, runs = colony
    name = f"tmp{uuid.uuid4().hex[:8]}"
    await host.ensure_agent(echo_blueprint(name))
    without_retirement_in_the_answer(monkeypatch)
    original = Blackboard.retire_group
    retiring = asyncio.Event()

    async def slow_retire(self: Blackboard, *args: Any, **kwargs: Any) -> None:
        retiring.set()  # a run's retirement: give the stop time to land inside it
        await asyncio.sleep(0.5)
        await original(self, *args, **kwargs)

    monkeypatch.setattr(Blackboard, "retire_group", slow_retire)
    record = await runs.submit(name, "hello")
    async with asyncio.timeout(15):
        await retiring.wait()
    assert await host.stop_agent(name)
    await asyncio.sleep(RETENTION + 1.0)
    assert await keys_named(bb, record.run_id) == []


async def test_a_retirement_still_waiting_at_close_finishes_when_redis_is_back(
    colony, bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis goes away inside an answered run's retirement (after its claim left the open-claims
    index) and stays away past the drain at close (the agent is suspended meanwhile): the
    retirement is not cancelled, it goes on alone, and once Redis is back nothing of the run
    stays for good (no later start could find the request to retire it again)."""
    host, runs = colony
    name = f"tmp{uuid.uuid4().hex[:8]}"
    await host.ensure_agent(echo_blueprint(name))
    without_retirement_in_the_answer(monkeypatch)
    monkeypatch.setattr(run_retention, "RETIRE_DRAIN_SECONDS", 0.3)
    original = Blackboard.retire_group
    outage = {"on": True}
    cut = asyncio.Event()

    async def retire(self: Blackboard, key: str, value: Any, **kwargs: Any) -> None:
        if outage["on"]:  # the claim leaves the open-claims index, then Redis is away
            await self.write(key, value, created_by=kwargs["created_by"], ttl_seconds=kwargs["ttl_seconds"])
            cut.set()
            raise BlackboardUnavailable("retire", "redis://injected", ConnectionError("away"))
        await original(self, key, value, **kwargs)

    async def answers(self: AgentRunCapability) -> bool:
        return not outage["on"]

    monkeypatch.setattr(Blackboard, "retire_group", retire)
    monkeypatch.setattr(AgentRunCapability, "_redis_answers", answers)
    record = await runs.submit(name, "hello")
    async with asyncio.timeout(15):
        await cut.wait()
    await host.suspend_agent(name)  # close waits 0.3 s, then leaves the retirement running
    outage["on"] = False
    await host.resume_agent(name)
    await asyncio.sleep(RETENTION + 1.0)
    assert await keys_named(bb, record.run_id) == []


async def test_event_streams_are_capped(redis_url: str) -> None:
    settings = BlackboardSettings(events_maxlen=100)
    client = create_redis(redis_url, settings)
    board = Blackboard(client, f"test:{uuid.uuid4().hex[:12]}", settings=settings)
    try:
        await board.write_many([{"key": f"k:{i}", "value": i} for i in range(1000)])
        for i in range(200):
            await board.write(f"w:{i}", i)
        async with board.transaction() as tx:
            for i in range(300):
                tx.write(f"t:{i}", i)
        length = await client.xlen(board.keyspace.events_key)
        assert 100 <= length < 400  # MAXLEN ~ trims whole stream nodes (100 entries each)
    finally:
        await client.aclose()


async def test_expired_entries_leave_their_tag_index(bb: Blackboard) -> None:
    for i in range(10):
        await bb.write(f"beat:{i}", i, tags={"kind:beat"}, ttl_seconds=0.2)
    await bb.write("keep", 1, tags={"kind:beat"})
    tag_set = bb.keyspace.tag_key("kind:beat")
    assert await bb.redis.scard(tag_set) == 11
    await asyncio.sleep(0.4)
    await bb.write("other", 2)  # any later write sweeps due members of the expiry index
    assert await bb.redis.smembers(tag_set) == {"keep"}
    assert await bb.redis.zcard(bb.keyspace.expiry_key) == 0


async def test_expire_by_tag_never_extends_and_covers_the_group(bb: Blackboard) -> None:
    await bb.write("a:1", 1, tags={"group:g"})
    await bb.write("a:2", 2, tags={"group:g"}, ttl_seconds=0.5)
    await bb.write("b:1", 3)
    assert await bb.expire(["b:1"], 60, tag="group:g") == 2  # a:2 already expires sooner
    assert 0 < await bb.redis.pttl(bb.keyspace.entry_key("a:2")) <= 500
    assert await bb.redis.pttl(bb.keyspace.tag_key("group:g")) > 0
    assert await bb.expire(["b:1"], 3600) == 0  # never extends
    assert (await bb.read("b:1")).expires_at < time.time() + 61


async def test_gap_then_terminal_when_events_are_gone(colony, bb: Blackboard) -> None:
    _, runs = colony
    record = await runs.submit("echo", {"v": 1})
    assert await wait_status(runs, record.run_id) == "succeeded"
    board = runs.run_board(record)
    await bb.redis.xtrim(board.keyspace.events_key, maxlen=0)  # the run's events are gone
    started = time.monotonic()
    events = await collect(runs.events(record.run_id))
    assert [e["event_type"] for _, e in events] == [GAP, "completed"]
    assert events[-1][1]["data"]["output"] == {"v": 1}
    assert time.monotonic() - started < 5
    # resuming after the gap id ends the same way instead of waiting forever (by now the result
    # itself may have passed its retention: the terminal event then says the run failed)
    again = await collect(runs.events(record.run_id, events[0][0]))
    assert again[0][1]["event_type"] == GAP
    assert again[-1][1]["event_type"] in ("completed", "failed") and len(again) == 2


@pytest.mark.parametrize("bad", ["garbage", "$", "1-2-3", "", "99999999999999-0", "-1"])
async def test_bad_last_event_id_is_refused(colony, bad: str) -> None:
    _, runs = colony
    record = await runs.submit("echo", "x")
    assert await wait_status(runs, record.run_id) == "succeeded"
    with pytest.raises(InvalidArgument):
        await runs.check_event_id(record.run_id, bad)
    with pytest.raises(InvalidArgument):
        await collect(runs.events(record.run_id, bad))
    events = await collect(runs.events(record.run_id))
    await runs.check_event_id(record.run_id, events[0][0])  # a real id passes


def test_context_ring_keeps_positions() -> None:
    ring = ContextRing(3)
    ring.extend([{"n": i} for i in range(5)])
    assert len(ring) == 5 and ring.first == 2 and [c["n"] for c in ring] == [2, 3, 4]
    assert [c["n"] for c in ring[0:]] == [2, 3, 4] and [c["n"] for c in ring[4:]] == [4]
    assert ring[5:] == [] and ring[-1] == {"n": 4}
    with pytest.raises(IndexError):
        ring[1]
    assert [c["n"] for c in ring.pending()] == [2, 3, 4]
    ring.mark_persisted()
    ring.append({"n": 5})
    assert ring.pending() == [{"n": 5}]


async def test_agent_context_is_a_bounded_ring_persisted_by_appends(runtime) -> None:
    agent = await runtime.spawn(echo_blueprint(f"ctx{uuid.uuid4().hex[:6]}"))
    agent.context.extend({"note": i} for i in range(MAX_CONTEXT_ITEMS + 500))
    await agent.persist()
    ring_key = agent.blackboard.keyspace.ring_key(AgentStateProtocol.key("context"))
    assert await agent.blackboard.redis.llen(ring_key) == MAX_CONTEXT_ITEMS
    head = await agent.blackboard.read(AgentStateProtocol.key("context"))
    assert "context" not in head.value and head.value["context_total"] == MAX_CONTEXT_ITEMS + 500
    agent.context.append({"note": "new"})
    await agent.persist()
    await agent.persist()  # nothing new: nothing pushed
    assert await agent.blackboard.redis.llen(ring_key) == MAX_CONTEXT_ITEMS
    assert await agent.blackboard.redis.lindex(ring_key, -1) == '{"note":"new"}'
    assert await agent.blackboard.redis.lindex(ring_key, -2) == f'{{"note":{MAX_CONTEXT_ITEMS + 499}}}'
    restored = await Agent.restore(
        agent.agent_id, runtime.blackboard, tenant_id=runtime.tenant_id, colony_id=runtime.colony_id
    , settings=load_settings())
    assert len(restored.context) == MAX_CONTEXT_ITEMS + 501
    newest = restored.context[MAX_CONTEXT_ITEMS + 499 :]
    assert [c["note"] for c in newest] == [MAX_CONTEXT_ITEMS + 499, "new"]
    assert len(list(restored.context)) == MAX_CONTEXT_ITEMS


async def test_events_of_one_run_are_capped(bb: Blackboard, redis_url: str) -> None:
    settings = ColonySettings(  # the replica's settings reach its agents (not the process env)
        redis_url=redis_url,
        colony_id=f"cap{uuid.uuid4().hex[:8]}",
        runs={"retention_seconds": RETENTION, "max_events_per_run": 10},
    )
    host = ReplicaHost(settings, "replica-c", engine=ScriptedEngine([ANSWER] * 2))
    await host.start(bb)
    try:
        await host.ensure_agent(ask_blueprint("capped"))
        assert host.registry is not None
        runs = RunService(bb, host.registry, colony_id=settings.colony_id, settings=load_settings())
        record = await runs.submit("capped", {"question": "count to sixty"})
        assert await wait_status(runs, record.run_id) == "succeeded"
        kinds = [e["event_type"] for _, e in await collect(runs.events(record.run_id))]
        assert kinds[0] == "started" and kinds[-2:] == ["truncated", "completed"] and len(kinds) == 11
        assert (await runs.get(record.run_id)).output == ANSWER  # the answer itself is whole
    finally:
        await host.close()
