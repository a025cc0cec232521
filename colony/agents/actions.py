"""Action executors: capability methods the action policy (and so the LLM) can invoke.

`@action_executor` marks a method; the agent discovers marked methods on every capability it
holds. Each action's parameters become a pydantic model built from the type hints (docstring
first paragraph = description), which gives the JSON schema the planner sees and validates the
parameters before the call: bad parameters become a failed ActionResult naming the field.

Every call goes through the agent's write-ahead action log (colony/agents/state/action_log.py): its
result is recorded before the policy sees it, so a step redone after a crash does not run an
action that had finished. `effects=` declares what an action does that restoring an agent's
checkpoint cannot take back (children spawned, writes outside the agent's own state, calls out of
Colony); an undo reports those calls. An action that declares an effect names what it creates
after its idempotency key, so a redo after a crash finds it made (once); one that declares none is
at-least-once (docs/effects.md lists every built-in action's guarantee).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from colony.agents.hooks import hookable
from colony.agents.models import ActionResult, ActionType
from colony.errors import AgentUsageError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from colony.agents.base import Agent, AgentCapability

ACTION_ATTR = "__colony_action__"

# What an action may do that a checkpoint restore cannot undo (declared with `effects=`):
EFFECTS: dict[str, str] = {
    "spawn": "starts other agents (children, workers)",
    "colony_write": "writes outside the agent's own state (colony or shared scopes, another agent's run, "
    "blocks shared with others)",
    "memory_write": "writes the agent's memory entries or blocks (not part of its checkpoints)",
    "external": "calls out of Colony (HTTP, processes, other services)",
}


@dataclass(frozen=True)
class ActionOptions:
    name: str | None
    description: str | None
    exclude_from_planning: bool
    action_type: ActionType | None
    effects: tuple[str, ...] = ()


def action_executor(
    *,
    name: str | None = None,
    description: str | None = None,
    exclude_from_planning: bool = False,
    action_type: ActionType | None = None,
    effects: Iterable[str] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark an async capability method as an action; `exclude_from_planning` hides it from the
    planner; `effects` names what it does that undoing a step cannot take back (keys of EFFECTS)."""
    declared = tuple(dict.fromkeys(effects))
    unknown = [e for e in declared if e not in EFFECTS]
    if unknown:
        raise AgentUsageError(
            f"@action_executor(effects=...) got unknown effect(s) {unknown}; known: {', '.join(EFFECTS)}"
        )

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@action_executor needs an async method; {fn.__qualname__} is not")
        options = ActionOptions(name, description, exclude_from_planning, action_type, declared)
        setattr(fn, ACTION_ATTR, options)
        return fn

    return mark


@dataclass(frozen=True)
class ActionSpec:
    """One discovered action, bound to its capability instance."""

    name: str
    capability: str
    description: str
    parameters: type[BaseModel]
    method: Callable[..., Any]
    exclude_from_planning: bool
    action_type: ActionType | None
    effects: tuple[str, ...] = ()

    def json_schema(self) -> dict[str, Any]:
        """The action as a planner sees it (built for every step: a fresh copy each time)."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": json.loads(_schema_text(self.parameters)),
        }


@functools.lru_cache(maxsize=4096)
def _schema_text(model: type[BaseModel]) -> str:
    """A parameters model's JSON schema, made once: pydantic builds it anew on every call, which
    cost a one-step run about 2% of its replica's CPU (the schemas go into every step's state)."""
    return json.dumps(model.model_json_schema())


@functools.lru_cache(maxsize=4096)
def _parameters_model(fn: Callable[..., Any], model_name: str) -> type[BaseModel]:
    """The model of an action method's parameters; one per method (every instance of the
    capability shares it), not one per agent."""
    signature = inspect.signature(fn)
    hints = typing.get_type_hints(fn, include_extras=True)  # keep Annotated bounds (max_length, ge...)
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)


def discover_actions(capability: AgentCapability) -> list[ActionSpec]:
    """Every `@action_executor` method of a capability, bound to it."""
    specs = []
    for attr in dir(type(capability)):
        fn = getattr(type(capability), attr, None)
        options: ActionOptions | None = getattr(fn, ACTION_ATTR, None)
        if options is None:
            continue
        doc = inspect.getdoc(fn) or ""
        name = options.name or attr
        specs.append(
            ActionSpec(
                name=name,
                capability=capability.name,
                description=options.description or doc.split("\n\n")[0].strip(),
                parameters=_parameters_model(fn, f"{type(capability).__name__}_{name}_params"),
                method=getattr(capability, attr),
                exclude_from_planning=options.exclude_from_planning,
                action_type=options.action_type,
                effects=options.effects,
            )
        )
    return specs


def _describe_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(parameters)"
        parts.append(f"{field}: {err['msg']}")
    return "invalid parameters: " + "; ".join(parts)


class ActionDispatcher:
    """The actions an agent can take, and the one place they are called from."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._actions: dict[str, ActionSpec] = {}

    def add(self, specs: Iterable[ActionSpec]) -> None:
        for spec in specs:
            if spec.name in self._actions and self._actions[spec.name].capability != spec.capability:
                raise AgentUsageError(
                    f"action {spec.name!r} is offered by both {self._actions[spec.name].capability!r} and "
                    f"{spec.capability!r}; exclude it from one (add_capability(exclude_actions=[...]))"
                )
            self._actions[spec.name] = spec

    def remove_capability(self, capability_name: str) -> None:
        self._actions = {n: s for n, s in self._actions.items() if s.capability != capability_name}

    def get(self, name: str) -> ActionSpec | None:
        return self._actions.get(name)

    def all_actions(self) -> list[ActionSpec]:
        return sorted(self._actions.values(), key=lambda s: s.name)

    def planning_actions(self, capabilities: Iterable[str] | None = None) -> list[ActionSpec]:
        """Actions the planner may choose (optionally only those of some capabilities)."""
        wanted = set(capabilities) if capabilities is not None else None
        available: dict[str, set[str] | None] = {}
        for name, capability in self.agent.capabilities.items():
            available[name] = capability.available_actions()
        return [
            s
            for s in self.all_actions()
            if not s.exclude_from_planning
            and (wanted is None or s.capability in wanted)
            and (available.get(s.capability) is None or s.name in available[s.capability])  # type: ignore[operator]
        ]

    @hookable
    async def dispatch(self, action: str, parameters: dict[str, Any] | None = None) -> ActionResult:
        """Validate the parameters, call the action through the agent's action log (a result
        recorded before, in a step redone after a crash, is returned without calling it again),
        return its ActionResult (the action's errors become data; the log's own errors, e.g.
        Redis unreachable, propagate: an action is never acted on unrecorded)."""
        spec = self._actions.get(action)
        if spec is None:
            known = ", ".join(sorted(self._actions)) or "none"
            return ActionResult(success=False, error=f"unknown action {action!r}; known actions: {known}")
        try:
            params = spec.parameters.model_validate(parameters or {})
        except ValidationError as exc:
            return ActionResult(success=False, error=f"{action}: {_describe_validation(exc)}")

        async def call() -> ActionResult:
            try:
                output = await spec.method(**dict(params))
            except Exception as exc:  # an action's failure is data for the policy, not a crash
                # logged once, with its traceback, here where it is caught (the result carries the
                # type and message to the policy, the run's step event and `colony run`)
                log.warning("agent %s: action %s raised", self.agent.agent_id, action, exc_info=True)
                return ActionResult(success=False, error=f"{action} failed: {type(exc).__name__}: {exc}")
            return output if isinstance(output, ActionResult) else ActionResult(success=True, output=output)

        return await self.agent.action_log.action_call(
            action,
            params.model_dump(mode="json", fallback=str),
            call,
            capability=spec.capability,
            effects=spec.effects,
        )
