"""Pinned pages: a page in use is never the eviction victim; a fault that finds every slot pinned
waits (bounded) for one; `analyze` over more pages than slots analyses every file, and pages that
could not be analysed make the run partial or failed, never a silent success."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_kit import counter_blueprint

from colony.agents import AgentMetadata, AgentState, AgentType
from colony.blackboard import Blackboard
from colony.config import ColonySettings, EngineSettings, ServeSettings, VcmSettings, load_settings
from colony.errors import InferenceError, PageNotResident, ResourceExhausted
from colony.inference.embedded import EmbeddedEngine
from colony.inference.models import InferenceRequest
from colony.inference.scripted import ScriptedEngine
from colony.system.analyze import analyze_blueprint
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.runs import RunService
from colony.vcm import PageSource
from colony.vcm.eviction import FrequencyEviction, LRUEviction
from colony.vcm.page import Page

FILES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")


def write_tree(root: Path) -> Path:
    """Six files of about 200 tokens: six pages at page_tokens=256."""
    root.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(FILES):
        body = "\n".join(f"def {name}_{i}(x):\n    return x * {i} + {index}" for i in range(14))
        (root / f"{name}.py").write_text(f'"""The {name} helpers."""\n\n{body}\n')
    return root


def test_eviction_policies_never_choose_a_pinned_page() -> None:
    for policy in (LRUEviction(), FrequencyEviction()):
        for page in ("cold", "warm", "hot", "hot", "hot", "warm"):
            policy.touch(page)
        cache = ["cold", "warm", "hot"]
        assert policy.victim(cache) == "cold"  # the policy's own choice ...
        assert policy.unpinned_victim(cache, {"cold"}) == ("warm" if policy.name == "lfu-da" else "hot")
        assert policy.unpinned_victim(cache, {"cold", "warm"}) == "hot"  # ... never a pinned one
        assert policy.unpinned_victim(cache, set(cache)) is None  # all in use: nothing to evict
        assert policy.unpinned_victim(cache) == "cold"


@pytest.fixture
async def replica(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[tuple[ReplicaHost, list]]:
    """One real EmbeddedEngine with 2 page slots behind a ReplicaHost, and 6 mapped pages."""
    settings = ColonySettings(
        redis_url=redis_url,
        colony_id=f"pin{uuid.uuid4().hex[:8]}",
        data_dir=tmp_path / "data",
        engine=EngineSettings(page_slots=2, slot_context_tokens=1024),
        vcm=VcmSettings(allowed_roots=[tmp_path], page_wait_seconds=300),
    )
    host = ReplicaHost(settings, "pinned-a")
    await host.start(bb)
    assert host.pages is not None
    source = await PageSource.open(write_tree(tmp_path / "tree"), settings.vcm, page_tokens=256)
    page_ids = (await host.pages.map_source(source)).page_ids
    assert len(page_ids) == 6
    yield host, page_ids
    await host.close()


async def test_concurrent_page_calls_over_more_pages_than_slots(replica: Any) -> None:
    """12 concurrent calls over 6 pages on 2 slots: each call's page stays resident from its fault
    to its answer (before pinning, a concurrent fault evicted it: PageNotResident)."""
    host, page_ids = replica
    engine = host.engine
    assert isinstance(engine, EmbeddedEngine) and engine.page_capacity() == 2
    question = {"prompt": "Name one function defined above.", "max_tokens": 4, "temperature": 0.0}
    calls = [host.generate(question, [page_ids[i % 6]]) for i in range(12)]
    answers = await asyncio.gather(*calls, return_exceptions=True)
    errors = [a for a in answers if isinstance(a, BaseException)]
    assert errors == []
    assert all(a["replica_id"] == "pinned-a" and a["usage"]["completion_tokens"] >= 1 for a in answers)
    # each answer was computed on its own page: the page's tokens were the cached prompt prefix
    assert all(a["usage"]["cached_tokens"] >= 100 for a in answers)
    assert len(engine.resident_pages()) == 2 and engine.pinned_pages() == set()
    assert sum(host.paging.counts[k] for k in ("loads", "swap_ins")) >= 6


async def test_a_fault_waits_for_a_pinned_slot_then_gives_up(replica: Any) -> None:
    host, page_ids = replica
    engine = host.engine
    assert isinstance(engine, EmbeddedEngine)
    first, second, third = [await host.pages.content(p) for p in page_ids[:3]]
    async with engine.pinned([first.page_id, second.page_id]):
        await engine.load_page(first)
        await engine.load_page(second)
        engine.pin_wait_seconds = 0.3
        with pytest.raises(ResourceExhausted, match="every page slot holds a page in use"):
            await engine.load_page(third)
        with pytest.raises(ResourceExhausted, match="in use"):
            await engine.evict_page(first.page_id)
        engine.pin_wait_seconds = 60
        waiting = asyncio.create_task(engine.load_page(third))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # still waiting: both slots are in use
    load = await waiting  # the pins are gone: the policy's victim leaves
    assert load.evicted and load.evicted[0] in {first.page_id, second.page_id}
    assert third.page_id in engine.resident_pages()


async def test_generation_pins_its_page_until_it_answers(tmp_path: Path) -> None:
    """On the engine itself: a load that would evict the page of a generation in progress waits."""
    engine = EmbeddedEngine(EngineSettings(page_slots=1, slot_context_tokens=1024), data_dir=tmp_path)
    try:
        pages = [Page(page_id=f"p{i}", text=f"def f{i}():\n    return {i}\n" * 20) for i in range(2)]
        await engine.load_page(pages[0])
        request = InferenceRequest(prompt="What does f0 return?", max_tokens=48, page_ids=["p0"])
        answer = asyncio.create_task(engine.generate(request))
        while "p0" not in engine.pinned_pages():  # noqa: ASYNC110 - the task has not started yet
            await asyncio.sleep(0.001)
        loading = asyncio.create_task(engine.load_page(pages[1]))
        checks = 0
        while not answer.done():  # p0 stays in its slot while it is answered
            assert "p0" in engine.resident_pages() and not loading.done()
            checks += 1
            await asyncio.sleep(0.005)
        assert checks > 0
        done = await answer
        assert done.usage.cached_tokens > 0
        assert (await loading).evicted == ["p0"]
        with pytest.raises(PageNotResident):
            await engine.generate(request)
    finally:
        await engine.close()


# -- several pages per request, page-bound agents, streams ------------------------------------------


def tiny_tree(root: Path, count: int) -> Path:
    """`count` files of about 50 tokens: one page each at page_tokens=64 (fast to prefill)."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (root / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" + f"# page {i}\n" * 16)
    return root


@pytest.fixture
async def tiny_host(bb: Blackboard, redis_url: str, tmp_path: Path, request: Any) -> AsyncIterator[Any]:
    """A ReplicaHost on the real embedded model with `request.param` page slots and 4 tiny pages."""
    settings = ColonySettings(
        redis_url=redis_url,
        colony_id=f"tiny{uuid.uuid4().hex[:8]}",
        data_dir=tmp_path / "data",
        engine=EngineSettings(page_slots=request.param, slot_context_tokens=1024),
        vcm=VcmSettings(allowed_roots=[tmp_path], page_wait_seconds=20),
    )
    host = ReplicaHost(settings, "tiny")
    await host.start(bb)
    assert host.pages is not None
    source = await PageSource.open(tiny_tree(tmp_path / "tiny", 4), settings.vcm, page_tokens=64)
    page_ids = (await host.pages.map_source(source)).page_ids
    assert len(page_ids) == 4
    yield host, page_ids
    await host.close()


@pytest.mark.parametrize("tiny_host", [2], indirect=True)
async def test_two_requests_of_two_pages_on_two_slots_do_not_deadlock(tiny_host: Any) -> None:
    """Each request already has one of its pages resident. Before: each pinned its resident page,
    then waited for a slot the other held pinned, until both failed with ResourceExhausted; now a
    request reserves all its slots at once or waits holding none."""
    host, (a1, a2, b1, b2) = tiny_host
    await host.ensure_pages([a1])
    await host.ensure_pages([b1])
    assert set(host.engine.resident_pages()) == {a1, b1}
    host.engine.pin_wait_seconds = 8  # the deadlock ended in ResourceExhausted after this long
    question = {"prompt": "Name one function defined above.", "max_tokens": 2, "temperature": 0.0}
    answers = await asyncio.gather(host.generate(question, [a1, a2]), host.generate(question, [b1, b2]))
    assert a2 in answers[0]["faulted"] and b2 in answers[1]["faulted"]
    assert all(a["usage"]["completion_tokens"] >= 1 for a in answers)
    assert host.engine.pinned_pages() == set() and host.engine._pin_waiters == []


def bound_blueprint(agent_id: str, page_ids: list[str]) -> Any:
    bp = counter_blueprint(agent_id, [{"action": "add", "parameters": {"amount": "$input"}}])
    metadata = AgentMetadata(agent_id=agent_id, agent_type=AgentType.VCM_BOUND, bound_pages=page_ids)
    return bp.model_copy(update={"metadata": metadata})


@pytest.mark.parametrize("tiny_host", [1], indirect=True)
async def test_a_running_page_bound_agents_page_is_not_evicted_for_another(tiny_host: Any) -> None:
    host, (mine, next_mine, other, _) = tiny_host
    engine = host.engine
    await host.ensure_agent(bound_blueprint("bound", [mine, next_mine]))
    await host.ensure_pages([mine])
    agent = host.runtime.get("bound")
    await agent.begin_run(1)  # RUNNING: it holds its pages
    assert agent.state is AgentState.RUNNING and host.paging.held() == {"bound": [mine, next_mine]}
    engine.pin_wait_seconds = 0.6
    with pytest.raises(ResourceExhausted, match="in use"):  # before: evicted `mine` at once
        await host.ensure_pages([other])
    assert set(engine.resident_pages()) == {mine}
    # the agent's own fault may move it on from its page to its next one
    answer = await host.generate({"prompt": "Say hi.", "max_tokens": 2}, [next_mine], holder="bound")
    assert answer["faulted"] == [next_mine] and set(engine.resident_pages()) == {next_mine}
    engine.pin_wait_seconds = 30
    waiting = asyncio.create_task(host.ensure_pages([other]))
    await asyncio.sleep(0.8)
    assert not waiting.done() and set(engine.resident_pages()) == {next_mine}
    await agent.run_until_done()  # the run ends: its pages are free (noticed by the poll)
    assert agent.state is not AgentState.RUNNING
    assert await asyncio.wait_for(waiting, 10) == [other]
    assert set(engine.resident_pages()) == {other} and host.paging.held() == {}


async def test_an_abandoned_stream_releases_its_pin(tmp_path: Path) -> None:
    """A stream's pin ends when the consumer closes it, and when the request's time is up if it
    never does (before: held until the generator was garbage collected, here: never)."""
    # the request's time bounds the abandoned pin; 8 s leaves a loaded CI box time for the first token
    settings = EngineSettings(page_slots=1, slot_context_tokens=1024, timeout_seconds=8)
    engine = EmbeddedEngine(settings, data_dir=tmp_path)
    try:
        await engine.load_page(Page(page_id="p0", text="def f():\n    return 0\n"))
        request = InferenceRequest(prompt="Count to fifty.", max_tokens=64, page_ids=["p0"])
        closed = engine.stream(request)
        await anext(closed)
        assert engine.pinned_pages() == {"p0"}
        await closed.aclose()  # the consumer stops: the pin ends now
        assert engine.pinned_pages() == set()
        abandoned = engine.stream(request)
        await anext(abandoned)  # then never read again, never closed (still referenced)
        assert engine.pinned_pages() == {"p0"}
        async with asyncio.timeout(20):
            while engine.pinned_pages():  # noqa: ASYNC110 - the pin's lifetime runs out
                await asyncio.sleep(0.1)
        load = await engine.load_page(Page(page_id="p1", text="def g():\n    return 1\n"))
        assert load.evicted == ["p0"]
        await abandoned.aclose()
    finally:
        await engine.close()


# -- analyze ----------------------------------------------------------------------------------------


async def analyze_run(host: ReplicaHost, control: ControlPlane, path: Path, max_workers: int = 16) -> Any:
    assert host.blackboard is not None
    await control.place(analyze_blueprint(max_workers=max_workers))
    runs = RunService(
        host.blackboard, control.registry, colony_id=host.settings.colony_id, settings=load_settings()
    )
    submitted = await runs.submit("analyze", {"path": str(path), "page_tokens": 256})
    async with asyncio.timeout(600):
        while (run := await runs.get(submitted.run_id)).status not in ("succeeded", "failed"):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    return run


@pytest.fixture
async def one_replica(bb: Blackboard, redis_url: str, tmp_path: Path, request: Any) -> AsyncIterator[Any]:
    engine = request.param(tmp_path) if callable(request.param) else None
    settings = ColonySettings(
        redis_url=redis_url,
        colony_id=f"pa{uuid.uuid4().hex[:8]}",
        data_dir=tmp_path / "data",
        engine=EngineSettings(page_slots=2, slot_context_tokens=1024),
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=16),
        vcm=VcmSettings(allowed_roots=[tmp_path], page_wait_seconds=300),
    )
    host = ReplicaHost(settings, "ra", engine=engine)
    control = ControlPlane(bb, {"ra": host}, settings)
    host.spawner = control.place
    await host.start(bb)
    control.start()
    yield host, control
    await control.close()
    await host.close()


@pytest.mark.parametrize("one_replica", [None], indirect=True)
async def test_analyze_six_pages_on_two_slots_analyses_every_file(one_replica: Any, tmp_path: Path) -> None:
    """The real embedded model, 6 pages, 2 slots, 6 workers on one replica: every file analysed."""
    host, control = one_replica
    assert isinstance(host.engine, EmbeddedEngine)
    run = await analyze_run(host, control, write_tree(tmp_path / "tree"))
    assert run.status == "succeeded", run.error
    report = run.output
    assert report["files"] == sorted(f"{name}.py" for name in FILES)
    assert report["pages"] == 6 and report["failed_workers"] == 0 and report["partial"] is False
    assert report["not_analysed"] == [] and "Not analysed" not in report["report"]
    for name in FILES:
        assert f"## {name}.py:1-" in report["report"]


@pytest.mark.parametrize("one_replica", [None], indirect=True)
async def test_analyze_workers_bound_to_more_pages_than_slots(one_replica: Any, tmp_path: Path) -> None:
    """2 workers of 3 pages each on 2 slots: each running worker holds its 3 pages, and moves on
    from its own page to its next (holder=); it never waits on the other's held page (that would
    leave both waiting until vcm.page_wait_seconds and the run partial)."""
    host, control = one_replica
    host.engine.pin_wait_seconds = 30
    run = await analyze_run(host, control, write_tree(tmp_path / "tree"), max_workers=2)
    assert run.status == "succeeded", run.error
    report = run.output
    assert report["pages"] == 6 and report["failed_workers"] == 0 and report["partial"] is False
    assert report["files"] == sorted(f"{name}.py" for name in FILES)


def failing_on(*names: str) -> Any:
    """A scripted engine (the words do not matter) that fails the pages holding the named files."""

    def build(tmp_path: Path) -> ScriptedEngine:
        source = PageSource(write_tree(tmp_path / "tree"), allowed_roots=[tmp_path], page_tokens=256)
        poisoned = {info.page_id for info, _ in source.pages() if info.files[0].path in names}

        def reply(request: InferenceRequest) -> str:
            if poisoned & set(request.page_ids):
                raise InferenceError("the model crashed on this page")
            return "It defines small helpers."

        return ScriptedEngine(reply)

    return build


@pytest.mark.parametrize("one_replica", [failing_on("beta.py", "zeta.py")], indirect=True)
async def test_analyze_with_failed_workers_is_partial(one_replica: Any, tmp_path: Path) -> None:
    host, control = one_replica
    run = await analyze_run(host, control, tmp_path / "tree")
    assert run.status == "succeeded", run.error
    report = run.output
    assert report["partial"] is True and report["failed_workers"] == 2
    assert sorted(f for n in report["not_analysed"] for f in n["files"]) == ["beta.py", "zeta.py"]
    assert all("model crashed" in n["error"] and len(n["pages"]) == 1 for n in report["not_analysed"])
    assert "beta.py" not in report["files"] and len(report["files"]) == 4
    assert "## Not analysed" in report["report"] and "beta.py" in report["report"].split("## Not analysed")[1]


@pytest.mark.parametrize("one_replica", [failing_on(*(f"{n}.py" for n in FILES))], indirect=True)
async def test_analyze_where_every_worker_fails_ends_failed(one_replica: Any, tmp_path: Path) -> None:
    host, control = one_replica
    run = await analyze_run(host, control, tmp_path / "tree")
    assert run.status == "failed" and run.output is None
    assert "no page could be analysed" in run.error and "model crashed" in run.error
