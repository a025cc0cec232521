"""The write-ahead action log: every model result and action result of a run, recorded before the
agent acts on it, so a resumed run replays what was done and re-executes only what was not.

Why: an agent persists after each step. A replica that dies in the middle of a step leaves the
step unpersisted, and the restored agent runs that step again; without a log, every model call
and action of that step would happen twice (a child spawned twice, a message sent twice). Here
each call of a step gets an idempotency key `{run_id}:{step}:{kind}{n}` (`m` a planning model
call, `s` a compaction summary, `a` action; `n` counts that kind of call within the step, so a
re-driven step makes the same keys in the same order; the summariser counts apart from the planner,
so whether a redone step summarises does not move the planner's recorded decision), and its
result is appended to the agent's `agent:action_log` ring, fenced by the agent's lifecycle like
`persist_agent`, BEFORE the result goes back to the policy. An action also gets a `started`
record: before it runs when it declares an effect, while it runs when it declares none (a mark
that lets a redone step tell a re-run from a first run). On resume:

- a recorded model response is returned without calling the model;
- a recorded action result is returned without running the action;
- an action with only `started` (cut off while it ran) runs again with the SAME idempotency key
  (`current_idempotency_key()`), so a capability can make its external effect idempotent (every
  built-in action with an effect derives what it creates from it: docs/effects.md); the re-run is
  counted (`colony_action_reruns_total{action}`).

Steps count from 1: the calls made while `run.steps == N - 1` belong to step N, the step that is
persisted as `run.steps == N` (the checkpoint of step N lists them, `step_calls(N)`).

The log is append-only and capped (`context.action_log_max_entries`); records are validated with
pydantic when read back (never unpickled) and bounded in size. It holds the agent's current (or
last) run: records carry their run id, records of other runs are ignored, and the ring is cleared
when a new run records its first call. `truncate_after(step)` appends a marker that drops the
records of later steps (what "re-execute from step N" needs); keeping them lets a re-driven step
replay them ("replay from the log"). docs/action-log.md has the details.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from colony import metrics
from colony.agents.hooks import hookable
from colony.agents.state.log_records import (
    MAX_RECORD_BYTES,
    LogRecord,
    action_shape,
    bounded,
    idempotency_key,
    model_shape,
    parse_records,
)
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import BlackboardError, ConcurrentModificationError

if TYPE_CHECKING:  # (imported where used: colony.agents imports this module)
    from colony.agents.base import Agent
    from colony.agents.models import ActionResult, AgentRun
    from colony.blackboard.transaction import Transaction
    from colony.inference import InferenceRequest, InferenceResponse

log = logging.getLogger(__name__)

LOG_KEY = AgentStateProtocol.key("action_log")
# Results of actions that declare no effect held for the step's persist, at most (then written).
DEFERRED_MAX = 16
MAX_MARKS = 64  # `started` marks of actions that declare no effect being stored at once, at most

ModelChannel = Literal["model", "summary"]
MODEL_CHANNELS: tuple[str, ...] = ("model", "summary")

_IDEMPOTENCY_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("idempotency_key", default=None)


def current_idempotency_key() -> str | None:
    """The idempotency key of the action being executed (None outside an action): the same on
    every re-execution of that action, so a capability can make an external effect idempotent."""
    return _IDEMPOTENCY_KEY.get()


def _validated(body: dict[str, Any], field: str) -> Any:
    """A recorded response (InferenceResponse) or result (ActionResult), validated; None when the
    stored body is not one (then the call is made again)."""
    from colony.agents.models import ActionResult
    from colony.inference import InferenceResponse

    model = InferenceResponse if field == "response" else ActionResult
    try:
        return model.model_validate(body)
    except ValidationError:
        log.warning("action log: a recorded %s is not a valid %s; calling again", field, model.__name__)
        return None


def _result(**fields: Any) -> ActionResult:
    from colony.agents.models import ActionResult

    return ActionResult(**fields)


async def _settle(write: Awaitable[None]) -> None:
    """Finish recording a call's answer even when the caller is cancelled meanwhile (a suspend or
    drop cancels the step), then re-raise the cancellation. The action already changed its
    capability's state, which a suspend persists: the log must then say the action is done, or
    the step redone after the resume would run it a second time."""
    task = asyncio.ensure_future(write)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True  # (the canceller repeats its cancel until the caller ends: keep waiting)
    if cancelled:
        raise asyncio.CancelledError
    task.result()  # the write's own error, if any


class ActionLog:
    """One agent's write-ahead log of its current run's model and action results."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._run_id: str | None = None  # the run whose records `_records` holds
        self._records: dict[str, LogRecord] = {}  # idempotency key -> its latest record
        self._stale = False  # the stored ring still holds another run's records
        self._counting: tuple[str, int] | None = None  # (run id, step) the ordinals count calls of
        self._ordinals: dict[str, int] = {}
        self._bodies: set[str] = set()  # keys of records still holding their response/result/state
        self._cap: int | None = None
        self._deferred: list[LogRecord] = []  # no-effect actions' results, stored with the next commit
        self._marks: set[asyncio.Task[None]] = set()  # `started` marks being stored

    # -- the interface -------------------------------------------------------------------------

    @hookable
    async def model_call(
        self,
        request: InferenceRequest,
        call: Callable[[], Awaitable[InferenceResponse]],
        *,
        channel: ModelChannel = "model",
    ) -> InferenceResponse:
        """A model call of the current run: the recorded response when this call was answered
        before (a resumed step), else the model's, recorded before it is returned.

        `channel` numbers the call: "model" (the planner's decisions, key `...:m{n}`) or "summary"
        (compaction's summariser, `...:s{n}`). Apart, because a redone step may summarise when its
        first run did not (events arrived after the crash): the planner's recorded decision must
        still be the one it gets back, or it would act a second time."""
        if channel not in MODEL_CHANNELS:
            raise ValueError(f"model_call channel must be one of {MODEL_CHANNELS}, not {channel!r}")
        run = self._active_run()
        if run is None:
            return await call()
        step, n = self._next(run, channel)
        await self._load(run.run_id)
        key = idempotency_key(run.run_id, step, channel, n)
        shape = model_shape(request)
        found = self._records.get(key)
        if found is not None and found.status == "done" and found.response is not None:
            replayed = _validated(found.response, "response") if found.shape == shape else None
            if replayed is not None:
                metrics.ACTION_LOG_REPLAYS.labels(kind="model", outcome="replayed").inc()
                log.info("agent %s: model call %s answered from the action log", self.agent.agent_id, key)
                return replayed
            if found.shape != shape:
                log.warning(
                    "agent %s: model call %s is not the call the action log recorded there (another "
                    "system prompt or output schema); calling the model",
                    self.agent.agent_id,
                    key,
                )
        if found is not None:  # recorded without its body, or another call: made again
            metrics.ACTION_LOG_REPLAYS.labels(kind="model", outcome="reexecuted").inc()
        response = await call()
        record = bounded(
            {
                "run_id": run.run_id,
                "step": step,
                "kind": channel,
                "n": n,
                "at": time.time(),
                "shape": shape,
            },
            "response",
            response,
        )
        await _settle(self._append([record]))
        return response

    async def action_call(
        self,
        action: str,
        parameters: dict[str, Any],
        call: Callable[[], Awaitable[ActionResult]],
        *,
        capability: str | None = None,
        effects: tuple[str, ...] = (),
    ) -> ActionResult:
        """An action of the current run: the recorded result when it ran to the end before (not
        run again), else run under its idempotency key and its result recorded before it is
        returned. One cut off while it ran runs again with the same key.

        An action that declares an effect gets a `started` record before it runs, so that a call
        cut off is known to have been made (counted, logged, listed by `step_calls`), and its
        result is in Redis before the policy sees it. One declaring none gets a `started` mark
        stored in the background while it runs (`_mark`: nothing waits for it), and its result
        goes with the step's persist (`write_deferred`), whose transaction also holds the
        capability state the action left; cut off before that, the step is redone and the action
        runs again, under the same key (at-least-once), counted as a re-run by its mark."""
        run = self._active_run()
        if run is None:
            return await call()
        step, n = self._next(run, "action")
        await self._load(run.run_id)
        key = idempotency_key(run.run_id, step, "action", n)
        shape = action_shape(action, parameters)
        replayed = self._replayed(key, shape, action, capability, effects)
        if replayed is not None:
            return replayed
        fields: dict[str, Any] = {
            "run_id": run.run_id,
            "step": step,
            "kind": "action",
            "n": n,
            "action": action[:200],
            "capability": capability[:200] if capability else None,
            "effects": tuple(effects),
            "shape": shape,
        }
        return await self._run_and_record(call, key, fields, capability, effects)

    def _replayed(
        self, key: str, shape: str, action: str, capability: str | None, effects: tuple[str, ...] = ()
    ) -> ActionResult | None:
        """The result the log answers action call `key` with (its capability's recorded state
        restored), or None when the call runs (again): none recorded, another call recorded there,
        only its `started` record (a re-run, counted), or a recorded result or state that cannot
        be restored."""
        found = self._records.get(key)
        if found is not None and found.shape != shape:
            log.warning(
                "agent %s: action call %s is %r, not the %r the action log recorded there; running it",
                self.agent.agent_id,
                key,
                action,
                found.action,
            )
            found = None
        if found is not None and found.status == "done" and found.dropped_bytes is not None:
            metrics.ACTION_LOG_REPLAYS.labels(kind="action", outcome="replayed").inc()
            return _result(
                success=False,
                error=(
                    f"{action} ran before this agent resumed, but its result ({found.dropped_bytes} "
                    f"bytes) was larger than the action log keeps ({MAX_RECORD_BYTES}); it is not "
                    "run twice. Check what it did before running it again."
                ),
            )
        if found is not None and found.status == "done" and found.result is not None:
            replayed = _validated(found.result, "result")
            if replayed is not None and self._restore_state(capability, found.state):
                metrics.ACTION_LOG_REPLAYS.labels(kind="action", outcome="replayed").inc()
                log.info(
                    "agent %s: action %s (%s) answered from the action log", self.agent.agent_id, action, key
                )
                return replayed
        if found is not None:
            metrics.ACTION_LOG_REPLAYS.labels(kind="action", outcome="reexecuted").inc()
            metrics.ACTION_RERUNS.labels(action=action, effects="declared" if effects else "none").inc()
            log.info(
                "agent %s: action %s (%s) was cut off before its result was recorded; running it "
                "again with the same idempotency key",
                self.agent.agent_id,
                action,
                key,
            )
        return None

    async def _run_and_record(
        self,
        call: Callable[[], Awaitable[ActionResult]],
        key: str,
        fields: dict[str, Any],
        capability: str | None,
        effects: tuple[str, ...],
    ) -> ActionResult:
        """Run the action under idempotency key `key` and record its result (`fields` are its
        record's): a `started` record first and the result committed when it declares `effects`,
        else a `started` mark stored in the background (`_mark`) and the result held for the
        step's persist."""
        started = LogRecord(status="started", at=time.time(), **fields)
        if effects:  # what a cut-off call did is worth telling apart from one never made
            await self._append([started])
        before = copy.deepcopy(self._capability_state(capability))
        token = _IDEMPOTENCY_KEY.set(key)
        if not effects:  # (sent once the action began: it runs first, up to its first wait)
            self._start_mark(started)
        try:
            result = await call()
        finally:
            _IDEMPOTENCY_KEY.reset(token)
        state = self._capability_state(capability)
        record = bounded({**fields, "at": time.time()}, "result", result, state)
        if not effects:  # held for the step's persist (or this log's next commit), in its transaction
            self._deferred.append(record)
            self._remember([record])
            if len(self._deferred) < DEFERRED_MAX:
                return result
        try:
            await _settle(self._append([] if not effects else [record]))
        except asyncio.CancelledError:
            # cancelled (a suspend) after the action changed its capability, before the policy took
            # its result: the capability goes back to where it was before the action, as the
            # policy is, for what the suspend persists; the redone step replays the result
            self._restore_state(capability, before)
            raise
        return result

    def step_calls(self, step: int) -> list[dict[str, Any]]:
        """The actions dispatched during `step` of the current run: `{"action", "capability",
        "effects", "key", "success"}` each (what an undo of that step reports it cannot undo);
        `success` is None for one cut off before its result was recorded."""
        run = self.agent.current_run
        if run is None or self._run_id != run.run_id:
            return []
        calls = [r for r in self._records.values() if r.kind == "action" and r.step == step]
        return [
            {
                "action": r.action,
                "capability": r.capability,
                "effects": list(r.effects),
                "key": r.key,
                "success": r.succeeded,
            }
            for r in sorted(calls, key=lambda r: r.n)
        ]

    async def truncate_after(self, step: int) -> None:
        """Drop the records of the current run's steps after `step` (a marker appended to the
        log), so re-driving those steps calls the model and runs the actions again. Not calling
        this keeps them: the re-driven steps get the recorded results (replay from the log)."""
        marker = await self.truncate_marker(step)
        if marker is None:
            return
        await self._append([marker])
        self.truncated(step)

    async def truncate_marker(self, step: int) -> LogRecord | None:
        """The marker `truncate_after(step)` appends (None without a current run), for a caller
        that appends it in a transaction of its own (a checkpoint restore: one fenced commit);
        `truncated(step)` once that commit applied. Results held for a persist are written first,
        so the marker follows them in the ring."""
        run = self.agent.current_run
        if run is None:
            return None
        await self._load(run.run_id)
        if self._deferred:
            await self._append([])
        return LogRecord(run_id=run.run_id, step=step, kind="truncate", at=time.time(), after_step=step)

    def truncated(self, step: int) -> None:
        """The stored log got the truncate marker of `step`: forget the later steps' records."""
        self._records = {k: r for k, r in self._records.items() if r.step <= step}
        self._counting, self._ordinals = None, {}

    async def records(self) -> list[LogRecord]:
        """The records that count for the current run (its latest per key), oldest first."""
        run = self.agent.current_run
        if run is None:
            return []
        await self._load(run.run_id)
        return sorted(self._records.values(), key=lambda r: (r.step, r.kind, r.n))

    # -- inside --------------------------------------------------------------------------------

    def _capability_state(self, name: str | None) -> dict[str, Any] | None:
        """The state of the action's capability after it ran: what the action changed in memory,
        which a replay (the action not run again) must put back."""
        capability = self.agent.capabilities.get(name) if name else None
        return capability.get_state() if capability is not None else None

    def _restore_state(self, name: str | None, state: dict[str, Any] | None) -> bool:
        """Put a replayed action's capability back in the state the action left it in; False when
        it cannot be (the capability refuses the recorded state: the action is run again)."""
        capability = self.agent.capabilities.get(name) if name else None
        if capability is None or state is None:
            return True
        try:
            capability.set_state(state)
        except Exception as exc:  # a stored state is input: one the capability refuses is not used
            log.warning(
                "agent %s: %s refused its recorded state (%s); running the action again",
                self.agent.agent_id,
                name,
                exc,
            )
            return False
        return True

    def _active_run(self) -> AgentRun | None:
        run = self.agent.current_run
        return run if run is not None and not run.done else None

    def _next(self, run: AgentRun, kind: str) -> tuple[int, int]:
        """The step this call belongs to and its ordinal among the step's calls of its kind."""
        step = run.steps + 1
        if self._counting != (run.run_id, step):
            self._counting, self._ordinals = (run.run_id, step), {}
            self._slim(step)
        n = self._ordinals.get(kind, 0)
        self._ordinals[kind] = n + 1
        return step, n

    @property
    def max_entries(self) -> int:
        """`context.action_log_max_entries` of the settings the agent's host was given."""
        if self._cap is None:
            self._cap = self.agent.colony_settings().context.action_log_max_entries
        return self._cap

    def _slim(self, step: int) -> None:
        """Drop the bodies of records of steps before `step` from memory: this copy went past
        them, so it never replays them (a restored copy reads them from Redis); `step_calls` needs
        only their outline. Keeps a long run's memory flat."""
        for key in [k for k in self._bodies if (r := self._records.get(k)) is None or r.step < step]:
            self._bodies.discard(key)
            record = self._records.get(key)
            if record is not None:
                outline = {"success": record.succeeded} if record.result is not None else None
                self._records[key] = record.model_copy(
                    update={"response": None, "result": outline, "state": None}
                )

    async def _load(self, run_id: str) -> None:
        """Read the stored log once per run (a restored agent finds what its last copy recorded)."""
        if self._run_id == run_id:
            return
        if self._run_id is not None:
            # a new run of this very copy, the only writer of the log since it read it: nothing of
            # the new run is stored, and what is (the last run's) goes with the first record, as
            # do results of the last run still held (its end was never persisted: no use now)
            self._run_id, self._records, self._bodies, self._stale = run_id, {}, set(), True
            self._deferred = []
            return
        stored = parse_records(await self.agent.blackboard.ring(LOG_KEY))
        records: dict[str, LogRecord] = {}
        for record in stored:
            if record.run_id != run_id:
                continue
            if record.kind == "truncate":
                after = record.after_step if record.after_step is not None else record.step
                records = {k: r for k, r in records.items() if r.step <= after}
            elif record.status == "done" or getattr(records.get(record.key), "status", "") != "done":
                records[record.key] = record  # (a mark that lands late never hides the result)
        self._run_id, self._records, self._bodies = run_id, records, set(records)
        self._stale = any(r.run_id != run_id for r in stored)

    def write_deferred(self, tx: Transaction) -> list[LogRecord]:
        """Put the results held for the step's persist into its transaction (fenced by it, as
        `_append` is), after clearing the previous run's records if they are still stored; which,
        for `deferred_stored` once it committed."""
        taken = list(self._deferred)
        if taken:
            self._push(tx, taken)
        return taken

    def deferred_stored(self, stored: list[LogRecord]) -> None:
        """These held results are in Redis now (the transaction that took them committed): no
        longer held. Those held meanwhile stay (by identity, not count: a commit of another path
        may have taken some of them too, which only repeats a record the ring keys)."""
        if stored:
            gone = {id(r) for r in stored}
            self._deferred = [r for r in self._deferred if id(r) not in gone]
            self._stale = False

    def _start_mark(self, record: LogRecord) -> None:
        """Store the `started` mark of an action that declares no effect, in the background: the
        action and the step go on without waiting for it (it costs them no round trip). At most
        `MAX_MARKS` in flight (more are not marked: a re-run of theirs goes uncounted)."""
        if len(self._marks) >= MAX_MARKS:
            return
        task = asyncio.ensure_future(self._mark(record))
        self._marks.add(task)
        task.add_done_callback(self._marks.discard)

    async def _mark(self, record: LogRecord) -> None:
        """Append the mark to the stored log, fenced like `_append` but on its own: it carries no
        held result and never clears the last run's records (a commit that does may drop the mark:
        it only counts). Best effort: the mark lets a step redone after a crash count the action's
        re-run (`colony_action_reruns_total`); one that cannot be stored (Redis down, this copy
        superseded) is skipped, and what the step does next (its persist) meets the same trouble
        and deals with it. It is sent once the action began: a mark stored is a run made, so a
        counted re-run is a real one (a crash before it reached Redis goes uncounted)."""
        from colony.agents.state.persistence import fence

        try:
            async with self.agent.blackboard.transaction() as tx:
                await fence(tx, self.agent)
                tx.ring_push(LOG_KEY, [record.model_dump(mode="json", exclude_none=True)], self.max_entries)
        except BlackboardError as exc:  # (a conflict too: this copy lost its place)
            log.debug("agent %s: start of %s not marked: %r", self.agent.agent_id, record.action, exc)
            return
        if record.key not in self._records:  # (never over the result of the call)
            self._remember([record])

    async def _append(self, records: list[LogRecord]) -> None:
        """Append to the stored log, fenced by the agent's lifecycle (as `persist_agent` is): a
        copy of the agent that lost its place records nothing. Returns once Redis has it. The
        results held for the step's persist go first, in the same commit."""
        from colony.agents.state.persistence import fence, recover_lifecycle

        held = list(self._deferred)
        board = self.agent.blackboard
        for attempt in (1, 2):
            try:
                async with board.transaction() as tx:
                    await fence(tx, self.agent)
                    self._push(tx, [*held, *records])
                self._stale = False
                break
            except ConcurrentModificationError:
                if attempt == 2 or not await recover_lifecycle(self.agent):
                    raise
        self.deferred_stored(held)
        self._remember(records)

    def _push(self, tx: Transaction, records: list[LogRecord]) -> None:
        """Append `records` in a fenced transaction; the previous run's records, if still stored,
        go in the same commit (a copy that lost its place clears nothing)."""
        if self._stale:
            tx.ring_truncate(LOG_KEY, 0)
        values = [r.model_dump(mode="json", exclude_none=True) for r in records]
        tx.ring_push(LOG_KEY, values, self.max_entries)

    def _remember(self, records: list[LogRecord]) -> None:
        """Keep records as the stored ring keeps them (the truncate marker is applied by its
        caller, `truncated`)."""
        for record in records:
            if record.kind != "truncate":
                self._records[record.key] = record
                self._bodies.add(record.key)
        while len(self._records) > self.max_entries:  # as the stored ring: the oldest go
            self._bodies.discard(oldest := next(iter(self._records)))
            self._records.pop(oldest)
