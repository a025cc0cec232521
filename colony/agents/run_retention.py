"""How long an answered request of `AgentRunCapability` stays (a mixin): its keys, its claim and,
for an HTTP run, its run record get `runs.retention_seconds` once it is answered; and how many
events one request may store. Kept apart from the serving logic (colony/agents/run_capability.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from colony.blackboard import BlackboardScope, scope_id
from colony.blackboard.connection import retry_unavailable
from colony.blackboard.protocol import AgentRunProtocol, ApiRunProtocol
from colony.config import load_settings

if TYPE_CHECKING:
    from colony.agents.base import Agent
    from colony.blackboard import Blackboard
    from colony.blackboard.protocol import RequestResultProtocol
    from colony.config import ColonySettings

log = logging.getLogger("colony.agents.run_capability")

RETIRE_DRAIN_SECONDS = 5.0  # how long closing waits for retirements in flight (then they go on alone)
_LEFT_RUNNING: set[asyncio.Task[None]] = set()  # retirements that outlived their capability's close


class RequestRetention:
    """Mixed into AgentRunCapability, which provides what is declared here."""

    if TYPE_CHECKING:
        agent: Agent | None
        protocol: type[RequestResultProtocol]
        blackboard: Blackboard
        _settings: ColonySettings | None
        _retention: float | None
        _max_events: int | None
        _retiring: set[asyncio.Task[None]]

        async def _redis_answers(self) -> bool: ...

    @property
    def retention_seconds(self) -> float:
        """How long an answered request's keys stay (`runs.retention_seconds` of the injected
        settings, read once)."""
        if self._retention is None:
            self._read_settings()
        assert self._retention is not None
        return self._retention

    @property
    def max_events(self) -> int:
        """Events one request may store (`runs.max_events_per_run`, read once)."""
        if self._max_events is None:
            self._read_settings()
        assert self._max_events is not None
        return self._max_events

    def _read_settings(self) -> None:
        runs = (self._settings or load_settings()).runs
        self._retention, self._max_events = runs.retention_seconds, runs.max_events_per_run

    async def _retire(self, request_id: str) -> None:
        """The request is answered: its claim leaves the open-claims index, and every key it left
        (request, claim, events, result; for an HTTP run its run record too) expires after the
        retention, as do this scope's stream events older than the retention. Idempotent (it
        never extends an expiry but the claim's, which a repeat rewrites), so it also runs after
        late writes. A failure is logged: the request is answered either way.

        The work runs in its own task, shielded from the caller's cancellation: an agent stopped
        just as its run is answered would otherwise cut it between the keys' expiry and the tag
        set's, and the tag set (or keys) would stay for good. `_drain_retiring` (at close) waits
        for it."""
        task = asyncio.create_task(self._retire_logged(request_id), name=f"retire-{request_id}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        await asyncio.shield(task)

    async def _drain_retiring(self) -> None:
        """Let retirements in flight finish, waiting at most `RETIRE_DRAIN_SECONDS`. One still
        waiting out an outage then is left to finish on its own (never cancelled: its claim is
        already out of the open-claims index, so no later start would find the request to retire
        it again); `_LEFT_RUNNING` holds it until it ends."""
        if not self._retiring:
            return
        _done, pending = await asyncio.wait(set(self._retiring), timeout=RETIRE_DRAIN_SECONDS)
        if pending:
            log.warning(
                "%d request retirements still waiting at close; they finish in the background", len(pending)
            )
            for task in pending:
                _LEFT_RUNNING.add(task)
                task.add_done_callback(_LEFT_RUNNING.discard)

    async def _retire_logged(self, request_id: str) -> None:
        try:
            await retry_unavailable(
                lambda: self._retire_once(request_id),
                f"retiring {request_id}",
                log,
                answers=self._redis_answers,
            )
        except Exception as exc:  # never left for the garbage collector to report (a shielded task)
            log.warning("keys of request %s were not given their retention: %r", request_id, exc)

    async def _retire_once(self, request_id: str) -> None:
        tag = self.protocol.request_tag(request_id)
        owner = self.agent.agent_id if self.agent else None
        ttl = self.retention_seconds
        # out of the open-claims index, its expiry in the same write (never left without one);
        # untagged first, so the expiry index needs no member for it (expired while it still
        # carried the open-claims tag, it would need one per run, for the whole retention); then
        # the request's keys, and an HTTP run's record: one round trip for the three
        elsewhere = []
        if self.protocol is AgentRunProtocol and self.agent is not None:
            meta = self.agent.metadata
            api_board = self.blackboard.scoped(
                scope_id(
                    BlackboardScope.COLONY,
                    tenant_id=meta.tenant_id,
                    colony_id=meta.colony_id,
                    namespace=ApiRunProtocol.namespace,
                )
            )
            elsewhere.append((api_board, [ApiRunProtocol.run_key(request_id)]))
        await self.blackboard.retire_group(
            self.protocol.claim_key(request_id),
            owner,
            created_by=owner,
            ttl_seconds=ttl,
            tag=tag,
            trim_events=True,
            elsewhere=elsewhere,
        )
