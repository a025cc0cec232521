"""The `analyze` job works unchanged on an OpenAI-compatible server (issue 13 item 4).

The replica's engine is an `OpenAICompatibleEngine` pointed at a running `EmbeddedEngine`'s own
HTTP server (its `base_url`): the same model, reached only over `/v1/chat/completions`. There a
page is no KV-cache slot: `load_page` warms the server's prefix cache and every request naming the
page sends its text as the leading system block. The report must still be complete, grounded (the
job's checker and an independent check over the report) and not partial.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from colony.blackboard import Blackboard
from colony.config import ColonySettings, EngineSettings, ServeSettings, VcmSettings
from colony.inference.openai_compat import OpenAICompatibleEngine
from colony.system.analyze import analyze_blueprint
from colony.system.analyze_check import Vocabulary, check_summary
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.research import research_blueprint
from colony.system.runs import RunService

FILES = {
    "ring.py": '"""A bounded ring of the most recent items (the oldest leaves when it is full)."""\n\n'
    "from collections import deque\n\n\nclass RecentRing:\n"
    '    """Keeps the last `size` items pushed."""\n\n'
    "    def __init__(self, size: int) -> None:\n        self.items = deque(maxlen=size)\n\n"
    "    def push(self, item: object) -> None:\n"
    '        """Add an item; the oldest one leaves when the ring is full."""\n'
    "        self.items.append(item)\n",
    "clock.py": '"""Deadlines for waits, on the monotonic clock."""\n\n'
    "import time\n\nfrom .ring import RecentRing\n\n\ndef deadline_after(seconds: float) -> float:\n"
    '    """The monotonic time `seconds` from now."""\n    return time.monotonic() + seconds\n\n\n'
    "def recent_deadlines(size: int) -> RecentRing:\n"
    '    """A ring for the last `size` deadlines."""\n    return RecentRing(size)\n',
}
HEADER = re.compile(r"(\d+) files in (\d+) page\(s\), summarised by (\d+) page-bound worker\(s\)")
NAME_LIKE = re.compile(r"\b(?:\w*_\w+|[A-Z][a-z0-9]+[A-Z]\w*|[a-z]+[A-Z]\w*)\b")
FILE_LIKE = re.compile(r"\b[\w/-]+\.(?:py|js|ts|c|h|go|rs|md|json|toml|yaml)\b")


class Recording(httpx.AsyncBaseTransport):
    """The client's HTTP transport, keeping each request's JSON body (what the server was sent)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class OpenAIRig:
    """One replica host whose engine is the OpenAI-compatible client, a control plane, runs."""

    def __init__(
        self, bb: Blackboard, settings: ColonySettings, engine: OpenAICompatibleEngine, sent: Recording
    ) -> None:
        self.bb, self.settings, self.engine, self.sent = bb, settings, engine, sent
        self.host = ReplicaHost(settings, "ra", engine=engine)
        self.control = ControlPlane(bb, {"ra": self.host}, settings)
        self.host.spawner = self.control.place
        self.runs = RunService(bb, self.control.registry, colony_id=settings.colony_id, settings=settings)

    async def start(self) -> None:
        await self.host.start(self.bb)
        self.control.start()
        await self.control.place(analyze_blueprint())
        await self.control.place(research_blueprint())

    async def close(self) -> None:
        await self.control.close()
        await self.host.close()  # closes the client engine, not the server

    async def analyze(self, folder: Path, timeout: float) -> tuple[Any, list[dict[str, Any]]]:
        return await self.submit("analyze", {"path": str(folder), "page_tokens": 128}, timeout)

    async def submit(
        self, agent: str, body: dict[str, Any], timeout: float
    ) -> tuple[Any, list[dict[str, Any]]]:
        submitted = await self.runs.submit(agent, body)
        events: list[dict[str, Any]] = []

        async def stream() -> None:
            async for _, event in self.runs.events(submitted.run_id):
                events.append(event)

        await asyncio.wait_for(stream(), timeout)
        return await self.runs.get(submitted.run_id), events


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Any]:
    """A running embedded engine, used only as an OpenAI-compatible HTTP server."""
    from colony.inference.embedded import EmbeddedEngine

    engine = EmbeddedEngine(EngineSettings(page_slots=2, threads=2), data_dir=tmp_path / "engine")
    await engine.start()
    yield engine
    await engine.close()


@pytest.fixture
async def rig(bb: Blackboard, redis_url: str, tmp_path: Path, server: Any) -> AsyncIterator[OpenAIRig]:
    settings = ColonySettings(
        vcm=VcmSettings(allowed_roots=[tmp_path]),
        redis_url=redis_url,
        colony_id=f"oa{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=8),
    )
    sent = Recording()
    client = OpenAICompatibleEngine(server.base_url, model="smollm2", timeout_seconds=120, transport=sent)
    rig = OpenAIRig(bb, settings, client, sent)
    await rig.start()
    yield rig
    await rig.close()


async def test_analyze_on_an_openai_compatible_server_is_complete_and_grounded(
    rig: OpenAIRig, server: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "helpers"
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(text)
    run, events = await rig.analyze(folder, timeout=280)
    assert run.status == "succeeded", run.error
    report = run.output
    # complete, not partial, consistent header
    assert report["partial"] is False and report["not_analysed"] == [] and report["failed_workers"] == 0
    assert report["files"] == sorted(FILES)
    for name in FILES:
        assert f"## {name}:" in report["report"]
    files, pages, workers = map(int, HEADER.search(report["report"]).groups())
    assert (files, pages, workers) == (len(report["files"]), report["pages"], len(report["workers"]))
    assert len(report["sections"]) == report["pages"] == len(report["workers"]) == 2
    assert report["stats"] == {
        kind: sum(1 for s in report["sections"] if s["grounding"] == kind)
        for kind in ("accepted", "regenerated", "extractive")
    }
    # grounded: the job's checker, then an independent one, over each section the report printed
    for section in report["sections"]:
        summary = section["summary"]
        assert summary.strip(), section
        page_text = "\n".join(FILES[f] for f in section["files"])
        verdict = check_summary(summary, Vocabulary(page_text, " ".join(FILES)))
        assert not verdict.unknown and not verdict.repeated, (section, verdict.problems())
        haystack = (page_text + " " + " ".join(FILES)).lower()
        for name in NAME_LIKE.findall(summary) + FILE_LIKE.findall(summary):
            assert name.lower() in haystack, (name, section)
        assert section["defines"], section  # the facts (no model) are there whatever the model said
        shown = f"{summary} (extractive)" if section["grounding"] == "extractive" else summary
        assert shown in report["report"]
    assert "clock.py imports ring.py" in report["report"]  # the overview's import graph, from facts
    # the words came over HTTP: the client sent every summary request, with the page as its prefix
    stats = rig.engine.stats()
    assert stats.engine == "openai" and stats.requests >= report["pages"]
    assert stats.completion_tokens > 0
    assert stats.cached_tokens > 0  # prefixes (the warmed page blocks) were cached on the server
    assert rig.host.pages is not None
    mapped = {record.page_id for record in await rig.host.pages.pages()}
    assert len(mapped) == 2 and mapped <= set(rig.engine.resident_pages())  # warmed = resident here
    assert server.resident_pages() == {}  # no page slot was used on the server: pages are prefixes
    # each page was warmed with its block alone, and every summary request began with that block
    warmed = {b["messages"][0]["content"] for b in rig.sent.bodies if b["max_tokens"] == 1}
    asks = [b for b in rig.sent.bodies if "Facts taken from the code above" in json.dumps(b)]
    assert len(warmed) == 2 and len(asks) >= 2
    for body in asks:
        first = body["messages"][0]
        assert first["role"] == "system" and first["content"] in warmed, first
        assert any(f"### {name} " in first["content"] for name in FILES)  # the page's text itself
    done = [e["data"] for e in events if e.get("event_type") == "worker_done"]
    assert sorted(d["worker"] for d in done) == report["workers"] and all(d["ok"] for d in done)
    # each page was brought in (= warmed on the server) for its worker: prefetched when the worker
    # was placed, else faulted in by its first step
    prefetched = rig.host.paging.counts["prefetched"]
    assert sum(d["faulted"] for d in done) + prefetched >= 2


async def test_research_on_an_openai_compatible_server_cites_its_line(rig: OpenAIRig, tmp_path: Path) -> None:
    """Issue 37: `research` needs no code change on an OpenAI-compatible endpoint: its plan and its
    workers' choices go as JSON-schema response formats, the page as the leading system block."""
    folder = tmp_path / "helpers"
    folder.mkdir()
    for name, text in FILES.items():
        (folder / name).write_text(text)
    question = {"question": "Where is a deadline some seconds from now computed?", "path": str(folder)}
    run, events = await rig.submit("research", question, timeout=280)
    assert run.status == "succeeded", run.error
    first = run.output["citations"][0]
    assert (first["path"], first["line"]) == ("clock.py", 8), run.output
    formats = [
        b["response_format"]["json_schema"]["schema"] for b in rig.sent.bodies if "response_format" in b
    ]
    assert any("files" in f["properties"] for f in formats) and any(
        "choice" in f["properties"] for f in formats
    )
    assert any(e["event_type"] == "evidence" for e in events)
