"""Action policies: what an agent does next, one iteration at a time.

A policy sees an `ActionPolicyExecutionState` (the run, its input, the actions it may choose,
context gathered by event handlers) and returns an `ActionPolicyIterationResult`. Its own state
must be JSON (`get_state`/`set_state`): the agent stores it after every iteration, which is what
lets a dropped agent continue where it was.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from colony.agents.blueprint import Bindable
from colony.agents.models import ActionResult, AgentRun
from colony.errors import AgentUsageError

if TYPE_CHECKING:
    from colony.agents.actions import ActionSpec
    from colony.agents.base import Agent

INPUT_PLACEHOLDER = "$input"


class ActionPolicyExecutionState(BaseModel):
    """What a policy iteration gets to decide on."""

    agent_id: str
    run: AgentRun
    step: int
    actions: list[dict[str, Any]] = Field(
        default_factory=list, description="JSON schemas of plannable actions"
    )
    context: list[dict[str, Any]] = Field(
        default_factory=list, description="accumulated event-handler context"
    )
    last_result: ActionResult | None = None


class ActionPolicyIterationResult(BaseModel):
    """The outcome of one iteration: the action taken (if any) and whether the run is finished."""

    action: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    action_result: ActionResult | None = None
    done: bool = False
    output: Any = None
    error: str | None = None


class ActionPolicy(Bindable, ABC):
    """Decides and dispatches the agent's next action."""

    def __init__(self, agent: Agent | None = None) -> None:
        self.agent = agent
        self._enabled: set[str] | None = None  # None: every capability's actions

    @abstractmethod
    async def execute_iteration(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult: ...

    def on_run_start(self, run: AgentRun) -> None:
        """A new run begins: reset per-run state (called before its first iteration)."""

    def use_agent_capabilities(self, names: Iterable[str]) -> None:
        """Let the planner choose the actions of these capabilities (besides those already enabled)."""
        self._enabled = (self._enabled or set()) | set(names)

    def disable_agent_capabilities(self, names: Iterable[str]) -> None:
        if self._enabled is None and self.agent is not None:
            self._enabled = set(self.agent.capabilities)
        self._enabled = (self._enabled or set()) - set(names)

    @property
    def enabled_capabilities(self) -> set[str] | None:
        return None if self._enabled is None else set(self._enabled)

    def planning_actions(self) -> list[ActionSpec]:
        if self.agent is None:
            return []
        return self.agent.dispatcher.planning_actions(self._enabled)

    def get_state(self) -> dict[str, Any]:
        """JSON state to persist after every iteration (subclasses add theirs to this)."""
        return {"enabled": sorted(self._enabled) if self._enabled is not None else None}

    def set_state(self, state: dict[str, Any]) -> None:
        enabled = state.get("enabled")
        self._enabled = set(enabled) if enabled is not None else None


def _substitute(value: Any, run_input: Any) -> Any:
    """ "$input" is the run's input; "$input.a.b" a field of it (None where absent)."""
    if not isinstance(value, str) or not value.startswith(INPUT_PLACEHOLDER):
        return value
    if value == INPUT_PLACEHOLDER:
        return run_input
    if not value.startswith(INPUT_PLACEHOLDER + "."):
        return value
    current = run_input
    for part in value[len(INPUT_PLACEHOLDER) + 1 :].split("."):
        current = current.get(part) if isinstance(current, dict) else None
    return current


class ScriptedStep(BaseModel):
    action: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class ScriptedActionPolicy(ActionPolicy):
    """Deterministic policy for tests and fixed pipelines: dispatch the scripted actions in order.

    A parameter value "$input" is replaced by the run's input, "$input.field" by one of its
    fields. The run's output is the last
    action's output. A failed action fails the run unless `continue_on_error`; a blocked one
    leaves the step to be retried after the agent resumes.
    """

    def __init__(
        self,
        steps: Iterable[ScriptedStep | dict[str, Any]],
        agent: Agent | None = None,
        *,
        continue_on_error: bool = False,
    ) -> None:
        super().__init__(agent)
        self.steps = [s if isinstance(s, ScriptedStep) else ScriptedStep.model_validate(s) for s in steps]
        self.continue_on_error = continue_on_error
        self.index = 0
        self.outputs: list[Any] = []

    def on_run_start(self, run: AgentRun) -> None:
        self.index, self.outputs = 0, []

    async def execute_iteration(self, state: ActionPolicyExecutionState) -> ActionPolicyIterationResult:
        if self.agent is None:
            raise AgentUsageError(
                "ScriptedActionPolicy needs its agent (build it with local_instance(agent=...))"
            )
        if self.index >= len(self.steps):
            return ActionPolicyIterationResult(done=True, output=self.outputs[-1] if self.outputs else None)
        step = self.steps[self.index]
        params = {k: _substitute(v, state.run.input) for k, v in step.parameters.items()}
        result = await self.agent.dispatcher.dispatch(step.action, params)
        if result.blocked:
            return ActionPolicyIterationResult(action=step.action, parameters=params, action_result=result)
        self.index += 1
        if not result.success and not self.continue_on_error:
            return ActionPolicyIterationResult(
                action=step.action, parameters=params, action_result=result, done=True, error=result.error
            )
        self.outputs.append(result.output)
        done = self.index >= len(self.steps)
        return ActionPolicyIterationResult(
            action=step.action,
            parameters=params,
            action_result=result,
            done=done,
            output=result.output if done else None,
        )

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "index": self.index, "outputs": self.outputs}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.index = int(state.get("index", 0))
        self.outputs = list(state.get("outputs", []))
