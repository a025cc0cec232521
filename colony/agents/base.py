"""The Agent: lifecycle, capabilities, hooks, actions and runs, with no hidden state.

Every fact about an agent (metadata, blueprint, lifecycle state, runs, policy and capability
state, gathered context, a pending suspension) is written to the agent's own blackboard scope
as it changes, so `Agent.restore(agent_id, blackboard, settings=...)` rebuilds an identical agent at any
moment. That is what suspension, resumption and replica failure rely on.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from typing import Any

from colony.agents.actions import ActionDispatcher
from colony.agents.blueprint import (
    AgentBlueprint,
    Bindable,
    CapabilitySpec,
    ResourceRequirements,
)
from colony.agents.capability import AgentCapability, CapabilityMode
from colony.agents.capability_set import CapabilitySet
from colony.agents.event_delivery import EventDelivery
from colony.agents.hooks import HookRegistry, hookable
from colony.agents.models import (
    ActionResult,
    AgentMetadata,
    AgentRun,
    AgentState,
    ResumptionCondition,
    ResumptionKind,
    RunStatus,
    SuspensionRequest,
    check_transition,
)
from colony.agents.policy import (
    ActionPolicy,
    ActionPolicyExecutionState,
    ActionPolicyIterationResult,
    ScriptedActionPolicy,
)
from colony.agents.profile import profile_of
from colony.agents.protocols import AgentHost
from colony.agents.state.action_log import ActionLog
from colony.agents.state.persistence import (
    LIFECYCLE,
    MAX_CONTEXT_ITEMS,
    build_agent,
    hold_own_lifecycle,
    persist_agent,
    recover_lifecycle,
    restore_agent,
    store_superseded_failure,
    write_first_state,
)
from colony.agents.state.ring import ContextRing
from colony.agents.state.stored import StoredState
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import ColonySettings
from colony.errors import (
    AgentUsageError,
    BlackboardUnavailable,
    ConcurrentModificationError,
    ResourceExhausted,
)

log = logging.getLogger(__name__)
Keys = AgentStateProtocol

__all__ = [
    "MAX_CONTEXT_ITEMS",
    "ActionPolicy",
    "ActionPolicyExecutionState",
    "ActionPolicyIterationResult",
    "Agent",
    "AgentCapability",
    "CapabilityMode",
    "ResourceExhausted",
    "ScriptedActionPolicy",
    "build_agent",
]


MAX_PAGE_ACCESSES = 256


def _idle_if_running(agent: Agent) -> AgentState | None:
    """The state a run's end moves the agent to: IDLE when it was RUNNING (else it stays)."""
    return AgentState.IDLE if agent.state is AgentState.RUNNING else None


class Agent(CapabilitySet, Bindable):
    """An agent: `run()` drives `run_step()` until its action policy says the run is done."""

    def __init__(
        self,
        metadata: AgentMetadata,
        blackboard: Blackboard,
        action_policy: ActionPolicy | None = None,
        *,
        max_steps: int = 100,
    ) -> None:
        self.metadata = metadata
        self.scope_id = scope_id(
            BlackboardScope.AGENT,
            tenant_id=metadata.tenant_id,
            colony_id=metadata.colony_id,
            agent_id=metadata.agent_id,
        )
        self.blackboard = blackboard.scoped(self.scope_id)
        self.action_policy = action_policy
        self.max_steps = max_steps
        self.hooks = HookRegistry()
        self.dispatcher = ActionDispatcher(self)
        self.action_log = ActionLog(self)  # write-ahead log of the current run (colony.context)
        self.capabilities: dict[str, AgentCapability] = {}
        self.current_run: AgentRun | None = None
        # held from a run's end being stored until the agent is IDLE again (and while a run begins):
        # whoever sees a run stored done may begin the next at once, and must not begin it into a
        # RUNNING state that the last run's end then turns IDLE (the new run left undriven)
        self._run_edge = asyncio.Lock()
        # gathered context, bounded; persisted by appending what is new to a capped Redis list
        self.context = ContextRing(MAX_CONTEXT_ITEMS)
        # which pages the agent used, where, when (bounded); persisted with its context
        self.page_accesses: list[dict[str, Any]] = []
        self.context_changed = asyncio.Event()  # set when an event handler adds context
        self.started = asyncio.Event()  # set once `start` finished (its capabilities and handlers)
        self.last_result: ActionResult | None = None
        self.last_action: str | None = None  # name of the last step's action (for its step event)
        self.suspension: SuspensionRequest | None = None
        self.stored = StoredState(self)  # this copy's hold on its stored lifecycle (agents/state)
        self.event_delivery = EventDelivery(self)  # its handlers' subscriptions and positions
        self.host: AgentHost | None = None  # the runtime hosting this agent (drives runs, suspensions)
        self.blueprint: AgentBlueprint | None = None  # set once recorded; kept in sync with capabilities
        self.capability_specs: dict[str, CapabilitySpec] = {}
        # the settings it works under when its host has none (a restorer without a host sets them)
        self.settings: ColonySettings | None = None
        # This copy's mark on its lifecycle writes and when it came to life: they tell its own
        # writes, and earlier ones, from another live copy's after Redis lost data (`recover_lifecycle`).
        self.holder = uuid.uuid4().hex
        self.born = time.time()
        # set by the runtime's stop before the agent is closed: its capabilities say goodbye for good
        # (a copy dropped for a restore, or replaced, is closed the same way and must not)
        self.stopping = False

    @property
    def retention_seconds(self) -> float:
        """How long finished runs (and an ended agent's state) stay in Redis: `runs.retention_seconds`
        of the settings it works under (`colony_settings`)."""
        return self.colony_settings().runs.retention_seconds

    @property
    def checkpoints_kept(self) -> int:
        """How many checkpoints the agent's ring keeps: `context.checkpoints_kept` of its settings."""
        return self.colony_settings().context.checkpoints_kept

    def colony_settings(self) -> ColonySettings:
        """The settings it works under: its host's (`services["settings"]`), else those it was built
        or restored with (`self.settings`). Never looked up: an agent with neither is a usage error."""
        given = self.host.services.get("settings") if self.host is not None else None
        if given is not None:
            return given
        if self.settings is None:
            raise AgentUsageError(
                f"agent {self.agent_id} has no settings: host it in a LocalAgentRuntime(settings=...) "
                "or set agent.settings"
            )
        return self.settings

    @property
    def agent_id(self) -> str:
        return self.metadata.agent_id

    @property
    def resources(self) -> ResourceRequirements:
        """What the agent needs from its replica (from its blueprint)."""
        return self.blueprint.resources if self.blueprint is not None else ResourceRequirements()

    @property
    def state(self) -> AgentState:
        return self.stored.state

    # -- lifecycle ------------------------------------------------------------------------

    async def initialize(self, blueprint: AgentBlueprint | None = None) -> None:
        """Record a new agent in the blackboard (its blueprint too, so it can be restored): one
        transaction, applied only if no lifecycle is stored under this id (else nothing is written
        and `ConcurrentModificationError` says so: a live agent of that id is never overwritten).
        Its event handlers' starting positions ("now") are taken first and stored with it, so
        starting them costs no persist of its own."""
        if blueprint is not None:
            self.blueprint = blueprint
        self.metadata.profile = profile_of(self)  # for people (the console); no write of its own
        fresh = await self.event_delivery.fresh_positions()  # "now" for its handlers, stored with its record
        async with self.blackboard.transaction() as tx:
            if blueprint is not None:
                tx.write(Keys.key("blueprint"), blueprint.to_text(), created_by=self.agent_id)
            tx.write(Keys.key("metadata"), self.metadata.model_dump(mode="json"), created_by=self.agent_id)
            lifecycle = self.stored.value(self.stored.state, "created")
            tx.write(LIFECYCLE, lifecycle, expected_version=0, created_by=self.agent_id)
            if fresh:  # what the first persist used to write when the handlers started
                write_first_state(tx, self, {**self.event_delivery.positions, **fresh})
        hold_own_lifecycle(self, tx, lifecycle)
        self.event_delivery.positions.update(fresh)

    async def transition(self, new_state: AgentState, reason: str | None = None) -> None:
        """Move to `new_state`, fenced by the lifecycle this copy holds (`StoredState.transition`)."""
        await self.stored.transition(new_state, reason)

    # -- event handlers ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start background work: capabilities' own start-up, then the event handlers. An agent
        stored without a profile (imported, or recorded before profiles were kept) records it now,
        once."""
        for capability in list(self.capabilities.values()):
            await capability.start()
        await self.event_delivery.start()
        if self.metadata.profile is None:
            self.metadata.profile = profile_of(self)
            await self.blackboard.write(
                Keys.key("metadata"), self.metadata.model_dump(mode="json"), created_by=self.agent_id
            )
        self.started.set()

    # -- runs -------------------------------------------------------------------------------

    async def begin_run(self, input_data: Any, *, request_id: str | None = None) -> AgentRun:
        """Create an AgentRun, persist it with the policy's reset state, and enter RUNNING;
        `run_until_done()` then drives it."""
        async with self._run_edge:
            return await self._begin_run(input_data, request_id)

    async def _begin_run(self, input_data: Any, request_id: str | None) -> AgentRun:
        if self.current_run is not None and not self.current_run.done:
            raise AgentUsageError(f"agent {self.agent_id} is already running {self.current_run.run_id}")
        run = AgentRun(
            agent_id=self.agent_id,
            request_id=request_id,
            input=input_data,
            status=RunStatus.RUNNING,
            started_at=time.time(),
        )
        previous, previous_result = self.current_run, self.last_result
        self.current_run = run
        self.last_result = None
        if self.action_policy is not None:
            self.action_policy.on_run_start(run)
        try:  # run, current_run, the reset policy state and RUNNING, in one transaction
            await self.persist(enter=AgentState.RUNNING, reason=f"run {run.run_id}")
        except BaseException:  # not begun: the agent stays as it was, free for the next run
            self.current_run, self.last_result = previous, previous_result
            raise
        return run

    async def run_until_done(self) -> AgentRun:
        """Step the current run until it finishes or the agent stops running (waiting, suspended)."""
        run = self.current_run
        if run is None:
            raise AgentUsageError(f"agent {self.agent_id} has no run to drive; call begin_run() first")
        while not run.done and self.stored.state is AgentState.RUNNING:
            await self.run_step()
        return run

    async def run(self, input_data: Any, *, request_id: str | None = None) -> AgentRun:
        """Start a run and drive it to the end (or until the agent must wait)."""
        await self.begin_run(input_data, request_id=request_id)
        return await self.run_until_done()

    @hookable
    async def run_step(self) -> None:
        """One action-policy iteration, applied and persisted.

        Hookable: capabilities wrap it to prepare context, post-process, or observe.
        """
        if self.stored.state not in (AgentState.RUNNING, AgentState.IDLE):
            return
        run = self.current_run
        if run is None or run.done:
            return
        if self.action_policy is None:
            await self._finish(run, error="agent has no action policy")
            return
        if run.steps >= self.max_steps:
            await self._finish(run, error=f"run exceeded max_steps={self.max_steps}")
            return
        before = _StepStart.of(self, run)
        try:
            try:
                result = await self.action_policy.execute_iteration(self._build_state(run))
            except Exception as exc:
                if isinstance(exc, BlackboardUnavailable) and self.host is not None:
                    raise  # a Redis outage, not the policy's fault: the host redoes the step (runtime._drive)
                log.exception("policy of agent %s failed", self.agent_id)
                await self._finish(run, error=f"action policy failed: {type(exc).__name__}: {exc}")
                return
            await self._apply_iteration_result(run, result)
        except asyncio.CancelledError:
            before.put_back(self, run)  # what a suspend persists now is the step not taken
            raise

    def _build_state(self, run: AgentRun) -> ActionPolicyExecutionState:
        actions = self.action_policy.planning_actions() if self.action_policy else []
        return ActionPolicyExecutionState(
            agent_id=self.agent_id,
            run=run,
            step=run.steps,
            actions=[a.json_schema() for a in actions],
            context=list(self.context),
            last_result=self.last_result,
        )

    async def _apply_iteration_result(self, run: AgentRun, result: ActionPolicyIterationResult) -> None:
        run.steps += 1
        self.last_result = result.action_result
        self.last_action = result.action
        action_result = result.action_result
        if action_result is not None and action_result.blocked and action_result.blocking_agent_ids:
            await self.stored.request_suspension(
                ResumptionCondition(
                    kind=ResumptionKind.CHILDREN_COMPLETED,
                    agent_ids=list(action_result.blocking_agent_ids),
                    reason=action_result.blocked_reason,
                )
            )
        if result.done:
            await self._finish(run, output=result.output, error=result.error)
        else:
            await self.persist()

    async def _finish(self, run: AgentRun, *, output: Any = None, error: str | None = None) -> None:
        async with self._run_edge:
            run.status = RunStatus.FAILED if error else RunStatus.SUCCEEDED
            run.output, run.error, run.finished_at = output, error, time.time()
            await self.persist(enter=_idle_if_running(self), reason=f"run {run.run_id} {run.status.value}")

    def record_page_access(self, page_ids: list[str], replica_id: str, cached_tokens: int = 0) -> None:
        """Note that the agent used these pages (kept, bounded, in its persisted state: a resumed
        agent knows its working set and where it last found it)."""
        self.page_accesses.append(
            {
                "pages": list(page_ids),
                "replica": replica_id,
                "at": time.time(),
                "cached_tokens": cached_tokens,
            }
        )
        del self.page_accesses[:-MAX_PAGE_ACCESSES]

    async def emit_run_event(self, event_type: str, data: Any = None) -> bool:
        """Stream an event to whoever asked for the current run (an AgentHandle / HTTP client).
        False when the run was not requested through a handle."""
        run = self.current_run
        if run is None or run.request_id is None:
            return False
        for capability in self.capabilities.values():
            if getattr(capability, "active_request", None) == run.request_id:
                await capability.emit(event_type, data)  # type: ignore[attr-defined]
                return True
        return False

    async def fail_run(self, reason: str, run: AgentRun | None = None) -> AgentRun | None:
        """End `run` (default: the current run) FAILED with `reason` after it raised inside the agent
        (its driver got the exception), answer whoever asked for it, and leave the agent IDLE to
        serve the next run. Storing the failure is best effort (the error may be Redis itself);
        never raises. A run that is no longer the current one (the next run began while this one's
        end was failing) gets its record stored failed, and the agent, RUNNING for the next run,
        is left as it is."""
        async with self._run_edge:
            current = self.current_run
            run = run or current
            if run is None:
                return None
            run.status, run.error, run.finished_at = RunStatus.FAILED, reason[:2000], time.time()
            if run is not current:
                await store_superseded_failure(self, run)
            else:
                await self._fail_current(run)
        for capability in list(self.capabilities.values()):
            ended = getattr(capability, "run_ended", None)
            if ended is not None:
                try:
                    await ended(run)
                except Exception:
                    log.exception(
                        "agent %s: %s did not take the end of run %s",
                        self.agent_id,
                        capability.name,
                        run.run_id,
                    )
        return run

    async def _fail_current(self, run: AgentRun) -> None:
        """IDLE first: whoever sees the failed run stored may send the next run at once (still
        RUNNING when this fails: the next begin_run then needs no transition); then the run."""
        try:
            if await self.stored.reload() is AgentState.RUNNING:
                await self.transition(AgentState.IDLE, f"run {run.run_id} failed")
        except Exception as exc:
            log.warning("agent %s: not marked idle after run %s failed: %r", self.agent_id, run.run_id, exc)
        try:
            await self.persist()
        except Exception as exc:
            log.warning("agent %s: failed run %s not stored: %r", self.agent_id, run.run_id, exc)

    async def cancel_run(self, reason: str = "cancelled") -> None:
        """End the current run as CANCELLED (its requester already gave up on it)."""
        async with self._run_edge:
            run = self.current_run
            if run is None or run.done:
                return
            run.status, run.error, run.finished_at = RunStatus.CANCELLED, reason, time.time()
            await self.persist(enter=_idle_if_running(self), reason=f"run {run.run_id} {run.status.value}")

    # -- persistence (colony/agents/state/persistence.py) ------------------------------------------

    async def persist(self, enter: AgentState | None = None, reason: str | None = None) -> None:
        """Write the run, policy state, capability states and context in one transaction
        (see `persist_agent`), fenced by the lifecycle version this copy holds; with `enter`, the
        agent enters that state in the same transaction (checked against the transition table
        first; nothing is written when it is not allowed), so a run's beginning and RUNNING, or
        its end and IDLE, are stored together. After Redis lost the agent's state, everything it
        holds is re-persisted instead (`recover_lifecycle`) and the write is tried once more."""
        for attempt in (1, 2):
            change = enter if enter is not None and enter is not self.stored.state else None
            if change is not None:
                check_transition(self.stored.state, change)
            try:
                await persist_agent(self, change, reason)
                return
            except ConcurrentModificationError:
                if attempt == 2 or not await recover_lifecycle(self):
                    raise

    @classmethod
    async def restore(
        cls,
        agent_id: str,
        blackboard: Blackboard,
        *,
        tenant_id: str = "default",
        colony_id: str = "default",
        **services: Any,
    ) -> Agent:
        """Rebuild an agent, with everything it had, from its blackboard scope (see `restore_agent`)."""
        return await restore_agent(agent_id, blackboard, tenant_id=tenant_id, colony_id=colony_id, **services)

    async def close(self) -> None:
        """Stop background work (handlers, capability tasks); state stays in the blackboard.

        Every task is told to stop before the first wait, so none of them runs again meanwhile
        (e.g. a request loop that would answer from this copy's memory after its host dropped it)."""
        for task in self.event_delivery.tasks:
            task.cancel()
        for capability in self.capabilities.values():
            await capability.close()
        await self.event_delivery.stop()


class _StepStart:
    """The agent's run and policy as a step found them. A step cut off (its driver cancelled: a
    suspend, a host going away) puts them back, so what is persisted next is the step not taken,
    and the redone step, whose calls the action log replays, starts from where the first did.
    Found by review: a suspend between a step's action and its persist saved the policy with the
    step's call recorded and the run's step count not moved, and the redo's model call no longer
    matched its record (another schema), so the recorded decision was thrown away."""

    RUN_FIELDS = ("steps", "status", "output", "error", "finished_at")

    def __init__(self, policy: dict[str, Any] | None, run: dict[str, Any], last: tuple[Any, Any]) -> None:
        self.policy, self.run, self.last = policy, run, last

    @classmethod
    def of(cls, agent: Agent, run: AgentRun) -> _StepStart:
        policy = agent.action_policy
        state = copy.deepcopy(policy.get_state()) if policy is not None else None
        fields = {name: copy.deepcopy(getattr(run, name)) for name in cls.RUN_FIELDS}
        return cls(state, fields, (agent.last_result, agent.last_action))

    def put_back(self, agent: Agent, run: AgentRun) -> None:
        if self.policy is not None and agent.action_policy is not None:
            agent.action_policy.set_state(self.policy)
        for name, value in self.run.items():
            setattr(run, name, value)
        agent.last_result, agent.last_action = self.last
