"""The control plane in-process: suspend/resume over HTTP, dead-replica recovery, the `analyze`
job (coordinator suspended on CHILDREN_COMPLETED and resumed), and the cluster-wide metrics."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from agent_kit import counter_blueprint
from prometheus_client import REGISTRY

from colony.api.app import ApiServices, create_app
from colony.blackboard import AgentRunProtocol, Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import ColonySettings, ServeSettings, VcmSettings, load_settings
from colony.errors import ResourceExhausted
from colony.inference.scripted import ScriptedEngine
from colony.system.analyze import analyze_blueprint, page_groups
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.runs import RunService
from colony.vcm import PageSource

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]


def summary(request: Any) -> str:
    return "It defines small helper functions."


class Cluster:
    def __init__(self, bb: Blackboard, settings: ColonySettings, names: tuple[str, ...]) -> None:
        self.bb = bb
        self.settings = settings
        self.hosts = {n: ReplicaHost(settings, n, engine=ScriptedEngine(summary, delay=0.2)) for n in names}
        self.control = ControlPlane(bb, self.hosts, settings)
        for host in self.hosts.values():
            host.spawner = self.control.place

    async def start(self) -> None:
        for host in self.hosts.values():
            await host.start(self.bb)
        self.control.start()

    async def close(self) -> None:
        await self.control.close()
        for host in self.hosts.values():
            await host.close()

    def where(self, agent_id: str) -> list[str]:
        return [n for n, h in self.hosts.items() if h.runtime and agent_id in h.runtime.agent_ids]


@pytest.fixture
async def cluster(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    settings = ColonySettings(
        vcm=VcmSettings(allowed_roots=[tmp_path]),  # the folders tests map
        redis_url=redis_url,
        colony_id=f"cp{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=8),
    )
    made = Cluster(bb, settings, ("ra", "rb"))
    await made.start()
    yield made
    await made.close()


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():  # noqa: ASYNC110 - polling Redis state
            await asyncio.sleep(0.05)


async def test_suspend_and_resume_over_http(cluster: Cluster) -> None:
    placed = await cluster.control.place(counter_blueprint("counter-1", STEPS))
    host = cluster.hosts[placed.replica_id]
    await host.runtime.get("counter-1").run(7)
    host.runtime.get("counter-1").record_page_access(["page-1"], placed.replica_id, 12)
    await host.runtime.get("counter-1").persist()
    registry = cluster.control.registry
    runs = RunService(cluster.bb, registry, colony_id=cluster.settings.colony_id, settings=load_settings())
    app = create_app(ApiServices(runs=runs, registry=registry, token="t", control=cluster.control))
    auth = {"Authorization": "Bearer t"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://c", headers=auth
    ) as client:
        suspended = await client.post("/v1/agents/counter-1/suspend")
        assert suspended.status_code == 200 and suspended.json()["state"] == "suspended"
        assert cluster.where("counter-1") == []
        await asyncio.sleep(0.5)  # CUSTOM: the monitor loop leaves it alone until asked
        assert (await registry.get("counter-1")).state == "suspended"
        again = await client.post("/v1/agents/counter-1/resume")
        assert again.status_code == 200 and again.json()["state"] != "suspended"
        (where,) = cluster.where("counter-1")
        agent = cluster.hosts[where].runtime.get("counter-1")
        assert agent.get_capability("CounterCapability").total == 7  # same id, state restored
        assert [(a["pages"], a["cached_tokens"]) for a in agent.page_accesses] == [(["page-1"], 12)]
        conflict = await client.post("/v1/agents/counter-1/resume")
        assert conflict.status_code == 409 and "not suspended" in conflict.json()["error"]["message"]
        missing = await client.post("/v1/agents/nobody/suspend")
        assert missing.status_code == 404
        await asyncio.sleep(0.5)  # a heartbeat publishes the replicas' page stats
        text = (await client.get("/metrics")).text
    assert sample(text, 'colony_cluster_agent_suspensions_total{reason="request"}') >= 1
    assert sample(text, 'colony_cluster_agent_resumptions_total{condition="custom"}') >= 1
    assert sample(text, 'colony_cluster_placements_total{step="soft"}') >= 1
    assert 'colony_replica_resident_pages{replica="ra"}' in text
    assert 'colony_replica_page_ops_total{op="faults",replica="rb"}' in text


def sample(text: str, series: str) -> float:
    """The value of one series in Prometheus text (0 when absent). A `colony_cluster_*` family has
    one series per process (label `process`): the sum of the processes' series."""
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        head = re.sub(r',?process="[^"]*"', "", head).replace("{,", "{").replace("{}", "")
        if head == series:
            total += float(value)
    return total


async def test_agents_of_a_dead_replica_are_re_placed_and_finish_their_runs(
    cluster: Cluster, tmp_path: Path
) -> None:
    placed = await cluster.control.place(
        counter_blueprint("slow-1", STEPS, delay=1.0, serve_namespace="jobs")
    )
    doomed = cluster.hosts[placed.replica_id]
    (tmp_path / "held.py").write_text("x = 1\n")
    source = PageSource(tmp_path, allowed_roots=[tmp_path])
    (page_id,) = (await cluster.control.pages.map_source(source)).page_ids
    await doomed.ensure_pages([page_id])  # the doomed replica holds a page
    await doomed.ensure_pages([page_id])
    assert {k: doomed.info()["pages"][k] for k in ("faults", "loads", "hits", "resident")} == {
        "faults": 1,
        "loads": 1,
        "hits": 1,
        "resident": 1,
    }
    assert (await cluster.control.pages.page(page_id)).resident_on == [placed.replica_id]
    scope = scope_id(BlackboardScope.AGENT, colony_id=cluster.settings.colony_id, agent_id="slow-1")
    jobs = cluster.bb.scoped(AgentRunProtocol.namespaced_scope(scope, "jobs"))
    await jobs.write(
        AgentRunProtocol.request_key("r1"), {"input": 5, "requester": "test", "agent_id": "slow-1"}
    )

    async def claimed() -> bool:
        return await jobs.read(AgentRunProtocol.claim_key("r1")) is not None

    await wait_for(claimed)
    await asyncio.sleep(0.3)  # the run is in its slow step
    await doomed.runtime.drop("slow-1")  # the replica dies: no goodbye, state stays in Redis
    del cluster.hosts[placed.replica_id]
    await doomed.close()

    async def answered() -> bool:
        return await jobs.read(AgentRunProtocol.result_key("r1")) is not None

    await wait_for(answered, timeout=15)
    result = await jobs.read(AgentRunProtocol.result_key("r1"))
    assert result.value["status"] == "succeeded" and result.value["output"] == 5
    (survivor,) = cluster.hosts
    assert cluster.where("slow-1") == [survivor]
    assert (await cluster.control.registry.get("slow-1")).replica == survivor
    assert await cluster.control.pages.pages(replica=placed.replica_id) == []
    assert (await cluster.control.pages.page(page_id)).resident_on == []


def resumptions(condition: str) -> float:
    return REGISTRY.get_sample_value("colony_agent_resumptions_total", {"condition": condition}) or 0.0


async def test_analyze_coordinator_waits_suspended_for_its_page_workers(
    cluster: Cluster, tmp_path: Path
) -> None:
    for name in ("alpha.py", "beta.py", "gamma.md"):
        (tmp_path / name).write_text(
            f"# {name}\n" + "\n".join(f"def f{i}():\n    return {i}" for i in range(80))
        )
    await cluster.control.place(analyze_blueprint())
    before = resumptions("children_completed")
    runs = RunService(
        cluster.bb, cluster.control.registry, colony_id=cluster.settings.colony_id, settings=load_settings()
    )
    submitted = await runs.submit("analyze", {"path": str(tmp_path), "page_tokens": 512})

    async def finished() -> bool:
        return (await runs.get(submitted.run_id)).status in ("succeeded", "failed")

    await wait_for(finished, timeout=30)
    run = await runs.get(submitted.run_id)
    assert run.status == "succeeded", run.error
    report = run.output
    assert report["files"] == ["alpha.py", "beta.py", "gamma.md"]
    for name in report["files"]:
        assert name in report["report"]
    assert "helper functions" in report["report"] and report["failed_workers"] == 0
    assert len(report["workers"]) == report["pages"] >= 3
    # plain words name nothing that is not in the pages: every summary accepted as the model said it
    assert report["stats"] == {"accepted": report["pages"], "regenerated": 0, "extractive": 0}
    registry = cluster.control.registry

    async def workers_stopped() -> bool:  # one-shot workers are done (the registry follows)
        states = [(await registry.get(w)).state for w in report["workers"]]
        return states == ["stopped"] * len(states)

    await wait_for(workers_stopped, timeout=5)
    worker = report["workers"][0]
    scope = scope_id(BlackboardScope.AGENT, colony_id=cluster.settings.colony_id, agent_id=worker)
    context = await cluster.bb.scoped(scope).read(AgentStateProtocol.key("context"))
    (access,) = context.value["page_accesses"]  # the worker's page access history is in its state
    assert access["replica"] in cluster.hosts and len(access["pages"]) == 1
    coordinator = await registry.get("analyze")
    assert coordinator.state != "suspended" and coordinator.agent_id == "analyze"
    assert resumptions("children_completed") == before + 1  # suspended, then resumed by the monitor


async def test_hard_affinity_refuses_instead_of_faulting(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("a = 1\n")
    source = PageSource(tmp_path, allowed_roots=[tmp_path])
    (page_id,) = (await cluster.control.pages.map_source(source)).page_ids
    host = cluster.hosts["ra"]
    request = {"prompt": "what is a?", "max_tokens": 4}
    with pytest.raises(ResourceExhausted, match="no replica holds all"):
        await host.generate(request, [page_id], hard=True)
    assert page_id not in host.engine.resident_pages()
    soft = await host.generate(request, [page_id])  # soft affinity faults it in
    assert soft["faulted"] == [page_id]
    hard = await host.generate(request, [page_id], hard=True)
    assert hard["faulted"] == [] and hard["usage"]["cached_tokens"] > 0
    before = time.time()
    await host._beat()  # the heartbeat records the pages' last access
    assert (await cluster.control.pages.page(page_id)).last_access >= before - 1


def test_big_folders_get_bigger_page_groups_not_more_workers() -> None:
    pages = [f"p{i}" for i in range(10)]
    assert page_groups(pages, 1, 16) == [[p] for p in pages]
    groups = page_groups(pages, 1, 4)
    assert len(groups) == 4 and [p for g in groups for p in g] == pages  # every page, in order
    assert page_groups(pages, 5, 16) == [pages[:5], pages[5:]]


async def test_a_placement_racing_the_monitors_recovery_starts_no_second_copy(
    bb: Blackboard, redis_url: str
) -> None:
    """Issue 12 (found by the chaos suite's daemon restart): the API places the built-in agents
    while the monitor's round is re-placing them off their dead replica. The placement must find
    the agent hosted once the round is done, not start a second copy of it on another replica."""
    settings = ColonySettings(
        redis_url=redis_url,
        colony_id=f"cp{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=8),
    )
    cluster = Cluster(bb, settings, ("ra", "rb", "rc"))
    for host in cluster.hosts.values():
        await host.start(bb)  # no monitor loop: the test drives its round
    try:
        blueprint = counter_blueprint("twice-1", STEPS, serve_namespace="jobs")
        placed = await cluster.control.place(blueprint)
        doomed = cluster.hosts.pop(placed.replica_id)
        await doomed.runtime.drop("twice-1")  # its replica dies
        await doomed.close()

        monitor = cluster.control.monitor
        original, in_round, go_on = monitor._resume, asyncio.Event(), asyncio.Event()

        async def slow_resume(replica_id: str, agent_id: str) -> bool:
            in_round.set()
            await go_on.wait()  # the round is re-placing the agent when the placement comes in
            return await original(replica_id, agent_id)

        monitor._resume = slow_resume  # type: ignore[method-assign]
        round_ = asyncio.create_task(monitor.tick())
        await in_round.wait()
        placement = asyncio.create_task(cluster.control.place(blueprint))
        await asyncio.sleep(0.2)
        go_on.set()
        assert await round_ == ["twice-1"]
        await placement
        assert len(cluster.where("twice-1")) == 1, cluster.where("twice-1")
    finally:
        await cluster.close()


async def test_a_failing_monitor_round_leaves_the_pool_round_running(cluster: Cluster) -> None:
    """The monitor, pool and metrics rounds of the resource monitor loop are independent: one that
    keeps raising (a bug, not an outage) does not stop the others (a pool's waiting requests would
    no longer be nudged)."""
    pool_rounds = 0

    async def broken() -> None:
        raise RuntimeError("injected")

    async def counted() -> None:
        nonlocal pool_rounds
        pool_rounds += 1

    cluster.control.monitor.tick = broken  # type: ignore[method-assign]
    cluster.control.pools = SimpleNamespace(tick=counted)  # type: ignore[assignment]
    await cluster.control.close()
    cluster.control.start()  # the loop again, with the broken monitor round
    await asyncio.sleep(0.6)  # about six rounds of 0.1 s
    assert pool_rounds >= 2
