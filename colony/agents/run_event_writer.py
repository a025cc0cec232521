"""How `AgentRunCapability` writes the events of the request it serves (`cap.events`): numbered,
create-only, marked with the attempt and the step in progress, bounded per request, the numbering
going on after what a request stored (adoption, a restart's announcement, the end of a stream its
host died before ending); and its answer (the run's last step event, its result and its terminal
event, one commit), or a failed one when that cannot be stored. Kept apart from the serving logic
(colony/agents/run_capability.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from colony.agents.models import RunStatus
from colony.agents.stored_events import StoredEvents, read_stored_events
from colony.blackboard.connection import retry_unavailable
from colony.errors import BlackboardError, ConcurrentModificationError
from colony.wire.run_events import RESTARTED, TERMINAL_EVENTS, AgentRunEvent, terminal_event

if TYPE_CHECKING:
    from colony.agents.models import AgentRun
    from colony.agents.run_capability import AgentRunCapability
    from colony.blackboard import BlackboardEntry

log = logging.getLogger("colony.agents.run_capability")


class RunEventWriter:
    """Writes the events and the answer of the request its `AgentRunCapability` serves (the
    capability's `active_request`); held by the capability as `cap.events`."""

    def __init__(self, cap: AgentRunCapability) -> None:
        self.cap = cap
        self.seq = 0
        self.attempt = 1  # of the active request: 1, one more after each `restarted` event

    def begin(self, request_id: str) -> None:
        """Make `request_id` the active one with fresh numbering (never the previous request's)."""
        self.cap.active_request = request_id
        self.seq, self.attempt = 0, 1

    async def adopt(self, request_id: str, stored: StoredEvents | None = None) -> StoredEvents:
        """Make `request_id` the active one; its event numbering (and attempt) continues after what
        is stored. What is stored, for the caller: read (unless the caller knows the request has no
        stored event: `stored`), even for a claim this copy just created (a pool re-opens a gone
        member's request by deleting its claim, and the events of that first attempt stay: the
        next server numbers after them and announces its restart)."""
        self.cap.active_request = request_id
        if stored is None:
            stored = await self.stored(request_id)
        self.seq, self.attempt = stored.last_seq, stored.attempt
        self.cap._idle.clear()
        return stored

    async def stored(self, request_id: str) -> StoredEvents:
        """The request's stored events (bounded: twice `runs.max_events_per_run`)."""
        return await read_stored_events(
            self.cap.blackboard, self.cap.protocol, request_id, limit=2 * self.cap.retention.max_events + 10
        )

    async def end_stream(self, request_id: str, result: BlackboardEntry) -> None:
        """A request this agent answered before its host died, maybe before the terminal event that
        follows the result was stored: store that event now (once), so the stream ends with it rather
        than with a `gap`. A result the requester wrote (cancel, timeout) is the requester's to
        report. Best effort: a failure is logged."""
        agent = self.cap._agent()
        if result.created_by != agent.agent_id:
            return
        value = result.value if isinstance(result.value, dict) else {}
        try:
            if not (await self.adopt(request_id)).ended:
                data = {"output": value.get("output"), "error": value.get("error")}
                await self.emit_marked(terminal_event(value.get("status")), data, during_step=None)
        except Exception as exc:  # e.g. Redis away, or an output it will not store: runs.py sends a gap
            log.warning("terminal event of request %s not stored: %r", request_id, exc)
        finally:
            self.cap.active_request = None
            self.cap._idle.set()

    async def announce_restart(self, run: AgentRun, stored: StoredEvents) -> None:
        """The restored `run` redoes step `run.steps` (0-based; the steps before it are checkpointed).
        If its abandoned attempt had emitted events during that step or later, those are superseded:
        emit one `restarted` event, and number what follows as the next attempt. A restart that
        takes nothing back emits nothing (the stream reads as an uninterrupted one). A failure
        to store it is logged: the run goes on either way."""
        redo = run.steps
        superseded = [seq for seq, during in stored.current if during is not None and during >= redo]
        if not superseded:
            return
        self.attempt = stored.attempt + 1
        step = redo + 1  # 1-based, as in `step` events
        data = {
            "attempt": self.attempt,
            "supersedes_after": min(superseded) - 1,
            "superseded": len(superseded),
            "step": step,
            "reason": f"the run was interrupted during step {step} (its replica stopped, or the agent "
            f"was suspended mid-step); it goes on from its last checkpoint and does step {step} again",
        }
        try:
            await self.emit_marked(RESTARTED, data, during_step=None)
        except BlackboardError as exc:
            log.warning("restart of request %s not announced: %s", self.cap.active_request, exc)

    async def emit(self, event_type: str, data: Any = None) -> None:
        """Write the next event of the active request (ordered by its sequence number), marked with
        the current attempt and the run step in progress (what a restart may supersede).

        A request stores at most `runs.max_events_per_run` events plus its terminal one: the last
        of them is a `truncated` event saying later ones were dropped (the terminal one always goes)."""
        await self.emit_marked(event_type, data, during_step=self._step_in_progress())

    def _step_in_progress(self) -> int | None:
        """Index of the step the active request's run is in (None outside one: not begun, done)."""
        run = self.cap.agent.current_run if self.cap.agent is not None else None
        if run is None or run.done or run.request_id is None or run.request_id != self.cap.active_request:
            return None
        return run.steps

    async def emit_marked(self, event_type: str, data: Any, *, during_step: int | None) -> None:
        if self.cap.active_request is None:
            return
        if event_type not in TERMINAL_EVENTS and self.seq >= self.cap.retention.max_events - 1:
            if self.seq == self.cap.retention.max_events - 1:
                await self._write_event("truncated", {"dropped_after": self.seq}, during_step)
            return
        await self._write_event(event_type, data, during_step)

    def _event_at(self, seq: int, event_type: str, data: Any, during_step: int | None) -> tuple[str, Any]:
        """The key and value of the active request's event number `seq` (built once: a write
        retried after an outage sends the very same value, which is how it is recognised)."""
        assert self.cap.active_request is not None
        event = AgentRunEvent(
            request_id=self.cap.active_request,
            event_type=event_type,
            data=data,
            seq=seq,
            attempt=self.attempt,
            during_step=during_step,
        )
        key = self.cap.protocol.event_key(self.cap.active_request, f"{seq:05d}.{event_type}")
        return key, event.model_dump(mode="json")

    async def _write_event(self, event_type: str, data: Any, during_step: int | None) -> None:
        assert self.cap.active_request is not None
        seq = self.seq + 1  # taken once stored: a write retried after an outage keeps its number
        await self.store_event(*self._event_at(seq, event_type, data, during_step))
        self.seq = seq

    async def store_event(self, key: str, value: Any) -> None:
        """Create-only, waiting out a Redis outage (or pause): the run emitting it does not fail, and
        a write Redis applied before its answer was lost is recognised, not written (and so
        streamed) a second time."""
        assert self.cap.active_request is not None
        stored = await self.cap._create_once(
            key,
            value,
            tags={self.cap.protocol.request_tag(self.cap.active_request)},
            what=f"event {key} of request {self.cap.active_request}",
            value_in_event=True,  # the event streams read it from the stream, no read per event
        )
        if not stored:
            log.warning("event %s was stored already; not written again", key)

    async def store_answer(
        self, request_id: str, result: dict[str, Any], kind: str, data: Any, step: Any = None
    ) -> bool:
        """Store the answer of the active request `request_id`: its last `step` event (if given),
        its result and its terminal event `kind`, in one commit, each create-only, and the
        request's retirement with it (`retention.retire_with`): one round trip where four used to go. True
        when that commit stored the answer and retired the request (else the caller `retention.retire`s
        it).

        A conflict (a result already there: the requester cancelled or timed the run out; or this
        commit sent twice by the Redis client after its answer was lost) or a value Redis refuses
        sends them one at a time instead, each judged on its own as before: a result already there
        stands and no terminal event follows; a step event Redis will not store is dropped. An
        outage is waited out (bounded; then the writes go one at a time, and their own outage is
        raised, as the result's write did)."""
        tags = {self.cap.protocol.request_tag(request_id)}
        result_key = self.cap.protocol.result_key(request_id)
        what = f"answer of request {request_id}"
        if self.cap.active_request != request_id:  # no event numbering of this request: the result alone
            if await self.cap._create_once(result_key, result, tags=tags, what=what):
                self.cap.counting.count_answer(request_id, result["status"])
            return False
        writer = self.cap.agent.agent_id if self.cap.agent is not None else None
        if (
            step is not None and self.seq >= self.cap.retention.max_events - 1
        ):  # over the bound: `events.emit_marked` says so
            await self.emit_step(step)
            step = None
        seq = self.seq
        events = []
        if step is not None:
            seq += 1
            events.append(self._event_at(seq, "step", step, None))
        terminal = self._event_at(seq + 1, kind, data, self._step_in_progress())

        async def commit() -> bool:
            create: dict[str, Any] = {"tags": tags, "created_by": writer, "expected_version": 0}
            async with self.cap.blackboard.transaction() as tx:
                for key, value in events:
                    tx.write(key, value, **create, value_in_event=True)
                tx.write(result_key, result, **create)
                tx.write(*terminal, **create, value_in_event=True)
                self.cap.retention.retire_with(tx, request_id)
            return self.cap.retention.retired_with(tx)

        try:
            retired = await retry_unavailable(commit, what, log, answers=self.cap._redis_answers)
        except Exception as exc:  # judged one at a time (see above), an outage's too: the commit
            # may have been applied though its answer was lost, which the judged writes recognise
            log.debug("%s not stored in one commit (%r); one write at a time", what, exc)
            await self._store_answer_one_by_one(request_id, result, kind, data, events, terminal)
            return False
        self.seq = seq + 1
        self.cap.counting.count_answer(request_id, result["status"])
        return retired

    async def _store_answer_one_by_one(
        self,
        request_id: str,
        result: dict[str, Any],
        kind: str,
        data: Any,
        events: list[tuple[str, Any]],
        terminal: tuple[str, Any],
    ) -> bool:
        for key, value in events:
            try:
                await self.store_event(key, value)
                self.seq = value["seq"]
            except Exception as exc:  # a step event Redis will not store is dropped; the run goes on
                log.warning("step event of request %s not stored: %r", request_id, exc)
                terminal = self._event_at(self.seq + 1, kind, data, self._step_in_progress())
        answered = await self.cap._create_once(
            self.cap.protocol.result_key(request_id),
            result,
            tags={self.cap.protocol.request_tag(request_id)},
            what=f"answer of request {request_id}",
        )
        if answered:  # a result already there (the requester's) stands: no terminal event follows
            self.cap.counting.count_answer(
                request_id, result["status"]
            )  # stored: the run ended, whatever follows
            await self.store_event(*terminal)
            self.seq = terminal[1]["seq"]
        return answered

    async def emit_step(self, step: Any) -> None:
        """A `step` event on its own (dropped, logged, when Redis will not store it)."""
        try:
            await self.emit_marked("step", step, during_step=None)
        except Exception as exc:
            log.warning("step event of request %s not stored: %r", self.cap.active_request, exc)

    async def store_failure(self, request_id: str, reason: str) -> None:
        """The result (or its event) could not be written: write a failed result without the output
        (create-only; a result already there stands) and a terminal event that agrees with it."""
        status = RunStatus.FAILED
        try:
            await self.cap.blackboard.write(
                self.cap.protocol.result_key(request_id),
                {"status": status.value, "output": None, "error": reason[:2000], "run_id": None, "steps": 0},
                tags={self.cap.protocol.request_tag(request_id)},
                created_by=self.cap.agent.agent_id if self.cap.agent else None,
                expected_version=0,
            )
            self.cap.counting.count_answer(request_id, status.value)
        except ConcurrentModificationError:
            existing = await self.cap.blackboard.read(self.cap.protocol.result_key(request_id))
            if existing is not None and existing.value.get("status") in {s.value for s in RunStatus}:
                status = RunStatus(existing.value["status"])
            if (await self.stored(request_id)).ended:
                return  # its answer's commit was applied, its terminal event with it: one is enough
        kind = terminal_event(status)
        await self.emit(kind, {"output": None, "error": reason[:2000]})
