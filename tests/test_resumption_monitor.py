"""Every ResumptionCondition kind: an agent is suspended, stays suspended while the condition is
unmet, and is resumed with the same id and its restored state once it holds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from agent_kit import counter_blueprint

from colony.agents import ResumptionCondition, ResumptionKind
from colony.blackboard import Blackboard
from colony.config import ColonySettings, load_settings
from colony.inference.scripted import ScriptedEngine
from colony.system.host import ReplicaHost
from colony.system.monitor import ResumptionMonitor
from colony.system.registry import AgentRecord
from colony.vcm import PageSource, PageTable

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]


@pytest.fixture
async def cluster(
    bb: Blackboard, redis_url: str
) -> AsyncIterator[tuple[dict[str, ReplicaHost], ResumptionMonitor]]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"mon{uuid.uuid4().hex[:8]}")
    hosts = {name: ReplicaHost(settings, name, engine=ScriptedEngine()) for name in ("ra", "rb")}
    for host in hosts.values():
        await host.start(bb)
    table = PageTable(bb, colony_id=settings.colony_id, settings=load_settings())
    monitor = ResumptionMonitor(
        bb,
        hosts,
        hosts["ra"].registry,
        page_table=table,
        max_agents_per_replica=2,
        period=0.1,
        colony_id=settings.colony_id,
    )
    yield hosts, monitor
    for host in hosts.values():
        await host.close()


async def start_worker(host: ReplicaHost, agent_id: str) -> None:
    await host.ensure_agent(counter_blueprint(agent_id, STEPS))
    await host.runtime.get(agent_id).run(7)  # state to keep: the counter's total is 7


async def assert_resumed_intact(hosts: dict[str, ReplicaHost], agent_id: str) -> str:
    where = [name for name, host in hosts.items() if agent_id in host.runtime.agent_ids]
    assert len(where) == 1
    agent = hosts[where[0]].runtime.get(agent_id)
    assert agent.agent_id == agent_id and agent.get_capability("CounterCapability").total == 7
    record = await hosts["ra"].registry.get(agent_id)
    assert record.state != "suspended" and record.replica == where[0]
    return where[0]


async def test_immediate_and_custom(cluster) -> None:
    hosts, monitor = cluster
    await start_worker(hosts["ra"], "now")
    await start_worker(hosts["ra"], "later")
    await hosts["ra"].runtime.suspend("now")  # no condition given: IMMEDIATE
    await hosts["ra"].runtime.suspend("later", "request", ResumptionCondition(kind=ResumptionKind.CUSTOM))
    assert (await hosts["ra"].registry.get("later")).state == "suspended"
    assert await monitor.tick() == ["now"]
    await assert_resumed_intact(hosts, "now")
    assert await monitor.tick() == []
    monitor.request_resume("later")  # POST /v1/agents/{id}/resume
    assert await monitor.tick() == ["later"]
    await assert_resumed_intact(hosts, "later")


async def test_children_completed_from_a_blocked_action(cluster) -> None:
    hosts, monitor = cluster
    registry = hosts["ra"].registry
    for child in ("c1", "c2"):
        await registry.put(AgentRecord(agent_id=child, state="running"))
    steps = [{"action": "wait_for_children", "parameters": {"ids": ["c1", "c2"]}}]
    await hosts["rb"].ensure_agent(counter_blueprint("parent", steps))
    await hosts["rb"].runtime.start_run("parent", None)
    async with asyncio.timeout(5):
        while (await registry.get("parent")).state != "suspended":  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert await monitor.tick() == []
    await registry.set_state("c1", "stopped")
    assert await monitor.tick() == []  # c2 still running
    await registry.set_state("c2", "failed")
    assert await monitor.tick() == ["parent"]
    assert "parent" in hosts["ra"].runtime.agent_ids or "parent" in hosts["rb"].runtime.agent_ids


async def test_resource_available(cluster) -> None:
    hosts, monitor = cluster
    for host, names in ((hosts["ra"], ("a1", "a2")), (hosts["rb"], ("b1", "b2"))):
        for name in names:
            await start_worker(host, name)
    await hosts["ra"].runtime.suspend(
        "a2", "make_room", ResumptionCondition(kind=ResumptionKind.RESOURCE_AVAILABLE)
    )
    await start_worker(hosts["ra"], "a3")  # the room is taken again: every replica is full
    assert await monitor.tick() == []
    await hosts["rb"].stop_agent("b1")
    assert await monitor.tick() == ["a2"]
    assert await assert_resumed_intact(hosts, "a2") == "rb"


async def test_pages_available_resumes_where_the_pages_are(cluster, bb: Blackboard, tmp_path) -> None:
    hosts, monitor = cluster
    (tmp_path / "doc.md").write_text("# Doc\n" + "words " * 300)
    table = monitor.page_table
    source = PageSource(tmp_path, allowed_roots=[tmp_path], page_tokens=1024)
    page_id = (await table.map_source(source)).page_ids[0]
    await start_worker(hosts["ra"], "reader")
    condition = ResumptionCondition(kind=ResumptionKind.PAGES_AVAILABLE, page_ids=[page_id])
    await hosts["ra"].runtime.suspend("reader", "pages evicted", condition)
    assert await monitor.tick() == []
    await hosts["rb"].ensure_pages([page_id])  # the page becomes resident on rb
    assert (await table.page(page_id)).resident_on == ["rb"]
    assert await monitor.tick() == ["reader"]
    assert await assert_resumed_intact(hosts, "reader") == "rb"


async def test_priority_order(cluster) -> None:
    hosts, monitor = cluster
    from colony.agents import AgentMetadata

    for agent_id, priority in (("low", 1), ("high", 9)):
        bp = counter_blueprint(agent_id, STEPS)
        bp = bp.model_copy(update={"metadata": AgentMetadata(agent_id=agent_id, priority=priority)})
        await hosts["ra"].ensure_agent(bp)
    await hosts["ra"].runtime.suspend("low")
    await hosts["ra"].runtime.suspend("high")
    assert await monitor.tick() == ["high", "low"]


async def test_vcm_bound_agent_follows_its_pages(cluster, tmp_path) -> None:
    from colony.agents import AgentMetadata, AgentType

    hosts, monitor = cluster
    (tmp_path / "notes.md").write_text("# Notes\n" + "facts " * 200)
    source = PageSource(tmp_path, allowed_roots=[tmp_path], page_tokens=1024)
    page_id = (await monitor.page_table.map_source(source)).page_ids[0]
    await hosts["rb"].ensure_pages([page_id])
    bp = counter_blueprint("bound", STEPS)
    bp = bp.model_copy(
        update={
            "metadata": AgentMetadata(agent_id="bound", agent_type=AgentType.VCM_BOUND, bound_pages=[page_id])
        }
    )
    await hosts["rb"].ensure_agent(bp)
    await hosts["rb"].runtime.get("bound").run(7)
    await hosts["rb"].evict_page(page_id)  # its page is gone: the agent is suspended with it
    assert "bound" not in hosts["rb"].runtime.agent_ids
    assert (await hosts["ra"].registry.get("bound")).state == "suspended"
    assert await monitor.tick() == []
    await hosts["ra"].ensure_pages([page_id])  # resident again, elsewhere
    assert await monitor.tick() == ["bound"]
    assert await assert_resumed_intact(hosts, "bound") == "ra"
