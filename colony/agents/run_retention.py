"""How long an answered request of `AgentRunCapability` stays (`cap.retention`): its keys, its claim
and, for an HTTP run, its run record get `runs.retention_seconds` once it is answered; and how many
events one request may store. Kept apart from the serving logic (colony/agents/run_capability.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from colony.blackboard.connection import retry_unavailable
from colony.blackboard.protocol import AgentRunProtocol, ApiRunProtocol

if TYPE_CHECKING:
    from colony.agents.run_capability import AgentRunCapability
    from colony.blackboard import Blackboard
    from colony.blackboard.transaction import Transaction
    from colony.config import ColonySettings

log = logging.getLogger("colony.agents.run_capability")

RETIRE_DRAIN_SECONDS = 5.0  # how long closing waits for retirements in flight (then they go on alone)
_LEFT_RUNNING: set[asyncio.Task[None]] = set()  # retirements that outlived their capability's close


class RequestRetention:
    """How long an answered request of an `AgentRunCapability` stays, and how many events one
    request may store; held by the capability as `cap.retention`."""

    def __init__(self, cap: AgentRunCapability, settings: ColonySettings | None) -> None:
        self.cap = cap
        self._settings = settings  # the host's (injected); else the agent's
        self._retention: float | None = None
        self._max_events: int | None = None
        self._retiring: set[asyncio.Task[None]] = set()  # retirements in flight

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
        runs = (self._settings or self.cap._agent().colony_settings()).runs
        self._retention, self._max_events = runs.retention_seconds, runs.max_events_per_run

    async def retire(self, request_id: str) -> None:
        """The request is answered: its claim leaves the open-claims index, and every key it left
        (request, claim, events, result; for an HTTP run its run record too) expires after the
        retention, as do this scope's stream events older than the retention. Idempotent (it
        never extends an expiry but the claim's, which a repeat rewrites), so it also runs after
        late writes. A failure is logged: the request is answered either way.

        The work runs in its own task, shielded from the caller's cancellation: an agent stopped
        just as its run is answered would otherwise cut it between the keys' expiry and the tag
        set's, and the tag set (or keys) would stay for good. `retention.drain` (at close) waits
        for it."""
        task = asyncio.create_task(self._retire_logged(request_id), name=f"retire-{request_id}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        await asyncio.shield(task)

    async def drain(self) -> None:
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
                answers=self.cap._redis_answers,
            )
        except Exception as exc:  # never left for the garbage collector to report (a shielded task)
            log.warning("keys of request %s were not given their retention: %r", request_id, exc)

    async def _retire_once(self, request_id: str) -> None:
        # out of the open-claims index, its expiry in the same write (never left without one);
        # untagged first, so the expiry index needs no member for it (expired while it still
        # carried the open-claims tag, it would need one per run, for the whole retention); then
        # the request's keys, and an HTTP run's record: one round trip for the three
        owner = self.cap.agent.agent_id if self.cap.agent else None
        await self.cap.blackboard.retire_group(
            self.cap.protocol.claim_key(request_id),
            owner,
            created_by=owner,
            ttl_seconds=self.retention_seconds,
            tag=self.cap.protocol.request_tag(request_id),
            trim_events=True,
            elsewhere=self._retired_elsewhere(request_id),
        )

    def retire_with(self, tx: Transaction, request_id: str) -> None:
        """Retire the request with its answer: the claim's rewrite (`_retire_once`'s write) in the
        answer's commit `tx`, so the request leaves the open-claims index exactly when it is
        answered; the expiry of its keys (and an HTTP run's record) right after the commit, in its
        round trip (sent whether the commit applies or not: a commit that does not is followed
        by `retire`, which gives them again). `retired_with` says after the commit whether the
        request's keys were done."""
        owner = self.cap.agent.agent_id if self.cap.agent else None
        ttl = self.retention_seconds
        tx.write(self.cap.protocol.claim_key(request_id), owner, created_by=owner, ttl_seconds=ttl)
        tx.followed_by(
            self.cap.blackboard.retire_calls(
                ttl_seconds=ttl,
                tag=self.cap.protocol.request_tag(request_id),
                trim_events=True,
                elsewhere=self._retired_elsewhere(request_id),
            )
        )

    def retired_with(self, tx: Transaction) -> bool:
        """After `tx` (with `retention.retire_with`) committed: False when the request's group was too large
        to be done in its round trip (`retention.retire` then pages it)."""
        return self.cap.blackboard.group_retired(tx.follower_replies[0])

    def _retired_elsewhere(self, request_id: str) -> list[tuple[Blackboard, list[str]]]:
        """An HTTP run's record, in the API's scope: retired with the request's keys."""
        if self.cap.protocol is not AgentRunProtocol or self.cap.agent is None:
            return []
        meta = self.cap.agent.metadata
        api_board = self.cap.blackboard.scoped(ApiRunProtocol.scope(meta.tenant_id, meta.colony_id))
        return [(api_board, [ApiRunProtocol.run_key(request_id)])]
