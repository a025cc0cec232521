"""The `research` job (issue 37, deliverable 3): a question over a mapped folder answered with a
citation of the line that holds the answer, by a coordinator that plans with the model, spawns
page-bound workers on the replicas holding their pages, is suspended while they work and resumed
when they finish. On the real embedded model; the failure paths on the scripted engine."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from colony.blackboard import Blackboard
from colony.config import ColonySettings, EngineSettings, ServeSettings, VcmSettings
from colony.inference import InferenceRequest, InferenceResponse
from colony.inference.engine import InferenceEngine
from colony.inference.scripted import ScriptedEngine
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.research import ResearchCapability, research_blueprint
from colony.system.runs import RunService
from colony.vcm import PageSource, PageTable

FILES = {
    "mail/dates.py": '"""Dates of mail headers."""\n\nimport time\n\n\n'
    "def header_date_to_timestamp(value: str) -> float:\n"
    '    """Turn the date written in a mail header into seconds since the epoch."""\n'
    "    return time.mktime(time.strptime(value))\n\n\n"
    "def now_header() -> str:\n"
    '    """The current time as a header date."""\n'
    '    return time.strftime("%a, %d %b %Y %H:%M:%S")\n',
    "mail/addresses.py": '"""Addresses."""\n\n\nclass AddressBook:\n'
    '    """Names and mail addresses of people."""\n\n'
    "    def __init__(self) -> None:\n        self.people: dict[str, str] = {}\n\n"
    "    def add_person(self, name: str, address: str) -> None:\n"
    '        """Remember the address of a person."""\n'
    "        self.people[name] = address\n\n"
    "    def lookup_address(self, name: str) -> str:\n"
    '        """The address of a person, by name."""\n'
    "        return self.people[name]\n",
    "web/cookies.py": '"""Cookies."""\n\n\ndef expire_cookie(jar: dict, name: str) -> None:\n'
    '    """Drop a cookie from the jar."""\n    jar.pop(name, None)\n',
}


def write_folder(folder: Path) -> Path:
    for name, text in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


class Rig:
    """Two replica hosts and a control plane in-process, the research agent placed."""

    def __init__(self, bb: Blackboard, settings: ColonySettings, engines: dict[str, InferenceEngine]) -> None:
        self.bb, self.settings = bb, settings
        self.hosts = {n: ReplicaHost(settings, n, engine=e) for n, e in engines.items()}
        self.control = ControlPlane(bb, self.hosts, settings)
        for host in self.hosts.values():
            host.spawner = self.control.place
        self.runs = RunService(bb, self.control.registry, colony_id=settings.colony_id, settings=settings)

    async def start(self, **options: Any) -> None:
        for host in self.hosts.values():
            await host.start(self.bb)
        self.control.start()
        blueprint = research_blueprint()
        if options:
            blueprint = blueprint.model_copy(
                update={"capabilities": [ResearchCapability.bind(**options), *blueprint.capabilities[1:]]}
            )
        await self.control.place(blueprint)

    async def states(self, agent_id: str, seen: list[str], stop: asyncio.Event) -> None:
        """Every lifecycle state `agent_id` is seen in (the registry) until `stop`."""
        while not stop.is_set():
            record = next((r for r in await self.control.registry.list() if r.agent_id == agent_id), None)
            if record is not None and (not seen or seen[-1] != record.state):
                seen.append(record.state)
            await asyncio.sleep(0.05)

    async def workers(self) -> dict[str, Any]:
        return {
            r.agent_id: r for r in await self.control.registry.list() if r.agent_id.startswith("research-")
        }

    async def map(self, folder: Path, page_tokens: int = 64) -> tuple[list[str], dict[str, str]]:
        """The folder's pages, and the page holding each file's first line."""
        table = PageTable(self.bb, settings=self.settings)
        source = await table.map_source(
            await PageSource.open(str(folder), self.settings.vcm, page_tokens=page_tokens)
        )
        first: dict[str, str] = {}
        for page_id in source.page_ids:
            record = await table.page(page_id)
            assert record is not None
            for span in record.files:
                if span.start_line == 1:
                    first[span.path] = page_id
        return source.page_ids, first

    async def close(self) -> None:
        await self.control.close()
        for host in self.hosts.values():
            await host.close()

    async def research(self, body: dict[str, Any], timeout: float) -> tuple[Any, list[dict[str, Any]]]:
        """The run's view and every event of its stream."""
        submitted = await self.runs.submit("research", body)
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
        colony_id=f"rs{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=8),
    )


QUESTION = "Which function converts the date of a mail header to seconds?"


def scripted_reply(request: InferenceRequest) -> str:
    """The scripted model: the first two files offered, the first candidate, a sentence."""
    schema = request.response_format
    if schema is None:
        return "It turns the header's date into seconds."
    properties = schema["properties"]
    if "files" in properties:
        return json.dumps({"files": properties["files"]["items"]["enum"][:2]})
    return json.dumps({"choice": 1})


class SlowJudge(ScriptedEngine):
    """The scripted model, `delay` seconds on each request about a page (a worker's judgement);
    requests about a page holding `doomed` fail; `says`: its answer's sentence."""

    def __init__(self, delay: float = 0.0, doomed: str | None = None, says: str | None = None) -> None:
        super().__init__(
            lambda request: says if says and request.response_format is None else scripted_reply(request)
        )
        self.judge_delay, self.doomed = delay, doomed

    async def generate(self, request: InferenceRequest) -> InferenceResponse:
        if request.page_ids:
            texts = [self._pages[p].text for p in request.page_ids if p in self._pages]
            if self.doomed is not None and any(f"### {self.doomed} " in t for t in texts):
                raise RuntimeError(f"engine refuses {self.doomed}")
            await asyncio.sleep(self.judge_delay)
        return await super().generate(request)


@pytest.fixture
async def rig_of(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    made: list[Rig] = []

    async def build(engine: InferenceEngine | None = None, **options: Any) -> Rig:
        engine = engine or SlowJudge()
        rig = Rig(bb, settings_for(redis_url, tmp_path), {"ra": engine, "rb": engine})
        await rig.start(**options)
        made.append(rig)
        return rig

    yield build
    for rig in made:
        await rig.close()


@pytest.fixture
async def embedded_rig(bb: Blackboard, redis_url: str, tmp_path: Path) -> AsyncIterator[Rig]:
    from colony.inference.embedded import EmbeddedEngine

    engines: dict[str, InferenceEngine] = {}
    for name in ("ra", "rb"):
        engine = EmbeddedEngine(EngineSettings(page_slots=2, threads=1), data_dir=tmp_path / name)
        await engine.start()
        engines[name] = engine
    rig = Rig(bb, settings_for(redis_url, tmp_path), engines)
    await rig.start()
    yield rig
    await rig.close()


async def test_on_the_embedded_model_workers_run_where_their_pages_are_and_the_answer_cites_its_line(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    rig = embedded_rig
    folder = write_folder(tmp_path / "code")
    pages, first = await rig.map(folder)
    # the page holding the answer is held by rb, the addresses' page by ra: workers go to them
    await rig.hosts["rb"].ensure_pages([first["mail/dates.py"]])
    await rig.hosts["ra"].ensure_pages([first["mail/addresses.py"]])
    seen: list[str] = []
    stop = asyncio.Event()
    watch = asyncio.create_task(rig.states("research", seen, stop))
    run, events = await rig.research({"question": QUESTION, "pages": pages, "path": str(folder)}, timeout=400)
    stop.set()
    await watch
    assert run.status == "succeeded", run.error
    out = run.output
    assert out["citations"][0] == {
        "path": "mail/dates.py",
        "line": 6,
        "text": "def header_date_to_timestamp(value: str) -> float:",
    }
    assert out["answer"].startswith("`header_date_to_timestamp` (mail/dates.py, line 6)")
    assert "mail/dates.py" in out["files"] and out["not_finished"] == []
    where = {a["page"]: a["replica_id"] for a in out["agents"]}
    assert where[first["mail/dates.py"]] == "rb", out["agents"]
    if first["mail/addresses.py"] in where:
        assert where[first["mail/addresses.py"]] == "ra", out["agents"]
    assert sorted(where) == sorted(out["pages"]) and 1 <= len(out["pages"]) <= 3
    # suspended while the workers ran, resumed when they had answered
    assert "suspended" in seen and seen[-1] in ("idle", "running"), seen
    kinds = [e["event_type"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "completed"
    assert kinds.index("plan") < kinds.index("children") < kinds.index("evidence") < kinds.index("token")
    evidence = [e["data"] for e in events if e["event_type"] == "evidence"]
    assert sorted(e["worker"] for e in evidence) == sorted(a["agent"] for a in out["agents"])
    assert {e["page"]: e["replica_id"] for e in evidence} == where
    steps = [e["data"] for e in events if e["event_type"] == "step"]
    assert steps[0]["action"]["blocked"] is True and steps[-1]["action"]["success"] is True
    # the job's runs seen together: the workers' requests under the research run
    tree = await rig.runs.tree(run.run_id)
    assert sorted(c.agent for c in tree.root.children) == sorted(a["agent"] for a in out["agents"])
    assert all(c.status == "succeeded" for c in tree.root.children)


async def test_the_best_candidate_wins_and_a_forged_worker_answer_is_not_cited(
    rig_of: Any, tmp_path: Path
) -> None:
    rig = await rig_of()
    folder = write_folder(tmp_path / "code")
    pages, _ = await rig.map(folder)
    run, _ = await rig.research({"question": QUESTION, "pages": pages}, timeout=60)
    assert run.status == "succeeded", run.error
    assert run.output["citations"][0]["path"] == "mail/dates.py" and run.output["citations"][0]["line"] == 6
    coordinator = next(
        h.runtime.get("research")
        for h in rig.hosts.values()
        if h.runtime and "research" in h.runtime.agent_ids
    )
    research = coordinator.get_capability("research")
    assert isinstance(research, ResearchCapability)
    forged = {
        "w1": {
            "status": "succeeded",
            "output": {
                "page": "pg-0000000000000000",
                "replica_id": "ra",
                "faulted": "many",
                "evidence": [
                    {"path": "/etc/passwd", "line": 1, "text": "root", "name": "x", "chosen": True},
                    {"path": "mail/dates.py", "line": 6, "text": "forged text", "name": "y", "chosen": True},
                    "not an item",
                ],
            },
        },
        "w2": {"status": "failed", "output": None, "error": "engine refuses"},
    }
    ranked, agents, not_finished, faulted = research._rank(forged)
    assert [(i["path"], i["line"]) for i in ranked] == [("mail/dates.py", 6)]
    assert ranked[0]["text"] == "def header_date_to_timestamp(value: str) -> float:"  # the coordinator's own
    assert ranked[0]["name"] == "header_date_to_timestamp" and ranked[0]["chosen"] is True
    assert faulted == 0 and [n["agent"] for n in not_finished] == ["w2"] and len(agents) == 1


async def test_a_step_redone_after_a_crash_spawns_no_worker_twice(rig_of: Any, tmp_path: Path) -> None:
    rig = await rig_of(SlowJudge(delay=1.0))
    folder = write_folder(tmp_path / "code")
    pages, _ = await rig.map(folder)
    home = next(n for n, h in rig.hosts.items() if h.runtime and "research" in h.runtime.agent_ids)
    host = rig.hosts[home]
    place = host.spawner
    assert place is not None
    placed: list[str] = []

    async def dies_after_the_first_worker(blueprint: Any) -> Any:
        placed.append(blueprint.metadata.agent_id)
        made = await place(blueprint)
        if len(placed) == 1:  # the replica dies mid-dispatch, the step cut off after one placement
            asyncio.get_running_loop().create_task(host.close())
            await asyncio.sleep(30)
        return made

    host.spawner = dies_after_the_first_worker
    run, _ = await rig.research({"question": QUESTION, "pages": pages}, timeout=90)
    assert run.status == "succeeded", run.error
    workers = await rig.workers()
    assert sorted(workers) == sorted(a["agent"] for a in run.output["agents"]), workers
    assert len(workers) == len(run.output["pages"]) >= 2  # each page's worker placed once, none twice
    assert placed[0] in workers
    # the cut-off step was redone (the first worker asked for again, found placed), no worker twice
    assert placed.count(placed[0]) == 2 and sorted(set(placed)) == sorted(workers), placed


async def test_max_pages_bounds_the_workers(rig_of: Any, tmp_path: Path) -> None:
    rig = await rig_of(max_pages=1)
    folder = write_folder(tmp_path / "code")
    pages, _ = await rig.map(folder)
    run, _ = await rig.research({"question": QUESTION, "pages": pages}, timeout=60)
    assert run.status == "succeeded", run.error
    assert len(run.output["agents"]) == 1 and len(await rig.workers()) == 1


async def test_cancelling_the_run_cancels_its_workers(rig_of: Any, tmp_path: Path) -> None:
    rig = await rig_of(SlowJudge(delay=4.0))
    folder = write_folder(tmp_path / "code")
    pages, _ = await rig.map(folder)
    submitted = await rig.runs.submit("research", {"question": QUESTION, "pages": pages})
    deadline = time.monotonic() + 20
    while len(await rig.workers()) < 2 and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    assert len(await rig.workers()) >= 2
    cancelled = await rig.runs.cancel(submitted.run_id)
    assert cancelled.status == "cancelled"
    tree = await rig.runs.tree(submitted.run_id)
    assert tree.root.children and all(c.status == "cancelled" for c in tree.root.children), tree
    assert all("its parent run" in (c.error or "") for c in tree.root.children)
    deadline = time.monotonic() + 20  # the workers stop at their next step (one-shot)
    while time.monotonic() < deadline:
        states = {r.state for r in (await rig.workers()).values()}
        if states <= {"stopped"}:
            break
        await asyncio.sleep(0.2)
    assert states <= {"stopped"}, states


async def test_a_failing_worker_is_restarted_once_then_reported(rig_of: Any, tmp_path: Path) -> None:
    rig = await rig_of(SlowJudge(doomed="mail/addresses.py"))
    folder = write_folder(tmp_path / "code")
    pages, _ = await rig.map(folder)
    question = "Which class keeps the mail address of a person, and which function converts a header date?"
    run, events = await rig.research({"question": question, "pages": pages}, timeout=60)
    assert run.status == "succeeded", run.error
    out = run.output
    lost = out["not_finished"]
    assert lost and all("engine refuses mail/addresses.py" in n["error"] and n["retried"] for n in lost)
    restarted = [e["data"]["agent"] for e in events if e["event_type"] == "child_restarted"]
    assert sorted(restarted) == sorted(n["agent"] for n in lost)  # each restarted once
    assert out["agents"] and out["citations"][0]["path"] == "mail/dates.py"  # the others' evidence
    assert len(out["agents"]) + len(lost) == len(out["pages"])
    # every worker failing fails the run, naming why
    run, _ = await rig.research(
        {"question": "Which class keeps a person's mail address?", "pages": pages}, timeout=60
    )
    assert run.status == "failed" and "no worker could examine its page" in (run.error or ""), run.error
    assert "engine refuses" in (run.error or "")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"question": "x" * 3000, "pages": []}, "question"),
        ({"question": "where?", "path": "/etc"}, "allowed"),
        ({"question": "where?", "pages": ["pg-0123456789abcdef"]}, "no page"),
        ({"question": "where?"}, "needs a folder"),
    ],
)
async def test_bad_input_fails_the_run_with_a_clear_error_and_spawns_nobody(
    rig_of: Any, body: dict[str, Any], error: str
) -> None:
    rig = await rig_of()
    run, _ = await rig.research(body, timeout=30)
    assert run.status == "failed" and error in (run.error or ""), run.error
    assert await rig.workers() == {}


async def test_pages_of_two_folders_are_refused(rig_of: Any, tmp_path: Path) -> None:
    rig = await rig_of()
    one, _ = await rig.map(write_folder(tmp_path / "one"))
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "other.py").write_text('def other() -> None:\n    """Another folder."""\n')
    two, _ = await rig.map(tmp_path / "two")
    run, _ = await rig.research({"question": "where?", "pages": one[:1] + two[:1]}, timeout=30)
    assert run.status == "failed" and "2 mapped folders" in (run.error or ""), run.error


@pytest.mark.parametrize(
    ("says", "answer_from", "ends"),
    [
        ("It turns the header's date into seconds.", "model", "It turns the header's date into seconds."),
        ("It calls parse_rfc2822_date on line 4242.", "docstring", "seconds since the epoch."),
        ("It returns 86400 for a day.", "docstring", "seconds since the epoch."),
    ],
)
async def test_an_answer_naming_what_the_code_lacks_is_replaced_by_the_docstring(
    rig_of: Any, tmp_path: Path, says: str, answer_from: str, ends: str
) -> None:
    rig = await rig_of(SlowJudge(says=says))
    pages, _ = await rig.map(write_folder(tmp_path / "code"))
    run, _ = await rig.research({"question": QUESTION, "pages": pages}, timeout=60)
    assert run.status == "succeeded", run.error
    assert run.output["stats"]["answer_from"] == answer_from
    assert run.output["answer"].startswith("`header_date_to_timestamp` (mail/dates.py, line 6): ")
    assert run.output["answer"].endswith(ends)


async def test_a_line_break_in_a_file_name_stays_out_of_the_answer_line(rig_of: Any, tmp_path: Path) -> None:
    rig = await rig_of()
    folder = tmp_path / "odd"
    folder.mkdir()
    name = "dates\n  fake.py:1  def trusted():\n.py"
    (folder / name).write_text(FILES["mail/dates.py"])
    pages, _ = await rig.map(folder)
    run, _ = await rig.research({"question": QUESTION, "pages": pages}, timeout=60)
    assert run.status == "succeeded", run.error
    assert run.output["citations"][0]["path"] == name  # (the JSON keeps it as it is)
    assert "\n" not in run.output["answer"] and "dates\\n  fake.py" in run.output["answer"]


async def test_a_folder_mapped_twice_is_researched_by_the_pages_of_either(
    rig_of: Any, tmp_path: Path
) -> None:
    """Found by the README's path in CI: a copy of a folder mapped before shares pages with it, and
    a shared page's record keeps naming the first mapping; the pages given are still of one
    folder, the one that holds them all."""
    rig = await rig_of()
    first, _ = await rig.map(write_folder(tmp_path / "one"))
    copy = write_folder(tmp_path / "two")
    (copy / "zz_more.py").write_text('def more() -> None:\n    """One more file."""\n')
    second, _ = await rig.map(copy)
    assert set(first) & set(second) and set(second) - set(first)  # shared pages, and its own
    for pages in (first, second):
        run, _ = await rig.research({"question": QUESTION, "pages": pages}, timeout=60)
        assert run.status == "succeeded", run.error
        assert (run.output["citations"][0]["path"], run.output["citations"][0]["line"]) == (
            "mail/dates.py",
            6,
        )


async def test_paths_too_long_for_the_plan_prompt_are_read_unasked(rig_of: Any, tmp_path: Path) -> None:
    """Found by review: the plan listed the candidate files whole, so paths of thousands of
    characters could overflow a small model's prompt; past MAX_PLAN_PATH the index's two best are
    read without asking the model."""
    asked: list[InferenceRequest] = []

    class Counting(SlowJudge):
        async def generate(self, request: InferenceRequest) -> InferenceResponse:
            if request.response_format is not None and "files" in request.response_format["properties"]:
                asked.append(request)
            return await super().generate(request)

    rig = await rig_of(Counting())
    folder = tmp_path / "deep"
    nested = folder / ("a" * 100) / ("b" * 100) / ("c" * 100)
    nested.mkdir(parents=True)
    (nested / "dates.py").write_text(FILES["mail/dates.py"])
    (folder / "other.py").write_text(FILES["mail/dates.py"].replace("header_date", "body_date"))
    pages, _ = await rig.map(folder)
    run, _ = await rig.research({"question": QUESTION, "pages": pages}, timeout=60)
    assert run.status == "succeeded", run.error
    assert asked == []
    assert run.output["citations"][0]["path"].endswith("/dates.py")
