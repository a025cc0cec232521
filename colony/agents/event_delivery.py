"""How an agent's event handlers get their events: one subscription per capability with handlers,
resumed from the position persisted with the agent, paused (not ended) by a Redis outage; what the
handlers return becomes context for the action policy. Held by its `Agent` (colony/agents/base.py)
as `agent.event_delivery`; the positions are persisted with the agent's state."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from colony.aio import cancel_and_wait
from colony.blackboard import Blackboard, BlackboardEvent
from colony.errors import BlackboardUnavailable, EventStreamRefused

if TYPE_CHECKING:
    from colony.agents.base import Agent
    from colony.agents.events import EventHandlerSpec

log = logging.getLogger("colony.agents.base")


class EventDelivery:
    """Event delivery to the handlers of an agent's capabilities: which handlers each capability
    has, the stream position each one has reached, and the tasks that feed them."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.handlers: dict[str, list[EventHandlerSpec]] = {}
        self.positions: dict[str, str] = {}
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Subscribe each capability with handlers to its scope, from where it last stopped.

        A fresh subscription starts "now"; that position is persisted at once, so events that
        arrive while the agent is down (dropped before its first step) are still delivered later.
        (A new agent's positions are taken and stored by `initialize`, with its record, so
        spawning costs no persist here.)"""
        fresh = await self.fresh_positions()
        if fresh:
            self.positions.update(fresh)
            await self.agent.persist()
        for name, handlers in self.handlers.items():
            self.tasks.append(
                asyncio.create_task(self._feed(name, handlers), name=f"{self.agent.agent_id}-{name}-events")
            )

    async def fresh_positions(self) -> dict[str, str]:
        """The newest event id of the scope of each capability with handlers that has no position
        yet ("0-0" for an empty scope), read in one pipelined round trip per Redis client."""
        wanted = [name for name in self.handlers if name not in self.positions]
        by_client: dict[int, list[tuple[str, Blackboard]]] = {}
        for name in wanted:
            board = self.agent.capabilities[name].blackboard
            by_client.setdefault(id(board.redis), []).append((name, board))
        positions: dict[str, str] = {}
        for boards in by_client.values():
            first = boards[0][1]
            async with first.guard("latest_event_id"), first.redis.pipeline(transaction=False) as pipe:
                for _name, board in boards:
                    pipe.xrevrange(board.keyspace.events_key, count=1)
                replies = await pipe.execute()
            for (name, _board), newest in zip(boards, replies, strict=True):
                positions[name] = newest[0][0] if newest else "0-0"
        return positions

    async def _feed(self, name: str, handlers: list[EventHandlerSpec]) -> None:
        """Deliver events to handlers; a Redis outage pauses delivery, it does not end it.

        One subscription for the life of the feed, read by the process's shared event reader (an
        idle agent holds no connection of its own); after an outage it goes on after the last
        event handled, so nothing is lost or delivered twice. Closed when the feed ends. A stream
        Redis refuses to read (its key overwritten with another type) ends this feed only, logged."""
        board = self.agent.capabilities[name].blackboard
        # the handlers' one key pattern (a run capability's "request:*") filters in the shared
        # reader: the scope's other events (a run's claims, events, results) never wake this feed
        patterns = {spec.pattern for spec in handlers}
        pattern = patterns.pop() if len(patterns) == 1 else "*"
        subscription = board.subscribe(pattern, from_id=self.positions[name])
        delay = 0.1
        try:
            while True:
                try:
                    event = await subscription.next()
                except BlackboardUnavailable as exc:
                    log.warning(
                        "agent %s: events of %s paused (%s); retrying in %.1fs",
                        self.agent.agent_id,
                        name,
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                except EventStreamRefused as exc:  # not an outage: Redis refuses this scope's events
                    log.error("agent %s: events of %s ended: %s", self.agent.agent_id, name, exc)
                    return
                if event is None:
                    return
                await self._handle(name, handlers, event)
                delay = 0.1
        finally:
            subscription.close()

    async def _handle(self, name: str, handlers: list[EventHandlerSpec], event: BlackboardEvent) -> None:
        """Broadcast one event to the handlers; what they return, merged, is one context entry
        (`{context_key: context}`) for the policy."""
        accumulated: dict[str, Any] = {}
        for spec in handlers:
            if spec.matches(event.key):
                try:
                    produced = await spec.handler(event)
                except Exception:
                    log.exception(
                        "event handler %s of agent %s failed on %s", name, self.agent.agent_id, event.key
                    )
                    continue
                if produced:
                    accumulated.update(produced)
        if accumulated:
            self.agent.context.append(accumulated)
            self.agent.context_changed.set()
        self.positions[name] = event.id

    async def stop(self) -> None:
        await cancel_and_wait(self.tasks)
        self.tasks.clear()
