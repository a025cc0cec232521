"""Needed soon from Colony's own state (docs/vcm.md): what a replica tells its engine it will need
next, in order, from what it knows before any request is made, and never from a trace's future:

- runs claimed or queued here but not begun (certain, next), then pages being prefetched;
- suspended page-bound agents whose resumption is close, closest first (the resource monitor's
  judgement: children mostly done before few done, whatever their priority), those that wait to
  be asked for last;
- idle page-bound agents by their pages' own history (`colony.vcm.page_demand`): agents taking
  turns (a cycle: the page used longest ago is needed next) and popular pages (short gaps) first;
- eviction passes over pages needed soon and, when all are, gives up the one needed last;
- the heartbeat shows the list (first 32 entries, with reasons and estimates) and a metric counts
  the uses by whether the list named the page and whether it was resident.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agent_kit import counter_blueprint
from prometheus_client import REGISTRY

from colony.agents import (
    Agent,
    AgentBlueprint,
    AgentHandle,
    AgentMetadata,
    AgentRunCapability,
    AgentState,
    AgentType,
    ResumptionCondition,
    ResumptionKind,
)
from colony.blackboard import Blackboard
from colony.config import ColonySettings, load_settings
from colony.inference import Page, PageLoad
from colony.inference.scripted import ScriptedEngine
from colony.system.host import ReplicaHost
from colony.system.host_pages import SHOWN_ENTRIES, ReplicaPages
from colony.system.monitor import ResumptionMonitor
from colony.system.registry import AgentRecord, SoonSuspended
from colony.vcm import PageSource, PageTable
from colony.vcm.eviction import FrequencyEviction, LRUEviction
from colony.vcm.page_demand import PageDemand

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]


# -- a page's own history: cycles and Zipf rates, no future knowledge ------------------------------


def play_turns(demand: PageDemand, pages: list[str], rounds: int, *, turn: float = 1.0) -> float:
    """Agents taking turns, one page each, in a fixed order: each turn uses its page for 0.6 s
    (several steps, one use) then the next agent's turn begins. Returns the time after the last."""
    now = 0.0
    for _ in range(rounds):
        for page_id in pages:
            for step in range(3):  # the steps of one run: one use, not three
                demand.record(page_id, now + 0.2 * step)
            demand.release(page_id, now + 0.6)
            now += turn
    return now


def test_turns_put_the_page_used_longest_ago_first() -> None:
    """A cycle of turns longer than any cache (the workload where LRU gets nothing): the page
    used longest ago is the one needed next, the page just used the one needed last."""
    demand = PageDemand()
    pages = [f"turn-{i}" for i in range(6)]
    now = play_turns(demand, pages, rounds=3)
    assert [p for p, _ in demand.order(reversed(pages), now)] == pages
    etas = [estimate.eta_s for _, estimate in demand.order(pages, now)]
    assert all(eta is not None for eta in etas) and etas == sorted(etas)
    # the steps of a run were one use each: about 5.4 s between uses, not 0.2 s
    assert "gap 5.4s" in demand.estimate("turn-0", now).basis
    # half a round on, the order has turned with the cycle: turn-3 is next, turn-2 was just used
    for page_id in pages[:3]:
        demand.record(page_id, now)
        demand.release(page_id, now + 0.6)
        now += 1.0
    assert [p for p, _ in demand.order(pages, now)] == pages[3:] + pages[:3]


def poisson_uses(seed: int, rates: dict[str, float], horizon: float) -> list[tuple[float, str]]:
    rng = random.Random(seed)
    uses = []
    for page_id, rate in rates.items():
        at = rng.expovariate(rate)
        while at < horizon:
            uses.append((at, page_id))
            at += rng.expovariate(rate)
    return sorted(uses)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_zipf_popular_pages_come_first(seed: int) -> None:
    """Independent requests at Zipf rates (Poisson gaps): the phase says nothing, the rate does,
    so the popular pages come before the rare ones whenever the last use happened to be."""
    pages = [f"zipf-{i}" for i in range(8)]
    rates = {page_id: 1.0 / (rank + 1) ** 1.2 for rank, page_id in enumerate(pages)}
    demand = PageDemand()
    for at, page_id in poisson_uses(seed, rates, horizon=400.0):
        demand.record(page_id, at)
        demand.release(page_id, at + 0.1)
    order = [p for p, _ in demand.order(sorted(pages, reverse=True), 400.0)]
    rank = {page_id: place for place, page_id in enumerate(order)}
    assert order[0] in pages[:2], order
    assert max(rank[p] for p in pages[:2]) < min(rank[p] for p in pages[-2:]), order
    # rank correlation with the true popularity order
    n = len(pages)
    spearman = 1 - 6 * sum((rank[p] - i) ** 2 for i, p in enumerate(pages)) / (n * (n * n - 1))
    assert spearman > 0.7, (spearman, order)


def test_a_page_seen_once_has_no_estimate_and_a_stopped_page_sinks() -> None:
    demand = PageDemand(max_pages=4)
    for at in (0.0, 10.0, 20.0, 30.0):
        demand.record("steady", at)
        demand.release("steady", at + 0.1)
    demand.record("old-once", 25.0)
    demand.record("new-once", 29.0)
    now = 31.0
    order = demand.order(["never", "old-once", "new-once", "steady"], now)
    assert [p for p, _ in order] == ["steady", "new-once", "old-once", "never"]
    assert order[1][1].eta_s is None and "used once" in order[1][1].basis
    assert order[3][1].seen is False
    # a page whose demand stopped is not due for ever: its estimate grows with the wait
    late, later = demand.estimate("steady", 50.0).eta_s, demand.estimate("steady", 200.0).eta_s
    assert later > 2 * late and later > 20.0  # past twice its usual gap of 10 s
    # bounded: the least recently used page is dropped first
    demand.record("fourth", 32.0)
    demand.record("fifth", 33.0)
    assert len(demand) == 4 and "steady" not in demand and "fifth" in demand


def test_a_prefetch_is_not_a_use_of_its_own() -> None:
    """The step a prefetch was for continues it (no gap of the load's length), and counts as
    the use that begins (what the metric judges the prediction on); the run's next steps do not."""
    demand = PageDemand()
    assert demand.record("p", 0.0) is True
    demand.release("p", 1.0)
    assert demand.record("p", 10.0, ahead=True) is False  # placed here: the prefetch
    demand.release("p", 13.0)  # a slow load
    assert demand.record("p", 13.1) is True  # the first step: begins the use
    assert demand.record("p", 13.3) is False  # the next step of the same run
    demand.release("p", 14.0)
    assert "gap 9.0s" in demand.estimate("p", 14.0).basis  # from 1.0 to 10.0, not 10.0 to 13.1


# -- a replica's list: the tiers, and what eviction does with them ---------------------------------


def fake_pages(agents: dict[str, Any], clock: list[float]) -> ReplicaPages:
    pages = ReplicaPages("r0")
    pages.demand.clock = lambda: clock[0]
    pages.runtime = SimpleNamespace(  # type: ignore[assignment]
        agent_ids=sorted(agents), get=agents.__getitem__, runs_waiting=lambda a: agents[a].runs
    )
    return pages


def bound_agent(pages: list[str], state: AgentState = AgentState.IDLE, runs: int = 0) -> SimpleNamespace:
    metadata = SimpleNamespace(agent_type=AgentType.VCM_BOUND, bound_pages=pages)
    return SimpleNamespace(state=state, runs=runs, metadata=metadata)


def test_eviction_gives_up_the_page_needed_last_in_a_cycle_of_turns() -> None:
    """Six agents take turns on six pages; four are resident, all needed soon. LRU and LFU-DA
    alone evict the page used longest ago, the very one needed next; with the replica's ordered
    list they evict the page just used (needed last), as Belady would. A resident page no agent
    here is bound to goes first."""
    pages = [f"t{i}" for i in range(6)]
    clock = [0.0]
    replica = fake_pages({f"agent-{p}": bound_agent([p]) for p in pages}, clock)
    clock[0] = play_turns(replica.demand, pages, rounds=3)
    soon = replica.needed_soon()
    assert [next(iter(tier)) for tier in soon.tiers] == pages
    assert {e.reason for e in replica.soon_entries()} == {"history"}
    resident = ["t2", "t3", "t4", "t5"]  # t0, t1 evicted: t0 is next, then t1
    for policy in (LRUEviction(), FrequencyEviction()):
        for _ in range(3):
            for page_id in resident:
                policy.touch(page_id)
        assert policy.victim(resident) == "t2"  # its own choice: the page needed next of these
        assert policy.unpinned_victim(resident, needed_soon=soon) == "t5"  # needed last
        assert policy.unpinned_victim([*resident, "stray"], needed_soon=soon) == "stray"
        assert policy.unpinned_victim(resident, {"t5"}, needed_soon=soon) == "t4"  # pins still win


def test_queued_runs_come_before_history_and_a_running_agent_holds_its_pages() -> None:
    clock = [100.0]
    agents = {
        "hot": bound_agent(["pHot"]),
        "queued": bound_agent(["pQueued"], runs=2),
        "busy": bound_agent(["pBusy"], AgentState.RUNNING, runs=1),
    }
    replica = fake_pages(agents, clock)
    for at in (90.0, 95.0, 99.0):
        replica.demand.record("pHot", at)
    entries = replica.soon_entries()
    assert [(e.page_id, e.reason, e.agent_id) for e in entries] == [
        ("pQueued", "run_waiting", "queued"),
        ("pHot", "history", "hot"),
    ]
    assert entries[0].eta_s == 0.0 and "2 run(s) claimed" in entries[0].basis
    assert entries[1].eta_s is not None and "gap" in entries[1].basis


def test_a_running_agents_page_keeps_the_reason_it_was_named_for() -> None:
    """Once its run begins the agent holds its page (not listed any more), but a use of it is
    still judged against what the list said before the run began."""
    clock = [10.0]
    reader = bound_agent(["p"])
    replica = fake_pages({"reader": reader}, clock)
    replica.demand.record("p", 1.0)
    assert [e.reason for e in replica.soon_entries()] == ["history"]
    reader.state = AgentState.RUNNING
    assert replica.soon_entries() == [] and replica.held() == {"reader": ["p"]}
    assert replica._named == {"p": "history"}


def test_the_heartbeat_shows_the_first_entries_with_reasons() -> None:
    clock = [0.0]
    replica = fake_pages({f"a{i:02d}": bound_agent([f"p{i:02d}"]) for i in range(40)}, clock)
    replica._soon_suspended = (SoonSuspended("pS", 0.75, "near: children 3/4 done"),)
    shown = replica.info()["needed_soon"]
    assert len(shown) == SHOWN_ENTRIES == 32
    assert shown[0] == {
        "page_id": "pS",
        "reason": "resuming",
        "eta_s": None,
        "basis": "near: children 3/4 done",
        "agent_id": None,
    }
    assert {entry["reason"] for entry in shown[1:]} == {"history"}


# -- through a real replica host: runs, prefetches, uses, the metric -------------------------------


class GatedEngine(ScriptedEngine):
    """Scripted, with page loads that wait for `gate` (a slow prefetch, held open by the test)."""

    def __init__(self) -> None:
        super().__init__(["ok"])
        self.gate = asyncio.Event()
        self.gate.set()

    async def load_page(self, page: Page) -> PageLoad:
        await self.gate.wait()
        return await super().load_page(page)


@pytest.fixture
async def host(bb: Blackboard, redis_url: str) -> AsyncIterator[ReplicaHost]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"soon{uuid.uuid4().hex[:8]}")
    made = ReplicaHost(settings, "r0", engine=GatedEngine())
    await made.start(bb)
    yield made
    made.engine.gate.set()
    await made.close()


async def map_pages(table: PageTable, tmp_path: Path, count: int) -> list[str]:
    pages = []
    for i in range(count):
        folder = tmp_path / f"src{i}"
        folder.mkdir()
        (folder / "doc.md").write_text(f"# Doc {i}\n" + f"word{i} " * 200)
        source = PageSource(folder, allowed_roots=[tmp_path], page_tokens=1024)
        pages += (await table.map_source(source)).page_ids
    return pages


def bound(agent_id: str, pages: list[str], *, priority: int = 0, **kw: Any) -> AgentBlueprint:
    blueprint = counter_blueprint(agent_id, STEPS, **kw)
    metadata = AgentMetadata(
        agent_id=agent_id, agent_type=AgentType.VCM_BOUND, bound_pages=pages, priority=priority
    )
    return blueprint.model_copy(update={"metadata": metadata})


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():  # noqa: ASYNC110 - state of other tasks, polled
            await asyncio.sleep(0.01)


async def test_a_claimed_run_comes_first_then_prefetches_then_history(
    host: ReplicaHost, tmp_path: Path, bb: Blackboard
) -> None:
    """An idle agent with a run claimed here that has not begun (its capability is still storing
    the answer of the one before: the window between two runs) is needed next; an agent just
    placed, whose pages are being fetched, after it; an idle agent used moments ago after both."""
    idle_page, worker_page, placed_page = await map_pages(host.pages, tmp_path, 3)
    await host.ensure_agent(bound("idle", [idle_page]))
    await host.ensure_agent(bound("worker", [worker_page], serve_namespace="jobs"))
    for name in ("idle", "worker"):
        await asyncio.wait_for(host.runtime.driver(name), 5)  # their prefetches, done
    await host.generate({"prompt": "q"}, [idle_page])  # used just now: history says soon
    runs = host.runtime.get("worker").get_capability("runs.jobs")
    assert isinstance(runs, AgentRunCapability)
    runs._idle.clear()  # as while the previous run's answer is stored
    owner = Agent(AgentMetadata(agent_id="outside", colony_id=host.settings.colony_id), bb)
    handle = AgentHandle("worker", owner=owner)
    request_id = await handle.submit(1, namespace="jobs")
    await until(lambda: host.runtime.runs_waiting("worker") == 1)
    host.engine.gate.clear()  # the next loads wait: a prefetch in flight
    await host.ensure_agent(bound("placed", [placed_page]))
    await until(lambda: "placed" in host.paging._prefetching)
    assert host.runtime.get("worker").state is not AgentState.RUNNING
    soon = host.paging.needed_soon()
    assert soon.tiers == (frozenset({worker_page}), frozenset({placed_page}), frozenset({idle_page}))
    entries = host.paging.soon_entries()
    assert [(e.reason, e.agent_id) for e in entries] == [
        ("run_waiting", "worker"),
        ("prefetching", "placed"),
        ("history", "idle"),
    ]
    shown = host.info()["needed_soon"]  # what `GET /v1/replicas` returns
    assert [(e["page_id"], e["reason"]) for e in shown] == [
        (worker_page, "run_waiting"),
        (placed_page, "prefetching"),
        (idle_page, "history"),
    ]
    runs._idle.set()
    host.engine.gate.set()
    async with asyncio.timeout(10):
        while await handle.result(request_id, namespace="jobs") is None:  # noqa: ASYNC110 - in Redis
            await asyncio.sleep(0.05)
    await until(lambda: not host.paging._prefetching and host.runtime.runs_waiting("worker") == 0)
    assert {e.reason for e in host.paging.soon_entries()} == {"history"}


async def test_runs_claimed_and_queued_here_count_until_they_begin(
    host: ReplicaHost, tmp_path: Path, bb: Blackboard
) -> None:
    """A run claimed while the agent runs another is counted (in memory, no Redis read) until it
    begins; none is left counted once both are answered."""
    (page,) = await map_pages(host.pages, tmp_path, 1)
    await host.ensure_agent(bound("worker", [page], delay=0.3, serve_namespace="jobs"))
    owner = Agent(AgentMetadata(agent_id="outside", colony_id=host.settings.colony_id), bb)
    handle = AgentHandle("worker", owner=owner)
    agent = host.runtime.get("worker")
    first = await handle.submit(1, namespace="jobs")
    await until(lambda: agent.state is AgentState.RUNNING)
    second = await handle.submit(2, namespace="jobs")
    await until(lambda: host.runtime.runs_waiting("worker") == 1)
    assert agent.state is AgentState.RUNNING and "worker" in host.paging.held()
    for request_id in (first, second):
        async with asyncio.timeout(10):
            while await handle.result(request_id, namespace="jobs") is None:  # noqa: ASYNC110 - in Redis
                await asyncio.sleep(0.05)
    await until(lambda: host.runtime.runs_waiting("worker") == 0)
    assert [e.reason for e in host.paging.soon_entries()] == ["history"]


async def test_turns_through_the_host_order_its_idle_agents(host: ReplicaHost, tmp_path: Path) -> None:
    """Agents taking turns (each turn a request on the agent's page, through `ReplicaPages.using`):
    the replica's list puts the page whose turn is next first, not the agents' ids."""
    clock = [1000.0]
    host.paging.demand.clock = lambda: clock[0]
    pages = await map_pages(host.pages, tmp_path, 4)
    names = ["d", "c", "b", "a"]  # ids in the reverse of the turn order
    for name, page_id in zip(names, pages, strict=True):
        await host.ensure_agent(bound(name, [page_id]))
        await asyncio.wait_for(host.runtime.driver(name), 5)
    for _ in range(3):
        for page_id in pages:
            await host.generate({"prompt": "your turn"}, [page_id])
            clock[0] += 2.0
    entries = host.paging.soon_entries()
    assert [e.page_id for e in entries] == pages
    assert [e.agent_id for e in entries] == names


def uses(named: str, outcome: str) -> float:
    labels = {"named": named, "outcome": outcome}
    return REGISTRY.get_sample_value("colony_needed_soon_page_uses_total", labels) or 0.0


async def test_page_uses_are_counted_against_the_list(host: ReplicaHost, tmp_path: Path) -> None:
    page, stray = await map_pages(host.pages, tmp_path, 2)
    await host.ensure_agent(bound("reader", [page]))
    await asyncio.wait_for(host.runtime.driver("reader"), 5)  # prefetched: resident
    host.info()  # a heartbeat works the list out: the idle reader's page, by its history
    before = {key: uses(*key) for key in [("history", "hit"), ("none", "fault")]}
    await host.generate({"prompt": "q"}, [page])  # named, resident
    await host.generate({"prompt": "q"}, [stray])  # named by nothing, faulted in
    await host.generate({"prompt": "q"}, [stray])  # the same use going on: not counted again
    assert uses("history", "hit") == before[("history", "hit")] + 1
    assert uses("none", "fault") == before[("none", "fault")] + 1
    assert host.info()["needed_soon_uses"] == {"named_hit": 1, "unnamed_fault": 1}


# -- suspended agents: the monitor's judgement of how close each resumption is ---------------------


@pytest.fixture
async def pair(
    bb: Blackboard, redis_url: str
) -> AsyncIterator[tuple[dict[str, ReplicaHost], ResumptionMonitor]]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"soonmon{uuid.uuid4().hex[:8]}")
    hosts = {name: ReplicaHost(settings, name, engine=ScriptedEngine()) for name in ("ra", "rb")}
    for made in hosts.values():
        await made.start(bb)
    table = PageTable(bb, colony_id=settings.colony_id, settings=load_settings())
    monitor = ResumptionMonitor(
        bb, hosts, hosts["ra"].registry, page_table=table, colony_id=settings.colony_id
    )
    yield hosts, monitor
    for made in hosts.values():
        await made.close()


async def test_suspended_agents_closest_to_resuming_come_first(pair, tmp_path: Path) -> None:
    """Three page-bound agents suspended with their pages resident on ra: one waits for four
    children of which three are done, one for four of which one is done (and has the higher
    priority), one to be asked for (the highest priority). The monitor's list for ra goes by
    closeness, not priority; the replica puts the close ones before its idle agents' history and
    the one that waits to be asked for last of all."""
    hosts, monitor = pair
    ra, registry = hosts["ra"], hosts["ra"].registry
    near_page, far_page, asked_page, home_page = await map_pages(monitor.page_table, tmp_path, 4)
    await ra.ensure_pages([near_page, far_page, asked_page, home_page])
    await ra.ensure_agent(bound("home", [home_page]))  # idle here: its page by its history
    children = {"near": ["n1", "n2", "n3", "n4"], "far": ["f1", "f2", "f3", "f4"]}
    for child in ["n1", "n2", "n3", "f1"]:
        await registry.put(AgentRecord(agent_id=child, state="stopped"))
    for child in ["n4", "f2", "f3", "f4"]:
        await registry.put(AgentRecord(agent_id=child, state="idle", replica="rb"))
    for agent_id, page_id, priority in [
        ("near", near_page, 0),
        ("far", far_page, 5),
        ("asked", asked_page, 9),
    ]:
        await ra.ensure_agent(bound(agent_id, [page_id], priority=priority))
        if agent_id in children:
            condition = ResumptionCondition(
                kind=ResumptionKind.CHILDREN_COMPLETED, agent_ids=children[agent_id]
            )
        else:
            condition = ResumptionCondition(kind=ResumptionKind.CUSTOM)
        await ra.runtime.suspend(agent_id, "blocked", condition)
    assert await monitor.tick() == []  # no condition holds
    assert await registry.needed_soon("ra") == [near_page, far_page, asked_page]
    told = await registry.needed_soon_entries("ra")
    assert [soon.close for soon in told] == [0.75, 0.25, 0.0]
    assert told[0].why == "near: children 3/4 done"
    assert await registry.needed_soon("rb") == []  # none of their pages is there
    await ra.paging.refresh_needed_soon()  # what each heartbeat does: one read
    entries = [(e.page_id, e.reason) for e in ra.paging.soon_entries()]
    assert entries == [
        (near_page, "resuming"),
        (far_page, "resuming"),
        (home_page, "history"),
        (asked_page, "suspended"),
    ]
    # the last child of `near` ends: its condition holds, it is resumed, and leaves the list
    await registry.put(AgentRecord(agent_id="n4", state="stopped"))
    assert await monitor.tick() == ["near"]
    assert await registry.needed_soon("ra") == [far_page, asked_page]


async def test_needed_soon_entries_read_back_from_redis_are_bounded(bb: Blackboard) -> None:
    """The entry is Redis data a client with Redis access could have written: page ids checked,
    reasons cut, closeness a number in [0, 1] (a bool is none)."""
    from colony.blackboard.protocol import NeededSoonKeys
    from colony.config import ColonySettings
    from colony.system.registry import AgentRegistry

    registry = AgentRegistry(bb, settings=ColonySettings())
    value = {
        "pages": ["p" * 1_000_000, "pg-0000000000000001", "pg-0000000000000002", "pg-0000000000000003", 7],
        "close": [0.5, True, 7.0, -5, 0.25],
        "why": ["w" * 2_000_000, "a", "b", "c", "d"],
    }
    await bb.write(NeededSoonKeys.soon_key("ra"), value, created_by="attacker")
    entries = await registry.needed_soon_entries("ra")
    assert [e.page_id for e in entries] == [f"pg-000000000000000{n}" for n in (1, 2, 3)]
    assert [e.close for e in entries] == [None, 1.0, 0.0]
    assert all(len(e.why) <= 200 for e in entries)
