"""How an agent's event handlers get their events: one subscription per capability with handlers,
resumed from the position persisted with the agent, paused (not ended) by a Redis outage; what the
handlers return becomes context for the action policy. A mixin of `Agent` (colony/agents/base.py),
whose state (positions, tasks, context) it uses."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from colony.aio import cancel_and_wait
from colony.blackboard import BlackboardEvent
from colony.errors import BlackboardUnavailable

if TYPE_CHECKING:
    from colony.agents.capability import AgentCapability
    from colony.agents.events import EventHandlerSpec
    from colony.agents.ring import ContextRing

log = logging.getLogger("colony.agents.base")


class EventDelivery:
    """Event delivery to the handlers of an agent's capabilities."""

    if TYPE_CHECKING:
        agent_id: str
        capabilities: dict[str, AgentCapability]
        context: ContextRing
        context_changed: asyncio.Event
        _handlers: dict[str, list[EventHandlerSpec]]
        _event_positions: dict[str, str]
        _handler_tasks: list[asyncio.Task[None]]

        async def persist(self) -> None: ...

    async def start_event_handlers(self) -> None:
        """Subscribe each capability with handlers to its scope, from where it last stopped.

        A fresh subscription starts "now"; that position is persisted at once, so events that
        arrive while the agent is down (dropped before its first step) are still delivered later.
        """
        fresh = False
        for name in self._handlers:
            if name not in self._event_positions:
                board = self.capabilities[name].blackboard
                self._event_positions[name] = await board.latest_event_id()
                fresh = True
        if fresh:
            await self.persist()
        for name, handlers in self._handlers.items():
            self._handler_tasks.append(
                asyncio.create_task(self._feed(name, handlers), name=f"{self.agent_id}-{name}-events")
            )

    async def _feed(self, name: str, handlers: list[EventHandlerSpec]) -> None:
        """Deliver events to handlers; a Redis outage pauses delivery, it does not end it."""
        board = self.capabilities[name].blackboard
        delay = 0.1
        while True:
            try:
                async for event in board.subscribe(from_id=self._event_positions[name]):
                    await self._handle(name, handlers, event)
                    delay = 0.1
                return
            except BlackboardUnavailable as exc:
                log.warning(
                    "agent %s: events of %s paused (%s); retrying in %.1fs", self.agent_id, name, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _handle(self, name: str, handlers: list[EventHandlerSpec], event: BlackboardEvent) -> None:
        """Broadcast one event to the handlers; what they return, merged, is one context entry
        (`{context_key: context}`) for the policy."""
        accumulated: dict[str, Any] = {}
        for spec in handlers:
            if spec.matches(event.key):
                try:
                    produced = await spec.handler(event)
                except Exception:
                    log.exception("event handler %s of agent %s failed on %s", name, self.agent_id, event.key)
                    continue
                if produced:
                    accumulated.update(produced)
        if accumulated:
            self.context.append(accumulated)
            self.context_changed.set()
        self._event_positions[name] = event.id

    async def stop_event_handlers(self) -> None:
        await cancel_and_wait(self._handler_tasks)
        self._handler_tasks.clear()
