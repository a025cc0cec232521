"""The resource monitor's replica liveness in an upgrade (issue 14 item 7): a draining or another
cluster's replica keeps its agents, a dead one's move, and so when the Ray actor table cannot tell
(by heartbeat); the Serve directory's cheap liveness lookup; a missing agent re-placed after the
grace, a slow suspension not taken for one. The cluster rehearsal is tests/test_upgrade_rehearsal.py.

In-process: real Redis, real ReplicaHosts with the scripted engine, the directory a stand-in for
Serve's (only `answering` replicas take calls; `liveness` raises or answers as told)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agent_kit import counter_blueprint

from colony.agents import ResumptionCondition, ResumptionKind
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.inference.scripted import ScriptedEngine
from colony.serve.replicas import ServeReplicas
from colony.system.host import ReplicaHost
from colony.system.monitor import ResumptionMonitor
from colony.system.replicas import GoneReplica, ReplicaPort

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]


class Directory:
    """Serve as the monitor sees it: a replica not `answering` refuses calls (draining, another
    cluster's, or dead); `liveness` fails like an unreadable actor table, or answers `states`."""

    def __init__(
        self, hosts: dict[str, ReplicaHost], answering: set[str], states: dict[str, str] | None
    ) -> None:
        self.hosts, self.answering, self.states = hosts, answering, states
        self.asked = 0

    async def ports(self) -> list[ReplicaPort]:
        return [self.hosts[name] for name in sorted(self.answering)]

    def port(self, replica_id: str) -> ReplicaPort:
        return self.hosts[replica_id] if replica_id in self.answering else GoneReplica(replica_id)

    async def liveness(self, replica_ids: list[str]) -> dict[str, str]:
        self.asked += 1
        if self.states is None:
            raise ConnectionError("GCS unreachable")
        return {r: self.states.get(r, "unknown") for r in replica_ids}


@pytest.fixture
async def hosts(bb: Blackboard, redis_url: str) -> AsyncIterator[dict[str, ReplicaHost]]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"live{uuid.uuid4().hex[:8]}")
    hosts = {name: ReplicaHost(settings, name, engine=ScriptedEngine()) for name in ("old", "new")}
    for host in hosts.values():
        await host.start(bb)
    yield hosts
    for host in hosts.values():
        await host.close()


def _monitor(bb: Blackboard, hosts: dict[str, ReplicaHost], directory: Any) -> ResumptionMonitor:
    colony_id = hosts["old"].settings.colony_id
    return ResumptionMonitor(bb, directory, hosts["old"].registry, period=0.1, colony_id=colony_id)


def _where(hosts: dict[str, ReplicaHost], agent_id: str) -> list[str]:
    return [name for name, host in hosts.items() if agent_id in host.runtime.agent_ids]


async def _beat(host: ReplicaHost, ttl: float) -> None:
    await host.registry.beat(host.replica_id, host.info(), ttl)


async def test_a_draining_or_other_clusters_replica_keeps_its_agents_a_dead_ones_move(
    bb: Blackboard, hosts: dict[str, ReplicaHost]
) -> None:
    """The in-place upgrade's race: a replica Serve is stopping no longer takes calls, but its
    agents run until its process exits; moving them then made two copies race, and the one on the
    draining replica could win and die with it (runs stuck for ever). Only a dead one is left."""
    await hosts["old"].ensure_agent(counter_blueprint("w", STEPS))
    states = {"old": "alive"}
    monitor = _monitor(bb, hosts, Directory(hosts, {"new"}, states))
    assert await monitor.tick() == []  # draining: its process lives
    states["old"] = "elsewhere"  # another Ray cluster's replica, heartbeating
    assert await monitor.tick() == []
    assert (await hosts["old"].registry.get("w")).replica == "old"
    states["old"] = "dead"
    assert await monitor.tick() == ["w"]
    assert (await hosts["old"].registry.get("w")).replica == "new"
    assert "w" in hosts["new"].runtime.agent_ids


async def test_an_agent_no_replica_hosts_is_replaced_after_the_grace(
    bb: Blackboard, hosts: dict[str, ReplicaHost]
) -> None:
    """A copy that yielded to another copy, which then ended with its replica, leaves the
    registry naming a live replica that does not host the agent: re-placed after the grace.
    One whose lifecycle says it left (suspended; its registry write lost) is not."""
    for agent_id in ("gone", "asleep"):
        await hosts["old"].ensure_agent(counter_blueprint(agent_id, STEPS))
    await hosts["old"].runtime.drop("gone")  # no write: the record still names "old"
    registry = hosts["old"].registry
    record = await registry.get("asleep")
    await hosts["old"].runtime.suspend("asleep", "request", ResumptionCondition(kind=ResumptionKind.CUSTOM))
    await registry.put(record)  # the suspension's registry write was lost: still "running" on old
    monitor = _monitor(bb, hosts, Directory(hosts, {"old", "new"}, {}))
    monitor.missing_grace = 0.5
    assert await monitor.tick() == []  # not yet: a record may lag a heartbeat behind
    await asyncio.sleep(0.6)
    assert await monitor.tick() == ["gone"]
    where = [name for name, host in hosts.items() if "gone" in host.runtime.agent_ids]
    assert len(where) == 1 and (await registry.get("gone")).replica == where[0]
    assert not any("asleep" in host.runtime.agent_ids for host in hosts.values())


@pytest.mark.parametrize("states", [None, {}], ids=["lookup-raises", "lookup-unknown"])
async def test_unreadable_actor_table_keeps_a_heartbeating_replicas_agents(
    bb: Blackboard, hosts: dict[str, ReplicaHost], states: dict[str, str] | None, caplog: Any
) -> None:
    """The actor table cannot be read and the old replica does not answer (Serve drains it): a
    probe would say ReplicaUnavailable and its agents were moved while they still ran (two copies,
    AgentStateConflict). Its heartbeat is fresh: they stay. Once it expires, they move. The
    fallback is logged once, not every round."""
    await hosts["old"].ensure_agent(counter_blueprint("w", STEPS))
    await _beat(hosts["old"], 30)
    directory = Directory(hosts, {"new"}, states)
    monitor = _monitor(bb, hosts, directory)
    with caplog.at_level("WARNING", logger="colony.system.monitor"):
        for _ in range(3):
            assert await monitor.tick() == []
    assert directory.asked == 3
    assert _where(hosts, "w") == ["old"] and (await hosts["old"].registry.get("w")).replica == "old"
    fallbacks = [r for r in caplog.records if "deciding by heartbeat" in r.getMessage()]
    assert len(fallbacks) == 1 and fallbacks[0].levelname == "WARNING"

    hosts["old"]._heartbeat.cancel()  # the replica's process is gone: its heartbeat stops
    await hosts["old"].runtime.drop("w")
    await _beat(hosts["old"], 0.2)
    await asyncio.sleep(0.4)
    assert await monitor.tick() == ["w"]
    assert _where(hosts, "w") == ["new"] and (await hosts["old"].registry.get("w")).replica == "new"


async def test_slow_suspension_is_not_taken_for_a_missing_agent(
    bb: Blackboard, hosts: dict[str, ReplicaHost]
) -> None:
    """A suspension still persisting when the missing grace ends (its replica detached the
    agent, so no snapshot lists it, and the registry still places it there) is not a lost agent:
    re-placing it started a second copy beside the suspending one."""
    await hosts["old"].ensure_agent(counter_blueprint("w", STEPS))
    agent = hosts["old"].runtime.get("w")
    real_persist = agent.persist

    async def slow_persist(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(1.0)
        return await real_persist(*args, **kwargs)

    agent.persist = slow_persist  # type: ignore[method-assign]
    monitor = _monitor(bb, hosts, Directory(hosts, {"old", "new"}, {"old": "alive", "new": "alive"}))
    monitor.missing_grace = 0.3
    suspending = asyncio.create_task(hosts["old"].suspend_agent("w", "request"))
    await asyncio.sleep(0.05)
    assert await monitor.tick() == []
    await asyncio.sleep(0.4)  # past the grace, the suspension not done
    assert await monitor.tick() == []
    await suspending
    assert await monitor.tick() == []
    assert _where(hosts, "w") == []
    assert (await hosts["old"].registry.get("w")).state == "suspended"


async def test_a_suspension_that_never_ends_is_replaced_after_the_longer_grace(
    bb: Blackboard, hosts: dict[str, ReplicaHost]
) -> None:
    """A suspension that failed half-way (detached, recorded, never SUSPENDED) is not waited on
    for ever: the agent is re-placed once the suspending grace is over."""
    await hosts["old"].ensure_agent(counter_blueprint("w", STEPS))
    agent = hosts["old"].runtime.get("w")

    async def failing_persist(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("redis went away mid-persist")

    agent.persist = failing_persist  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await hosts["old"].suspend_agent("w", "request")
    monitor = _monitor(bb, hosts, Directory(hosts, {"old", "new"}, {"old": "alive", "new": "alive"}))
    monitor.missing_grace = 0.1
    assert await monitor.tick() == []
    await asyncio.sleep(0.3)  # past the missing grace, within the suspending one
    assert await monitor.tick() == []
    await asyncio.sleep(0.4)  # past SUSPENDING_GRACE_FACTOR (6) graces
    assert await monitor.tick() == ["w"]
    assert len(_where(hosts, "w")) == 1


class CountingServeReplicas(ServeReplicas):
    """ServeReplicas with the GCS's answers given (`alive`: ALIVE actors; `table`: every actor),
    counting the whole-table reads, the costly ones."""

    def __init__(self, registry: Any, alive: dict[str, str], table: dict[str, str]) -> None:
        super().__init__(handle=None, registry=registry)  # type: ignore[arg-type]
        self.alive, self.table, self.full_reads = alive, table, 0

    def _replica_actors(self, state: str | None = None) -> dict[str, str]:
        if state is None:
            self.full_reads += 1
            return dict(self.table)
        return {r: s for r, s in self.alive.items() if s == state}


async def test_serve_liveness_reads_the_whole_table_only_for_heartbeating_replicas_not_alive(
    hosts: dict[str, ReplicaHost],
) -> None:
    """ALIVE actors first: alive is alive, no actor alive and no heartbeat is dead, and only a
    heartbeating replica with no ALIVE actor costs a whole-table read: a killed one is dead at
    once (not after its heartbeat expires), for good; another cluster's is "elsewhere", re-read
    only after RECHECK_SECONDS."""
    registry = hosts["old"].registry
    for name in ("killed", "other"):
        await registry.beat(name, {"replica_id": name}, 30)
    alive = {"old": "ALIVE", "new": "ALIVE"}
    table = {"old": "ALIVE", "new": "ALIVE", "killed": "DEAD", "ancient": "DEAD"}
    serve = CountingServeReplicas(registry, alive, table)
    assert await serve.liveness(["old", "new", "ancient"]) == {
        "old": "alive",
        "new": "alive",
        "ancient": "dead",
    }
    assert serve.full_reads == 0
    answer = await serve.liveness(["old", "killed", "other"])
    assert answer == {"old": "alive", "killed": "dead", "other": "elsewhere"} and serve.full_reads == 1
    for _ in range(5):  # a NewCluster overlap asks every round
        assert await serve.liveness(["killed", "other"]) == {"killed": "dead", "other": "elsewhere"}
    assert serve.full_reads == 1
    serve._recent["other"] = ("elsewhere", 0.0)  # RECHECK_SECONDS over
    assert await serve.liveness(["other"]) == {"other": "elsewhere"} and serve.full_reads == 2

    def unreadable(state: str | None = None) -> dict[str, str]:
        raise ConnectionError("GCS unreachable")

    serve._replica_actors = unreadable  # type: ignore[method-assign]
    assert await serve.liveness(["old", "killed"]) == {"old": "unknown", "killed": "dead"}
