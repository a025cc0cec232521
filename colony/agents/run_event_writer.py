"""How `AgentRunCapability` writes the events of the request it serves (a mixin): numbered,
create-only, marked with the attempt and the step in progress, bounded per request. Kept apart from
the serving logic (colony/agents/run_capability.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from colony.agents.handle import TERMINAL_EVENTS, AgentRunEvent

if TYPE_CHECKING:
    from colony.agents.base import Agent
    from colony.blackboard.protocol import RequestResultProtocol

log = logging.getLogger("colony.agents.run_capability")


class RunEventWriter:
    """Mixed into AgentRunCapability, which provides what is declared here."""

    if TYPE_CHECKING:
        agent: Agent | None
        protocol: type[RequestResultProtocol]
        active_request: str | None
        _seq: int
        _attempt: int

        @property
        def max_events(self) -> int: ...

        async def _create_once(
            self, key: str, value: Any, *, tags: set[str], what: str, value_in_event: bool = False
        ) -> bool: ...

    async def emit(self, event_type: str, data: Any = None) -> None:
        """Write the next event of the active request (ordered by its sequence number), marked with
        the current attempt and the run step in progress (what a restart may supersede).

        A request stores at most `runs.max_events_per_run` events plus its terminal one: the last
        of them is a `truncated` event saying later ones were dropped (the terminal one always goes)."""
        await self._emit(event_type, data, during_step=self._step_in_progress())

    def _step_in_progress(self) -> int | None:
        """Index of the step the active request's run is in (None outside one: not begun, done)."""
        run = self.agent.current_run if self.agent is not None else None
        if run is None or run.done or run.request_id is None or run.request_id != self.active_request:
            return None
        return run.steps

    async def _emit(self, event_type: str, data: Any, *, during_step: int | None) -> None:
        if self.active_request is None:
            return
        if event_type not in TERMINAL_EVENTS and self._seq >= self.max_events - 1:
            if self._seq == self.max_events - 1:
                await self._write_event("truncated", {"dropped_after": self._seq}, during_step)
            return
        await self._write_event(event_type, data, during_step)

    async def _write_event(self, event_type: str, data: Any, during_step: int | None) -> None:
        assert self.active_request is not None
        seq = self._seq + 1  # taken once stored: a write retried after an outage keeps its number
        event = AgentRunEvent(
            request_id=self.active_request,
            event_type=event_type,
            data=data,
            seq=seq,
            attempt=self._attempt,
            during_step=during_step,
        )
        key = self.protocol.event_key(self.active_request, f"{seq:05d}.{event_type}")
        # create-only, waiting out a Redis outage (or pause): the run emitting it does not fail, and
        # a write Redis applied before its answer was lost is recognised, not written (and so
        # streamed) a second time
        stored = await self._create_once(
            key,
            event.model_dump(mode="json"),
            tags={self.protocol.request_tag(self.active_request)},
            what=f"event {seq} of request {self.active_request}",
            value_in_event=True,  # the event streams read it from the stream, no read per event
        )
        self._seq = seq
        if not stored:
            log.warning("event %s of request %s was stored already; not written again", seq, key)
