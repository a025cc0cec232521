"""Per-agent checkpoints: the agent's own state after every step, kept in a capped ring, and the
undo/restore that brings it back (docs/checkpoints.md).

Why a ring written in the persist transaction: a checkpoint must describe exactly what Redis holds
after that step (a second write could fail or interleave with another step), and an agent's
history must stay bounded (`context.checkpoints_kept`). A checkpoint holds the run, the policy
state, every capability's state (and its event position), the context head (its position, last
result, page accesses: the context entries themselves stay in the context ring, which a restore
truncates), the lifecycle state, the time, and the calls of that step from the action log (what an
undo reports it cannot undo).

Numbering: checkpoint `n` of a run is the state after `n` steps (`run.steps == n`); the beginning of
a run is checkpoint 0. Persists that are not steps (a suspension, a cancel or failure outside a
step, a re-persist after Redis lost data) push none: the newest checkpoint of the same step stays.

Every write of the head entry `agent:checkpoints` (op created/restored) is the blackboard event of
that operation in the agent's scope.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from colony import metrics
from colony.agents.models import ActionResult, AgentRun, RunStatus
from colony.agents.state.action_log import LOG_KEY
from colony.agents.state.ring import ContextRing
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.errors import (
    AgentStateConflict,
    CheckpointNotFound,
    ConcurrentModificationError,
    ContextError,
    InvalidArgument,
    NothingToUndo,
)

if TYPE_CHECKING:
    from colony.agents.base import Agent
    from colony.agents.state.persistence import OwnStates
    from colony.blackboard import Blackboard
    from colony.blackboard.transaction import Transaction

CHECKPOINTS = Keys.key("checkpoints")  # the ring of checkpoints and, as an entry, its head
MODES = ("reexecute", "replay")
Mode = Literal["reexecute", "replay"]
RerunWhen = Literal["now", "on_resume", "never"]
MAX_CALLS_PER_STEP = 200  # calls kept in one checkpoint (a step making more is summarised)


class StepCall(BaseModel):
    """One action dispatched during a step, as the action log reports it (`step_calls`)."""

    model_config = ConfigDict(extra="ignore")

    action: str = Field(max_length=256)
    capability: str | None = Field(None, max_length=256)
    effects: list[str] = Field(default_factory=list, max_length=32)
    key: str | None = Field(None, max_length=512)
    success: bool | None = None


class Checkpoint(BaseModel):
    """One checkpoint as stored (read back from Redis: validated, never trusted)."""

    model_config = ConfigDict(extra="ignore")

    step: int = Field(ge=0)
    run_id: str = Field(min_length=1, max_length=128)
    run: dict[str, Any]
    policy_state: dict[str, Any] | None = None
    capabilities: dict[str, dict[str, Any]] = Field(default_factory=dict)
    events_from: dict[str, str] = Field(default_factory=dict)
    context: dict[str, Any] = Field(default_factory=dict)
    lifecycle: str = Field(max_length=32)
    at: float
    calls: list[StepCall] | None = None  # None: the action log did not say

    @field_validator("run")
    @classmethod
    def _a_run(cls, value: dict[str, Any]) -> dict[str, Any]:
        AgentRun.model_validate(value)  # a checkpoint whose run is not one is not a checkpoint
        return value


class CheckpointInfo(BaseModel):
    """A checkpoint as listed (no bodies)."""

    step: int
    run_id: str = Field(description="the agent's own run id (the action log's keys carry it)")
    request_id: str | None = Field(
        None, description="the HTTP run it serves, if any: the id GET /v1/runs/{id} knows"
    )
    at: float
    lifecycle: str
    run_status: str | None
    size: int = Field(description="bytes of the stored checkpoint (JSON)")
    calls: int | None = Field(description="actions dispatched during the step (None: not recorded)")
    effects: list[str] = Field(description="the effects those actions declare (spawn, colony_write, ...)")


class UndoneCall(BaseModel):
    """A call of a discarded step whose effect outside the agent's own state is not undone."""

    step: int
    run_id: str
    action: str
    capability: str | None
    effects: list[str]
    key: str | None


class RestoreReport(BaseModel):
    """What an undo or restore did, and what it could not undo."""

    agent_id: str
    step: int = Field(description="the checkpoint the agent is back at")
    run_id: str
    at: float = Field(description="when that checkpoint was taken")
    mode: Mode
    discarded: list[int] = Field(description="steps of the checkpoints discarded (after the restored one)")
    not_undone: list[UndoneCall] = Field(
        description="calls of the discarded steps whose declared effects outside the agent stay done"
    )
    notes: list[str] = Field(description="plain statements about effects that are not known")
    kept: list[int] = Field(description="steps of the checkpoints kept now (oldest first)")
    state: str | None = Field(None, description="the agent's lifecycle state afterwards")
    request_id: str | None = Field(
        None, description="the HTTP run the restored run serves, if any (GET /v1/runs/{request_id})"
    )
    reruns: list[int] = Field(
        default_factory=list,
        description="steps of the restored run that ran before and run again when it is driven on "
        "(the discarded steps of that run; none when the restored run is finished)",
    )
    rerun_when: RerunWhen = Field(
        "never",
        description="when the restored run is driven on: now (the agent is hosted and resumed at "
        "once), on_resume (it stays suspended until resumed), never (the run is finished)",
    )


# -- taking checkpoints (inside `persist_agent`'s transaction) ---------------------------------------


def due(agent: Agent, states: OwnStates) -> dict[str, Any] | None:
    """The checkpoint this persist pushes (with the policy and capability states it writes): one per
    (run, step) not pushed yet; None otherwise."""
    run = agent.current_run
    if run is None or (run.run_id, run.steps) == agent.stored.checkpointed:
        return None
    return {
        "step": run.steps,
        "run_id": run.run_id,
        "run": run.model_dump(mode="json"),
        "policy_state": states.policy,
        "capabilities": states.capabilities,
        "events_from": {n: p for n, p in agent.event_delivery.positions.items() if n in agent.capabilities},
        "context": {
            "context_total": len(agent.context),
            "last_result": agent.last_result.model_dump(mode="json") if agent.last_result else None,
            "page_accesses": list(agent.page_accesses),
        },
        "lifecycle": agent.state.value,
        "at": time.time(),
        "calls": _step_calls(agent, run.steps),
    }


def _step_calls(agent: Agent, step: int) -> list[dict[str, Any]]:
    """The calls of the step that brought the run to `step` (none for its beginning): the action
    log numbers steps as checkpoints do (step N: the calls made while `run.steps == N - 1`)."""
    if step == 0:
        return []
    return agent.action_log.step_calls(step)[:MAX_CALLS_PER_STEP]


def push(tx: Transaction, agent: Agent, checkpoint: dict[str, Any]) -> None:
    """Buffer the checkpoint onto the ring, and the head entry whose write is the event."""
    tx.ring_push(CHECKPOINTS, [checkpoint], agent.checkpoints_kept)
    head = {"op": "created", **{k: checkpoint[k] for k in ("step", "run_id", "at")}}
    tx.write(CHECKPOINTS, head, created_by=agent.agent_id)


def pushed(agent: Agent, checkpoint: dict[str, Any]) -> None:
    """After the commit: what this copy now knows the ring holds; the metric."""
    agent.stored.checkpointed = (checkpoint["run_id"], checkpoint["step"])
    metrics.CONTEXT_CHECKPOINTS.labels("created").inc()


def adopt_head(agent: Agent, head: Any) -> None:
    """On restore: which checkpoint is the newest (from the ring's head entry)."""
    if not isinstance(head, dict):
        return
    step, run_id = head.get("step"), head.get("run_id")
    if isinstance(step, int) and not isinstance(step, bool) and isinstance(run_id, str):
        agent.stored.checkpointed = (run_id, step)


# -- reading them ----------------------------------------------------------------------------------


async def read_checkpoints(board: Blackboard) -> list[tuple[Checkpoint, int]]:
    """The kept checkpoints, oldest first, with their stored sizes. Items that do not validate are
    skipped (never trusted); the ring is bounded by `context.checkpoints_kept`."""
    return (await _read(board))[1]


async def _read(board: Blackboard) -> tuple[int, list[tuple[Checkpoint, int]]]:
    """The head's version (0: none) and the kept checkpoints (see `read_checkpoints`)."""
    head = await board.read(CHECKPOINTS)
    items = await board.ring(CHECKPOINTS)  # cut back by a restore in its own commit: all count
    kept = []
    for item in items:
        try:
            kept.append((Checkpoint.model_validate(item), len(_json(item))))
        except ValidationError:
            continue
    return (head.version if head is not None else 0), kept


def _json(item: Any) -> bytes:
    return json.dumps(item, separators=(",", ":"), default=str).encode()


async def list_checkpoints(board: Blackboard) -> list[CheckpointInfo]:
    """What `GET /v1/agents/{id}/checkpoints` answers: one line per kept checkpoint."""
    listed = []
    for checkpoint, size in await read_checkpoints(board):
        calls = checkpoint.calls
        effects = sorted({e for c in calls or [] for e in c.effects})
        status = checkpoint.run.get("status")
        request = checkpoint.run.get("request_id")
        listed.append(
            CheckpointInfo(
                step=checkpoint.step,
                run_id=checkpoint.run_id,
                request_id=request if isinstance(request, str) else None,
                at=checkpoint.at,
                lifecycle=checkpoint.lifecycle,
                run_status=status if isinstance(status, str) else None,
                size=size,
                calls=None if calls is None else len(calls),
                effects=effects,
            )
        )
    return listed


# -- undo and restore --------------------------------------------------------------------------------


def pick(kept: list[Checkpoint], agent_id: str, step: int | None, run_id: str | None) -> int:
    """The index of the checkpoint to go back to (`step` None: undo); CheckpointNotFound or
    NothingToUndo with the kept steps."""
    steps = [c.step for c in kept]
    if step is None:
        if len(kept) < 2:
            raise NothingToUndo(
                f"agent {agent_id} has no earlier checkpoint to go back to (kept steps: {steps}); "
                "checkpoints are taken after each step of a run"
            )
        return len(kept) - 2
    for index in range(len(kept) - 1, -1, -1):
        if kept[index].step == step and (run_id is None or kept[index].run_id == run_id):
            return index
    where = f" of run {run_id}" if run_id else ""
    raise CheckpointNotFound(
        f"agent {agent_id} keeps no checkpoint of step {step}{where} (kept steps: {steps}); "
        "GET /v1/agents/{id}/checkpoints lists them"
    )


def _report(agent: Agent, target: Checkpoint, dropped: list[Checkpoint], mode: Mode) -> RestoreReport:
    not_undone: list[UndoneCall] = []
    unknown_steps: list[int] = []
    quiet: list[str] = []
    for checkpoint in dropped:
        if checkpoint.calls is None:
            unknown_steps.append(checkpoint.step)
            continue
        for call in checkpoint.calls:
            if call.effects:
                not_undone.append(
                    UndoneCall(
                        step=checkpoint.step,
                        run_id=checkpoint.run_id,
                        action=call.action,
                        capability=call.capability,
                        effects=list(call.effects),
                        key=call.key,
                    )
                )
            else:
                quiet.append(call.action)
    notes = []
    if not dropped:
        notes.append(f"nothing was discarded: checkpoint {target.step} is the agent's newest")
    if unknown_steps:
        notes.append(
            f"the actions of step(s) {unknown_steps} were not recorded: whatever they did outside "
            "this agent's own state is not undone"
        )
    if quiet:
        names = ", ".join(sorted(set(quiet))[:20])
        notes.append(
            f"{len(quiet)} action call(s) of the discarded steps declare no effects ({names}): "
            "anything they did outside this agent's own state is not undone"
        )
    if mode == "replay":
        notes.append(
            "replay: the re-driven steps reuse the results the action log still holds for them "
            "(no model calls, no actions run again); steps it holds nothing for run again"
        )
    run = AgentRun.model_validate(target.run)
    return RestoreReport(
        agent_id=agent.agent_id,
        step=target.step,
        run_id=target.run_id,
        at=target.at,
        mode=mode,
        discarded=[c.step for c in dropped],
        not_undone=not_undone,
        notes=notes,
        kept=[],
        request_id=run.request_id,
        reruns=[] if run.done else sorted({c.step for c in dropped if c.run_id == target.run_id}),
        rerun_when="never" if run.done else "on_resume",
    )


def announce_reruns(report: RestoreReport, when: RerunWhen) -> None:
    """Say in the report when the restored run is driven on (`when`, as its host knows it) and
    which steps that runs again: a step that ran before must not run again unannounced."""
    if report.rerun_when == "never":
        report.notes.append(f"run {report.run_id} is finished at checkpoint {report.step}: nothing reruns")
        return
    report.rerun_when = when
    timing = {
        "now": "now: the agent is resumed at once and drives it on",
        "on_resume": f"when the agent is resumed (POST /v1/agents/{report.agent_id}/resume)",
    }[when]
    again = (
        "their model calls and actions run again"
        if report.mode == "reexecute"
        else "from the action log where it still holds their results, else run again"
    )
    done_before = f"; step(s) {report.reruns} ran before and run again ({again})" if report.reruns else ""
    report.notes.append(
        f"run {report.run_id} is not finished: it is driven on from step {report.step + 1} "
        f"{timing}{done_before}"
    )


def _apply(agent: Agent, target: Checkpoint) -> AgentRun | None:
    """Set the agent object's state to the checkpoint's. Returns the run it replaces when that run
    is another, unfinished one (it is then ended CANCELLED)."""
    run = AgentRun.model_validate(target.run)
    replaced = agent.current_run
    if replaced is not None and (replaced.run_id == run.run_id or replaced.done):
        replaced = None
    agent.current_run = run
    if agent.action_policy is not None and target.policy_state is not None:
        agent.action_policy.set_state(target.policy_state)
    for name, capability in agent.capabilities.items():
        if name in target.capabilities:
            capability.set_state(target.capabilities[name])
        position = target.events_from.get(name)
        if position:
            agent.event_delivery.positions[name] = position
    context = target.context
    last = context.get("last_result")
    agent.last_result = ActionResult.model_validate(last) if last else None
    agent.page_accesses = list(context.get("page_accesses") or [])
    total = context.get("context_total")
    if isinstance(total, int) and not isinstance(total, bool) and 0 <= total <= len(agent.context):
        ring = agent.context
        kept = ring[ring.first : total] if total > ring.first else []
        agent.context = ContextRing(ring.cap, kept, total=total)
    return replaced


def _applied(agent: Agent, target: Checkpoint) -> AgentRun | None:
    """`_apply`, a capability refusing the stored state (or a value no run holds) being a
    ContextError before anything is written."""
    try:
        return _apply(agent, target)
    except (ValidationError, ValueError, TypeError, KeyError) as exc:
        raise ContextError(
            f"checkpoint {target.step} of agent {agent.agent_id} cannot be restored: {type(exc).__name__}: "
            f"{str(exc)[:300]}; restore another one (GET /v1/agents/{agent.agent_id}/checkpoints)"
        ) from None


async def restore_checkpoint(
    agent: Agent,
    step: int | None = None,
    *,
    mode: str = "reexecute",
    run_id: str | None = None,
    when: RerunWhen = "on_resume",
) -> RestoreReport:
    """Bring an agent that is not being driven (suspended, or an object no host runs) back to a
    kept checkpoint: `step` None is undo (the checkpoint before the newest). Its run, policy state,
    capability states (`set_state`) and context head are set, then written in one transaction
    fenced by `agent:lifecycle` like every persist; the checkpoints after it are discarded and the
    context ring is truncated to the checkpoint's position. `mode`: "reexecute" drops the action
    log's records of the later steps (they run again), "replay" keeps them (the re-driven steps
    reuse them). The report lists what the discarded steps did that is not undone, and which steps
    run again and `when` (the host says: "now" when it drives the agent on at once)."""
    from colony.agents.state.persistence import check_fence, write_context_head, write_state

    if mode not in MODES:
        raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    board = agent.blackboard
    version, read = await _read(board)
    kept = [c for c, _ in read]
    index = pick(kept, agent.agent_id, step, run_id)
    target, dropped = kept[index], kept[index + 1 :]
    report = _report(agent, target, dropped, mode)  # type: ignore[arg-type]
    replaced = _applied(agent, target)
    context = agent.context
    position, held = len(context), len(context) - context.first
    marker = await agent.action_log.truncate_marker(target.step) if mode == "reexecute" else None
    try:
        async with board.transaction() as tx:
            await check_fence(tx, agent)
            if replaced is not None:
                replaced.status, replaced.finished_at = RunStatus.CANCELLED, time.time()
                replaced.error = f"replaced by restoring checkpoint {target.step} of run {target.run_id}"
                tx.write(
                    Keys.run_key(replaced.run_id),
                    replaced.model_dump(mode="json"),
                    created_by=agent.agent_id,
                    ttl_seconds=agent.retention_seconds,
                )
            write_state(tx, agent)
            write_context_head(tx, agent, position)
            head = {
                "op": "restored",
                "step": target.step,
                "run_id": target.run_id,
                "at": time.time(),
                "mode": mode,
                "discarded": report.discarded,
            }
            # only over the ring as read: a checkpoint pushed or another restore meanwhile refuses
            tx.write(CHECKPOINTS, head, created_by=agent.agent_id, expected_version=version)
            # the rings lose their discarded tails and the action log its later steps in the same
            # commit: a copy resumed right after it never has its new items cut by a late trim
            tx.ring_truncate(CHECKPOINTS, index + 1)
            tx.ring_truncate(Keys.key("context"), held)
            if marker is not None:
                record = marker.model_dump(mode="json", exclude_none=True)
                tx.ring_push(LOG_KEY, [record], agent.action_log.max_entries)
    except ConcurrentModificationError:
        raise AgentStateConflict(
            f"agent {agent.agent_id} changed while checkpoint {target.step} was being restored; "
            "nothing was restored: try again"
        ) from None
    context.mark_persisted(position)
    agent.stored.checkpointed = (target.run_id, target.step)
    if marker is not None:
        agent.action_log.truncated(target.step)
    metrics.CONTEXT_CHECKPOINTS.labels("restored").inc()
    report.kept = [c.step for c in kept[: index + 1]]
    announce_reruns(report, when)
    report.state = agent.state.value
    return report


async def undo(agent: Agent, *, mode: str = "reexecute") -> RestoreReport:
    """Back to the checkpoint before the newest (see `restore_checkpoint`)."""
    return await restore_checkpoint(agent, None, mode=mode)
