"""The control plane over spoilt records and replicas that die at the wrong moment (found by a
hostile review): a record, an agent's metadata or lifecycle, or a heartbeat that a writer of Redis
spoilt stops nothing but itself; an agent stopped or suspended on a replica that died before its
registry write stays so; a live replica whose heartbeat lapsed is not given a second copy of its
agent; a one-shot worker whose stop failed half-way is stopped all the same, so its parent resumes.
Real redis-server, ReplicaHosts with the scripted engine."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agent_kit import counter_blueprint

from colony.agents import ResumptionCondition, ResumptionKind
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentRegistryProtocol as Keys
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import ColonySettings, ServeSettings
from colony.errors import BlackboardUnavailable
from colony.inference.scripted import ScriptedEngine
from colony.serve.replicas import ServeReplicas
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.monitor import ResumptionMonitor
from colony.system.registry import AgentRecord, AgentRegistry

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]


def settings_of(redis_url: str, **serve: Any) -> ColonySettings:
    extra = {"serve": ServeSettings(**serve)} if serve else {}
    return ColonySettings(redis_url=redis_url, colony_id=f"mh{uuid.uuid4().hex[:8]}", **extra)


@pytest.fixture
async def hosts(bb: Blackboard, redis_url: str) -> AsyncIterator[dict[str, ReplicaHost]]:
    settings = settings_of(redis_url)
    made = {name: ReplicaHost(settings, name, engine=ScriptedEngine()) for name in ("ra", "rb")}
    for host in made.values():
        await host.start(bb)
    yield made
    for host in list(made.values()):
        await host.close()


def monitor_of(bb: Blackboard, hosts: dict[str, ReplicaHost], **options: Any) -> ResumptionMonitor:
    first = next(iter(hosts.values()))
    assert first.registry is not None
    return ResumptionMonitor(
        bb,
        hosts,
        first.registry,
        max_agents_per_replica=4,
        period=0.1,
        colony_id=first.settings.colony_id,
        **options,
    )


def where(hosts: dict[str, ReplicaHost], agent_id: str) -> list[str]:
    return [name for name, host in hosts.items() if host.runtime and agent_id in host.runtime.agent_ids]


async def suspended_until_a_round(host: ReplicaHost) -> None:
    """An agent suspended IMMEDIATE: the next round that runs resumes it."""
    assert host.runtime is not None
    await host.ensure_agent(counter_blueprint("victim", STEPS))
    await host.runtime.suspend("victim", "x", ResumptionCondition(kind=ResumptionKind.IMMEDIATE))


async def state_after_rounds(bb: Blackboard, hosts: dict[str, ReplicaHost], **options: Any) -> str:
    monitor = monitor_of(bb, hosts, **options)
    for _ in range(3):
        await monitor.tick()
    record = await next(iter(hosts.values())).registry.get("victim")  # type: ignore[union-attr]
    assert record is not None
    return record.state


@pytest.mark.parametrize("value", ["garbage", {"agent_id": 5}, {"state": "idle"}, ["a"]])
async def test_a_spoilt_registry_record_stops_no_round(bb: Blackboard, hosts: Any, value: Any) -> None:
    ra = hosts["ra"]
    await suspended_until_a_round(ra)
    tags = {Keys.index_tag("agent"), Keys.state_tag("idle"), Keys.replica_tag("ra")}
    await ra.registry.board.write(Keys.agent_key("evil"), value, tags=tags)
    assert await state_after_rounds(bb, hosts) != "suspended"
    assert await ra.registry.get("evil") is None  # read as no record


async def test_an_orphans_spoilt_metadata_or_lifecycle_stops_no_round(bb: Blackboard, hosts: Any) -> None:
    ra, rb = hosts["ra"], hosts["rb"]
    await suspended_until_a_round(rb)
    await ra.ensure_agent(counter_blueprint("orphan", STEPS))
    await ra.runtime.agent_board("orphan").write(AgentStateProtocol.key("metadata"), {"priority": "x"})
    await rb.registry.put(AgentRecord(agent_id="ghost", state="idle", replica="rb"))  # rb hosts no ghost
    await rb.runtime.agent_board("ghost").write(AgentStateProtocol.key("lifecycle"), ["not", "a", "dict"])
    await hosts.pop("ra").close()
    assert await state_after_rounds(bb, hosts, missing_grace=0.0) != "suspended"


async def test_agents_stopped_or_suspended_on_a_replica_that_died_stay_so(bb: Blackboard, hosts: Any) -> None:
    """The replica died between the lifecycle's write and the registry's."""
    ra, rb = hosts["ra"], hosts["rb"]

    async def lost(*_: Any) -> None:  # the process dies before its registry write
        return None

    await ra.ensure_agent(counter_blueprint("stopped", STEPS))
    await ra.runtime.get("stopped").run(7)
    await ra.ensure_agent(counter_blueprint("held", STEPS))
    ra.runtime.on_stopped, ra.runtime.on_suspended = lost, lost
    await ra.runtime.stop("stopped")
    await ra.runtime.suspend("held", "request", ResumptionCondition(kind=ResumptionKind.CUSTOM))
    assert (await rb.registry.get("stopped")).replica == "ra"  # the registry still places them on ra
    await hosts.pop("ra").close()
    assert await monitor_of(bb, hosts).tick() == []
    assert where(hosts, "stopped") == [] and where(hosts, "held") == []
    healed = {a: await rb.registry.get(a) for a in ("stopped", "held")}
    assert healed["stopped"].state == "stopped" and healed["held"].state == "suspended"
    assert healed["stopped"].replica is None and healed["held"].replica is None


@pytest.mark.parametrize("value", [{"engine": "x"}, "garbage", {"replica_id": ["a"]}, {"replica_id": "a b"}])
async def test_a_spoilt_heartbeat_is_no_replica(bb: Blackboard, redis_url: str, value: Any) -> None:
    settings = settings_of(redis_url)
    where_ = {"tenant_id": settings.tenant_id, "colony_id": settings.colony_id}
    board = bb.scoped(scope_id(BlackboardScope.COLONY, **where_))
    registry = AgentRegistry(board, settings=settings)
    await registry.beat("good", {"replica_id": "good"}, 30)
    await board.write(Keys.replica_key("evil"), value, tags={Keys.index_tag("replica")}, ttl_seconds=30)
    directory = ServeReplicas(handle=None, registry=registry)  # ports() reads only the registry
    assert [p.replica_id for p in await directory.ports()] == ["good"]


class BeatDirectory:
    """As ServeReplicas: live ports are the replicas with a heartbeat, any running replica is
    reached, and the actor table says the ones that run are alive."""

    def __init__(self, hosts: dict[str, ReplicaHost], registry: AgentRegistry) -> None:
        self.hosts, self.registry = hosts, registry

    async def ports(self) -> list[ReplicaHost]:
        ids = sorted({b["replica_id"] for b in await self.registry.replicas()})
        return [self.hosts[i] for i in ids if i in self.hosts]

    def port(self, replica_id: str) -> ReplicaHost:
        return self.hosts[replica_id]

    async def liveness(self, ids: list[str]) -> dict[str, str]:
        return {i: "alive" for i in ids if i in self.hosts}


async def test_a_live_replica_whose_heartbeat_lapsed_gets_no_second_copy(
    bb: Blackboard, redis_url: str
) -> None:
    settings = settings_of(
        redis_url, monitor_period_seconds=0.1, heartbeat_seconds=30, max_agents_per_replica=8
    )
    hosts = {n: ReplicaHost(settings, n, engine=ScriptedEngine()) for n in ("ra", "rb")}
    for host in hosts.values():
        await host.start(bb)
    try:
        control = ControlPlane(bb, BeatDirectory(hosts, hosts["ra"].registry), settings)
        blueprint = counter_blueprint("dup", STEPS)
        first = (await control.place(blueprint)).replica_id
        await hosts[first].registry.board.delete(Keys.replica_key(first))  # alive, its beat lapsed
        assert await control.monitor.tick() == []
        again = await control.place(blueprint)  # e.g. the built-ins ensured after a restart
        assert where(hosts, "dup") == [first] and again.replica == first
    finally:
        for host in hosts.values():
            await host.close()


async def test_a_workers_stop_that_failed_half_way_is_finished_and_its_parent_resumes(
    bb: Blackboard, hosts: Any
) -> None:
    ra = hosts["ra"]
    await ra.ensure_agent(counter_blueprint("child", STEPS))
    await ra.runtime.get("child").run(1)  # its one job: answered
    await ra.ensure_agent(counter_blueprint("parent", STEPS))
    waits = ResumptionCondition(kind=ResumptionKind.CHILDREN_COMPLETED, agent_ids=["child"])
    await ra.runtime.suspend("parent", "x", waits)
    child = ra.runtime.get("child")
    original = child.transition

    async def blip(*args: Any, **kwargs: Any) -> Any:  # one Redis blip during the stop
        child.transition = original
        raise BlackboardUnavailable("connection reset")

    child.transition = blip
    ra.runtime.retire("child")
    await asyncio.sleep(1.0)
    monitor = monitor_of(bb, hosts, missing_grace=0.0)
    for _ in range(3):
        await monitor.tick()
    assert (await ra.registry.get("child")).state == "stopped" and where(hosts, "child") == []
    assert (await ra.registry.get("parent")).state != "suspended"
