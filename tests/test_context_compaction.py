"""Compaction under a token budget, against a real redis-server: 200 events under a 1,000-token
budget (every prompt under budget, a summary in it, the stored policy state no longer growing, a
100 KB output never in a prompt, the pinned correction always in it), with the real SmolLM2 model
writing the summaries and its tokenizer counting; the scripted engine where the words do not
matter (a failing summariser retried without failing the run, a restore of the uncompacted view
from a state taken before compaction and from a checkpoint (colony.agents.state.checkpoints), recall of
an archive by reference, the prompt event's token figures, summaries in the agent's history log
block)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from colony import metrics
from colony.agents import (
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    LocalAgentRuntime,
    action_executor,
)
from colony.agents.hooks import HookType, Pointcut
from colony.agents.models import ActionResult
from colony.agents.policy import ActionPolicyExecutionState, ActionPolicyIterationResult
from colony.blackboard import Blackboard, create_redis
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.config import ContextSettings, EngineSettings, load_settings
from colony.errors import InferenceError
from colony.inference import InferenceRequest, InferenceResponse
from colony.inference.embedded import EmbeddedEngine
from colony.inference.engine import InferenceEngine
from colony.inference.scripted import ScriptedEngine
from colony.inference.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_tokens, plan_budget
from colony.planning import (
    ActionKeySubstringFilter,
    ConsciousnessStream,
    EventContextKeyFilter,
    EventDrivenActionPolicy,
    JSONStreamFormatter,
    StructuredActionPolicy,
)
from colony.planning.compaction import COMPACTION_KEY, SUMMARISER_SYSTEM
from colony.planning.context import HISTORY_SUMMARY_CLOSE, HISTORY_SUMMARY_OPEN
from colony.planning.policies import call_record

BIG_MARKER = "BIGOUTPUT-MIDDLE-7f3a"
CORRECTION = "Always report temperatures in Celsius, never Fahrenheit."
BUDGET = 1000


NOTED: list[str] = []  # every `note` that really ran, in this process


class Sensors(AgentCapability):
    """Notes readings; `dump` returns a 100 KB log (the output that must never reach a prompt)."""

    @action_executor(effects=("external",))  # NOTED is outside the agent: a redo must not add to it
    async def note(self, text: str) -> str:
        """Write down what the latest reading says."""
        NOTED.append(text)
        return f"noted: {text}"

    @action_executor()
    async def dump(self) -> str:
        """Dump the full sensor log."""
        half = "sensor log line with readings 0123456789 " * 1250
        return half + BIG_MARKER + half


def streams(max_entries: int = 1000) -> list[Any]:
    return [
        ConsciousnessStream.bind(
            name="observations",
            formatter=JSONStreamFormatter.bind(section_title="## Observations"),
            event_filter=EventContextKeyFilter("observation", "user_correction"),
            max_entries=max_entries,
        ),
        ConsciousnessStream.bind(
            name="activity",
            formatter=JSONStreamFormatter.bind(section_title="## Activity"),
            action_filter=ActionKeySubstringFilter(""),
            max_entries=max_entries,
        ),
    ]


def blueprint(agent_id: str, settings: ContextSettings, max_entries: int = 1000) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(
            agent_id=agent_id, action_policy_blueprints={"consciousness_streams": streams(max_entries)}
        ),
        capabilities=[Sensors.bind()],
        action_policy=StructuredActionPolicy.bind(
            goals=["Watch the sensors and note every reading."], max_tokens=48, context_settings=settings
        ),
    )


def is_summariser(request: InferenceRequest) -> bool:
    return request.messages[0].content == SUMMARISER_SYSTEM


class Planner:
    """Scripted planner decisions: `note` each event, `dump` at one step, `recall_archived` when asked."""

    def __init__(self, dump_at: int = 100) -> None:
        self.calls = 0
        self.dump_at = dump_at
        self.recall_next: str | None = None

    def decide(self, request: InferenceRequest) -> dict[str, Any]:
        self.calls += 1
        if self.recall_next is not None:
            ref, self.recall_next = self.recall_next, None
            return {"action": "recall_archived", "parameters": {"ref": ref}}
        if self.calls == self.dump_at:
            return {"action": "dump", "parameters": {}}
        return {"action": "note", "parameters": {"text": f"r{self.calls} ok"}}


def observation(i: int) -> dict[str, Any]:
    """Short, so the real model's summaries (a CPU prefill each) stay few."""
    return {"observation": f"reading {i}: s{i % 5} {18 + i % 9}C"}


def prompt_of(request: InferenceRequest) -> str:
    return request.messages[-1].content


def summary_in(prompt: str) -> str | None:
    found = re.search(
        re.escape(HISTORY_SUMMARY_OPEN) + r"\n(.*?)\n" + re.escape(HISTORY_SUMMARY_CLOSE), prompt, re.S
    )
    return found.group(1) if found else None


async def drive(agent: Agent, events: int, *, correction_at: int = 10) -> list[int]:
    """Deliver `events` events one step each; the stored policy-state size after every step."""
    agent.max_steps = events + 10
    await agent.begin_run({"task": "Watch the sensors"})
    sizes = []
    for i in range(events):
        agent.context.append(observation(i))
        if i == correction_at:
            agent.context.append({"user_correction": CORRECTION})
        await agent.run_step()
        assert agent.current_run is not None and not agent.current_run.done, agent.current_run
        entry = await agent.blackboard.read(Keys.key("policy_state"))
        assert entry is not None
        sizes.append(len(json.dumps(entry.value)))
    return sizes


@pytest_asyncio.fixture
async def board(redis_url: str) -> AsyncIterator[Blackboard]:
    client = create_redis(redis_url)
    yield Blackboard(client, "test:compaction")
    await client.aclose()


def assert_state_stops_growing(sizes: list[int]) -> None:
    """Saw-toothed once compaction runs: the later peaks are no higher than the earlier ones, and
    far below what 200 steps of history weigh."""
    early, late = max(sizes[40:120]), max(sizes[120:])
    assert late <= early * 1.1, (early, late)
    assert late < 40_000, late


def test_the_trigger_leaves_room_for_the_summarisers_own_call() -> None:
    settings = ContextSettings(summary_max_tokens=256, summariser_input_tokens=2048)
    budget = plan_budget(settings, window=4096, planner_max_tokens=256)
    assert budget is not None
    assert budget.limit == 4096 - 256
    assert budget.trigger == 4096 - 256 - 2048  # window - max output - summariser input
    assert budget.summariser_input + budget.summary_max <= 4096
    # a configured budget below that is the limit and the trigger
    small = plan_budget(settings.model_copy(update={"token_budget": 1000}), 4096, 64)
    assert small is not None and small.limit == small.trigger == 1000
    # a summariser input larger than the window is cut to what the window leaves
    tiny = plan_budget(settings.model_copy(update={"summariser_input_tokens": 100_000}), 4096, 64)
    assert tiny is not None and tiny.summariser_input + tiny.summary_max <= 4096
    # no window and no budget: nothing to keep under
    assert plan_budget(settings, None, 64) is None
    assert plan_budget(settings.model_copy(update={"token_budget": 500}), None, 64).limit == 500  # type: ignore[union-attr]


async def test_200_events_stay_under_budget_with_a_summary_and_bounded_state(board: Blackboard) -> None:
    planner = Planner()
    summaries: list[str] = []

    def reply(request: InferenceRequest) -> Any:
        if is_summariser(request):
            summaries.append(f"Summary {len(summaries) + 1}: sensors read 18-26 degrees; all notes taken.")
            return summaries[-1]
        return planner.decide(request)

    engine = ScriptedEngine(reply)
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    before = {s: metrics.CONTEXT_COMPACTIONS.labels(stage=s)._value.get() for s in ("summarized", "failed")}
    try:
        agent = await runtime.spawn(
            blueprint("watcher", ContextSettings(token_budget=BUDGET, summary_max_tokens=96))
        )
        reports: list[dict[str, Any]] = []

        async def emit(event_type: str, data: Any = None) -> bool:  # what a handle would stream
            if event_type == "compaction":
                reports.append(data)
            return True

        agent.emit_run_event = emit  # type: ignore[method-assign]
        sizes = await drive(agent, 200)
        assert len(reports) >= 3 and {r["stage"] for r in reports} <= {"masked", "summarized"}
        assert all(r["tokens_after"] < r["tokens_before"] and r["tokens_after"] <= BUDGET for r in reports)
        prompts = [prompt_of(r) for r in engine.requests if not is_summariser(r)]
        assert len(prompts) == 200
        system = StructuredActionPolicy.SYSTEM
        for i, prompt in enumerate(prompts):
            tokens = estimate_tokens(system) + estimate_tokens(prompt) + 2 * MESSAGE_OVERHEAD_TOKENS
            assert tokens <= BUDGET, (i, tokens)
            assert BIG_MARKER not in prompt
        first = next(i for i, p in enumerate(prompts) if summary_in(p))
        assert first < 100  # compaction started well before the end
        for prompt in prompts[first:]:
            summary = summary_in(prompt)
            assert summary is not None and summary.startswith("Summary ")  # the summariser's words
        assert len(summaries) >= 3
        # the pinned correction is never compacted: in every prompt after it arrived
        assert all(CORRECTION in p for p in prompts[11:])
        assert_state_stops_growing(sizes)
        # the 100 KB output: archived whole, referenced from the view
        policy = agent.action_policy
        held = [
            await agent.blackboard.read(Keys.archived_output_key(r)) for r in policy.compactor.state.archives
        ]
        big = [e.value for e in held if e is not None and e.value["kind"] == "output"]
        assert len(big) == 1 and BIG_MARKER in big[0]["text"] and len(big[0]["text"]) > 100_000
        spans = [e.value for e in held if e is not None and e.value["kind"] == "span"]
        assert "reading 3:" in "".join(s["text"] for s in spans)  # what was summarised stays recallable
        assert metrics.CONTEXT_COMPACTIONS.labels(stage="summarized")._value.get() >= before["summarized"] + 3
        assert metrics.CONTEXT_COMPACTIONS.labels(stage="failed")._value.get() == before["failed"]
        report = await agent.blackboard.read(COMPACTION_KEY)
        assert report is not None and report.value["tokens_after"] < report.value["tokens_before"]
    finally:
        await runtime.shutdown()


async def test_a_failing_summariser_never_fails_the_run_and_is_retried(board: Blackboard) -> None:
    planner = Planner(dump_at=10_000)
    failing = {"on": True}
    summarised: list[str] = []

    def reply(request: InferenceRequest) -> Any:
        if is_summariser(request):
            if failing["on"]:
                raise InferenceError("summariser down")
            summarised.append("Summary after recovery: readings normal.")
            return summarised[-1]
        return planner.decide(request)

    engine = ScriptedEngine(reply)
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    failed_before = metrics.CONTEXT_COMPACTIONS.labels(stage="failed")._value.get()
    try:
        agent = await runtime.spawn(
            blueprint("flaky", ContextSettings(token_budget=700, summary_max_tokens=64))
        )
        await drive(agent, 60)
        assert metrics.CONTEXT_COMPACTIONS.labels(stage="failed")._value.get() > failed_before
        state = agent.action_policy.compactor.state
        assert state.summary == "" and state.pending  # nothing summarised, the taken items kept
        prompts = [prompt_of(r) for r in engine.requests if not is_summariser(r)]
        for prompt in prompts:
            assert estimate_tokens(StructuredActionPolicy.SYSTEM) + estimate_tokens(prompt) + 16 <= 700
        assert "not summarised yet" in prompts[-1]
        failing["on"] = False
        agent.max_steps = 200
        for i in range(60, 90):
            agent.context.append(observation(i))
            await agent.run_step()
        assert summarised and agent.action_policy.compactor.state.summary == summarised[-1]
        assert agent.current_run is not None and not agent.current_run.done
    finally:
        await runtime.shutdown()


async def test_restoring_a_state_from_before_compaction_restores_the_uncompacted_view(
    board: Blackboard,
) -> None:
    planner = Planner(dump_at=10_000)

    def reply(request: InferenceRequest) -> Any:
        return "Summary: fine." if is_summariser(request) else planner.decide(request)

    engine = ScriptedEngine(reply)
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        agent = await runtime.spawn(
            blueprint("undoer", ContextSettings(token_budget=600, summary_max_tokens=64))
        )
        policy = agent.action_policy
        agent.max_steps = 100
        await agent.begin_run({"task": "Watch the sensors"})
        saved: dict[str, Any] | None = None
        for i in range(60):
            agent.context.append(observation(i))
            await agent.run_step()
            if policy.compactor.state.compactions == 0:
                saved = json.loads(json.dumps(policy.get_state()))  # what a checkpoint holds
        assert saved is not None and policy.compactor.state.summary == "Summary: fine."
        compacted = len(policy.streams[0].entries)
        policy.set_state(saved)
        assert policy.compactor.state.summary == "" and not policy.compactor.state.pending
        assert len(policy.streams[0].entries) > compacted
        assert all(f"reading {i}:" in policy.streams[0].render() for i in range(0, 20))
    finally:
        await runtime.shutdown()


async def test_restoring_a_checkpoint_from_before_a_compaction_brings_the_uncompacted_view_back(
    board: Blackboard,
) -> None:
    from colony.agents.state.checkpoints import restore_checkpoint

    planner = Planner(dump_at=10_000)
    engine = ScriptedEngine(lambda r: "Summary: fine." if is_summariser(r) else planner.decide(r))
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        agent = await runtime.spawn(
            blueprint("rewinder", ContextSettings(token_budget=600, summary_max_tokens=64))
        )
        policy = agent.action_policy
        agent.max_steps = 100
        await agent.begin_run({"task": "Watch the sensors"})
        i = 0
        while policy.compactor.state.compactions == 0:
            held_before = len(policy.streams[0].entries)  # as the previous step's checkpoint holds them
            agent.context.append(observation(i))
            await agent.run_step()
            i += 1
            assert i < 90, "no compaction happened"
        assert agent.current_run is not None
        compacted_at = agent.current_run.steps  # the checkpoint of the step that compacted
        assert len(policy.streams[0].entries) < held_before
        report = await restore_checkpoint(agent, compacted_at - 1)
        assert report.step == compacted_at - 1
        assert policy.compactor.state.summary == "" and policy.compactor.state.compactions == 0
        assert len(policy.streams[0].entries) == held_before  # the entries compaction took are back
        stored = await agent.blackboard.read(Keys.key("policy_state"))
        assert stored is not None and stored.value["compaction"]["summary"] == ""
        assert "reading 3:" in json.dumps(stored.value["streams"]["observations"])
    finally:
        await runtime.shutdown()


async def test_an_archived_output_is_recalled_by_reference(board: Blackboard) -> None:
    planner = Planner(dump_at=2)
    engine = ScriptedEngine(lambda r: "Summary." if is_summariser(r) else planner.decide(r))
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        agent = await runtime.spawn(blueprint("recaller", ContextSettings(token_budget=4000)))
        agent.max_steps = 10
        events: list[tuple[str, Any]] = []

        async def emit(event_type: str, data: Any = None) -> bool:  # what a handle would stream
            events.append((event_type, data))
            return True

        agent.emit_run_event = emit  # type: ignore[method-assign]
        await agent.begin_run({"task": "Watch the sensors", "emit_prompt": True})
        for i in range(3):  # the second step dumps the 100 KB log
            agent.context.append(observation(i))
            await agent.run_step()
        # --show-prompt's figures: each step's prompt with its tokens and the budget
        prompts = [data for kind, data in events if kind == "prompt"]
        assert [p["step"] for p in prompts] == [0, 1, 2]
        assert all(p["budget"] == 4000 and 0 < p["tokens"] <= 4000 for p in prompts)
        assert prompts[-1]["text"] == prompt_of(engine.requests[-1])
        prompt = prompt_of(engine.requests[-1])
        assert BIG_MARKER not in prompt
        ref = re.search(r"archived as ref ([0-9a-f]{16})", prompt).group(1)  # what the planner sees
        planner.recall_next = ref
        agent.context.append(observation(3))
        await agent.run_step()
        assert "recall_archived" in json.dumps(engine.requests[-1].response_format)
        assert agent.last_result is not None and agent.last_result.success
        assert agent.last_result.output.startswith("sensor log line with readings")
        assert "more characters: offset=400" in agent.last_result.output
        # a ref that is not one is refused with a message, not looked up
        planner.recall_next = "../../etc"
        agent.context.append(observation(4))
        await agent.run_step()
        assert agent.last_result is not None and not agent.last_result.success
        assert "16 hex characters" in (agent.last_result.error or "")
    finally:
        await runtime.shutdown()


async def test_summaries_go_to_the_agents_history_log_block(board: Blackboard) -> None:
    from colony.memory.blocks.tools import MemoryBlocksCapability

    planner = Planner(dump_at=10_000)
    written: list[str] = []

    def reply(request: InferenceRequest) -> Any:
        if is_summariser(request):
            written.append(f"Summary {len(written) + 1}: readings noted.")
            return written[-1]
        return planner.decide(request)

    engine = ScriptedEngine(reply)
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        plan = blueprint("logger", ContextSettings(token_budget=900, summary_max_tokens=64))
        plan.capabilities.append(MemoryBlocksCapability.bind(tool_log=False))
        agent = await runtime.spawn(plan)
        await drive(agent, 80)
        assert len(written) >= 2
        blocks = next(c for c in agent.capabilities.values() if isinstance(c, MemoryBlocksCapability))
        view = await blocks.store().read(agent.agent_id, "history_summary")
        assert [e["text"] for e in view.entries or []] == written
    finally:
        await runtime.shutdown()


class RecordsDirectly(EventDrivenActionPolicy):
    """A policy that records calls itself (as the code-generating one does for a program's calls)."""

    async def plan_step(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult:
        output = "x" * 5000 + BIG_MARKER
        self.record_call(call_record("dump", {}, ActionResult(success=True, output=output)))
        return ActionPolicyIterationResult(done=True, output="done")


async def test_an_output_recorded_by_a_subclass_is_archived_before_the_step_persists(
    board: Blackboard,
) -> None:
    runtime = LocalAgentRuntime(board, colony_id=f"c{uuid.uuid4().hex[:8]}", settings=load_settings())
    try:
        agent = await runtime.spawn(
            AgentBlueprint(
                agent_class=Agent,
                metadata=AgentMetadata(
                    agent_id="direct", action_policy_blueprints={"consciousness_streams": streams()}
                ),
                action_policy=RecordsDirectly.bind(),
            )
        )
        run = await agent.run({"task": "t"})
        assert run.output == "done"
        stored = await agent.blackboard.read(Keys.key("policy_state"))
        assert stored is not None and BIG_MARKER not in json.dumps(stored.value)
        ref = re.search(r"archived as ref ([0-9a-f]{16})", json.dumps(stored.value)).group(1)
        archive = await agent.blackboard.read(Keys.archived_output_key(ref))
        assert archive is not None and archive.value["text"].endswith(BIG_MARKER)
    finally:
        await runtime.shutdown()


# -- the real model ------------------------------------------------------------------------------------


class SummariserOnModel(InferenceEngine):
    """The planner's decisions scripted (200 of them on a CPU would take minutes), its summaries
    written by the real SmolLM2 model, and tokens counted by that model's tokenizer (the engine
    presents itself as the embedded engine it wraps)."""

    kind = "embedded"

    def __init__(self, model: EmbeddedEngine, planner: Planner) -> None:
        super().__init__()
        self.model = model
        self.settings = model.settings
        self.planner = planner
        self.scripted = ScriptedEngine(planner.decide)
        self.requests: list[InferenceRequest] = []
        self.summaries: list[str] = []

    async def start(self) -> None:
        await self.model.start()

    @property
    def base_url(self) -> str:
        return self.model.base_url

    async def generate(self, request: InferenceRequest) -> InferenceResponse:
        self.requests.append(request)
        if is_summariser(request):
            response = await self.model.generate(request)
            self.summaries.append(response.text.strip())
            return response
        return await self.scripted.generate(request)

    def stream(self, request: InferenceRequest) -> Any:
        """Summaries stream from the model, planner decisions from the script (as `generate`)."""
        return (self.model if is_summariser(request) else self.scripted).stream(request)

    async def load_page(self, page: Any) -> Any:
        return await self.model.load_page(page)

    async def evict_page(self, page_id: str) -> bool:
        return await self.model.evict_page(page_id)

    def resident_pages(self) -> dict[str, int | None]:  # pragma: no cover - not used
        return {}


@pytest_asyncio.fixture
async def model(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEngine]:
    engine = EmbeddedEngine(EngineSettings(page_slots=1), data_dir=tmp_path_factory.mktemp("compaction"))
    await engine.start()
    yield engine
    await engine.close()


async def real_tokens(model: EmbeddedEngine, request: InferenceRequest) -> int:
    """The request's tokens as the model sees them: its chat template applied, then tokenised."""
    async with httpx.AsyncClient(base_url=model.base_url, timeout=30) as http:
        templated = await http.post(
            "/apply-template", json={"messages": [m.model_dump() for m in request.messages]}
        )
        templated.raise_for_status()
        tokens = await http.post("/tokenize", json={"content": templated.json()["prompt"]})
        tokens.raise_for_status()
        return len(tokens.json()["tokens"])


async def test_real_model_200_events_under_a_1000_token_budget(
    board: Blackboard, model: EmbeddedEngine
) -> None:
    planner = Planner()
    engine = SummariserOnModel(model, planner)
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        settings = ContextSettings(token_budget=BUDGET, summary_max_tokens=48, keep_recent_items=4)
        agent = await runtime.spawn(blueprint("watcher-real", settings))
        sizes = await drive(agent, 200)
        planned = [r for r in engine.requests if not is_summariser(r)]
        assert len(planned) == 200
        for i, request in enumerate(planned):
            tokens = await real_tokens(model, request)
            assert tokens <= BUDGET, (i, tokens)
            assert BIG_MARKER not in prompt_of(request)
        assert engine.summaries and all(engine.summaries)
        first = next(i for i, r in enumerate(planned) if summary_in(prompt_of(r)))
        for request in planned[first:]:
            summary = summary_in(prompt_of(request))
            assert summary is not None
            # the text the model wrote (the section may add archive references after it)
            assert any(summary.startswith(s[:40]) for s in engine.summaries), summary[:200]
        assert_state_stops_growing(sizes)
    finally:
        await runtime.shutdown()


async def test_a_redone_step_that_summarises_replays_the_planners_recorded_decision(
    board: Blackboard,
) -> None:
    """The crash window (action done, step not persisted) when the redone step's prompt, with events
    that arrived after the crash, passes the trigger: the summariser's call is numbered apart from
    the planner's, so the planner is not asked again and its action does not run a second time."""
    import asyncio

    planner = Planner(dump_at=10_000)
    summarised: list[int] = []

    def reply(request: InferenceRequest) -> Any:
        if is_summariser(request):
            summarised.append(1)
            return "Summary: readings fine."
        return planner.decide(request)

    engine = ScriptedEngine(reply)
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    NOTED.clear()
    dispatched = asyncio.Event()
    try:
        agent = await runtime.spawn(
            blueprint("diverge", ContextSettings(token_budget=600, summary_max_tokens=64))
        )
        agent.max_steps = 100

        async def hold(ctx: Any, result: Any) -> None:
            if len(NOTED) == 3:
                dispatched.set()
                await asyncio.sleep(3600)  # the replica dies here: step 3 done, not persisted

        agent.hooks.register(Pointcut.pattern("ActionDispatcher.dispatch"), HookType.AFTER, hold)
        await runtime.start_run("diverge", {"task": "Watch the sensors"})
        await asyncio.wait_for(dispatched.wait(), 30)
        assert summarised == [] and planner.calls == 3
        await runtime.drop("diverge")
        restored = await Agent.restore("diverge", board, colony_id=runtime.colony_id, **runtime.services)
        for i in range(120):  # events that arrived after the crash: the redone prompt passes the trigger
            restored.context.append(observation(1000 + i))
        await restored.run_step()
        assert summarised, "the redone step did not summarise: the test does not test the case"
        assert planner.calls == 3  # the planner's recorded decision was replayed
        assert NOTED == ["r1 ok", "r2 ok", "r3 ok"]  # the done action did not run again
        records = await restored.action_log.records()
        keys = {r.key.rsplit(":", 1)[1] for r in records if r.step == 3}
        assert {"m0", "s0", "a0"} <= keys, keys
    finally:
        await runtime.shutdown()


class OneTokenPerChar:
    """A tokenizer that counts every character as a token (CJK-heavy text comes close)."""

    def encode(self, text: str) -> list[str]:
        return list(text)


class ExactScriptedEngine(ScriptedEngine):
    """The scripted engine presenting an exact tokenizer and a 4096-token window (as vLLM does)."""

    kind = "vllm"
    context_window = 4096

    def __init__(self, reply: Any) -> None:
        super().__init__(reply)
        self._tokenizer = OneTokenPerChar()


async def test_the_summarisers_input_is_measured_with_the_engines_tokenizer(board: Blackboard) -> None:
    """With a tokenizer counting 4x the chars/4 estimate, and a backlog gathered while the
    summariser was down, every summariser request still fits `summariser_input` (and so the window
    with its summary)."""
    planner = Planner(dump_at=10_000)
    inputs: list[int] = []
    failing = {"on": True}

    def reply(request: InferenceRequest) -> Any:
        if is_summariser(request):
            if failing["on"]:
                raise InferenceError("summariser down")
            inputs.append(sum(len(m.content) + MESSAGE_OVERHEAD_TOKENS for m in request.messages))
            return "S."
        return planner.decide(request)

    settings = ContextSettings(summary_max_tokens=256, summariser_input_tokens=2048)
    budget = plan_budget(settings, ExactScriptedEngine.context_window, 48)
    assert budget is not None
    runtime = LocalAgentRuntime(
        board,
        colony_id=f"c{uuid.uuid4().hex[:8]}",
        engine=ExactScriptedEngine(reply),
        settings=load_settings(),
    )
    try:
        agent = await runtime.spawn(blueprint("exact", settings))
        agent.max_steps = 400
        await agent.begin_run({"task": "t"})
        for i in range(110):
            failing["on"] = i < 90
            agent.context.append({"observation": f"{i}: " + "温度計" * 30})
            await agent.run_step()
        assert len(inputs) >= 2 and not agent.action_policy.compactor.state.pending
        assert max(inputs) <= budget.summariser_input, (inputs, budget)
        assert max(inputs) + budget.summary_max <= ExactScriptedEngine.context_window
    finally:
        await runtime.shutdown()


async def test_a_summary_longer_than_the_limit_is_cut_not_refused(board: Blackboard) -> None:
    """Without a tokenizer the estimate can count a summary the model kept within max_tokens as
    longer than summary_max_tokens: it is cut to fit, not refused (refused, nothing is ever
    summarised)."""
    long_summary = ("The sensors reported temperatures between eighteen and twenty six degrees. " * 16)[:1150]
    planner = Planner(dump_at=10_000)
    engine = ScriptedEngine(lambda r: long_summary if is_summariser(r) else planner.decide(r))
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    failed_before = metrics.CONTEXT_COMPACTIONS.labels(stage="failed")._value.get()
    try:
        agent = await runtime.spawn(
            blueprint("cut", ContextSettings(token_budget=1500, summary_max_tokens=256))
        )
        await drive(agent, 120)
        state = agent.action_policy.compactor.state
        assert state.summary and long_summary.startswith(state.summary.rstrip("."))
        assert estimate_tokens(state.summary) <= 256
        assert state.failures == 0 and state.summarized_items > 0
        assert metrics.CONTEXT_COMPACTIONS.labels(stage="failed")._value.get() == failed_before
    finally:
        await runtime.shutdown()


async def test_a_large_last_output_is_held_by_reference_and_is_the_runs_output_whole(
    board: Blackboard,
) -> None:
    """The 100 KB output of the last action stays out of the policy state and every checkpoint (held
    by its archive reference), and still ends the run whole, also in an agent restored from Redis."""
    from colony.agents.state.checkpoints import read_checkpoints

    planner = Planner(dump_at=2)
    engine = ScriptedEngine(lambda r: "Summary." if is_summariser(r) else planner.decide(r))
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        agent = await runtime.spawn(blueprint("output", ContextSettings(token_budget=1000)))
        agent.max_steps = 20
        await agent.begin_run({"task": "Watch the sensors"})
        for i in range(2):  # the second step dumps the 100 KB log: the last successful output
            agent.context.append(observation(i))
            await agent.run_step()
        stored = await agent.blackboard.read(Keys.key("policy_state"))
        assert stored is not None and BIG_MARKER not in json.dumps(stored.value)
        assert stored.value["last_output_ref"]["chars"] > 100_000
        held = [c for c, _ in await read_checkpoints(agent.blackboard)]
        assert held and not any(BIG_MARKER in json.dumps(c.policy_state) for c in held)
        await runtime.drop("output")
        restored = await Agent.restore("output", board, colony_id=runtime.colony_id, **runtime.services)
        restored.action_policy._enabled = set()  # no action left: the run ends on the last output
        await restored.run_step()
        run = restored.current_run
        assert run is not None and run.done, run
        assert isinstance(run.output, str) and len(run.output) > 100_000 and BIG_MARKER in run.output
        assert run.output.startswith("sensor log line with readings")
    finally:
        await runtime.shutdown()


async def test_a_pinned_correction_survives_the_streams_own_window(board: Blackboard) -> None:
    """A stream with a 20-entry window: the user correction delivered at event 10 is still in the
    prompt, verbatim, 30 events later (the window keeps pinned entries; they are not summarised)."""
    planner = Planner(dump_at=10_000)
    engine = ScriptedEngine(lambda r: "Summary: readings fine." if is_summariser(r) else planner.decide(r))
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        agent = await runtime.spawn(
            blueprint("pinned", ContextSettings(token_budget=1000, summary_max_tokens=96), max_entries=20)
        )
        await drive(agent, 45, correction_at=10)
        prompts = [prompt_of(r) for r in engine.requests if not is_summariser(r)]
        assert len(prompts) == 45
        assert all(CORRECTION in p for p in prompts[10:])
        assert CORRECTION not in (summary_in(prompts[-1]) or "")  # verbatim, in its stream section
        observations = agent.action_policy.streams[0]
        assert len(observations.entries) <= 20 + 1  # the window, plus the one pinned entry
    finally:
        await runtime.shutdown()


def test_a_streams_window_keeps_at_most_the_newest_32_pinned_entries() -> None:
    from colony.planning.streams import MAX_PINNED

    stream = ConsciousnessStream(
        "s",
        JSONStreamFormatter(),
        event_filter=EventContextKeyFilter("observation", "user_correction"),
        max_entries=5,
    )
    stream.pinned_keys = frozenset({"user_correction"})
    stream.overflow = []
    for i in range(40):
        stream.consider_event({"user_correction": f"c{i}"})
        stream.consider_event({"observation": f"o{i}"})
    pinned = [e["contexts"]["user_correction"] for e in stream.entries if "user_correction" in e["contexts"]]
    assert MAX_PINNED == 32 and pinned == [f"c{i}" for i in range(8, 40)]
    others = [e["contexts"]["observation"] for e in stream.entries if "observation" in e["contexts"]]
    assert others == [f"o{i}" for i in range(35, 40)]
    assert len(stream.overflow) == 80 - len(stream.entries)  # every dropped entry went to overflow


async def test_a_huge_chat_message_is_archived_when_recorded_and_stays_out_of_the_prompt(
    board: Blackboard,
) -> None:
    """One 40,000-character (not pinned) chat message: the stream records a preview with its ref,
    every prompt stays under budget, the policy state stays small, the message stays recallable."""
    from colony.planning import ConversationFormatter

    planner = Planner(dump_at=10_000)
    engine = ScriptedEngine(lambda r: "S." if is_summariser(r) else planner.decide(r))
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    chat = ConsciousnessStream.bind(
        name="chat",
        formatter=ConversationFormatter.bind(),
        event_filter=EventContextKeyFilter("user_chat_message"),
        action_filter=ActionKeySubstringFilter("note"),
        max_entries=50,
    )
    plan = AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id="chatty", action_policy_blueprints={"consciousness_streams": [chat]}),
        capabilities=[Sensors.bind()],
        action_policy=StructuredActionPolicy.bind(
            goals=["chat"], max_tokens=48, context_settings=ContextSettings(token_budget=1000)
        ),
    )
    huge = "y" * 20_000 + BIG_MARKER + "y" * 20_000
    try:
        agent = await runtime.spawn(plan)
        agent.max_steps = 20
        await agent.begin_run({"task": "t"})
        for i in range(8):
            agent.context.append({"user_chat_message": {"message": huge if i == 6 else f"hello {i}"}})
            await agent.run_step()
        prompts = [prompt_of(r) for r in engine.requests if not is_summariser(r)]
        for prompt in prompts:
            assert BIG_MARKER not in prompt
            assert estimate_tokens(StructuredActionPolicy.SYSTEM) + estimate_tokens(prompt) + 16 <= 1000
        ref = re.search(r"archived as ref ([0-9a-f]{16})", prompts[-1]).group(1)  # type: ignore[union-attr]
        assert "**User**: [40021 characters archived" in prompts[-1]
        stored = await agent.blackboard.read(Keys.key("policy_state"))
        assert stored is not None and len(json.dumps(stored.value)) < 10_000
        archive = await agent.blackboard.read(Keys.archived_output_key(ref))
        assert archive is not None and archive.value["text"] == huge
    finally:
        await runtime.shutdown()


async def test_no_summariser_call_at_every_step_when_the_fixed_prompt_alone_passes_the_trigger(
    board: Blackboard,
) -> None:
    """The task alone is over the budget: a summary cannot bring the prompt under it, so the items
    taken out wait until enough gather (one summariser call per SUMMARISE_PENDING_AT items, not one
    per step), and the run goes on."""
    from colony.planning.compaction import SUMMARISE_PENDING_AT

    planner = Planner(dump_at=10_000)
    engine = ScriptedEngine(lambda r: "Summary." if is_summariser(r) else planner.decide(r))
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        agent = await runtime.spawn(
            blueprint("thrash", ContextSettings(token_budget=1000, summary_max_tokens=96))
        )
        agent.max_steps = 200
        deferred = counted_stage("deferred")
        await agent.begin_run({"task": "Watch the sensors. " + "Details of the task. " * 190})
        for i in range(60):
            agent.context.append(observation(i))
            await agent.run_step()
        summariser_calls = sum(1 for r in engine.requests if is_summariser(r))
        assert 1 <= summariser_calls <= 2 * 60 // SUMMARISE_PENDING_AT + 1, summariser_calls
        assert agent.current_run is not None and not agent.current_run.done
        assert agent.action_policy.compactor.state.summary == "Summary."
        assert counted_stage("deferred") > deferred  # the waiting is counted
    finally:
        await runtime.shutdown()


def counted_stage(stage: str) -> float:
    value = REGISTRY.get_sample_value("colony_context_compactions_total", {"stage": stage})
    return value or 0.0


async def test_archives_expire_with_the_run_retention_and_a_restored_views_are_refreshed(
    board: Blackboard,
) -> None:
    """Every archive carries the `runs.retention_seconds` expiry, so one no view lists any more
    (written after a checkpoint that was restored since) leaves Redis; the archives a view lists
    get their expiry refreshed when that view is restored."""
    planner = Planner(dump_at=1)
    engine = ScriptedEngine(lambda r: "Summary." if is_summariser(r) else planner.decide(r))
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        agent = await runtime.spawn(blueprint("expiring", ContextSettings(token_budget=4000)))
        agent.max_steps = 20
        policy = agent.action_policy
        await agent.begin_run({"task": "Watch the sensors"})
        await agent.run_step()  # the 100 KB dump: archived
        saved = json.loads(json.dumps(policy.get_state()))
        (ref,) = saved["compaction"]["archives"]
        key = Keys.archived_output_key(ref)
        entry = await agent.blackboard.read(key)
        retention = agent.retention_seconds
        assert entry is not None and entry.expires_at is not None
        assert abs(entry.expires_at - (entry.created_at + retention)) < 60
        await agent.blackboard.expire([key], 30)  # as if most of its retention had passed
        policy.set_state(saved)  # a checkpoint restore puts this view back
        await policy.compactor.flush_archives()
        refreshed = await agent.blackboard.read(key)
        assert refreshed is not None and refreshed.expires_at is not None
        assert refreshed.expires_at > entry.created_at + retention - 60
    finally:
        await runtime.shutdown()


def test_the_budget_is_clamped_so_every_call_fits_the_window() -> None:
    # a summary the window cannot hold: at most a quarter of the window and of the limit, and the
    # summariser's call (input + summary) fits the window
    budget = plan_budget(ContextSettings(summary_max_tokens=8192), 4096, 256)
    assert budget is not None
    assert budget.summary_max <= 4096 // 4 and budget.summary_max <= budget.limit // 4
    assert budget.summariser_input + budget.summary_max <= 4096
    assert budget.limit + budget.planner_max <= 4096
    # a planner max_tokens near the window: clamped, so the prompt keeps a quarter of the window
    # and prompt limit + the planner's output still fit it
    near = plan_budget(ContextSettings(), 4096, 4050)
    assert near is not None
    assert near.planner_max == 4096 - 1024 and near.limit == 1024
    assert near.limit + near.planner_max <= 4096
    assert near.trigger <= near.limit
    # a configured budget: the summary is at most a quarter of it
    small = plan_budget(ContextSettings(token_budget=200, summary_max_tokens=256), None, 64)
    assert small is not None and small.summary_max == 50 and small.planner_max == 64


async def test_the_planner_asks_for_the_clamped_max_tokens(board: Blackboard) -> None:
    planner = Planner(dump_at=10_000)
    engine = ExactScriptedEngine(lambda r: "S." if is_summariser(r) else planner.decide(r))
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        plan = blueprint("greedy", ContextSettings())
        plan.action_policy = StructuredActionPolicy.bind(goals=["Watch."], max_tokens=4050)
        agent = await runtime.spawn(plan)
        agent.max_steps = 5
        await agent.begin_run({"task": "Watch the sensors"})
        agent.context.append(observation(0))
        await agent.run_step()
        (request,) = engine.requests
        assert request.max_tokens == 4096 - 1024  # the prompt keeps a quarter of the 4096 window
    finally:
        await runtime.shutdown()


async def test_the_code_writing_planner_asks_for_the_clamped_max_tokens(board: Blackboard) -> None:
    """The code-writing planner asks for the output the window leaves beside its prompt, as the
    structured one does (its program would otherwise not fit the window beside the prompt)."""
    from colony.planning import CodeGenerationActionPolicy

    program = "```python\nrun('finish', answer='done')\n```"
    engine = ExactScriptedEngine(lambda r: "S." if is_summariser(r) else program)
    runtime = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:8]}", engine=engine, settings=load_settings()
    )
    try:
        plan = blueprint("greedy-coder", ContextSettings())
        plan.action_policy = CodeGenerationActionPolicy.bind(goals=["Watch."], max_tokens=4050)
        agent = await runtime.spawn(plan)
        run = await agent.run({"task": "Watch the sensors"})
        assert run.output == "done", run
        (request,) = engine.requests
        assert request.max_tokens == 4096 - 1024  # the prompt keeps a quarter of the 4096 window
    finally:
        await runtime.shutdown()
