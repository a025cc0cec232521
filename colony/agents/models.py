"""The agent system's data: lifecycle states and their legal transitions, metadata, actions,
action results, resumption conditions and runs. All of it is JSON-safe so it can live in the
blackboard (the one exception, `action_policy_blueprints`, is excluded from JSON)."""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from colony.agents.profile import AgentProfile
from colony.errors import IllegalStateTransition
from colony.wire.run_events import RunStatus


class AgentState(StrEnum):
    INITIALIZED = "initialized"  # created, not yet started
    RUNNING = "running"  # executing an action-policy iteration
    WAITING = "waiting"  # blocked on input, a tool result or a child agent
    LOADED = "loaded"  # VCM-bound, pages resident in cache
    UNLOADED = "unloaded"  # VCM-bound, pages evicted
    IDLE = "idle"  # between tasks
    SUSPENDED = "suspended"  # resources freed, state in the blackboard, resumable
    STOPPED = "stopped"  # terminated gracefully
    FAILED = "failed"  # terminated by an error


_S = AgentState
LEGAL_TRANSITIONS: dict[AgentState, frozenset[AgentState]] = {
    _S.INITIALIZED: frozenset(
        {_S.RUNNING, _S.IDLE, _S.LOADED, _S.UNLOADED, _S.SUSPENDED, _S.STOPPED, _S.FAILED}
    ),
    _S.RUNNING: frozenset({_S.IDLE, _S.WAITING, _S.SUSPENDED, _S.UNLOADED, _S.STOPPED, _S.FAILED}),
    _S.WAITING: frozenset({_S.RUNNING, _S.SUSPENDED, _S.STOPPED, _S.FAILED}),
    _S.LOADED: frozenset({_S.RUNNING, _S.IDLE, _S.UNLOADED, _S.SUSPENDED, _S.STOPPED, _S.FAILED}),
    _S.UNLOADED: frozenset({_S.LOADED, _S.SUSPENDED, _S.STOPPED, _S.FAILED}),
    _S.IDLE: frozenset({_S.RUNNING, _S.WAITING, _S.UNLOADED, _S.SUSPENDED, _S.STOPPED, _S.FAILED}),
    _S.SUSPENDED: frozenset({_S.RUNNING, _S.IDLE, _S.LOADED, _S.STOPPED, _S.FAILED}),
    _S.STOPPED: frozenset(),
    _S.FAILED: frozenset(),
}
TERMINAL_STATES = frozenset({_S.STOPPED, _S.FAILED})


def check_transition(current: AgentState, new: AgentState) -> None:
    """Raise `IllegalStateTransition` unless `current -> new` is in the table."""
    if new not in LEGAL_TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in LEGAL_TRANSITIONS[current])) or "none (terminal)"
        raise IllegalStateTransition(
            f"an agent cannot go from {current.value} to {new.value}; allowed: {allowed}"
        )


class AgentType(StrEnum):
    VCM_BOUND = "vcm_bound"  # loaded/unloaded with its pages
    UNBOUND = "unbound"  # picks pages as it goes
    SERVICE = "service"  # always running, serves other agents
    SUPERVISOR = "supervisor"  # coordinates others, independent of pages


class ActionType(StrEnum):
    """The seed's action taxonomy."""

    PLAN_CREATE = "plan_create"
    PLAN_REVISE = "plan_revise"
    PLAN_BACKTRACK = "plan_backtrack"
    ANALYZE = "analyze"
    HYPOTHESIS_TEST = "hypothesis_test"
    DECISION_MAKE = "decision_make"
    TOOL_DISCOVER = "tool_discover"
    TOOL_USE = "tool_use"
    TOOL_FIX = "tool_fix"
    TOOL_CREATE = "tool_create"
    CONTEXT_FETCH = "context_fetch"
    CONTEXT_COMPACT = "context_compact"
    CONTEXT_SUMMARIZE = "context_summarize"
    MESSAGE_SEND = "message_send"
    MESSAGE_RECEIVE = "message_receive"
    NEGOTIATE = "negotiate"
    MEMORY_SEARCH = "memory_search"
    MEMORY_READ = "memory_read"
    MEMORY_WRITE = "memory_write"
    AGENT_SPAWN = "agent_spawn"
    AGENT_TERMINATE = "agent_terminate"
    AGENT_MONITOR = "agent_monitor"
    OUTPUT_WRITE = "output_write"
    OUTPUT_FORMAT = "output_format"
    REPORT_GENERATE = "report_generate"


ACTION_CATEGORIES: dict[str, tuple[ActionType, ...]] = {
    "planning": (ActionType.PLAN_CREATE, ActionType.PLAN_REVISE, ActionType.PLAN_BACKTRACK),
    "reasoning": (ActionType.ANALYZE, ActionType.HYPOTHESIS_TEST, ActionType.DECISION_MAKE),
    "tools": (ActionType.TOOL_DISCOVER, ActionType.TOOL_USE, ActionType.TOOL_FIX, ActionType.TOOL_CREATE),
    "context": (ActionType.CONTEXT_FETCH, ActionType.CONTEXT_COMPACT, ActionType.CONTEXT_SUMMARIZE),
    "communication": (ActionType.MESSAGE_SEND, ActionType.MESSAGE_RECEIVE, ActionType.NEGOTIATE),
    "memory": (ActionType.MEMORY_SEARCH, ActionType.MEMORY_READ, ActionType.MEMORY_WRITE),
    "orchestration": (ActionType.AGENT_SPAWN, ActionType.AGENT_TERMINATE, ActionType.AGENT_MONITOR),
    "output": (ActionType.OUTPUT_WRITE, ActionType.OUTPUT_FORMAT, ActionType.REPORT_GENERATE),
}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class AgentMetadata(BaseModel):
    """Who an agent is; persisted in its scope. `action_policy_blueprints` stays out of JSON."""

    agent_id: str = Field(default_factory=lambda: new_id("agent"))
    agent_type: AgentType = AgentType.UNBOUND
    role: str | None = None
    parent_id: str | None = None
    priority: int = 0
    bound_pages: list[str] = Field(default_factory=list)
    action_policy_config: dict[str, Any] = Field(default_factory=dict)
    action_policy_blueprints: dict[str, Any] = Field(
        default_factory=dict,
        exclude=True,
        description="blueprints for the policy, e.g. consciousness_streams",
    )
    tenant_id: str = "default"
    colony_id: str = "default"
    profile: AgentProfile | None = Field(
        None, description="what it is built with, written when it is first recorded (not an input)"
    )


class ActionResult(BaseModel):
    """What an action returned; `blocked` + `blocking_agent_ids` ask for suspension until they finish."""

    success: bool = True
    output: Any = None
    error: str | None = None
    blocked: bool = False
    blocked_reason: str | None = None
    blocking_agent_ids: list[str] = Field(default_factory=list)


class ResumptionKind(StrEnum):
    CHILDREN_COMPLETED = "children_completed"  # all blocking children STOPPED/FAILED
    RESOURCE_AVAILABLE = "resource_available"  # a spawn attempt succeeds
    PAGES_AVAILABLE = "pages_available"  # required pages loaded on some replica
    IMMEDIATE = "immediate"  # resume as soon as possible
    CUSTOM = "custom"  # only an external trigger resumes


class ResumptionCondition(BaseModel):
    """When a suspended agent may run again."""

    kind: ResumptionKind
    agent_ids: list[str] = Field(default_factory=list)
    page_ids: list[str] = Field(default_factory=list)
    reason: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class SuspensionRequest(BaseModel):
    """An agent's request to be suspended, for its host (runtime or system) to carry out."""

    agent_id: str
    condition: ResumptionCondition
    requested_at: float = Field(default_factory=time.time)


class RunServing(BaseModel):
    """How an agent role's runs are served (`AgentBlueprint.serving`); the defaults are one agent
    serving every run one at a time, admitting any number.

    - `single`: one long-lived agent; its runs go one at a time, in the order they were claimed
      (submit order); `max_concurrent_runs` bounds how many are admitted at once (running plus
      waiting); a submit beyond it is refused (`RunQueueFull`, HTTP 429) rather than queued for ever.
    - `pool`: `min_size` to `max_size` identical member agents (the role's agent is the first),
      spread over the replicas by the control plane's placement. Each member serves one run at a
      time; a busy member claims nothing more, an idle one picks up the oldest open request. The
      pool grows while open unclaimed requests per live member exceed `scale_up_queue_depth`, and
      a member idle for `idle_seconds` is stopped (never below `min_size`). Runs of a pool end in
      no guaranteed order. `max_concurrent_runs` (if set) bounds each member: the pool admits
      `max_size` times that.
    See docs/scaling.md."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["single", "pool"] = "single"
    max_concurrent_runs: int | None = Field(
        None, ge=1, description="runs admitted at once (running + waiting) per agent; None = unbounded"
    )
    min_size: int = Field(1, ge=1, description="pool: members kept at least (the role's agent included)")
    max_size: int = Field(1, ge=1, le=256, description="pool: members at most")
    scale_up_queue_depth: float = Field(
        1.0, gt=0, description="pool: grow while open unclaimed requests per live member exceed this"
    )
    idle_seconds: float = Field(30.0, gt=0, description="pool: a member idle this long is stopped")

    @model_validator(mode="after")
    def _check_sizes(self) -> Self:
        if self.min_size > self.max_size:
            raise ValueError(f"min_size ({self.min_size}) must not exceed max_size ({self.max_size})")
        if self.mode == "single" and (self.min_size, self.max_size) != (1, 1):
            raise ValueError("min_size/max_size describe a pool; set mode='pool' or leave them at 1")
        return self

    @property
    def is_pool(self) -> bool:
        return self.mode == "pool"

    def admitted_at_once(self) -> int | None:
        """How many runs of the role may be open at once (None = unbounded)."""
        if self.max_concurrent_runs is None:
            return None
        return self.max_concurrent_runs * (self.max_size if self.is_pool else 1)


class AgentRun(BaseModel):
    """One `Agent.run()` call: its input, progress and outcome."""

    model_config = ConfigDict(validate_assignment=True)

    run_id: str = Field(default_factory=lambda: new_id("run"))
    agent_id: str
    request_id: str | None = Field(None, description="the AgentHandle request this run serves, if any")
    input: Any = None
    status: RunStatus = RunStatus.PENDING
    output: Any = None
    error: str | None = None
    steps: int = 0
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def output_data(self) -> Any:
        """The run's output (the seed's name for it)."""
        return self.output

    @property
    def done(self) -> bool:
        return self.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
