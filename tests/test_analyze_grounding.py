"""The `analyze` job's report is grounded, complete and shows its progress (issue 13).

Facts extraction and the grounding check run without a model; one test runs the whole job with
the real embedded model over a tiny folder; the failure and retry paths use the scripted engine
(the model's words do not matter there)."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import time
import unicodedata
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from colony.blackboard import AgentRunProtocol, Blackboard
from colony.config import ColonySettings, EngineSettings, ServeSettings, VcmSettings
from colony.errors import InvalidKey
from colony.inference import InferenceRequest, InferenceResponse
from colony.inference.engine import InferenceEngine
from colony.inference.scripted import ScriptedEngine
from colony.system.analyze import analyze_blueprint
from colony.system.analyze_check import Vocabulary, check_summary, names_in, repetitions
from colony.system.analyze_facts import (
    clean,
    extract_facts,
    extractive_summary,
    facts_text,
    overview_paragraph,
)
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.runs import RunService
from colony.vcm import PageSource

FILES = {
    "__init__.py": '"""Small helpers: a ring of recent items and deadlines for waits."""\n\n'
    "from .clock import deadline_after, remaining\nfrom .ring import RecentRing\n\n"
    '__all__ = ["RecentRing", "deadline_after", "remaining"]\n',
    "ring.py": '"""A bounded ring of the most recent items (the oldest leaves when it is full)."""\n\n'
    "from collections import deque\n\n\nclass RecentRing:\n"
    '    """Keeps the last `size` items pushed."""\n\n'
    "    def __init__(self, size: int) -> None:\n        self.items = deque(maxlen=size)\n\n"
    "    def push(self, item: object) -> None:\n"
    '        """Add an item; the oldest one leaves when the ring is full."""\n'
    "        self.items.append(item)\n",
    "clock.py": '"""Deadlines for waits, on the monotonic clock."""\n\n'
    "import time\n\n\ndef deadline_after(seconds: float) -> float:\n"
    '    """The monotonic time `seconds` from now."""\n    return time.monotonic() + seconds\n\n\n'
    "def remaining(deadline: float) -> float:\n"
    '    """Seconds left until `deadline` (never negative)."""\n'
    "    return max(0.0, deadline - time.monotonic())\n",
}
HEADER = re.compile(r"(\d+) files in (\d+) page\(s\), summarised by (\d+) page-bound worker\(s\)")
NAME_LIKE = re.compile(r"\b(?:\w*_\w+|[A-Z][a-z0-9]+[A-Z]\w*|[a-z]+[A-Z]\w*)\b")


def write_folder(folder: Path, files: dict[str, str] = FILES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def pages_of(folder: Path, page_tokens: int = 128) -> list[tuple[Any, Any]]:
    return list(PageSource(folder, allowed_roots=[folder], page_tokens=page_tokens).pages())


# -- facts, without a model ------------------------------------------------------------------------


def test_facts_of_whole_python_files_name_docstrings_signatures_and_local_imports(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "helpers")
    pairs = pages_of(folder, page_tokens=2048)
    ((info, page),) = pairs  # the three small files share one page
    facts = {f.path: f for f in extract_facts(page.text, info.files, mapped_files=FILES, root=str(folder))}
    assert set(facts) == set(FILES)
    ring, clock, init = facts["ring.py"], facts["clock.py"], facts["__init__.py"]
    assert ring.doc.startswith("A bounded ring of the most recent items") and ring.parsed
    assert ring.names == ["RecentRing"]
    assert (
        "def RecentRing.push(self, item: object) -> None: "
        "Add an item; the oldest one leaves when the ring is full." in ring.definitions
    )
    assert (
        "def deadline_after(seconds: float) -> float: The monotonic time `seconds` from now."
        in clock.definitions
    )
    assert init.imports == ["clock.py", "ring.py"]  # relative imports between the mapped files
    assert clock.imports == [] and ring.imports == []  # `time`, `collections`: libraries, not files
    assert (clock.start_line, clock.end_line, clock.lines) == (1, 13, 13)
    text = facts_text(list(facts.values()))
    assert (
        "File clock.py (lines 1-13, 13 lines)" in text
        and "Imports the mapped files: clock.py, ring.py" in text
    )


def test_absolute_imports_resolve_under_the_mapped_folder_only(tmp_path: Path) -> None:
    folder = write_folder(
        tmp_path / "pkg" / "vcm",
        {
            "table.py": "from pkg.vcm.pages import Page\nfrom pkg.other.models import Model\nimport json\n",
            "pages.py": "class Page:\n    pass\n",
            "models.py": "X = 1\n",
        },
    )
    ((info, page),) = pages_of(folder, page_tokens=2048)
    facts = {
        f.path: f
        for f in extract_facts(
            page.text, info.files, mapped_files=["models.py", "pages.py", "table.py"], root=str(folder)
        )
    }
    assert facts["table.py"].imports == ["pages.py"]  # pkg.other.models is another package's models


def test_split_files_and_other_languages_fall_back_to_line_patterns(tmp_path: Path) -> None:
    body = "\n\n".join(
        f"def step_{i}(x: int) -> int:\n    '''Step {i}.'''\n    return x + {i}" for i in range(40)
    )
    folder = write_folder(
        tmp_path / "mixed",
        {
            "long.py": '"""Many steps."""\n' + body + "\n",
            "app.ts": "// The app's entry point.\nimport { run } from './run';\n"
            "export function main(argv: string[]) {\n  run(argv);\n}\n",
            "run.ts": "export async function run(args: string[]) {}\n",
        },
    )
    pairs = pages_of(folder, page_tokens=256)
    mapped = ["app.ts", "long.py", "run.ts"]
    facts = [
        f
        for info, page in pairs
        for f in extract_facts(page.text, info.files, mapped_files=mapped, root=str(folder))
    ]
    app = next(f for f in facts if f.path == "app.ts")
    assert app.doc == "The app's entry point." and app.names == ["main"] and app.imports == ["run.ts"]
    parts = [f for f in facts if f.path == "long.py"]
    assert len(parts) > 1  # split over pages
    assert parts[0].doc == "Many steps."
    later = parts[1]
    assert later.start_line > 1 and later.names and all(n.startswith("step_") for n in later.names)
    names = [n for f in parts for n in f.names]
    assert [f"step_{i}" for i in range(40)] == sorted(set(names), key=lambda n: int(n.split("_")[1]))


def test_extractive_summary_and_overview_say_only_the_facts(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "helpers")
    ((info, page),) = pages_of(folder, page_tokens=2048)
    facts = extract_facts(page.text, info.files, mapped_files=FILES, root=str(folder))
    summary = extractive_summary(facts)
    assert "ring.py (14 lines): A bounded ring of the most recent items" in summary
    assert "defines deadline_after, remaining" in summary and "imports" not in summary
    assert check_summary(summary, Vocabulary(page.text, facts_text(facts))).ok
    overview = overview_paragraph([f.to_dict() for f in facts])
    assert "__init__.py imports clock.py, ring.py" in overview
    assert "clock.py: Deadlines for waits, on the monotonic clock" in overview


def test_a_piece_without_facts_gets_a_plain_extractive_line(tmp_path: Path) -> None:
    long = "\n".join(
        ["def build() -> list[int]:", "    return ["] + [f"        {i}," for i in range(300)] + ["    ]"]
    )
    folder = write_folder(tmp_path / "tail", {"table.py": long + "\n"})
    pairs = pages_of(folder, page_tokens=256)
    last = extract_facts(pairs[-1][1].text, pairs[-1][0].files, mapped_files=["table.py"])
    (tail,) = last
    assert tail.start_line > 1 and not (tail.doc or tail.names or tail.comments)
    assert extractive_summary(last) == (
        f"table.py lines {tail.start_line}-{tail.end_line} "
        "(continued from the part before; no definition begins here)."
    )


# -- the grounding check, without a model ----------------------------------------------------------

PAGE = FILES["ring.py"] + FILES["clock.py"]


@pytest.mark.parametrize(
    ("summary", "invented"),
    [
        ("It defines `PageTable` for the ring.", ["PageTable"]),  # backticked
        ("The ring keeps items in a circular_buffer.", ["circular_buffer"]),  # snake_case
        ("RecentRing wraps a LinkedQueue of items.", ["LinkedQueue"]),  # CamelCase
        ("It calls scheduler.tick on each push.", ["scheduler.tick"]),  # dotted
        ("push() calls evict() when full.", ["evict"]),  # a call
        ("See calendar.py for the days of a month.", ["calendar.py"]),  # a file
        ("It is a web scraper built with numpy and the requests library.", ["numpy", "requests"]),
        ("Items are hashed with sha256 into MAX_ITEMS slots.", ["MAX_ITEMS", "sha256"]),
    ],
)
def test_the_check_rejects_names_not_in_the_page(summary: str, invented: list[str]) -> None:
    verdict = check_summary(summary, Vocabulary(PAGE))
    assert not verdict.ok and sorted(verdict.unknown) == sorted(invented)
    assert all(name in verdict.problems() for name in invented)


@pytest.mark.parametrize(
    "summary",
    [
        "RecentRing keeps the last items pushed; push() adds one and the oldest leaves when it is full.",
        "The module defines `deadline_after` and `remaining`, deadlines on the monotonic clock.",
        "Python helpers: a bounded ring (ring.py) and deadlines for waits (clock.py, uses time.monotonic).",
        "It keeps recent items in a deque. Deadlines use the time module.",
    ],
)
def test_the_check_accepts_grounded_text(summary: str) -> None:
    vocabulary = Vocabulary(PAGE, "File ring.py\nFile clock.py")
    verdict = check_summary(summary, vocabulary)
    assert verdict.ok, verdict.problems()


def test_the_check_rejects_repetition_and_emptiness() -> None:
    said = (
        "It uses a list comprehension to create a new list with the average of each element. "
        "It uses a list comprehension to create a new list with the average of each element."
    )
    assert repetitions(said) and not check_summary(said, Vocabulary(said)).ok
    looping = "The ring keeps the last items pushed and the ring keeps the last items pushed again."
    assert repetitions(looping)
    assert repetitions("This code is designed to manage and manage a database.") == ["manage and manage"]
    assert not repetitions("RecentRing keeps recent items. deadline_after gives a deadline.")
    assert check_summary("  ", Vocabulary(PAGE)).empty


def test_plain_english_is_not_taken_for_names() -> None:
    text = "Eviction happens when the ring is full. This module is a small helper library for Python."
    assert names_in(text) == []


def test_child_event_keys_stream_with_the_run_but_outside_its_numbering() -> None:
    key = AgentRunProtocol.child_event_key("run-1", "analyze-abc-w0", "worker_done")
    assert key == "event:run:run-1:child.analyze-abc-w0.worker_done"
    kind, segments = AgentRunProtocol.identify(key)
    assert kind == "event" and segments["request_id"] == "run-1"  # what the SSE stream selects
    seq, _, _ = segments["event_name"].partition(".")
    assert not seq.isdigit()  # `AgentRunCapability.events.stored` skips it: no seq of the run
    with pytest.raises(InvalidKey):
        AgentRunProtocol.child_event_key("run-1", "w:0", "worker_done")


# -- the check and the facts against hostile text (review of issue 13) ----------------------------

# what the page shows for the ring and clock files (the page's text and its facts' file names)
GROUNDED = Vocabulary(PAGE, "File ring.py\nFile clock.py")


@pytest.mark.parametrize(
    ("summary", "invented"),
    [
        ("RecentRing.rebalance() evicts the oldest item.", "RecentRing.rebalance"),  # a method
        ("The Scheduler class rebalances items on every tick.", "Scheduler"),  # before "class"
        ("It serves the items with the Werkzeug app.", "Werkzeug"),  # before "app"
        ("The ring uses Elasticsearch for its items.", "Elasticsearch"),  # a proper name
        ("It calls rebalance on every tick.", "rebalance"),  # lowercase code named by "calls"
        ("The rebalance method evicts items.", "rebalance"),  # lowercase before "method"
        ("It defines the push method of class Scheduler.", "Scheduler"),  # after "class"
        ("See ing.py for the ring.", "ing.py"),  # a substring of ring.py is no file of the page
        ("The ring lives in invented_pkg/made_up/ring.py.", "invented_pkg/made_up/ring.py"),
        ("It uses the \uff2e\uff55\uff4d\uff50\uff59 library.", "Numpy"),  # fullwidth letters
        ("It is built on num\u200bpy arrays.", "numpy"),  # a zero-width space inside the name
    ],
)
def test_the_check_rejects_names_that_slipped_through_before(summary: str, invented: str) -> None:
    verdict = check_summary(summary, GROUNDED)
    assert not verdict.ok and invented in verdict.unknown, verdict


@pytest.mark.parametrize(
    "summary",
    [
        "The RecentRing class keeps the last items pushed, and its push method adds one.",
        "This Python module defines the RecentRing class, a bounded ring of the most recent items.",
        "The clock module provides deadline_after and remaining, deadlines on the monotonic clock.",
        "It defines two functions, deadline_after and remaining, for deadlines of waits.",
        "The code in clock.py defines functions for Deadlines on the Monotonic clock.",
        "The module calls time.monotonic to compute a deadline; a helper function returns the rest.",
        "It calls push for each item, and the oldest item leaves when the ring is full.",
        "This file defines a class RecentRing with a method push (see ring.py and ./clock.py).",
        "It is a small utility module for Python, with a ring buffer class. It uses the JSON format.",
        "RecentRing keeps items in a deque, e.g. the Last items pushed: The oldest leaves first.",
    ],
)
def test_the_check_still_accepts_grounded_text(summary: str) -> None:
    verdict = check_summary(summary, GROUNDED)
    assert verdict.ok, verdict.problems()


HOSTILE_SUMMARIES = {
    "nested CamelCase": "Ab" + "A" * 26 + "_",  # exponential in the old CamelCase pattern
    "capitals before snake": "It wraps the XmlRPCSERVERCONFIGURATIONSX_v2 class.",
    "digits": "a1" + "1" * 20000 + "_",
    "hyphens before a kind": "a-" * 20000 + " x",
    "dots": "a." * 20000,
    "slashes": "a/" * 20000 + "b.py",
    "underscores": "a_" * 20000 + "!",
    "repeated words": "word " * 20000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE_SUMMARIES))
def test_a_hostile_summary_is_checked_in_well_under_a_second(name: str) -> None:
    started = time.perf_counter()
    check_summary(HOSTILE_SUMMARIES[name], Vocabulary(PAGE))
    assert time.perf_counter() - started < 1.0


HOSTILE_LINES = {
    "relative import of dots": "from " + "." * 40000 + " x",  # quadratic in the old import pattern
    "import keywords": "import " * 9000,
    "requires": "require(" * 9000,
    "includes": '#include "' * 9000,
    "indent": " " * 40000 + "x",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_LINES))
@pytest.mark.parametrize("suffix", ["py", "ts", "txt"])
def test_a_hostile_page_line_is_read_in_well_under_a_second(name: str, suffix: str) -> None:
    from types import SimpleNamespace

    text = f"### a.{suffix} (lines 1-2)\ndef f():\n{HOSTILE_LINES[name]}"
    started = time.perf_counter()
    (facts,) = extract_facts(text, [SimpleNamespace(path=f"a.{suffix}", start_line=1, end_line=2)])
    assert time.perf_counter() - started < 1.0
    assert facts.names == ["f"]


def test_a_piece_ast_cannot_read_for_memory_gets_line_pattern_facts() -> None:
    from types import SimpleNamespace

    body = '"""Deep."""\n\ndef shallow(a):\n    return a\n\nx = ' + "-" * 6000 + "1\n"
    lines = body.count("\n")
    with pytest.raises(MemoryError):  # what `ast` does with it (and what escaped the worker)
        ast.parse(body)
    text = f"### deep.py (lines 1-{lines})\n{body}"
    (facts,) = extract_facts(text, [SimpleNamespace(path="deep.py", start_line=1, end_line=lines)])
    assert not facts.parsed and facts.names == ["shallow"] and facts.definitions == ["def shallow(a)"]


def test_control_and_format_characters_never_reach_facts() -> None:
    from types import SimpleNamespace

    path = "evil\x1b[7m\u202e.py"
    body = (
        '"""Pages\x1b]52;c;cHduZWQ=\x07 and\x1b[2J cleared\u200b."""\n'
        "import os\n\ndef f():\n    '''Runs\u202e\x9b backwards.'''\n"
    )
    comment_first = "# \x1b[31mred\tcomment\x85\n" + body
    pages = [(path, body, 6), ("notes\x07.py", comment_first, 7)]
    for name, text, lines in pages:
        span = SimpleNamespace(path=name, start_line=1, end_line=lines)
        facts = extract_facts(f"### {name} (lines 1-{lines})\n{text}", [span], mapped_files=[name])
        shown = json.dumps([f.to_dict() for f in facts], ensure_ascii=False)
        shown += extractive_summary(facts) + overview_paragraph([f.to_dict() for f in facts])
        hidden = {ch for ch in shown if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")}
        assert not hidden, sorted(hidden)
        (fact,) = facts
        assert fact.path in (clean(name), "evil[7m.py", "notes.py")
        assert fact.definitions == ["def f(): Runs backwards."]  # the text is kept
        assert fact.doc == "Pages]52;c;cHduZWQ= and[2J cleared."
        assert fact.comments == ([] if lines == 6 else ["[31mred comment"])


# -- the job, end to end ---------------------------------------------------------------------------


class Rig:
    """Replica hosts and a control plane in-process (as tests/test_control_plane.py)."""

    def __init__(self, bb: Blackboard, settings: ColonySettings, engines: dict[str, InferenceEngine]) -> None:
        self.bb, self.settings = bb, settings
        self.hosts = {n: ReplicaHost(settings, n, engine=e) for n, e in engines.items()}
        self.control = ControlPlane(bb, self.hosts, settings)
        for host in self.hosts.values():
            host.spawner = self.control.place
        self.runs = RunService(bb, self.control.registry, colony_id=settings.colony_id, settings=settings)

    async def start(self) -> None:
        for host in self.hosts.values():
            await host.start(self.bb)
        self.control.start()
        await self.control.place(analyze_blueprint())

    async def close(self) -> None:
        await self.control.close()
        for host in self.hosts.values():
            await host.close()

    async def analyze(
        self, folder: Path, page_tokens: int, timeout: float
    ) -> tuple[Any, list[dict[str, Any]]]:
        """The run's view and every event of its stream."""
        submitted = await self.runs.submit("analyze", {"path": str(folder), "page_tokens": page_tokens})
        events: list[dict[str, Any]] = []

        async def stream() -> None:
            async for _, event in self.runs.events(submitted.run_id):
                events.append(event)

        await asyncio.wait_for(stream(), timeout)
        return await self.runs.get(submitted.run_id), events


def settings_for(redis_url: str, root: Path) -> ColonySettings:
    return ColonySettings(
        vcm=VcmSettings(allowed_roots=[root]),
        redis_url=redis_url,
        colony_id=f"an{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=8),
    )


@pytest.fixture
async def embedded_rig(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[Rig]:
    from colony.inference.embedded import EmbeddedEngine

    engine = EmbeddedEngine(EngineSettings(page_slots=2, threads=2), data_dir=tmp_path / "engine")
    await engine.start()
    rig = Rig(bb, settings_for(redis_url, tmp_path), {"ra": engine})
    await rig.start()
    yield rig
    await rig.close()


def assert_consistent(report: dict[str, Any]) -> None:
    """The header's numbers are the lists' lengths, and every section is reported."""
    files, pages, workers = map(int, HEADER.search(report["report"]).groups())
    assert (files, pages, workers) == (len(report["files"]), report["pages"], len(report["workers"]))
    assert len(report["sections"]) == report["pages"]
    assert report["stats"] == {
        kind: sum(1 for s in report["sections"] if s["grounding"] == kind)
        for kind in ("accepted", "regenerated", "extractive")
    }


def worker_done(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e.get("event_type") == "worker_done"]


async def test_real_model_report_is_grounded_complete_and_streams_worker_progress(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    folder = write_folder(tmp_path / "helpers")
    run, events = await embedded_rig.analyze(folder, page_tokens=128, timeout=400)
    assert run.status == "succeeded", run.error
    report = run.output
    assert report["partial"] is False and report["not_analysed"] == []
    assert report["files"] == sorted(FILES)
    for name in FILES:
        assert f"## {name}:" in report["report"]  # every file has its section
    assert_consistent(report)
    assert len(report["workers"]) == report["pages"] == 3
    texts = {name: (folder / name).read_text() for name in FILES}
    for section in report["sections"]:
        page_text = "\n".join(texts[f] for f in section["files"])
        # the checker over the report (the page's text and the mapped file names as vocabulary)
        verdict = check_summary(section["summary"], Vocabulary(page_text, " ".join(FILES)))
        assert not verdict.unknown, (section, verdict.problems())
        # and an independent, simpler check: every snake_case / CamelCase word is in the page
        haystack = (page_text + " " + " ".join(FILES)).lower()  # the page, and the files' names
        for name in NAME_LIKE.findall(section["summary"]):
            assert name.lower() in haystack, (name, section)
        assert section["grounding"] in ("accepted", "regenerated", "extractive")
        if section["grounding"] == "extractive":
            assert f"{section['summary']} (extractive)" in report["report"]
    # progress: `mapped`, `workers`, then one `worker_done` per worker, in the coordinator's stream
    kinds = [e["event_type"] for e in events]
    assert kinds[0] == "started" and "mapped" in kinds and "workers" in kinds and kinds[-1] == "completed"
    done = worker_done(events)
    assert sorted(d["worker"] for d in done) == report["workers"]
    assert all(d["ok"] and d["pages"] == 1 for d in done)
    assert sorted(f for d in done for f in d["files"]) == sorted(FILES)
    # each page was brought in for its worker: prefetched when the worker was placed, else
    # faulted in by its first step
    prefetched = sum(host.paging.counts["prefetched"] for host in embedded_rig.hosts.values())
    assert sum(d["faulted"] for d in done) + prefetched >= 3
    assert kinds.index("workers") < kinds.index("worker_done") < kinds.index("completed")
    numbered = [e["seq"] for e in events if e["event_type"] != "worker_done"]
    assert numbered == list(range(1, len(numbered) + 1))  # the coordinator's own numbering is intact


class FailingEngine(ScriptedEngine):
    """Raises for any request about a page holding `doomed` (the first `failures` times; None: always)."""

    def __init__(self, doomed: str, failures: int | None = None) -> None:
        super().__init__(self.reply)
        self.doomed, self.failures = doomed, failures

    @staticmethod
    def reply(request: InferenceRequest) -> str:
        return "The code keeps recent items."

    async def generate(self, request: InferenceRequest) -> InferenceResponse:
        pages = [self._pages[p].text for p in request.page_ids if p in self._pages]
        doomed = any(f"### {self.doomed} " in text for text in pages)
        if doomed and (self.failures is None or self.failures > 0):
            if self.failures is not None:
                self.failures -= 1
            raise RuntimeError(f"engine refuses {self.doomed}")
        return await super().generate(request)


@pytest.fixture
async def failing_rig(
    bb: Blackboard, redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Rig]:
    failures = request.param
    engine = FailingEngine("clock.py", failures)
    rig = Rig(bb, settings_for(redis_url, tmp_path), {"ra": engine})
    await rig.start()
    yield rig
    await rig.close()


@pytest.mark.parametrize("failing_rig", [None], indirect=True)
async def test_a_worker_that_fails_twice_makes_the_report_partial_naming_its_files(
    failing_rig: Rig, tmp_path: Path
) -> None:
    folder = write_folder(tmp_path / "helpers")
    run, events = await failing_rig.analyze(folder, page_tokens=128, timeout=60)
    assert run.status == "succeeded", run.error
    report = run.output
    assert report["partial"] is True and report["failed_workers"] == 1
    (lost,) = report["not_analysed"]
    assert lost["files"] == ["clock.py"] and lost["retried"] is True and "engine refuses" in lost["error"]
    assert report["files"] == ["__init__.py", "ring.py"]
    assert "## Not analysed" in report["report"] and "- clock.py:" in report["report"]
    assert_consistent(report)
    done = worker_done(events)
    failed = [d for d in done if not d["ok"]]
    assert len(failed) == 2 and all(d["files"] == ["clock.py"] for d in failed)  # the worker, its retry
    assert sorted(d["worker"] for d in done if d["ok"]) == report["workers"]
    assert len(done) == len(report["workers"]) + 2


@pytest.mark.parametrize("failing_rig", [1], indirect=True)
async def test_a_worker_that_fails_once_is_retried_and_the_report_is_complete(
    failing_rig: Rig, tmp_path: Path
) -> None:
    folder = write_folder(tmp_path / "helpers")
    run, events = await failing_rig.analyze(folder, page_tokens=128, timeout=60)
    assert run.status == "succeeded", run.error
    report = run.output
    assert report["partial"] is False and report["files"] == sorted(FILES)
    (retried,) = report["retried"]
    assert f"{retried}-r" in report["workers"] and retried not in report["workers"]
    assert "1 worker(s) failed and were retried" in report["report"]
    assert_consistent(report)
    retry_events = [e for e in events if e["event_type"] == "workers" and e["data"].get("retrying")]
    assert [e["data"]["retrying"] for e in retry_events] == [[f"{retried}-r"]]
    assert retry_events[0]["data"]["workers"] == report["workers"]  # the retry in place of the worker
    assert retry_events[0]["data"]["pages"] == report["pages"] == 3
    assert {d["worker"]: d["ok"] for d in worker_done(events)}[retried] is False


def test_adjacent_parts_of_one_file_in_a_page_read_as_one_span() -> None:
    from types import SimpleNamespace

    from colony.system.analyze_worker import _spans_of

    span = SimpleNamespace
    files = [
        span(path="ring.py", start_line=1, end_line=13),
        span(path="ring.py", start_line=14, end_line=14),
        span(path="clock.py", start_line=1, end_line=9),
    ]
    record = SimpleNamespace(files=files)
    assert _spans_of(record) == ["ring.py:1-14", "clock.py:1-9"]
