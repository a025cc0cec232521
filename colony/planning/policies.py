"""Event-driven action policies: streams fed from events and actions, and a model deciding next.

`EventDrivenActionPolicy` feeds every accumulated event context (high-priority keys first) and
every action call to every consciousness stream, builds the planning context and leaves the
decision to `plan_step`. `StructuredActionPolicy` asks the model for JSON constrained to the
available actions (each: its key plus its own parameter schema), so even a 135M model always
answers with a valid, dispatchable action.

Both keep their history under the token budget with a `Compactor` (colony/planning/compaction.py):
large outputs are archived when recorded, and the prompt is compacted before it is sent
(`fit_prompt`); its summary, pending items and archive references are policy state.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from colony.agents.blueprint import Blueprint
from colony.agents.models import ActionResult
from colony.agents.policy import ActionPolicy, ActionPolicyExecutionState, ActionPolicyIterationResult
from colony.agents.reply_stream import emit_usage
from colony.agents.state.action_log import ModelChannel
from colony.config import ContextSettings
from colony.errors import AgentUsageError
from colony.inference import ChatMessage, InferenceRequest, InferenceResponse
from colony.inference.engine import InferenceEngine
from colony.planning.compaction import (
    DEFAULT_PINNED_KEYS,
    RECALL,
    RECALL_ACTION,
    REF_PATTERN,
    Compactor,
    FittedPrompt,
)
from colony.planning.context import PlanningContext, PlanningContextBuilder, format_planning_prompt
from colony.planning.functions import OfferedFunctions, call_output, offered_functions
from colony.planning.streams import ConsciousnessStream
from colony.wire.run_task import task_text

if TYPE_CHECKING:
    from colony.agents.base import Agent

log = logging.getLogger(__name__)
REF = re.compile(REF_PATTERN)
MAX_PROMPT_EVENT_CHARS = 50_000
CALL_TRACE_MAX = 50  # calls of the current run kept in the trace (slim records, no outputs)
TRACE_PREVIEW_CHARS = 200

FINISH = "finish"
FINISH_ACTION = {
    "name": FINISH,
    "description": "End the task and give the final answer.",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
}


def call_record(
    action: str, parameters: dict[str, Any], result: ActionResult, preview_chars: int = 500
) -> dict[str, Any]:
    """The dict a stream's `consider_action` gets for one dispatched action."""
    output = result.output
    text = output if isinstance(output, str) else json.dumps(output, default=str)
    return {
        "action_key": action,
        "parameters": parameters,
        "success": result.success,
        "output": output,
        "output_preview": text[:preview_chars],
        "error": result.error,
        **({"blocked": result.blocked_reason or True} if result.blocked else {}),
    }


class EventDrivenActionPolicy(ActionPolicy):
    def __init__(
        self,
        agent: Agent | None = None,
        *,
        consciousness_streams: Iterable[ConsciousnessStream | Blueprint[ConsciousnessStream]] = (),
        goals: Iterable[str] = (),
        constraints: Iterable[str] = (),
        priority_context_keys: Iterable[str] = (),
        wait_for_events: bool = False,
        event_wait_seconds: float = 30.0,
        context_settings: ContextSettings | None = None,
        pinned_context_keys: Iterable[str] = DEFAULT_PINNED_KEYS,
    ) -> None:
        """`context_settings`: the compaction settings (default: `context` of the host's settings);
        `pinned_context_keys`: event context keys whose stream entries are never compacted."""
        super().__init__(agent)
        self.streams = [s.local_instance() if isinstance(s, Blueprint) else s for s in consciousness_streams]
        self.goals = list(goals)
        self.constraints = list(constraints)
        self.priority_context_keys = set(priority_context_keys)
        self.wait_for_events = wait_for_events
        self.event_wait_seconds = event_wait_seconds
        self.builder = PlanningContextBuilder(self.streams)
        self.call_trace: list[dict[str, Any]] = []
        self._context_seen = 0
        self.compactor = Compactor(self, context_settings, pinned_context_keys)
        # a call that came back blocked (waiting for other agents): run again when the agent resumes
        self.blocked_call: dict[str, Any] | None = None

    # -- capture -------------------------------------------------------------------------------

    def _new_contexts(self) -> list[dict[str, Any]]:
        if self.agent is None:
            return []
        fresh = self.agent.context[self._context_seen :]
        self._context_seen = len(self.agent.context)
        urgent = [c for c in fresh if self.priority_context_keys & set(c)]
        return urgent + [c for c in fresh if not self.priority_context_keys & set(c)]

    def consider_events(self) -> int:
        """Feed contexts gathered since the last iteration to every stream; how many there were.
        Long values are archived and recorded by reference (`Compactor.mask_event`)."""
        contexts = self._new_contexts()
        for contexts_of_event in contexts:
            # a value longer than `context.mask_output_chars` is archived (written by the next
            # `flush_archives`, before the step persists) and recorded as a preview with its ref
            recorded = self.compactor.mask_event(contexts_of_event) if self.streams else contexts_of_event
            for stream in self.streams:
                stream.consider_event(recorded)
        return len(contexts)

    def held_archive_refs(self) -> list[str]:
        """Archives this policy still needs whole (none here; a policy holding its last output by
        reference names that one), which the archive cap never deletes."""
        return []

    def record_call(self, call: dict[str, Any]) -> None:
        """A dispatched action: into the run's call trace (a slim record) and every stream, its
        output archived and shown by reference when longer than `context.mask_output_chars`
        (written by the next `flush_archives`, which `record_action` and `fit_prompt` call)."""
        call = self.compactor.mask_call(call)
        self.call_trace.append(trace_record(call))
        del self.call_trace[:-CALL_TRACE_MAX]
        for stream in self.streams:
            stream.consider_action(call)

    async def record_action(self, action: str, parameters: dict[str, Any], result: ActionResult) -> None:
        """Record a dispatched action and write what it archived before the step is persisted."""
        self.record_call(call_record(action, parameters, result))
        await self.compactor.flush_archives()

    async def wait_for_next_event(self, timeout: float | None = None) -> bool:
        """Until an event handler adds context (True) or `timeout` passes (False)."""
        if self.agent is None:
            return False
        if len(self.agent.context) > self._context_seen:
            return True
        self.agent.context_changed.clear()
        try:
            await asyncio.wait_for(self.agent.context_changed.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- decide ----------------------------------------------------------------------------------

    async def execute_iteration(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult:
        if self.blocked_call is not None:  # resumed: the call that waited is made again, not re-planned
            action, parameters = self.blocked_call["action"], dict(self.blocked_call["parameters"])
            done = await self.dispatch(action, parameters)
            self.after_dispatch(done)
            return ActionPolicyIterationResult(action=action, parameters=parameters, action_result=done)
        waiting = self.consider_events() == 0 and self.wait_for_events
        if waiting and await self.wait_for_next_event(self.event_wait_seconds):
            self.consider_events()
        result = await self.plan_step(state)
        # outputs a subclass recorded with the sync `record_call` are archived before the step persists
        await self.compactor.flush_archives()
        return result

    async def plan_step(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult:
        raise AgentUsageError(f"{type(self).__name__} must implement plan_step (e.g. StructuredActionPolicy)")

    def planning_context(
        self,
        state: ActionPolicyExecutionState,
        actions: list[dict[str, Any]],
        memory_sections: list[str] | None = None,
    ) -> PlanningContext:
        return self.builder.get_planning_context(
            goals=[*self.goals, f"Task: {task_text(state.run.input)}"],
            constraints=self.constraints,
            actions=actions,
            memory_sections=memory_sections,
            step=state.step,
            history_summary=self.compactor.summary_section(),
        )

    def planning_action_schemas(self) -> list[dict[str, Any]]:
        """The plannable actions' schemas, plus `recall_archived` once something was archived."""
        actions = [a.json_schema() for a in self.planning_actions()]
        if actions and self.compactor.has_archives:
            actions.append(RECALL_ACTION)
        return actions

    async def fit_prompt(
        self,
        state: ActionPolicyExecutionState,
        render: Callable[[], str],
        *,
        engine: InferenceEngine | None,
        system: str,
        max_tokens: int,
    ) -> FittedPrompt:
        """The prompt `render()` makes (it reads the policy's streams and summary each time),
        compacted under the token budget first when it passes the trigger; emitted as the step's
        `prompt` run event when the run asked for it."""
        fitted = await self.compactor.fit(
            state.step, engine, render, system=system, planner_max_tokens=max_tokens
        )
        await self.emit_prompt(
            state, fitted.text, tokens=fitted.tokens, budget=fitted.budget.limit if fitted.budget else None
        )
        return fitted

    async def recall_archived(self, parameters: dict[str, Any]) -> ActionPolicyIterationResult:
        """The planner chose `recall_archived`: read the archive and record the call."""
        result = await self.compactor.recall(parameters)
        await self.record_action(RECALL, parameters, result)
        return ActionPolicyIterationResult(action=RECALL, parameters=parameters, action_result=result)

    async def memory_sections(self, state: ActionPolicyExecutionState) -> list[str]:
        """The agent's memory lenses rendered for this task (capabilities offering
        `memory_sections(task)`, e.g. MemoryToolsCapability). Memory that cannot be read leaves its
        section out: planning goes on without it."""
        if self.agent is None:
            return []
        sections: list[str] = []
        for capability in list(self.agent.capabilities.values()):
            render = getattr(capability, "memory_sections", None)
            if render is None or not callable(render):
                continue
            try:
                sections += await render(task_text(state.run.input))
            except Exception as exc:
                log.warning(
                    "agent %s: memory section of %s left out: %r", self.agent.agent_id, capability.name, exc
                )
        return sections

    async def emit_prompt(
        self,
        state: ActionPolicyExecutionState,
        prompt: str,
        *,
        tokens: int | None = None,
        budget: int | None = None,
    ) -> None:
        """The whole prompt as a `prompt` run event, when the run asked for it (input
        `{"emit_prompt": true, ...}`): what the planner saw, for debugging and tests, with its
        token count and the budget it was kept under (None: no budget applies)."""
        run_input = state.run.input
        if self.agent is not None and isinstance(run_input, dict) and run_input.get("emit_prompt") is True:
            data: dict[str, Any] = {"step": state.step, "text": prompt[:MAX_PROMPT_EVENT_CHARS]}
            if tokens is not None:
                data |= {"tokens": tokens, "budget": budget}
            await self.agent.emit_run_event("prompt", data)

    async def generate(
        self, engine: InferenceEngine, request: InferenceRequest, *, channel: ModelChannel = "model"
    ) -> InferenceResponse:
        """A model call of this policy, through the agent's write-ahead action log: a resumed run
        gets the recorded response back instead of calling the model again. `channel` "summary"
        (compaction's summariser) is numbered apart from the planner's calls ("model"), so a redone
        step that summarises still gets the planner's recorded decision back."""
        if self.agent is None:
            return await engine.generate(request)
        agent = self.agent

        async def call() -> InferenceResponse:  # (not replayed: the engine's work, in the run's usage)
            response = await engine.generate(request)
            await emit_usage(agent, response.usage)
            return response

        return await agent.action_log.model_call(request, call, channel=channel)

    async def dispatch(self, action: str, parameters: dict[str, Any]) -> ActionResult:
        if self.agent is None:
            raise AgentUsageError("the policy has no agent to dispatch with; build it with agent=...")
        result = await self.agent.dispatcher.dispatch(action, parameters)
        await self.record_action(action, parameters, result)
        self.blocked_call = {"action": action, "parameters": parameters} if result.blocked else None
        return result

    def after_dispatch(self, result: ActionResult) -> None:
        """What a policy keeps of a dispatched call's result (a planner: its output)."""

    # -- state -----------------------------------------------------------------------------------

    def on_run_start(self, run: Any) -> None:
        self.call_trace = []
        self.blocked_call = None

    def get_state(self) -> dict[str, Any]:
        return {
            **super().get_state(),
            "streams": {s.name: s.entries for s in self.streams},
            "call_trace": self.call_trace,
            "context_seen": self._context_seen,
            "compaction": self.compactor.get_state(),
            "blocked_call": self.blocked_call,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        saved = state.get("streams") or {}
        for stream in self.streams:
            stream.entries = list(saved.get(stream.name, []))
        self.call_trace = list(state.get("call_trace") or [])
        self._context_seen = int(state.get("context_seen", 0))
        self.compactor.set_state(state.get("compaction"))
        held = state.get("blocked_call")
        valid = isinstance(held, dict) and isinstance(held.get("action"), str)
        self.blocked_call = dict(held) if valid and isinstance(held.get("parameters"), dict) else None


def trace_record(call: dict[str, Any]) -> dict[str, Any]:
    """What the call trace keeps of a call: no output, a short preview (the streams hold the rest)."""
    error = call.get("error")
    return {
        "action_key": call.get("action_key"),
        "parameters": call.get("parameters"),
        "success": call.get("success"),
        "output_preview": str(call.get("output_preview", ""))[:TRACE_PREVIEW_CHARS],
        "error": error[: TRACE_PREVIEW_CHARS * 5] if isinstance(error, str) else error,
        **({"blocked": call["blocked"]} if call.get("blocked") else {}),
    }


def choice_schema(actions: list[dict[str, Any]]) -> dict[str, Any]:
    """JSON Schema of one decision: an action key and that action's parameters."""
    options = [
        {
            "type": "object",
            "properties": {
                "action": {"const": a["name"]},
                "parameters": a.get("parameters") or {"type": "object"},
            },
            "required": ["action", "parameters"],
            "additionalProperties": False,
        }
        for a in actions
    ]
    return options[0] if len(options) == 1 else {"oneOf": options}


class StructuredActionPolicy(EventDrivenActionPolicy):
    """The model picks the next action as schema-constrained JSON; the default for small models.

    When no action is available any more the run ends with the last action's output; `finish`
    lets the model end earlier with an answer of its own.
    """

    SYSTEM = (
        "You are the planner of an agent. Read the goals, what happened so far and the available actions, "
        "then choose the single next action and its parameters."
    )

    def __init__(
        self,
        agent: Agent | None = None,
        *,
        engine: InferenceEngine | None = None,
        max_tokens: int = 256,
        allow_finish: bool = True,
        consciousness_streams: Iterable[ConsciousnessStream | Blueprint[ConsciousnessStream]] = (),
        goals: Iterable[str] = (),
        constraints: Iterable[str] = (),
        priority_context_keys: Iterable[str] = (),
        wait_for_events: bool = False,
        event_wait_seconds: float = 30.0,
        context_settings: ContextSettings | None = None,
        pinned_context_keys: Iterable[str] = DEFAULT_PINNED_KEYS,
        client_functions: bool = False,
    ) -> None:
        # explicit parameters, no **kwargs: a host injects only the services a policy names
        # (engine=), not its settings, replica or page table
        super().__init__(
            agent,
            consciousness_streams=consciousness_streams,
            goals=goals,
            constraints=constraints,
            priority_context_keys=priority_context_keys,
            wait_for_events=wait_for_events,
            event_wait_seconds=event_wait_seconds,
            context_settings=context_settings,
            pinned_context_keys=pinned_context_keys,
        )
        self.engine = engine
        self.max_tokens = max_tokens
        self.allow_finish = allow_finish
        # the functions a run's client offers (`tools` in its input) are actions too: choosing one
        # ends the run with the call (colony.planning.functions); off: the input's `tools` unread
        self.client_functions = client_functions
        self._last_output: Any = None
        # a last output longer than `context.mask_output_chars` is held in state by its archive
        # reference (Compactor.archived_value) and read back only when it becomes the run's output
        self._last_output_ref: dict[str, Any] | None = None

    def _remember_output(self, output: Any) -> None:
        self._last_output = output
        self._last_output_ref = self.compactor.archived_value(output)

    async def _run_output(self) -> Any:
        """The run's output: the last action's, read back whole from its archive when the policy
        holds only its reference (a restored agent)."""
        if self._last_output_ref is not None and self._last_output is None:
            self._last_output = await self.compactor.read_archived_value(self._last_output_ref)
        return self._last_output

    def held_archive_refs(self) -> list[str]:
        ref = (self._last_output_ref or {}).get("ref")
        return [ref] if isinstance(ref, str) else []

    async def plan_step(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult:
        if self.engine is None:
            raise AgentUsageError("StructuredActionPolicy needs an engine (hosted agents get the replica's)")
        actions = self.planning_action_schemas()
        functions = self.offered_functions(state, actions)
        if functions is not None:
            actions = functions.actions(actions)
        if not actions:
            return ActionPolicyIterationResult(done=True, output=await self._run_output())
        if self.allow_finish and state.step > 0 and (functions is None or not functions.only):
            actions.append(FINISH_ACTION)
        memory = await self.memory_sections(state)

        def render() -> str:
            return format_planning_prompt(
                self.planning_context(state, actions, memory),
                instructions="Answer with JSON naming the next action and its parameters.",
            )

        fitted = await self.fit_prompt(
            state, render, engine=self.engine, system=self.SYSTEM, max_tokens=self.max_tokens
        )
        prompt = fitted.text
        # a max_tokens the window cannot hold beside a prompt is clamped (Budget.planner_max)
        max_tokens = fitted.budget.planner_max if fitted.budget is not None else self.max_tokens
        response = await self.generate(
            self.engine,
            InferenceRequest(
                messages=[
                    ChatMessage(role="system", content=self.SYSTEM),
                    ChatMessage(role="user", content=prompt),
                ],
                response_format=choice_schema(actions),
                max_tokens=max_tokens,
                temperature=0.0,
            ),
        )
        decision = response.parsed
        action, parameters = decision["action"], decision.get("parameters") or {}
        if action == FINISH:
            return ActionPolicyIterationResult(action=FINISH, done=True, output=parameters.get("answer"))
        if action == RECALL:
            return await self.recall_archived(parameters)
        if functions is not None and action in functions.names:  # the client runs it: the run's answer
            key = f"{state.run.run_id}:{state.step}"
            return ActionPolicyIterationResult(
                action=action, parameters=parameters, done=True, output=call_output(action, parameters, key)
            )
        result = await self.dispatch(action, parameters)
        self.after_dispatch(result)
        return ActionPolicyIterationResult(action=action, parameters=parameters, action_result=result)

    def offered_functions(
        self, state: ActionPolicyExecutionState, actions: list[dict[str, Any]]
    ) -> OfferedFunctions | None:
        """The client's functions this run offers, when this policy takes them."""
        if not self.client_functions:
            return None
        own = [a["name"] for a in actions] + [FINISH, RECALL]
        return offered_functions(state.run.input, own)

    def after_dispatch(self, result: ActionResult) -> None:
        if result.success and not result.blocked:
            self._remember_output(result.output)

    def on_run_start(self, run: Any) -> None:
        super().on_run_start(run)
        self._last_output, self._last_output_ref = None, None

    def get_state(self) -> dict[str, Any]:
        """A large last output is stored as its archive reference (`last_output_ref`), not whole:
        it would otherwise sit in the policy state and every checkpoint until the run ends."""
        if self._last_output_ref is not None:
            return {**super().get_state(), "last_output": None, "last_output_ref": self._last_output_ref}
        return {**super().get_state(), "last_output": self._last_output}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        held = state.get("last_output_ref")
        valid = isinstance(held, dict) and isinstance(held.get("ref"), str) and REF.match(held["ref"])
        self._last_output_ref = dict(held) if valid else None  # type: ignore[arg-type]
        self._last_output = None if valid else state.get("last_output")
