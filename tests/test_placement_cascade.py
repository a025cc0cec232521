"""The ResourceExhausted cascade, each step exercised: hard affinity, soft affinity, retry later,
suspend a lower-priority agent."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from colony.agents import AgentBlueprint, AgentMetadata, ResourceRequirements
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.errors import ResourceExhausted
from colony.inference import Page
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.placement import AgentPlacer


def bp(
    agent_id: str,
    *,
    priority: int = 0,
    required: list[str] | None = None,
    preferred: list[str] | None = None,
    memory_mb: int = 256,
) -> AgentBlueprint:
    base = echo_blueprint(agent_id)
    return base.model_copy(
        update={
            "metadata": AgentMetadata(agent_id=agent_id, priority=priority, role="echo"),
            "resources": ResourceRequirements(
                required_pages=required or [], preferred_pages=preferred or [], memory_mb=memory_mb
            ),
        }
    )


@pytest.fixture
async def hosts(bb: Blackboard, redis_url: str) -> AsyncIterator[dict[str, ReplicaHost]]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"place{uuid.uuid4().hex[:8]}")
    made = {name: ReplicaHost(settings, name, engine=ScriptedEngine()) for name in ("ra", "rb")}
    for host in made.values():
        await host.start(bb)
    yield made
    for host in made.values():
        await host.close()


async def test_hard_then_soft_affinity(hosts: dict[str, ReplicaHost]) -> None:
    await hosts["rb"].engine.load_page(Page(page_id="p1", text="page one"))
    placer = AgentPlacer(hosts, max_agents_per_replica=2)
    hard = await placer.place(bp("worker-1", required=["p1"]))
    assert (hard.step, hard.replica_id) == ("hard", "rb")
    soft = await placer.place(bp("worker-2", required=["p-nowhere"]))
    assert soft.step == "soft" and soft.replica_id == "ra"  # no holder: least loaded replica
    assert "worker-2" in hosts["ra"].runtime.agent_ids


async def test_retry_later_when_everything_is_full(hosts: dict[str, ReplicaHost]) -> None:
    placer = AgentPlacer(hosts, max_agents_per_replica=1, retry_seconds=3)
    await placer.place(bp("a1"))
    await placer.place(bp("a2"))

    async def free_room() -> None:
        await asyncio.sleep(0.3)
        await hosts["ra"].runtime.stop("a1")  # room appears on ra

    freeing = asyncio.create_task(free_room())
    placed = await placer.place(bp("a3"))
    await freeing
    assert placed.step == "retry" and placed.replica_id == "ra" and placed.waited_seconds >= 0.25


async def test_suspend_lowest_priority_longest_idle(hosts: dict[str, ReplicaHost], bb: Blackboard) -> None:
    placer = AgentPlacer(hosts, max_agents_per_replica=1, retry_seconds=0.2)
    await placer.place(bp("low-old", priority=1))
    await placer.place(bp("low-new", priority=1))
    await hosts["rb"].runtime.get("low-new").run("recent work")  # low-old has been idle longer
    placed = await placer.place(bp("vip", priority=5))
    assert placed.step == "suspend" and placed.suspended == ["low-old"]
    assert placed.replica_id == "ra" and "vip" in hosts["ra"].runtime.agent_ids
    lifecycle = await bb.scoped(hosts["ra"].runtime.agent_board("low-old").scope_id).read("agent:lifecycle")
    assert lifecycle.value["state"] == "suspended"
    with pytest.raises(ResourceExhausted, match="lower priority"):
        await placer.place(bp("nobody-to-evict", priority=0))


async def test_replica_memory_is_a_capacity_too(hosts: dict[str, ReplicaHost]) -> None:
    placer = AgentPlacer(hosts, max_agents_per_replica=10, memory_per_replica_mb=1000, retry_seconds=0.2)
    first = await placer.place(bp("big-1", memory_mb=700))
    second = await placer.place(bp("big-2", memory_mb=700))
    assert first.replica_id != second.replica_id  # 1400 MB do not fit one replica
    small = await placer.place(bp("small", memory_mb=300))
    assert small.step == "soft"
    # 700 MB more fit nowhere: two low-priority agents must make room on one replica
    vip = await placer.place(bp("vip", priority=5, memory_mb=700))
    assert vip.step == "suspend" and vip.suspended
    with pytest.raises(ResourceExhausted, match=r"serve\.replica_memory_mb=1000"):
        await placer.place(bp("huge", memory_mb=2000))
