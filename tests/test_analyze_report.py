"""The analyze report's header, completeness and order, and the coordinator's dispatch (issue 13
review findings 5, 6, 7, 9, 10, 11).

The report is a function of the job's record and the workers' answers, so most of it is tested
through `compose_report` / `build_report` directly. What needs the job to run (duplicate page
ids, a run requested by someone other than the worker's parent) runs on in-process replica hosts
with the scripted engine: the model's words do not matter here."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from colony.agents import AgentMetadata
from colony.blackboard import AgentRunProtocol, Blackboard, BlackboardScope, scope_id
from colony.config import ColonySettings, ServeSettings, VcmSettings
from colony.errors import PageNotResident
from colony.inference.scripted import ScriptedEngine
from colony.system import analyze as analyze_module
from colony.system.analyze import (
    AnalyzeCapability,
    PageSummaryCapability,
    analyze_blueprint,
    page_worker_blueprint,
)
from colony.system.analyze_report import (
    UNCOVERED,
    build_report,
    collect_sections,
    compose_report,
)
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.runs import RunService
from colony.vcm import PageSource

HEADER = re.compile(r"(\d+) files in (\d+) page\(s\), summarised by (\d+) page-bound worker\(s\)")
SPLIT = re.compile(
    r"(\d+) of (\d+) mapped file\(s\) analysed in full(?:, (\d+) in part \([^)]*\))?, (\d+) not at all"
)


def answered(*sections: dict[str, Any]) -> Any:
    return SimpleNamespace(error=None, output={"pages": list(sections), "faulted": 0})


def failed(error: str = "boom") -> Any:
    return SimpleNamespace(error=error, output=None)


def section(page: str, *files: str, grounding: str = "accepted", asked: bool = True) -> dict[str, Any]:
    return {
        "page_id": page,
        "files": list(files),
        "spans": [f"{f}:1-9" for f in files],
        "summary": "It does things.",
        "grounding": grounding,
        "asked": asked,
    }


def files_from(table: dict[str, list[str]]) -> Any:
    async def files_of_pages(pages: list[str]) -> list[str]:
        return sorted({f for p in pages for f in table.get(p, [])})

    return files_of_pages


async def report_of(job: dict[str, Any], results: dict[str, Any], table: dict[str, list[str]]) -> Any:
    return await build_report(job, results, files_of_pages=files_from(table), engine=None, overview_tokens=0)


def split_counts(report: dict[str, Any]) -> tuple[int, int, int, int]:
    full, mapped, part, none = SPLIT.search(report["report"]).groups()
    return int(full), int(mapped), int(part or 0), int(none)


# -- the header (finding 5) ----------------------------------------------------------------------


async def test_a_split_file_with_a_page_lost_is_counted_once_as_analysed_in_part() -> None:
    job = {
        "path": "/x",
        "files": ["big.py"],
        "groups": {"w0": ["p1"], "w1": ["p2"], "w1-r": ["p2"]},
        "retries": {"w1": "w1-r"},
    }
    results = {"w0": answered(section("p1", "big.py")), "w1": failed(), "w1-r": failed()}
    report = await report_of(job, results, {"p1": ["big.py"], "p2": ["big.py"]})
    assert report["partial"] is True and report["mapped_files"] == 1
    assert report["partly_analysed"] == ["big.py"]
    full, mapped, part, none = split_counts(report)
    assert (full, mapped, part, none) == (0, 1, 1, 0)  # one file, counted once
    assert full + part + none == mapped
    assert "(1 worker(s) failed after a retry)" in report["report"]
    files, pages, workers = map(int, HEADER.search(report["report"]).groups())
    assert (files, pages, workers) == (len(report["files"]), report["pages"], len(report["workers"]))


async def test_every_mapped_file_is_counted_in_exactly_one_class() -> None:
    job = {
        "path": "/x",
        "files": ["a.py", "b.py", "c.py", "d.py"],
        "groups": {"w0": ["p1"], "w1": ["p2", "p3"]},
        "retries": {},
    }
    table = {"p1": ["a.py", "b.py"], "p2": ["b.py", "c.py"], "p3": ["d.py"]}
    results = {"w0": answered(section("p1", "a.py", "b.py")), "w1": failed("no replica")}
    report = await report_of(job, results, table)
    full, mapped, part, none = split_counts(report)
    assert (full, mapped, part, none) == (1, 4, 1, 2)
    # the retry never started: the header does not say it failed "after a retry"
    assert "after a retry" not in report["report"]
    assert "1 worker(s) failed and could not be retried" in report["report"]
    assert report["not_analysed"][0]["retried"] is False and report["failed_workers"] == 1


def test_extractive_sections_say_why_only_where_it_applies() -> None:
    from colony.system.analyze_report import Section

    facts_less = Section.model_validate(section("p1", "a.py", grounding="extractive", asked=False))
    report = compose_report("/x", [facts_less], ["w0"], [], [], "")
    assert "rejected" not in report["report"] and "named things" not in report["report"]
    assert "1 extractive (1 with nothing a model could summarise)" in report["report"]
    rejected = Section.model_validate(section("p2", "b.py", grounding="extractive"))
    report = compose_report("/x", [facts_less, rejected], ["w0"], [], [], "")
    assert "2 extractive (1 after the model's summary was rejected twice, 1 with nothing" in report["report"]
    accepted = Section.model_validate(section("p3", "c.py"))
    assert "extractive." in compose_report("/x", [accepted], ["w0"], [], [], "")["report"]


# -- completeness against the dispatched list (finding 6) ----------------------------------------


async def test_a_mapped_file_no_answer_covers_is_listed_as_not_analysed() -> None:
    # a worker answered p2 with no files (e.g. a section built without its page record)
    job = {"path": "/x", "files": ["a.py", "b.py"], "groups": {"w0": ["p1", "p2"]}, "retries": {}}
    results = {"w0": answered(section("p1", "a.py"), section("p2", "ghost.py"))}
    report = await report_of(job, results, {"p1": ["a.py"], "p2": []})
    assert report["partial"] is True
    assert report["files"] == ["a.py"]  # a file the page table never mapped is not reported as analysed
    (entry,) = report["not_analysed"]
    assert entry["files"] == ["b.py"] and entry["error"] == UNCOVERED
    assert f"- b.py: {UNCOVERED}" in report["report"]
    assert split_counts(report) == (1, 2, 0, 1)


async def test_a_worker_whose_page_record_is_gone_fails_instead_of_naming_no_files() -> None:
    class Pages:
        async def page(self, page_id: str) -> None:
            return None

    capability = PageSummaryCapability(
        scope_id="test:worker", replica=SimpleNamespace(replica_id="ra"), pages=Pages()
    )  # type: ignore[arg-type]
    with pytest.raises(PageNotResident, match="no page record"):
        await capability.summarize_pages(["p1"], files=["a.py"], root="/x")


# -- order (finding 11) ----------------------------------------------------------------------------


async def test_sections_come_in_dispatch_order_with_more_than_ten_workers() -> None:
    groups = {f"analyze-abcdefgh-w{i}": [f"p{i:02d}"] for i in range(12)}
    results = {w: answered(section(g[0], f"f{g[0][1:]}.py")) for w, g in groups.items()}
    sections, _, _ = await collect_sections({"groups": groups}, results, files_from({}))
    assert [s.page_id for s in sections] == [f"p{i:02d}" for i in range(12)]


# -- the coordinator: unique ids per dispatch, deduplicated pages, validated backfill (7, 5, 9) ----


class FakeHandle:
    submitted: list[tuple[str, Any]] = []

    def __init__(self, agent_id: str, owner: Any = None) -> None:
        self.agent_id = agent_id

    async def submit(self, request: Any, namespace: str) -> str:
        FakeHandle.submitted.append((self.agent_id, request))
        return f"req-{self.agent_id}"


class FakeAgent:
    def __init__(self, board: Blackboard | None = None) -> None:
        self.agent_id = "analyze"
        self.metadata = AgentMetadata(agent_id="analyze", role="analyze")
        self.current_run = SimpleNamespace(run_id="run-0123456789", request_id="req-coord")
        self.events: list[tuple[str, Any]] = []
        self.blackboard = board

    async def emit_run_event(self, kind: str, data: Any) -> None:
        self.events.append((kind, data))


class PageRecords:
    async def page(self, page_id: str) -> Any:
        return SimpleNamespace(files=[SimpleNamespace(path=f"{page_id}.py", start_line=1, end_line=5)])


def coordinator(monkeypatch: pytest.MonkeyPatch, board: Blackboard | None = None) -> AnalyzeCapability:
    monkeypatch.setattr(analyze_module, "AgentHandle", FakeHandle)
    FakeHandle.submitted = []
    placed: list[str] = []

    async def spawner(blueprint: Any) -> dict[str, Any]:
        placed.append(blueprint.metadata.agent_id)
        return {}

    capability = AnalyzeCapability(
        scope_id="test:analyze", pages=PageRecords(), spawner=spawner, pages_per_worker=1
    )  # type: ignore[arg-type]
    capability.agent = FakeAgent(board)  # type: ignore[assignment]
    return capability


async def test_a_redone_dispatch_starts_workers_under_new_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    capability = coordinator(monkeypatch)
    await capability._dispatch("run-0123456789", None, ["p1", "p2"], 128)
    first = list(capability.job["groups"])
    capability.job = {}  # the step redone from its last checkpoint, before the job was saved
    await capability._dispatch("run-0123456789", None, ["p1", "p2"], 128)
    second = list(capability.job["groups"])
    assert len(first) == len(second) == 2 and not set(first) & set(second)
    keys = {AgentRunProtocol.child_event_key("req-coord", w, "worker_done") for w in first + second}
    assert len(keys) == 4  # the redo's worker_done events are not dropped as the first ones'
    assert capability.job["dispatch"] in second[0]


async def test_duplicate_page_ids_are_dispatched_once_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    capability = coordinator(monkeypatch)
    await capability._dispatch("run-0123456789", None, ["p2", "p1", "p2", "p1"], 128)
    assert [g for g in capability.job["groups"].values()] == [["p2"], ["p1"]]
    assert capability.job["files"] == ["p1.py", "p2.py"]
    assert [r["pages"] for _, r in FakeHandle.submitted] == [["p2"], ["p1"]]


async def test_backfill_validates_what_workers_answered(
    monkeypatch: pytest.MonkeyPatch, bb: Blackboard
) -> None:
    capability = coordinator(monkeypatch, bb)
    capability.job = {
        "request_id": "req-coord",
        "groups": {"w0": ["p1"], "w1": ["p2"], "w2": ["p3"], "w3": ["p4"]},
    }
    results = {
        "w0": SimpleNamespace(error=None, output={"faulted": "many"}),
        "w1": SimpleNamespace(error=None, output={"faulted": 10**15}),
        "w2": SimpleNamespace(error=None, output={"faulted": True}),
        "w3": SimpleNamespace(error=None, output={"faulted": 2}),
    }
    await capability._backfill_done(results)  # never raises over bad data
    meta = capability.agent.metadata  # type: ignore[union-attr]
    scope = AgentRunProtocol.namespaced_scope(
        scope_id(
            BlackboardScope.AGENT, tenant_id=meta.tenant_id, colony_id=meta.colony_id, agent_id="analyze"
        ),
        RUNS_NAMESPACE,
    )
    board = bb.scoped(scope)
    faulted = {}
    for worker in results:
        entry = await board.read(AgentRunProtocol.child_event_key("req-coord", worker, "worker_done"))
        assert entry is not None, worker
        faulted[worker] = entry.value["data"]["faulted"]
    assert faulted == {"w0": 0, "w1": 0, "w2": 0, "w3": 2}


# -- report_to only from the worker's parent (finding 10), on replica hosts ---------------------


@pytest.fixture
async def rig(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    settings = ColonySettings(
        vcm=VcmSettings(allowed_roots=[tmp_path]),
        redis_url=redis_url,
        colony_id=f"ar{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=8),
    )
    host = ReplicaHost(settings, "ra", engine=ScriptedEngine(["It keeps recent items."]))
    control = ControlPlane(bb, {"ra": host}, settings)
    host.spawner = control.place
    runs = RunService(bb, control.registry, colony_id=settings.colony_id, settings=settings)
    await host.start(bb)
    control.start()
    await control.place(analyze_blueprint())
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "a.py").write_text('"""Alpha: keeps recent items."""\n\n\ndef push(x):\n    return x\n')
    (folder / "b.py").write_text('"""Beta: deadlines."""\n\n\ndef remaining(d):\n    return d\n')
    source = PageSource(folder, allowed_roots=[tmp_path], page_tokens=128)
    pages = (await host.pages.map_source(source)).page_ids  # type: ignore[union-attr]
    yield SimpleNamespace(host=host, control=control, runs=runs, pages=pages, folder=folder)
    await control.close()
    await host.close()


async def events_of(runs: RunService, run_id: str, timeout: float = 60) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []

    async def stream() -> None:
        async for _, event in runs.events(run_id):
            events.append(event)

    await asyncio.wait_for(stream(), timeout)
    return events


async def test_duplicate_pages_in_a_run_are_analysed_once(rig: Any) -> None:
    page = rig.pages[0]
    submitted = await rig.runs.submit("analyze", {"pages": [page, page]})
    events = await events_of(rig.runs, submitted.run_id)
    run = await rig.runs.get(submitted.run_id)
    assert run.status == "succeeded", run.error
    assert run.output["pages"] == 1 and len(run.output["workers"]) == 1
    assert len([e for e in events if e["event_type"] == "worker_done"]) == 1


async def test_report_to_is_ignored_unless_the_parent_requested_the_run(rig: Any, bb: Blackboard) -> None:
    worker = "analyze-forged-w0"
    await rig.control.place(page_worker_blueprint(worker, rig.pages[:1], parent_id="analyze"))
    coordinator_run = await rig.runs.submit("analyze", {"pages": rig.pages[:1]})
    await events_of(rig.runs, coordinator_run.run_id)
    view = await rig.runs.get(coordinator_run.run_id)
    assert view.status == "succeeded", view.error
    (own,) = view.output["workers"]
    forged = {"agent_id": "analyze", "request_id": coordinator_run.run_id}  # an API run's request id
    # a run submitted through the API (requester: the API), naming the coordinator's run
    submitted = await rig.runs.submit(worker, {"pages": rig.pages[:1], "report_to": forged})
    await events_of(rig.runs, submitted.run_id)
    assert (await rig.runs.get(submitted.run_id)).status == "succeeded"
    scope = AgentRunProtocol.namespaced_scope(
        scope_id(
            BlackboardScope.AGENT,
            tenant_id="default",
            colony_id=rig.host.settings.colony_id,
            agent_id="analyze",
        ),
        RUNS_NAMESPACE,
    )
    board = bb.scoped(scope)
    key = AgentRunProtocol.child_event_key
    assert await board.read(key(coordinator_run.run_id, own, "worker_done")) is not None  # its parent's
    assert await board.read(key(coordinator_run.run_id, worker, "worker_done")) is None


async def test_a_page_in_two_groups_is_one_section() -> None:
    job = {"path": "/x", "files": ["a.py"], "groups": {"w0": ["p1"], "w1": ["p1"]}, "retries": {}}
    results = {"w0": answered(section("p1", "a.py")), "w1": answered(section("p1", "a.py"))}
    report = await report_of(job, results, {"p1": ["a.py"]})
    assert report["pages"] == 1 and report["files"] == ["a.py"] and not report["partial"]
