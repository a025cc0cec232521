"""The write-ahead action log (issue #17) on a real redis-server: an agent dropped in the crash
window (its actions done and recorded, the step not persisted) is restored and neither calls the
model again nor runs a finished action again; an action cut off while it ran runs again once, with
the same idempotency key; `truncate_after`, `step_calls`, one run per log, bounded and validated
records, and the fence that keeps a superseded copy of an agent from recording anything.

The actions count their executions in Redis (INCR), so "ran once" is what Redis saw, not what the
agent believes. A hook on the dispatcher holds the first copy of the agent after the dispatch
returned (so its result is recorded but the step is not persisted) until the test drops it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agent_kit import CounterCapability, counter_blueprint

from colony import metrics
from colony.agents import (
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    AgentRun,
    LocalAgentRuntime,
    RunStatus,
    action_executor,
)
from colony.agents.actions import discover_actions
from colony.agents.hooks import HookType, Pointcut
from colony.agents.policy import ActionPolicyExecutionState, ActionPolicyIterationResult
from colony.agents.state.action_log import (
    LOG_KEY,
    MAX_RECORD_BYTES,
    current_idempotency_key,
    parse_records,
)
from colony.blackboard import Blackboard
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import load_settings
from colony.errors import AgentUsageError
from colony.inference import ChatMessage, InferenceRequest, InferenceResponse
from colony.inference.scripted import ScriptedEngine
from colony.planning.codegen import CodeGenerationActionPolicy
from colony.planning.policies import EventDrivenActionPolicy

# item -> what the first execution of `book(item)` does after counting: "hang" (cut off while
# it runs) or "huge" (an output larger than the log keeps). Process-local: only the first copy sees it.
ONCE: dict[str, str] = {}


class Ledger(AgentCapability):
    """Books items: each execution is counted in Redis with the idempotency key it ran under."""

    def _key(self, what: str, item: str) -> str:
        assert self.agent is not None
        return f"{self.agent.scope_id}:test:{what}:{item}"

    @action_executor(effects=("external",))
    async def book(self, item: str) -> dict[str, Any]:
        """Book `item` (an external effect, counted)."""
        redis = self.blackboard.redis
        count = await redis.incr(self._key("count", item))
        await redis.rpush(self._key("keys", item), current_idempotency_key() or "none")
        behaviour = ONCE.pop(f"{self.agent.agent_id}:{item}", None) if self.agent else None
        if behaviour == "hang":
            await asyncio.sleep(3600)  # cut off here: started, never finished
        if behaviour == "huge":
            return {"item": item, "blob": "x" * (MAX_RECORD_BYTES + 10)}
        return {"item": item, "count": count}

    @action_executor()
    async def look(self, item: str) -> int:
        """Read how often `item` was booked (no effect)."""
        return int(await self.blackboard.redis.get(self._key("count", item)) or 0)


class BatchPolicy(EventDrivenActionPolicy):
    """Each step asks the model which items to book (a JSON list) and books them all in that one
    step; an empty list ends the run with every booking's output."""

    def __init__(self, agent: Agent | None = None, *, engine: Any = None) -> None:
        super().__init__(agent)
        self.engine = engine
        self.booked: list[Any] = []

    async def execute_iteration(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult:
        request = InferenceRequest(
            messages=[
                ChatMessage(role="system", content="List the items to book next as JSON."),
                ChatMessage(role="user", content=f"step {state.step}"),
            ],
            max_tokens=32,
        )
        items = json.loads((await self.generate(self.engine, request)).text)
        if not items:
            return ActionPolicyIterationResult(done=True, output=self.booked)
        for item in items:
            result = await self.dispatch("book", {"item": item})
            self.booked.append(result.output if result.success else {"error": result.error})
        return ActionPolicyIterationResult(action="book", parameters={"items": items})

    def on_run_start(self, run: Any) -> None:
        super().on_run_start(run)
        self.booked = []

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "booked": self.booked}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.booked = list(state.get("booked") or [])


PLAN = {"step 0": ["a", "b", "c"], "step 1": ["d"]}


def planner(request: InferenceRequest) -> str:
    return json.dumps(PLAN.get(request.messages[-1].content, []))


def blueprint(agent_id: str) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, role="booker"),
        capabilities=[Ledger.bind()],
        action_policy=BatchPolicy.bind(),
    )


@pytest.fixture
async def host(bb: Blackboard) -> AsyncIterator[tuple[LocalAgentRuntime, ScriptedEngine]]:
    engine = ScriptedEngine(planner)
    rt = LocalAgentRuntime(bb, colony_id=f"c{uuid.uuid4().hex[:10]}", engine=engine, settings=load_settings())
    yield rt, engine
    await rt.shutdown()


async def counts(agent: Agent, items: str = "abcd") -> dict[str, int]:
    redis = agent.blackboard.redis
    return {i: int(await redis.get(f"{agent.scope_id}:test:count:{i}") or 0) for i in items}


async def keys_of(agent: Agent, item: str) -> list[str]:
    raw = await agent.blackboard.redis.lrange(f"{agent.scope_id}:test:keys:{item}", 0, -1)
    return [k.decode() if isinstance(k, bytes) else k for k in raw]


def hold_after_dispatch_of(agent: Agent, item: str) -> asyncio.Event:
    """Hold this copy of the agent once `book(item)` returned (result recorded, step not persisted)."""
    reached = asyncio.Event()

    async def hold(ctx: Any, result: Any) -> None:
        if ctx.args[:1] == ("book",) and (ctx.args[1] or {}).get("item") == item:
            reached.set()
            await asyncio.sleep(3600)

    agent.hooks.register(Pointcut.pattern("ActionDispatcher.dispatch"), HookType.AFTER, hold)
    return reached


def replays(kind: str, outcome: str) -> float:
    return metrics.ACTION_LOG_REPLAYS.labels(kind=kind, outcome=outcome)._value.get()


async def stored_run_steps(agent: Agent, run_id: str) -> int:
    return (await agent.blackboard.read(AgentStateProtocol.run_key(run_id))).value["steps"]


async def test_a_step_redone_after_the_crash_window_calls_neither_the_model_nor_the_actions_again(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    runtime, engine = host
    first = await runtime.spawn(blueprint("crash-window"))
    reached = hold_after_dispatch_of(first, "c")
    run = await runtime.start_run("crash-window", None)
    await asyncio.wait_for(reached.wait(), 10)
    assert await counts(first) == {"a": 1, "b": 1, "c": 1, "d": 0}
    assert len(engine.requests) == 1 and await stored_run_steps(first, run.run_id) == 0  # not persisted
    replayed_model, replayed_actions = replays("model", "replayed"), replays("action", "replayed")

    await runtime.drop("crash-window")  # nothing saved on the way out: the step is lost
    restored = await runtime.resume("crash-window")
    assert restored is not first
    done = await runtime.wait_for_run("crash-window", run.run_id, timeout=10)

    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await counts(restored) == {"a": 1, "b": 1, "c": 1, "d": 1}  # each ran exactly once
    # the redone step got the model's recorded answer: the model saw steps 0 (once), 1 and 2
    assert [r.messages[-1].content for r in engine.requests] == ["step 0", "step 1", "step 2"]
    assert replays("model", "replayed") == replayed_model + 1
    assert replays("action", "replayed") == replayed_actions + 3
    # ... and the recorded outputs, as the first copy saw them
    assert done.output == [{"item": i, "count": 1} for i in "abcd"]
    assert (await keys_of(restored, "a")) == [f"{run.run_id}:1:a0"]


async def test_an_action_cut_off_while_it_ran_runs_again_once_with_the_same_key(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    runtime, engine = host
    first = await runtime.spawn(blueprint("cut-off"))
    ONCE["cut-off:b"] = "hang"
    run = await runtime.start_run("cut-off", None)
    async with asyncio.timeout(10):
        while (await counts(first))["b"] < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    reexecuted = replays("action", "reexecuted")
    await runtime.drop("cut-off")
    restored = await runtime.resume("cut-off")
    done = await runtime.wait_for_run("cut-off", run.run_id, timeout=10)

    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await counts(restored) == {"a": 1, "b": 2, "c": 1, "d": 1}  # b: cut off, then once more
    assert await keys_of(restored, "b") == [f"{run.run_id}:1:a1"] * 2  # the same idempotency key
    assert replays("action", "reexecuted") == reexecuted + 1
    assert len(engine.requests) == 3  # steps 0, 1, 2: step 0's plan came from the log
    assert [o["item"] for o in done.output] == ["a", "b", "c", "d"]


class QuietLedger(Ledger):
    """The same bookings, declared without an effect."""

    @action_executor()
    async def book(self, item: str) -> dict[str, Any]:
        """Book `item` (declared with no effect)."""
        return await Ledger.book(self, item)


async def quiet_run_cut_at_b(runtime: LocalAgentRuntime, agent_id: str) -> tuple[Agent, Any]:
    """A QuietLedger agent whose first step booked `a` and hangs in `b`, b's start marked (the
    step not persisted)."""
    quiet = blueprint(agent_id).model_copy(update={"capabilities": [QuietLedger.bind()]})
    first = await runtime.spawn(quiet)
    ONCE[f"{agent_id}:b"] = "hang"
    run = await runtime.start_run(agent_id, None)
    async with asyncio.timeout(10):
        while (await counts(first))["b"] < 1 or len(  # noqa: ASYNC110
            [r for r in parse_records(await first.blackboard.ring(LOG_KEY)) if r.status == "started"]
        ) < 2:
            await asyncio.sleep(0.01)
    return first, run


def reruns(action: str, effects: str) -> float:
    return metrics.ACTION_RERUNS.labels(action=action, effects=effects)._value.get()


async def test_an_action_declaring_no_effect_is_marked_and_its_rerun_counted(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """An action that declares no effect gets a `started` mark, stored in the background while it
    runs (no round trip of the step waits for it), and its result goes with the step's persist
    (or the next commit). A step cut off before its persist is redone from its start: its
    actions that had run (a, done; b, cut off) run again under the same idempotency keys and
    are counted as re-runs (`colony_action_reruns_total{effects="none"}`); c, which had not
    started, is not counted. The model's answer is replayed."""
    runtime, engine = host
    first, run = await quiet_run_cut_at_b(runtime, "quiet-cut")
    stored = parse_records(await first.blackboard.ring(LOG_KEY))
    assert [(r.kind, r.status, r.n) for r in stored] == [
        ("model", "done", 0),
        ("action", "started", 0),  # a's mark (a's result is held for the persist)
        ("action", "started", 1),  # b's mark: b runs
    ]
    assert [c["success"] for c in first.action_log.step_calls(1)] == [True, None]  # in memory
    reran, reexecuted = reruns("book", "none"), replays("action", "reexecuted")
    await runtime.drop("quiet-cut")
    restored = await runtime.resume("quiet-cut")
    done = await runtime.wait_for_run("quiet-cut", run.run_id, timeout=10)

    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await counts(restored) == {"a": 2, "b": 2, "c": 1, "d": 1}  # step 1's actions again
    assert await keys_of(restored, "a") == [f"{run.run_id}:1:a0"] * 2
    assert await keys_of(restored, "b") == [f"{run.run_id}:1:a1"] * 2
    assert reruns("book", "none") == reran + 2  # a's and b's re-runs, not c's first run
    assert replays("action", "reexecuted") == reexecuted + 2
    assert len(engine.requests) == 3  # step 1's plan came from the log
    assert [o["item"] for o in done.output] == ["a", "b", "c", "d"]
    # every result of the finished run is stored: with the persists of their steps
    final = parse_records(await restored.blackboard.ring(LOG_KEY))
    actions = [r for r in final if r.kind == "action"]
    assert len({r.key for r in actions}) == 4
    assert all(any(r.key == k and r.status == "done" for r in actions) for k in {r.key for r in actions})


async def test_a_suspend_after_a_no_effect_action_stores_its_result_with_the_state_it_left(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """What a suspend persists agrees with itself: the held result goes with the capability state
    the action left, so the step redone after the resume replays it (the action is not run
    again)."""
    runtime, _engine = host
    first, run = await quiet_run_cut_at_b(runtime, "quiet-held")
    await runtime.suspend("quiet-held")  # cancels the step (b, cut off) and persists the agent
    stored = parse_records(await first.blackboard.ring(LOG_KEY))
    assert [(r.kind, r.status) for r in stored] == [
        ("model", "done"),
        ("action", "started"),  # a's and b's marks
        ("action", "started"),
        ("action", "done"),  # a's result, with the suspend's persist
    ]
    await runtime.resume("quiet-held")
    done = await runtime.wait_for_run("quiet-held", run.run_id, timeout=10)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert await counts(first) == {"a": 1, "b": 2, "c": 1, "d": 1}  # a replayed from the log


async def test_a_replayed_action_puts_its_capabilitys_state_back(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """The counter's total lives in its capability state, persisted with the step: a replayed
    `add` (not run again) must leave the total as the run that did it had it."""
    runtime, _engine = host
    steps = [{"action": "add", "parameters": {"amount": n}} for n in (5, 7, 11)]
    first = await runtime.spawn(counter_blueprint("counter", steps))
    reached = asyncio.Event()

    async def hold(ctx: Any, result: Any) -> None:
        if ctx.args[:2] == ("add", {"amount": 7}):
            reached.set()
            await asyncio.sleep(3600)

    first.hooks.register(Pointcut.pattern("ActionDispatcher.dispatch"), HookType.AFTER, hold)
    run = await runtime.start_run("counter", None)
    await asyncio.wait_for(reached.wait(), 10)
    await runtime.drop("counter")
    await runtime.resume("counter")
    done = await runtime.wait_for_run("counter", run.run_id, timeout=10)
    assert done.status is RunStatus.SUCCEEDED and done.output == 5 + 7 + 11
    record = next(
        r
        for r in parse_records(await first.blackboard.ring(LOG_KEY))
        if r.key == f"{run.run_id}:2:a0" and r.status == "done"
    )
    assert record.state == {"total": 12} and record.result["output"] == 12


async def test_a_generated_program_redone_after_the_crash_window_is_not_asked_for_again(
    bb: Blackboard,
) -> None:
    """Code generation: the model's program comes from the log, and its proxied calls (run in the
    sandbox) that had finished get their recorded results."""
    program = "```python\nrun('book', item='a')\nrun('book', item='b')\nrun('finish', answer='booked')\n```"
    engine = ScriptedEngine([program])
    runtime = LocalAgentRuntime(
        bb, colony_id=f"c{uuid.uuid4().hex[:10]}", engine=engine, settings=load_settings()
    )
    try:
        first = await runtime.spawn(
            AgentBlueprint(
                agent_class=Agent,
                metadata=AgentMetadata(agent_id="coder", role="booker"),
                capabilities=[Ledger.bind()],
                action_policy=CodeGenerationActionPolicy.bind(goals=["Book a and b."]),
            )
        )
        reached = hold_after_dispatch_of(first, "b")
        run = await runtime.start_run("coder", None)
        await asyncio.wait_for(reached.wait(), 30)
        await runtime.drop("coder")
        restored = await runtime.resume("coder")
        done = await runtime.wait_for_run("coder", run.run_id, timeout=30)
        assert done.status is RunStatus.SUCCEEDED and done.output == "booked", done.error
        assert len(engine.requests) == 1  # the program was not asked for again
        assert await counts(restored, "ab") == {"a": 1, "b": 1}
    finally:
        await runtime.shutdown()


class PayingCounter(CounterCapability):
    """The counter, its `add` declared with an effect: recorded before the policy sees it."""

    @action_executor(effects=("external",))
    async def add(self, amount: int, note: str = "") -> int:
        """Add `amount` to the running total."""
        return await CounterCapability.add(self, amount, note)


async def test_a_suspend_while_a_result_is_recorded_waits_for_the_record(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """A suspend cancels the step and persists the agent as it is: `add` already changed the
    counter's total, so the log must say `add` is done, or the resumed step would add twice."""
    runtime, _engine = host
    steps = [{"action": "add", "parameters": {"amount": 1}} for _ in range(3)]
    blueprint = counter_blueprint("sleeper", steps).model_copy(
        update={"capabilities": [PayingCounter.bind()]}
    )
    agent = await runtime.spawn(blueprint)
    log = agent.action_log
    original, reached, release = log._append, asyncio.Event(), asyncio.Event()

    async def slow_append(records: list[Any]) -> None:
        if records[0].step == 2 and records[0].status == "done":
            reached.set()
            await release.wait()
        await original(records)

    log._append = slow_append  # type: ignore[method-assign]
    run = await runtime.start_run("sleeper", None)
    await asyncio.wait_for(reached.wait(), 10)
    assert agent.get_capability("PayingCounter").total == 2  # changed, not yet recorded
    suspending = asyncio.create_task(runtime.suspend("sleeper"))
    await asyncio.sleep(0.3)
    assert not suspending.done()  # the cancelled step finishes its record first
    release.set()
    await asyncio.wait_for(suspending, 10)
    # what the suspend persisted agrees with itself: the counter as the policy last saw it
    board = agent.blackboard
    stored = await board.read(AgentStateProtocol.capability_state_key("PayingCounter"))
    assert stored.value["state"] == {"total": 1}
    assert (await board.read(AgentStateProtocol.key("policy_state"))).value["index"] == 1
    resumed = await runtime.resume("sleeper")
    done = await runtime.wait_for_run("sleeper", run.run_id, timeout=10)
    assert done.status is RunStatus.SUCCEEDED and done.output == 3, done.output
    assert resumed.get_capability("PayingCounter").total == 3


async def test_a_suspend_after_a_steps_action_and_before_its_persist_redoes_the_step_as_recorded(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a suspend landing while the policy recorded the step's action (its output
    archived: a Redis round trip) persisted the policy with the call recorded and the run's step
    count not moved; the redo's planner call then offered `recall_archived`, no longer matched its
    record, and the model was asked again. The step is now put back as it started."""
    from colony.planning import StructuredActionPolicy, archives
    from colony.system.builtin import EchoCapability

    asked: list[str] = []

    def decide(request: InferenceRequest) -> str:
        asked.append(request.messages[-1].content)
        if len(asked) == 1:
            return json.dumps({"action": "echo", "parameters": {"value": "x" * 3000}})
        return json.dumps({"action": "finish", "parameters": {"answer": "done"}})

    runtime = LocalAgentRuntime(
        bb, colony_id=f"c{uuid.uuid4().hex[:10]}", engine=ScriptedEngine(decide), settings=load_settings()
    )
    flush, entered, held = archives.ArchivedHistory.flush_archives, asyncio.Event(), asyncio.Event()

    async def slow_flush(self: Any) -> None:
        if self._unsaved and not entered.is_set():
            entered.set()
            await held.wait()  # the round trip the suspend cuts off
        await flush(self)

    monkeypatch.setattr(archives.ArchivedHistory, "flush_archives", slow_flush)
    blueprint = AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id="planner"),
        capabilities=[EchoCapability.bind()],
        action_policy=StructuredActionPolicy.bind(max_tokens=64),
    )
    try:
        await runtime.spawn(blueprint)
        run = await runtime.start_run("planner", {"task": "echo a long value"})
        await asyncio.wait_for(entered.wait(), 10)
        await runtime.suspend("planner", "make room")
        resumed = await runtime.resume("planner")
        done = await runtime.wait_for_run("planner", run.run_id, timeout=20)
        assert done.status is RunStatus.SUCCEEDED and done.steps == 2, done  # echo replayed, then finish
        assert len(asked) == 2  # the model was not asked again for the first step
        assert [c["action_key"] for c in resumed.action_policy.call_trace] == ["echo"]
    finally:
        await runtime.shutdown()


async def test_step_calls_list_a_steps_actions_with_their_effects(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    runtime, _engine = host
    agent = await runtime.spawn(blueprint("lister"))
    run = await agent.run(None)
    assert run.status is RunStatus.SUCCEEDED
    calls = agent.action_log.step_calls(1)
    assert calls == [
        {
            "action": "book",
            "capability": "Ledger",
            "effects": ["external"],
            "key": f"{run.run_id}:1:a{n}",
            "success": True,
        }
        for n in range(3)
    ]
    assert [c["key"] for c in agent.action_log.step_calls(2)] == [f"{run.run_id}:2:a0"]
    assert agent.action_log.step_calls(3) == []  # the last step only asked the model


async def test_truncate_after_makes_later_steps_run_again_and_keeping_them_replays(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    runtime, _engine = host
    agent = await runtime.spawn(blueprint("truncated"))
    run = await agent.run(None)
    assert run.status is RunStatus.SUCCEEDED
    await runtime.drop("truncated")

    # another copy of the agent object, as a restore from a checkpoint builds it
    restored = await Agent.restore(
        "truncated", agent.blackboard, colony_id=runtime.colony_id, settings=load_settings()
    )
    kept = {r.key for r in await restored.action_log.records()}
    assert f"{run.run_id}:2:a0" in kept and f"{run.run_id}:3:m0" in kept
    await restored.action_log.truncate_after(1)
    assert {r.step for r in await restored.action_log.records()} == {1}

    # a fresh copy reads the marker back: steps after 1 are gone, step 1 is kept
    again = await Agent.restore(
        "truncated", agent.blackboard, colony_id=runtime.colony_id, settings=load_settings()
    )
    records = await again.action_log.records()
    assert {r.key for r in records} == {f"{run.run_id}:1:m0"} | {f"{run.run_id}:1:a{n}" for n in range(3)}
    assert again.action_log.step_calls(2) == [] and len(again.action_log.step_calls(1)) == 3


async def test_the_log_holds_one_run_and_skips_what_is_not_a_record(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    runtime, _engine = host
    agent = await runtime.spawn(blueprint("two-runs"))
    first = await agent.run(None)
    stored = parse_records(await agent.blackboard.ring(LOG_KEY))
    assert {r.run_id for r in stored} == {first.run_id}
    assert len(stored) == 2 * 4 + 3  # started + done per action, one per model call

    second = await agent.run(None)
    assert second.status is RunStatus.SUCCEEDED
    stored = parse_records(await agent.blackboard.ring(LOG_KEY))
    assert {r.run_id for r in stored} == {second.run_id}  # the first run's records went

    # hostile ring items are skipped, not trusted (and never unpickled)
    async with agent.blackboard.transaction() as tx:
        tx.ring_push(LOG_KEY, [{"run_id": "../x", "step": 1, "kind": "model"}, "junk", 7], 100)
    assert len(parse_records(await agent.blackboard.ring(LOG_KEY))) == len(stored)


async def test_a_result_too_large_to_record_is_not_run_twice(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    runtime, _engine = host
    first = await runtime.spawn(blueprint("huge"))
    ONCE["huge:a"] = "huge"
    reached = hold_after_dispatch_of(first, "c")
    run = await runtime.start_run("huge", None)
    await asyncio.wait_for(reached.wait(), 10)
    record = next(
        r
        for r in parse_records(await first.blackboard.ring(LOG_KEY))
        if r.key.endswith(":1:a0") and r.status == "done"
    )
    assert record.dropped_bytes is not None and record.dropped_bytes > MAX_RECORD_BYTES
    assert record.result == {"success": True, "error": ""}
    await runtime.drop("huge")
    restored = await runtime.resume("huge")
    done = await runtime.wait_for_run("huge", run.run_id, timeout=10)
    assert done.status is RunStatus.SUCCEEDED
    assert (await counts(restored))["a"] == 1
    assert "larger than the action log keeps" in done.output[0]["error"]


async def test_a_superseded_copy_records_nothing(host: tuple[LocalAgentRuntime, ScriptedEngine]) -> None:
    runtime, _engine = host
    agent = await runtime.spawn(blueprint("fenced"))
    stale = await Agent.restore(
        "fenced", agent.blackboard, colony_id=runtime.colony_id, settings=load_settings()
    )
    await agent.begin_run(None)  # the hosted copy moves on (its lifecycle is written)
    stale.current_run = agent.current_run
    before = await agent.blackboard.ring(LOG_KEY)
    with pytest.raises(Exception) as refused:
        await stale.dispatcher.dispatch("book", {"item": "a"})
    assert "another live copy" in str(refused.value) or "version" in str(refused.value)
    assert await agent.blackboard.ring(LOG_KEY) == before
    # an action with no effect holds its result for the step's persist, which is fenced the same
    assert (await stale.dispatcher.dispatch("look", {"item": "a"})).success
    with pytest.raises(Exception, match=r"another live copy|version"):
        await stale.persist()
    assert await agent.blackboard.ring(LOG_KEY) == before


async def test_a_superseded_copy_starting_a_new_run_clears_nothing(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """The first record of a new run clears the last run's records in the same fenced commit: a
    copy that lost its place (its first record refused) leaves the live copy's log whole."""
    runtime, _engine = host
    agent = await runtime.spawn(blueprint("wiper"))
    stale = await Agent.restore(
        "wiper", agent.blackboard, colony_id=runtime.colony_id, settings=load_settings()
    )
    stale.current_run = AgentRun(agent_id="wiper", status=RunStatus.RUNNING)
    await stale.action_log.model_call(  # the stale copy read the (empty) log of an older run
        InferenceRequest(messages=[ChatMessage(role="user", content="x")]), _answer
    )
    run = await agent.begin_run(None)  # the hosted copy moves on and records its own run
    await agent.dispatcher.dispatch("book", {"item": "a"})
    before = await agent.blackboard.ring(LOG_KEY)
    assert before and all(item["run_id"] == run.run_id for item in before)
    stale.current_run = AgentRun(agent_id="wiper", status=RunStatus.RUNNING)  # a new run of its own
    with pytest.raises(Exception, match=r"another live copy|version"):
        await stale.dispatcher.dispatch("book", {"item": "b"})
    assert await agent.blackboard.ring(LOG_KEY) == before


async def _answer() -> InferenceResponse:
    return InferenceResponse(text="{}", parsed={})


def test_effects_are_declared_from_a_known_set() -> None:
    [book] = [s for s in discover_actions(Ledger(scope_id="test:effects")) if s.name == "book"]
    assert book.effects == ("external",)
    with pytest.raises(AgentUsageError, match="unknown effect"):
        action_executor(effects=("teleport",))


async def test_summariser_calls_are_numbered_apart_from_the_planners(
    host: tuple[LocalAgentRuntime, ScriptedEngine],
) -> None:
    """A redone step that summarises first (its first run did not) still gets the planner's
    recorded decision: the summariser's calls are `s{n}`, the planner's `m{n}`."""
    from colony.agents.state.action_log import ActionLog

    runtime, _engine = host
    agent = await runtime.spawn(blueprint("channels"))
    await agent.begin_run(None)
    asked: list[str] = []

    def request(system: str) -> InferenceRequest:
        return InferenceRequest(
            messages=[ChatMessage(role="system", content=system), ChatMessage(role="user", content="u")]
        )

    def answer(text: str) -> Any:
        async def call() -> InferenceResponse:
            asked.append(text)
            return InferenceResponse(text=text)

        return call

    first = await agent.action_log.model_call(request("plan"), answer("decision-1"))
    assert first.text == "decision-1"
    redone = ActionLog(agent)  # a restored copy of the agent redoing the step
    summary = await redone.model_call(request("summarise"), answer("summary"), channel="summary")
    decision = await redone.model_call(request("plan"), answer("decision-2"))
    assert summary.text == "summary" and decision.text == "decision-1"  # replayed, not asked again
    assert asked == ["decision-1", "summary"]
    stored = parse_records(await agent.blackboard.ring(LOG_KEY))
    assert sorted(r.key.rsplit(":", 1)[1] for r in stored) == ["m0", "s0"]
    assert {r.kind for r in stored} == {"model", "summary"}
    with pytest.raises(ValueError):
        await redone.model_call(request("plan"), answer("x"), channel="other")  # type: ignore[arg-type]
