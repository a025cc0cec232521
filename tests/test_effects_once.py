"""Effects once (issue 34, M16 deliverable 2): every built-in action that declares an effect derives
what it creates from its idempotency key, so the action redone after a crash between its effect and
its `done` record finds the effect made. A kill test per action, on a real redis-server, with real
agents (a replica host and a control plane where the action places agents): the `done` record's
append fails as Redis going away would (`BlackboardUnavailable`), the host drops that copy of the
agent without a write and restores it from Redis, and the restored copy redoes the step, running
the action again under the same key. Then the effects are counted: no duplicates.

Actions that declare no effect are at-least-once: their re-run is counted by
`colony_action_reruns_total{effects="none"}`, only when they really ran before. docs/effects.md
lists every built-in action's guarantee; a test keeps the table true to the declared effects.
(The block tools' kill tests are in their own file.)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import pkgutil
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import colony
from colony import metrics
from colony.agents import (
    Agent,
    AgentBlueprint,
    AgentMetadata,
    LocalAgentRuntime,
    RunStatus,
    ScriptedActionPolicy,
)
from colony.agents.actions import ACTION_ATTR
from colony.agents.capability import AgentCapability
from colony.agents.hooks import HookType, Pointcut
from colony.agents.state import action_log
from colony.agents.state.action_log import LOG_KEY, ActionLog, parse_records
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentRunProtocol
from colony.config import ColonySettings, ServeSettings, VcmSettings
from colony.context.sessions import SESSION_ROLE, SessionStore, is_session_id, new_session_id
from colony.errors import BlackboardUnavailable
from colony.inference.scripted import ScriptedEngine
from colony.memory.capability import MemoryCapability
from colony.memory.shared import SharedMemoryCapability, SharedScopes, shared_scope_id
from colony.memory.shared_tools import SharedMemoryToolsCapability
from colony.memory.store import MemoryStore
from colony.memory.tools import MemoryToolsCapability, entry_id_for
from colony.memory.types import NewMemory
from colony.run_display import AnalyzeProgress
from colony.system.analyze import analyze_blueprint
from colony.system.builtin import (
    RUNS_NAMESPACE,
    session_blueprint,
    session_id_for,
    session_starter_blueprint,
    single_echo_blueprint,
)
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.runs import RunService
from colony.vcm import PageSource

DOC = Path(__file__).resolve().parents[1] / "docs" / "effects.md"


# -- the crash ---------------------------------------------------------------------------------


def crash_before_done(monkeypatch: pytest.MonkeyPatch, action: str, times: int = 1) -> dict[str, int]:
    """The first `times` appends of a `done` record of `action` fail as if Redis went away (the
    effect is made, its result is not recorded): the host drops that copy and redoes the step."""
    crashes = {"count": 0}
    original = ActionLog._append

    async def append(self: ActionLog, records: list[Any]) -> None:
        if crashes["count"] < times and any(
            r.kind == "action" and r.status == "done" and r.action == action for r in records
        ):
            crashes["count"] += 1
            raise BlackboardUnavailable("append (simulated crash before the done record)", "redis://test")
        await original(self, records)

    monkeypatch.setattr(ActionLog, "_append", append)
    return crashes


def reruns(action: str, effects: str) -> float:
    return metrics.ACTION_RERUNS.labels(action=action, effects=effects)._value.get()


# -- on a replica host with a control plane ----------------------------------------------------


@contextlib.asynccontextmanager
async def replica(bb: Blackboard, redis_url: str, tmp_path: Path, engine: Any = None) -> AsyncIterator[Any]:
    settings = ColonySettings(
        vcm=VcmSettings(allowed_roots=[tmp_path]),
        redis_url=redis_url,
        colony_id=f"eo{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=16),
    )
    host = ReplicaHost(settings, "ra", engine=engine or ScriptedEngine(["It keeps recent items."]))
    control = ControlPlane(bb, {"ra": host}, settings)
    host.spawner = control.place
    runs = RunService(bb, control.registry, colony_id=settings.colony_id, settings=settings)
    await host.start(bb)
    control.start()
    try:
        yield SimpleNamespace(host=host, control=control, runs=runs, colony_id=settings.colony_id)
    finally:
        await control.close()
        await host.close()


async def finished(runs: RunService, run_id: str, timeout: float = 60) -> tuple[Any, list[dict[str, Any]]]:
    """The run once it ended, and its events."""
    events: list[dict[str, Any]] = []

    async def stream() -> None:
        async for _, event in runs.events(run_id):
            events.append(event)

    await asyncio.wait_for(stream(), timeout)
    return await runs.get(run_id), events


async def agents_of_role(rig: Any, role: str) -> list[str]:
    return [r.agent_id for r in await rig.control.registry.list() if r.role == role]


async def test_start_session_redone_after_placing_its_agent_starts_one_session(
    bb: Blackboard, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with replica(bb, redis_url, tmp_path) as rig:
        await rig.control.place(session_starter_blueprint())
        crashes = crash_before_done(monkeypatch, "start_session")
        reran = reruns("start_session", "declared")
        submitted = await rig.runs.submit("session", {})
        run, _ = await finished(rig.runs, submitted.run_id)

        assert crashes["count"] == 1 and reruns("start_session", "declared") == reran + 1
        assert run.status == "succeeded", run.error
        session_id = run.output["session_id"]
        assert await agents_of_role(rig, SESSION_ROLE) == [session_id]  # one session agent, not two
        hosted = [a for a in rig.host.runtime.agent_ids if a.startswith("session-")]
        assert hosted == [session_id]
        store = SessionStore.of(bb, session_id, tenant_id="default", colony_id=rig.colony_id)
        assert (await store.head()).branches == {}  # its tree, empty, created once
        starter = rig.host.runtime.get("session")
        outside = {session_id_for(starter) for _ in range(2)}  # outside an action: fresh ids
        assert len(outside) == 2 and all(is_session_id(s) for s in outside)


async def test_analyze_redone_after_dispatching_places_and_asks_each_worker_once(
    bb: Blackboard, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with replica(bb, redis_url, tmp_path) as rig:
        pages = await mapped_pages(rig, tmp_path)
        await rig.control.place(analyze_blueprint())
        crashes = crash_before_done(monkeypatch, "analyze")
        submitted = await rig.runs.submit("analyze", {"pages": pages})
        run, events = await finished(rig.runs, submitted.run_id)

        assert crashes["count"] == 1
        assert run.status == "succeeded", run.error
        workers = await agents_of_role(rig, "page-worker")
        assert sorted(run.output["workers"]) == workers and len(workers) == len(pages)  # not 2 sets
        for worker in workers:  # each asked once
            assert len(await requests_of(bb, rig.colony_id, worker)) == 1, worker
        done = [e["data"]["worker"] for e in events if e["event_type"] == "worker_done"]
        assert sorted(done) == workers
        # `colony run`'s progress line: the restart takes the first `workers` event back, the
        # redone dispatch lists the same workers, whose reports (made once) count again
        assert "restarted" in [e["event_type"] for e in events]
        progress = AnalyzeProgress(live=False, started=0.0, active=True)
        for event in events:
            progress.feed(event, 0.0)
        assert progress.line(0.0).startswith(f"analyzing: {len(workers)}/{len(workers)} workers done,")


async def test_summarize_pages_redone_after_reporting_reports_once(
    bb: Blackboard, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with replica(bb, redis_url, tmp_path) as rig:
        pages = await mapped_pages(rig, tmp_path)
        await rig.control.place(analyze_blueprint())
        crashes = crash_before_done(monkeypatch, "summarize_pages", times=len(pages))
        submitted = await rig.runs.submit("analyze", {"pages": pages})
        run, events = await finished(rig.runs, submitted.run_id)

        assert crashes["count"] == len(pages)  # every worker cut off after its report, redone
        assert run.status == "succeeded", run.error
        done = [e["data"]["worker"] for e in events if e["event_type"] == "worker_done"]
        assert sorted(done) == sorted(run.output["workers"])  # one report per worker
        board = coordinator_runs_board(bb, rig.colony_id)
        for worker in run.output["workers"]:
            key = AgentRunProtocol.child_event_key(submitted.run_id, worker, "worker_done")
            assert (await board.read(key)).version == 1  # written once, never over


async def mapped_pages(rig: Any, tmp_path: Path) -> list[str]:
    folder = tmp_path / "src"
    folder.mkdir()
    body = "".join(f"\n\ndef step_{i}(x):\n    return x + {i}\n" for i in range(12))
    (folder / "a.py").write_text('"""Alpha: keeps recent items."""\n' + body)
    (folder / "b.py").write_text('"""Beta: deadlines."""\n' + body)
    source = PageSource(folder, allowed_roots=[tmp_path], page_tokens=128)
    pages = (await rig.host.pages.map_source(source)).page_ids
    assert 2 <= len(pages) <= 6
    return pages


def coordinator_runs_board(bb: Blackboard, colony_id: str, agent_id: str = "analyze") -> Blackboard:
    base = scope_id(BlackboardScope.AGENT, tenant_id="default", colony_id=colony_id, agent_id=agent_id)
    return bb.scoped(AgentRunProtocol.namespaced_scope(base, RUNS_NAMESPACE))


async def requests_of(bb: Blackboard, colony_id: str, agent_id: str) -> list[str]:
    board = coordinator_runs_board(bb, colony_id, agent_id)
    return [e.key async for e in board.iter_query(AgentRunProtocol.pattern("request"))]


async def test_session_turn_actions_redone_after_storing_store_each_message_once(
    bb: Blackboard, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replies = iter(["the answer", "a second answer"])
    async with replica(bb, redis_url, tmp_path, ScriptedEngine(lambda request: next(replies))) as rig:
        session_id = new_session_id()
        await rig.control.place(session_blueprint(session_id))
        crashes = [
            crash_before_done(monkeypatch, "handle_user_message"),
            crash_before_done(monkeypatch, "respond_to_user"),
        ]
        submitted = await rig.runs.submit(session_id, {"message": "pay the invoice"})
        run, _ = await finished(rig.runs, submitted.run_id)

        assert [c["count"] for c in crashes] == [1, 1]
        assert run.status == "succeeded", run.error
        store = SessionStore.of(bb, session_id, tenant_id="default", colony_id=rig.colony_id)
        _, everything = await store.all_messages()
        assert [(m.role, m.content) for m in everything] == [
            ("user", "pay the invoice"),
            ("assistant", "the answer"),
        ]


# -- memory actions, on a local runtime --------------------------------------------------------


GROUNDED_SUMMARIES = [
    "The user lives in Lyon and owns a red bicycle.",
    "The user owns a red bicycle and lives in Lyon.",
    "The user lives in Lyon.",
    "The user owns a red bicycle.",
]


@pytest.fixture
async def local(bb: Blackboard, redis_url: str) -> AsyncIterator[tuple[LocalAgentRuntime, ScriptedEngine]]:
    # each call reads otherwise (a redo's summary differs) and is grounded in the notes it summarises
    # (a summary its sources do not back is not stored: colony.memory.transformers)
    summaries = iter(GROUNDED_SUMMARIES)
    engine = ScriptedEngine(lambda request: next(summaries))
    settings = ColonySettings(redis_url=redis_url)
    rt = LocalAgentRuntime(bb, colony_id=f"m{uuid.uuid4().hex[:10]}", engine=engine, settings=settings)
    yield rt, engine
    await rt.shutdown()


def memory_agent(agent_id: str, steps: list[dict[str, Any]]) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id),
        capabilities=[
            MemoryCapability.bind(level="working"),
            MemoryCapability.bind(level="ltm:semantic"),
            MemoryToolsCapability.bind(),
        ],
        action_policy=ScriptedActionPolicy.bind(steps=steps),
    )


def scope(agent: Agent, level: str) -> MemoryCapability:
    memories = [c for c in agent.capabilities.values() if isinstance(c, MemoryCapability)]
    return next(c for c in memories if c.scope_type == level)


async def entries(agent: Agent, level: str) -> list[Any]:
    memory = scope(agent, level)
    return await memory.store.entries(memory.memory_scope)


async def run_cut_before_done(
    monkeypatch: pytest.MonkeyPatch,
    runtime: LocalAgentRuntime,
    agent: Agent,
    action: str,
    input_data: Any = None,
) -> Any:
    crashes = crash_before_done(monkeypatch, action)
    reran = reruns(action, "declared")
    run = await runtime.start_run(agent.agent_id, input_data)
    done = await runtime.wait_for_run(agent.agent_id, run.run_id, timeout=30)
    assert crashes["count"] == 1 and reruns(action, "declared") == reran + 1  # it did run again
    assert done.status is RunStatus.SUCCEEDED, done.error
    return done


@pytest.mark.parametrize("action", ["remember", "remember_message"])
async def test_remember_redone_after_storing_stores_one_entry_and_says_so(
    local: tuple[LocalAgentRuntime, ScriptedEngine], monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    runtime, _engine = local
    fact = "The invoice of March is due on Friday."
    parameters = {"fact": fact} if action == "remember" else {}
    agent = await runtime.spawn(memory_agent(f"mem-{action}", [{"action": action, "parameters": parameters}]))
    done = await run_cut_before_done(monkeypatch, runtime, agent, action, {"task": fact})

    stored = await entries(agent, "ltm:semantic")
    assert [e.content for e in stored] == [fact]
    # the redo answers as the cut-off call would have: the entry is the one this call stored
    assert done.output == {"entry_id": stored[0].entry_id, "stored": True, "duplicate_of": None}


async def test_share_memory_redone_after_storing_shares_one_entry_and_says_so(
    local: tuple[LocalAgentRuntime, ScriptedEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, _engine = local
    store = MemoryStore(runtime.blackboard, ColonySettings())
    await SharedScopes(store, colony_id=runtime.colony_id).define("task:t1", writers=["*"])
    fact = "The staging cluster is back after the outage."
    agent = await runtime.spawn(
        AgentBlueprint(
            agent_class=Agent,
            metadata=AgentMetadata(agent_id="sharer"),
            capabilities=[SharedMemoryCapability.bind(name="task:t1"), SharedMemoryToolsCapability.bind()],
            action_policy=ScriptedActionPolicy.bind(
                steps=[{"action": "share_memory", "parameters": {"fact": fact}}]
            ),
        )
    )
    done = await run_cut_before_done(monkeypatch, runtime, agent, "share_memory", {"task": "report"})
    held = await store.entries(shared_scope_id("task:t1", colony_id=runtime.colony_id))
    assert [e.content for e in held] == [fact]
    assert done.output == {
        "scope": "task:t1",
        "entry_id": held[0].entry_id,
        "shared": True,
        "duplicate_of": None,
    }


async def test_a_re_executed_step_that_remembers_another_text_stores_it(
    local: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """A step re-executed after an undo keeps its idempotency key; memory is not part of a
    checkpoint, so what the redone call remembers must not be taken for the first call's entry
    when it says something else (simulated: two calls under one key, with other texts)."""
    runtime, _engine = local
    agent = await runtime.spawn(memory_agent("mem-redo-other", []))
    tools = next(c for c in agent.capabilities.values() if isinstance(c, MemoryToolsCapability))
    token = action_log._IDEMPOTENCY_KEY.set("run-abc:3:a0")
    try:
        first = await tools._remember("The meeting is on Monday.", None)
        again = await tools._remember("The meeting is on Monday.", None)
        other = await tools._remember("The meeting moved to Thursday.", None)
    finally:
        action_log._IDEMPOTENCY_KEY.reset(token)
    contents = sorted(e.content for e in await entries(agent, "ltm:semantic"))
    assert contents == ["The meeting is on Monday.", "The meeting moved to Thursday."]
    assert first["stored"] and again == first  # the same text: the redo finds its entry
    assert other["stored"] and other["entry_id"] != first["entry_id"]


async def test_remember_of_a_fact_held_before_is_still_a_duplicate(
    local: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """The derived id does not hide real duplicates: a fact another call stored is reported held."""
    runtime, _engine = local
    fact = "The invoice of March is due on Friday."
    step = {"action": "remember", "parameters": {"fact": fact}}
    agent = await runtime.spawn(memory_agent("mem-twice", [step, step]))
    run = await runtime.start_run("mem-twice", None)
    done = await runtime.wait_for_run("mem-twice", run.run_id, timeout=30)
    assert done.status is RunStatus.SUCCEEDED, done.error
    (entry,) = await entries(agent, "ltm:semantic")
    assert done.output == {"entry_id": entry.entry_id, "stored": False, "duplicate_of": entry.entry_id}
    assert entry_id_for("ltm") is None  # outside an action: the store picks the id, as before


async def test_consolidate_redone_after_storing_its_summary_stores_one_summary(
    local: tuple[LocalAgentRuntime, ScriptedEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redo's summary reads otherwise (the model is asked again): without the derived id it
    would be a second entry."""
    runtime, engine = local
    step = {"action": "consolidate", "parameters": {"source": "working", "target": "ltm:semantic"}}
    agent = await runtime.spawn(memory_agent("mem-consolidate", [step]))
    for text in ("The user lives in Lyon.", "The user owns a red bicycle."):
        await scope(agent, "working").write(NewMemory(content=text))
    done = await run_cut_before_done(monkeypatch, runtime, agent, "consolidate")

    summaries = [e for e in await entries(agent, "ltm:semantic") if e.kind == "summary"]
    assert len(engine.requests) == 2  # asked twice: the cut-off call and its redo
    assert [e.content for e in summaries] == [GROUNDED_SUMMARIES[0]]  # stored once
    assert done.output == {"consolidated": 2, "entries": [summaries[0].entry_id]}


async def test_forget_redone_after_deleting_deletes_nothing_else(
    local: tuple[LocalAgentRuntime, ScriptedEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, _engine = local
    step = {"action": "forget", "parameters": {"entry_id": "old-address", "scope": "ltm:semantic"}}
    agent = await runtime.spawn(memory_agent("mem-forget", [step]))
    semantic = scope(agent, "ltm:semantic")
    await semantic.write(NewMemory(content="The old address was Rue Neuve.", entry_id="old-address"))
    await semantic.write(NewMemory(content="The new address is Rue Haute.", entry_id="new-address"))
    await run_cut_before_done(monkeypatch, runtime, agent, "forget")
    assert [e.entry_id for e in await entries(agent, "ltm:semantic")] == ["new-address"]


# -- actions that declare no effect: at-least-once, their re-runs counted ----------------------


async def test_a_no_effect_action_re_run_by_a_redone_step_is_counted_only_when_it_ran(
    local: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """`echo` declares no effect: its result waits for the step's persist. A crash after it ran
    (its start mark stored) redoes the step and runs it again: counted. A crash before it ran
    redoes the step too: not counted (it runs for the first time). A run without a crash: not
    counted."""
    runtime, _engine = local

    async def run_with(agent_id: str, hook: HookType | None) -> float:
        agent = await runtime.spawn(single_echo_blueprint(agent_id))
        crashed = asyncio.Event()
        if hook is not None:

            async def crash(ctx: Any, *result: Any) -> None:
                if not crashed.is_set():
                    crashed.set()
                    while hook is HookType.AFTER and not [  # noqa: ASYNC110
                        r for r in parse_records(await agent.blackboard.ring(LOG_KEY)) if r.action == "echo"
                    ]:
                        await asyncio.sleep(0.005)  # the mark is in Redis (it is stored in the background)
                    raise BlackboardUnavailable("persist (simulated crash)", "redis://test")

            agent.hooks.register(Pointcut.pattern("ActionDispatcher.dispatch"), hook, crash)
        before = reruns("echo", "none")
        run = await runtime.start_run(agent_id, "hello")
        done = await runtime.wait_for_run(agent_id, run.run_id, timeout=30)
        assert done.status is RunStatus.SUCCEEDED and done.output == "hello", done.error
        assert crashed.is_set() == (hook is not None)
        return reruns("echo", "none") - before

    assert await run_with("echo-after", HookType.AFTER) == 1
    assert await run_with("echo-before", HookType.BEFORE) == 0
    assert await run_with("echo-calm", None) == 0


# -- docs/effects.md is true to the declared effects -------------------------------------------


def builtin_actions() -> dict[tuple[str, str], tuple[str, ...]]:
    """(capability class, action) -> declared effects, for every action of a capability in colony."""
    for module in pkgutil.walk_packages(colony.__path__, "colony."):
        importlib.import_module(module.name)
    found: dict[tuple[str, str], tuple[str, ...]] = {}
    pending = list(AgentCapability.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if not cls.__module__.startswith("colony."):
            continue
        for attr in dir(cls):
            options = getattr(getattr(cls, attr, None), ACTION_ATTR, None)
            if options is not None:
                found[(cls.__name__, options.name or attr)] = options.effects
    return found


def documented() -> dict[tuple[str, str], tuple[tuple[str, ...], str]]:
    """The table of docs/effects.md: (capability, action) -> (effects, guarantee)."""
    rows: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {}
    row = re.compile(r"^\| `(\w+)` \| `(\w+)` \| ([^|]+) \| ([^|]+) \|$")
    for line in DOC.read_text().splitlines():
        if (m := row.match(line)) is not None:
            effects = tuple(re.findall(r"`(\w+)`", m[3])) if m[3].strip() != "none" else ()
            rows[(m[2], m[1])] = (effects, m[4].strip())
    return rows


def test_the_effects_table_lists_every_builtin_action_with_its_effects_and_guarantee() -> None:
    actions, table = builtin_actions(), documented()
    assert any(effects for effects in actions.values()) and len(table) >= len(actions) > 10
    missing = sorted(f"{cap}.{name}" for cap, name in set(actions) - set(table))
    assert not missing, f"docs/effects.md lacks a row for {missing}"
    stale = sorted(f"{cap}.{name}" for cap, name in set(table) - set(actions))
    assert not stale, f"docs/effects.md lists actions that do not exist: {stale}"
    for key, effects in actions.items():
        listed, guarantee = table[key]
        assert listed == effects, f"{key}: the table says {listed}, the action declares {effects}"
        expected = "once" if effects else "at-least-once"
        assert guarantee.split(":")[0].split(" ")[0] == expected, f"{key}: {guarantee!r}"


async def test_a_mark_that_lands_after_the_result_never_hides_it(
    local: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """The mark is stored in the background: it may reach the log after the action's result (an
    action that never waits, `echo`). Read back, the result stands, so a redo would replay it."""
    runtime, _engine = local
    agent = await runtime.spawn(single_echo_blueprint("echo-late"))
    run = await runtime.start_run("echo-late", "hello")
    assert (await runtime.wait_for_run("echo-late", run.run_id, timeout=30)).status is RunStatus.SUCCEEDED
    stored = parse_records(await agent.blackboard.ring(LOG_KEY))
    done = next(r for r in stored if r.kind == "action" and r.status == "done")
    late = done.model_copy(update={"status": "started", "result": None, "state": None})
    async with agent.blackboard.transaction() as tx:
        tx.ring_push(LOG_KEY, [late.model_dump(mode="json", exclude_none=True)], 100)
    await runtime.drop("echo-late")
    restored = await runtime.resume("echo-late")
    assert [(r.key, r.status) for r in await restored.action_log.records() if r.kind == "action"] == [
        (done.key, "done")
    ]
