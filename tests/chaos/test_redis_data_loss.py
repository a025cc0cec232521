"""Agents survive a Redis that comes back having lost data (flushed, an AOF window lost, an older
value restored): the agent notices that its `agent:lifecycle` is gone or went back in time, logs
it, re-persists what it holds and serves the next run at once. A second live copy of the agent is
never written over.

Each test runs its own redis-server (it flushes and rewrites keys). Before the fix, every run after
the loss failed with `ConcurrentModificationError ... agent:lifecycle: expected version 3, found 0`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis
from agent_kit import counter_blueprint

from colony.agents import Agent, AgentHandle, AgentMetadata, AgentRun, LocalAgentRuntime
from colony.blackboard import Blackboard, create_redis
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, load_settings
from colony.errors import AgentStateConflict, ConcurrentModificationError

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]
AGENT = "worker"
PROMPTLY = 5.0  # seconds a run after the loss may take, all told


@dataclass
class Rig:
    board: Blackboard
    runtime: LocalAgentRuntime
    handle: AgentHandle
    raw: aioredis.Redis  # bytes in and out, for DUMP / RESTORE

    def agent(self) -> Agent:
        return self.runtime.get(AGENT)

    def entry_key(self, name: str) -> str:
        return self.runtime.agent_board(AGENT).keyspace.entry_key(Keys.key(name))

    def ring_key(self) -> str:
        return self.runtime.agent_board(AGENT).keyspace.ring_key(Keys.key("context"))

    async def run(self, value: int) -> AgentRun:
        started = time.monotonic()
        run = await self.handle.run(value, namespace="ns", timeout=PROMPTLY)
        assert time.monotonic() - started < PROMPTLY
        return run


@pytest.fixture
async def rig(private_redis: EmbeddedRedis) -> AsyncIterator[Rig]:
    info = private_redis.start()
    settings = BlackboardSettings(op_timeout_seconds=1.0, connect_timeout_seconds=0.5)
    client = create_redis(info.url, settings)
    board = Blackboard(client, "test:data-loss", settings=settings)
    runtime = LocalAgentRuntime(board, colony_id="loss", settings=load_settings())
    handle = AgentHandle(AGENT, owner=Agent(AgentMetadata(agent_id="p", colony_id="loss"), board))
    raw = aioredis.Redis.from_url(info.url)
    await runtime.spawn(counter_blueprint(AGENT, STEPS, serve_namespace="ns"))
    try:
        yield Rig(board, runtime, handle, raw)
    finally:
        await runtime.shutdown()
        await client.aclose()
        await raw.aclose()


def _succeeded(run: AgentRun, output: int) -> None:
    assert run.status.value == "succeeded", f"the run did not succeed: {run.error}"
    assert run.output == output


async def test_an_idle_agent_serves_the_next_run_after_redis_was_flushed(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    _succeeded(await rig.run(1), 1)
    agent = rig.agent()
    agent.context.extend([{"n": 1}, {"n": 2}])
    await agent.persist()
    await rig.board.redis.flushall()

    with caplog.at_level(logging.WARNING, logger="colony.agents.state.persistence"):
        _succeeded(await rig.run(10), 11)  # at once, and the counter went on where it was
        _succeeded(await rig.run(100), 111)
    lost = [r for r in caplog.records if "Redis lost its state" in r.getMessage()]
    assert len(lost) == 1, "the loss is logged once, at WARNING"
    assert lost[0].levelno == logging.WARNING

    # everything it holds is back: the lifecycle (with its mark), the context ring, the blueprint
    lifecycle = await agent.blackboard.read(Keys.key("lifecycle"))
    assert lifecycle is not None and lifecycle.value["state"] == "idle"
    assert lifecycle.value["holder"] == agent.holder
    stored = await agent.blackboard.ring(Keys.key("context"))
    assert stored == list(agent.context) and {"n": 1} in stored and {"n": 2} in stored
    await rig.runtime.drop(AGENT)
    restored = await rig.runtime.resume(AGENT)  # restorable again (blueprint and metadata re-persisted)
    assert restored.capabilities["CounterCapability"].get_state() == {"total": 111}
    _succeeded(await rig.run(1000), 1111)


@pytest.mark.parametrize("earlier_copy", [False, True], ids=["own-write", "earlier-copy-write"])
async def test_an_agent_serves_the_next_run_after_its_state_went_back_in_time(
    rig: Rig, earlier_copy: bool
) -> None:
    redis = rig.raw
    _succeeded(await rig.run(1), 1)
    agent = rig.agent()
    agent.context.append({"n": 1})
    await agent.persist()
    # what an AOF replay that lost the last writes brings back: these keys as they are now
    names = ("lifecycle", "context", "current_run")
    snapshot = {n: await redis.dump(rig.entry_key(n)) for n in names}
    ring = await redis.dump(rig.ring_key())
    old_version = (await agent.blackboard.read(Keys.key("lifecycle"))).version
    if earlier_copy:  # the agent moved (a new copy restored it) after that snapshot was written
        await rig.runtime.drop(AGENT)
        await rig.runtime.resume(AGENT)
        agent = rig.agent()
    _succeeded(await rig.run(10), 11)
    agent.context.append({"n": 2})
    await agent.persist()
    held = agent.stored.version
    for name, dumped in snapshot.items():
        await redis.restore(rig.entry_key(name), 0, dumped, replace=True)
    await redis.restore(rig.ring_key(), 0, ring, replace=True)
    assert (await agent.blackboard.read(Keys.key("lifecycle"))).version == old_version < held

    _succeeded(await rig.run(100), 111)  # the first run after the rollback already succeeds
    lifecycle = await agent.blackboard.read(Keys.key("lifecycle"))
    assert lifecycle.value["holder"] == agent.holder and lifecycle.value["state"] == "idle"
    # the context entries the rollback lost are pushed again, each once
    stored = await agent.blackboard.ring(Keys.key("context"))
    assert stored == list(agent.context) and stored.count({"n": 1}) == stored.count({"n": 2}) == 1


async def test_a_copy_placed_after_the_loss_is_never_written_over(rig: Rig) -> None:
    """Redis lost the agent's keys and another runtime spawned the agent again before this copy
    noticed: two live copies. The first one yields: it writes nothing over the second's state."""
    _succeeded(await rig.run(1), 1)
    first = rig.agent()
    held = first.stored.version
    await rig.board.redis.flushall()
    other = LocalAgentRuntime(rig.board, colony_id="loss", settings=load_settings())
    try:
        second = await other.spawn(counter_blueprint(AGENT, STEPS, serve_namespace="ns"))
        board = second.blackboard
        before = {n: await board.read(n) for n in (Keys.key("lifecycle"), Keys.key("blueprint"))}

        with pytest.raises(AgentStateConflict, match="another live copy"):
            await first.persist()  # its counter (total 1) would overwrite the second's (0)
        with pytest.raises(AgentStateConflict, match="another live copy"):
            await first.stored.reload()
        first_runs = [await rig.handle.submit(i, namespace="ns") for i in range(4)]

        async def ended(request_id: str) -> AgentRun:
            while (run := await rig.handle.result(request_id, namespace="ns")) is None:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            return run

        outcomes = [await asyncio.wait_for(ended(r), PROMPTLY) for r in first_runs]
        for run in outcomes:  # each served by the second copy, or refused by the first: never stuck
            assert run.status.value in ("succeeded", "failed")
            if run.status.value == "failed":
                assert "another live copy" in (run.error or "")

        lifecycle = await board.read(Keys.key("lifecycle"))
        assert lifecycle.value["holder"] == second.holder  # the first copy never wrote it
        assert (await board.read(Keys.key("blueprint"))).version == before[Keys.key("blueprint")].version
        counter = await board.read(Keys.capability_state_key("CounterCapability"))
        assert counter.value["state"] == second.capabilities["CounterCapability"].get_state()
        assert first.stored.version == held  # it took nothing from the other copy either

        await rig.runtime.drop(AGENT)  # the yielded copy goes; the second serves every run
        total = second.capabilities["CounterCapability"].get_state()["total"]
        _succeeded(await rig.run(5), total + 5)
    finally:
        await other.shutdown()


async def test_a_spawn_after_the_agent_re_persisted_itself_writes_nothing(rig: Rig) -> None:
    """The other order: the live copy noticed the loss first; a later spawn of the same id (a
    placement that found no record after the loss) is refused and writes nothing."""
    _succeeded(await rig.run(1), 1)
    await rig.board.redis.flushall()
    _succeeded(await rig.run(10), 11)  # re-persisted
    board = rig.agent().blackboard
    names = ("blueprint", "metadata", "lifecycle")
    before = {n: (await board.read(Keys.key(n))).version for n in names}

    other = LocalAgentRuntime(rig.board, colony_id="loss", settings=load_settings())
    try:
        with pytest.raises(ConcurrentModificationError):
            await other.spawn(counter_blueprint(AGENT, STEPS, serve_namespace="ns"))
        assert {n: (await board.read(Keys.key(n))).version for n in names} == before
        _succeeded(await rig.run(100), 111)
    finally:
        await other.shutdown()


@pytest.mark.parametrize(
    "garbage",
    ["not a dict", {"state": 7, "since": "later", "holder": "x" * 10_000}, {"since": float("inf")}],
    ids=["string", "wrong-types", "no-state"],
)
async def test_a_lifecycle_left_unreadable_by_the_loss_is_taken_back(rig: Rig, garbage: object) -> None:
    """What Redis holds is untrusted: an older value no live copy would write counts as lost."""
    _succeeded(await rig.run(1), 1)
    await rig.board.redis.flushall()
    await rig.agent().blackboard.write(Keys.key("lifecycle"), garbage)  # version 1, held 3
    _succeeded(await rig.run(10), 11)
    lifecycle = await rig.agent().blackboard.read(Keys.key("lifecycle"))
    assert lifecycle.value["holder"] == rig.agent().holder and lifecycle.value["state"] == "idle"


async def test_a_host_drops_its_copy_once_another_live_copy_serves_the_agent(
    private_redis: EmbeddedRedis,
) -> None:
    """Two replicas, Redis flushed, the agent placed again on the other replica (a second copy):
    the first copy yields, and its replica's heartbeat drops it, so it stops claiming the agent's
    runs (which it could only refuse) and every later run is served by the copy that holds it."""
    import uuid

    from colony.config import ColonySettings, ServeSettings
    from colony.inference.scripted import ScriptedEngine
    from colony.system.host import ReplicaHost

    info = private_redis.start()
    settings = ColonySettings(
        redis_url=info.url,
        colony_id=f"dl{uuid.uuid4().hex[:6]}",
        serve=ServeSettings(heartbeat_seconds=0.2),
    )
    client = create_redis(info.url, settings.blackboard)
    board = Blackboard(client, "test:data-loss", settings=settings.blackboard)
    hosts = {n: ReplicaHost(settings, n, engine=ScriptedEngine(lambda r: "x")) for n in ("ra", "rb")}
    for host in hosts.values():
        await host.start(board)
    try:
        blueprint = counter_blueprint(AGENT, STEPS, serve_namespace="ns")
        await hosts["ra"].ensure_agent(blueprint)
        first = hosts["ra"].runtime.get(AGENT)  # type: ignore[union-attr]
        await client.flushall()
        await hosts["rb"].ensure_agent(blueprint)  # the agent is unknown now: a second copy
        with pytest.raises(AgentStateConflict):
            await first.persist()
        assert first.stored.yielded

        async def dropped() -> None:
            while AGENT in hosts["ra"].runtime.agent_ids:  # type: ignore[union-attr]  # noqa: ASYNC110
                await asyncio.sleep(0.05)

        await asyncio.wait_for(dropped(), 5)
        handle = AgentHandle(
            AGENT, owner=Agent(AgentMetadata(agent_id="p", colony_id=settings.colony_id), board)
        )
        for value in (1, 2, 3):
            run = await handle.run(value, namespace="ns", timeout=PROMPTLY)
            assert run.status.value == "succeeded", run.error
        assert AGENT in hosts["rb"].runtime.agent_ids  # type: ignore[union-attr]
    finally:
        for host in hosts.values():
            await host.close()
        await client.aclose()
