"""The pool member's side of `AgentRunCapability` (`cap.pool`): what a member does with the pending
index of its role's run scope (colony.agents.run_claims), how it keeps the role's serving
declaration, and how it announces a run it serves again from the start after the member that
held it ended (docs/scaling.md, Pools)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Literal

from colony.agents.models import RunServing
from colony.agents.run_claims import (
    API_INDEXED_WRITER,
    SAMPLE_PENDING,
    PickedUp,
    claim_oldest_pending,
    claim_value,
    drop_pending,
    pending_requests,
    pending_write,
    publish_serving,
)
from colony.blackboard import TagFilter
from colony.blackboard.connection import redis_url_of, retry_unavailable
from colony.errors import BlackboardError, BlackboardUnavailable, ConcurrentModificationError
from colony.wire.run_events import RESTARTED, STARTED

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from colony.agents.base import Agent
    from colony.agents.run_capability import AgentRunCapability
    from colony.agents.stored_events import StoredEvents
    from colony.blackboard import BlackboardEntry, BlackboardEvent

log = logging.getLogger("colony.agents.run_capability")

CLAIMS_REMEMBERED = 4096  # request events whose claim a member of this process tried, kept (the newest)


class ClaimsInProcess:
    """The request events a pool member of this process took on: it is claiming the request, or
    it tried and Redis decided (claimed it, or found it claimed by someone else). Every idle member
    of a pool sees each request's event; the first member of a process to take one on is the only
    one of that process to try to claim it (by a pick-up, or a create-only claim), so the others'
    attempts (a failed commit and a read each, or a pick-up that finds nothing) are not made. The
    others wait for its outcome: when its attempt raises or is cancelled (a Redis outage it could
    not wait out, the member stopping), or its pick-up took an older request, the next of them
    still free tries. Members of other processes still race for it in Redis,
    which decides. Keyed by the event (its server, scope and stream id), not the request: a request
    written again (re-opened by the pool, or nudged) is a new event, tried again. Bounded: the
    oldest decided events are forgotten (a forgotten one costs one failed claim at most)."""

    def __init__(self, size: int = CLAIMS_REMEMBERED) -> None:
        self._size = size
        # event -> its attempt in flight (resolved True once Redis decided, False when it failed),
        # or None once decided
        self._taken: OrderedDict[str, asyncio.Future[bool] | None] = OrderedDict()

    def take(self, event: str) -> asyncio.Future[bool] | None:
        """None for the member that is to try `event`'s claim now; else the attempt in flight
        (True once decided; False when it failed, so the waiter takes it again), or a future
        already True for an event decided before."""
        if event not in self._taken:
            self._taken[event] = asyncio.get_running_loop().create_future()
            self._forget_oldest()
            return None
        attempt = self._taken[event]
        if attempt is None:
            decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            decided.set_result(True)
            return decided
        return attempt

    def settle(self, event: str, decided: bool) -> None:
        """The attempt at `event`'s claim ended: Redis decided it (`decided`), or it failed before
        it knew, and another member may try."""
        attempt = self._taken.get(event)
        if decided:
            if event in self._taken:
                self._taken[event] = None
        else:
            self._taken.pop(event, None)
        if attempt is not None and not attempt.done():
            attempt.set_result(decided)

    def _forget_oldest(self) -> None:
        """Keep the newest `size` events; one in flight is kept whatever its age."""
        skipped = 0
        while len(self._taken) > self._size and skipped < len(self._taken):
            oldest, attempt = next(iter(self._taken.items()))
            if attempt is not None:
                self._taken.move_to_end(oldest)
                skipped += 1
                continue
            del self._taken[oldest]


CLAIMS_HERE = ClaimsInProcess()
_MARKING: set[asyncio.Task[None]] = set()  # pending markers being written for failed claims


class PoolMember:
    """What makes an `AgentRunCapability` a member of a pool (docs/scaling.md): claiming announced
    requests once per process, picking up pending ones when idle, serving claims a lost pick-up
    took; held by the capability as `cap.pool`."""

    def __init__(self, cap: AgentRunCapability) -> None:
        self.cap = cap

    async def mark_pending(self, request_id: str) -> None:
        """Put a request into the pending index (create-only: once, whichever busy member or
        submitter is first), so the first member to become idle picks it up; it expires with the
        request's keys. A marker this call created for a request an idle member claimed meanwhile
        (the claimer dropped the marker before it existed), or whose request is gone (a submit
        refused or failed half-way took it back), is dropped again here."""
        item = pending_write(
            self.cap.protocol, request_id, self.cap.retention.retention_seconds, self.cap._agent().agent_id
        )
        with contextlib.suppress(ConcurrentModificationError, BlackboardError):
            await self.cap.blackboard.write(**item, expected_version=0)
            claim, request = await self.cap.blackboard.read_many(
                [self.cap.protocol.claim_key(request_id), self.cap.protocol.request_key(request_id)]
            )
            if claim is not None or request is None:
                await self.drop(request_id)

    async def claim_first_here(self, agent: Agent, request_id: str, event: BlackboardEvent) -> str | None:
        """Claim a request announced by `event` (the id of the request claimed, else None), unless
        another member of this process took that event on first (`ClaimsInProcess`): then wait for
        its outcome, and try in its place if its attempt failed or took another request. An
        attempt at a request no submitter indexed that raises (or is cancelled) also marks the
        request pending (in case no member of this process is left to try it), for whichever idle
        member looks next.

        A request its submitter indexed as pending (written by API_INDEXED_WRITER) is taken by a
        pick-up (`pool.take_oldest`): the oldest pending request is claimed and read in one script
        call (the claim's commit and the request's read took two round trips), so one that waited
        goes before the one just announced, and the next waiting member of this process tries too
        (the announced one is still pending). A large index claims the announced request alone.
        So does a pick-up cut off by a Redis outage that claimed nothing: the claims this copy
        holds are looked up first, in this task (waiting the outage out), as the pick-up may have
        claimed one (a pick-up is not sent again: a second one could claim a second request);
        when that look-up fails, the member claims nothing more and the next one tries."""
        claim = f"{redis_url_of(self.cap.blackboard.redis)}\x1f{event.scope_id}\x1f{event.id}"
        indexed = event.created_by == API_INDEXED_WRITER
        while True:
            if self.cap.busy or agent.stored.yielded:  # since it began to wait: the next member tries instead
                if not indexed and not agent.stored.yielded:
                    await self.mark_pending(request_id)
                return None
            attempt = CLAIMS_HERE.take(claim)
            if attempt is None:
                break
            if await asyncio.shield(attempt):
                return None  # decided by the member that tried: claimed, or someone else's
        try:
            taken, direct, unknown = None, not indexed, False
            if indexed:
                try:
                    picked = await self.take_oldest(agent, look_up_held=False)
                except BlackboardUnavailable:
                    held = await self._held_after_a_lost_pick_up()
                    if held is None:  # not known what this copy holds: nothing more, the next tries
                        unknown = True
                    elif not held:  # the pick-up claimed nothing
                        direct = True
                    else:
                        taken = request_id if request_id in held else held[0]
                except BaseException:
                    self._recovering(self.serve_held_claims())
                    raise
                else:
                    direct = picked == SAMPLE_PENDING
                    taken = picked.request_id if isinstance(picked, PickedUp) else None
            if direct:
                taken = request_id if await self.cap._claim(agent, request_id) else None
        except BaseException:  # an error, or this member stopping (its claim may stand or not)
            CLAIMS_HERE.settle(claim, decided=False)
            if not indexed:
                # in a task of its own, which the cancellation of this one does not cut short; a
                # marker for a request that is claimed after all is dropped again by `pool.mark_pending`
                marking = asyncio.create_task(self.mark_pending(request_id), name=f"pending-{request_id}")
                _MARKING.add(marking)
                marking.add_done_callback(_MARKING.discard)
            raise
        CLAIMS_HERE.settle(claim, decided=not unknown and (taken is None or taken == request_id))
        return taken

    async def _held_after_a_lost_pick_up(self) -> list[str] | None:
        """The claims this copy holds after a pick-up whose answer was lost, served (queued); the
        member counts as claiming meanwhile."""
        self.cap._claiming = True
        try:
            return await self.serve_held_claims()
        finally:
            self.cap._claiming = False

    async def drop(self, request_id: str) -> None:
        """The request is claimed: out of the pending index. A marker left behind (Redis away now)
        costs an idle member one failed claim later, which drops it then."""
        with contextlib.suppress(BlackboardError):
            await drop_pending(self.cap.blackboard, self.cap.protocol, request_id)

    async def pick_up(self) -> None:
        """A pool member with nothing to do claims the oldest open unclaimed request, if any (a
        request that came while every member was busy). Never raises: a failure leaves the
        requests pending for the next idle member (and the pool manager's nudge)."""
        agent = self.cap._agent()
        if self.cap.busy or agent.stored.yielded or not self.cap._hosted(agent):
            return
        try:
            taken = await self.take_oldest(agent)
        except Exception as exc:  # e.g. Redis away (`pool.take_oldest` looks for what it may have claimed)
            log.warning("agent %s: pending requests not picked up: %r", agent.agent_id, exc)
            return
        if taken != SAMPLE_PENDING:  # claimed one (queued), or nothing was claimable
            return
        try:  # a large index: sampled, then claimed one request at a time
            for request_id in await pending_requests(
                self.cap.blackboard, self.cap.protocol, written_only=True
            ):
                if self.cap.busy:
                    return
                if await self.cap._claim(agent, request_id):
                    return
                await self.drop(request_id)  # claimed by a member that left its marker
        except Exception as exc:
            log.warning("agent %s: pending requests not picked up: %r", agent.agent_id, exc)

    async def take_oldest(
        self, agent: Agent, *, look_up_held: bool = True
    ) -> PickedUp | Literal["sample"] | None:
        """Claim the oldest pending request whose request is written, and queue it with what the
        same script call read for serving it (`claim_oldest_pending`, whose answer it returns: None
        when nothing was claimable, SAMPLE_PENDING when the index is for the sampling path).
        Raises what the call raised, after starting the look-up of the claims this copy holds
        (the call may have claimed a request all the same), unless the caller does it
        (`look_up_held` False)."""
        # the oldest first, only those whose request is written (an admission reservation's is
        # not yet; a submit that died leaves none, and its marker expires): never claimed
        self.cap._claiming = True
        try:
            picked = await claim_oldest_pending(
                self.cap.blackboard,
                self.cap.protocol,
                claim_value(agent),
                agent.agent_id,
                # nothing of the scope outlives its retention
                receipt_seconds=self.cap.retention.retention_seconds,
            )
        except Exception:
            if look_up_held:
                self._recovering(self.serve_held_claims())
            raise
        finally:
            self.cap._claiming = False
        if isinstance(picked, PickedUp):
            self.cap._picked_up[picked.request_id] = (time.monotonic(), picked)
            self.cap._enqueue(picked.request_id)
        return picked

    def _recovering(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in a task of the capability's own (its `_tasks`: cancelled at close), so the
        member is neither busy nor blocked meanwhile (requests that come are claimed as usual)."""
        task = asyncio.create_task(work, name=f"{self.cap._agent().agent_id}-held-claims")
        self.cap._tasks.append(task)
        task.add_done_callback(lambda done: done in self.cap._tasks and self.cap._tasks.remove(done))

    async def serve_held_claims(self) -> list[str] | None:
        """After a pick-up whose outcome is not known (Redis away, an answer lost): serve every open
        claim this copy holds and does not serve yet (the pick-up claimed it), so none is left held
        by a live member that does not know it; their ids, or None when the look-up failed. It
        does not pick up again itself (a pick-up that keeps failing while Redis answers reads,
        e.g. refusing writes, would loop): what is still pending reaches this member through the
        pool's nudge, or its next pick-up after a run. Waits out an outage; never raises (a
        failure is logged, the claims stay for this copy's next start)."""
        agent = self.cap._agent()
        mine = claim_value(agent)

        async def find() -> list[str]:
            return [
                self.cap.protocol.parse("claim", entry.key)["request_id"]
                async for entry in self.cap._open_claims()
                if entry.value == mine
            ]

        try:
            held = await retry_unavailable(
                find, f"agent {agent.agent_id}: its claims", log, answers=self.cap._redis_answers
            )
        except Exception as exc:
            log.warning("agent %s: claims it holds not looked up: %r", agent.agent_id, exc)
            return None
        held = [request_id for request_id in held if request_id != self.cap.active_request]
        for request_id in held:
            self.cap._enqueue(request_id)
        return held

    async def keep_serving(self, declaration: BlackboardEntry | None) -> None:
        """The role's declaration, read beside each request served: written again (without an
        expiry) when it is missing or carries one, which a copy dropped after its replacement
        started may have put there (see `close`). Best effort."""
        if self.cap.serving == RunServing() or (declaration is not None and declaration.expires_at is None):
            return
        with contextlib.suppress(BlackboardError):
            await publish_serving(
                self.cap.blackboard, self.cap.protocol, self.cap.serving, self.cap._agent().agent_id
            )

    async def announce_rerun(self, request_id: str, stored: StoredEvents) -> None:
        """A request whose run had begun elsewhere (a pool member that ended for good held it, and
        the pool re-opened it) is run again from its start here: what was streamed after its
        `started` event is superseded by one `restarted` event, and the rerun's events carry the
        next attempt. Nothing after `started`: nothing to take back, nothing emitted."""
        started = await self._started_seq(request_id)
        if started is None or stored.last_seq <= started or stored.ended:
            return
        self.cap.events.attempt = stored.attempt + 1
        data = {
            "attempt": self.cap.events.attempt,
            "supersedes_after": started,
            "superseded": stored.last_seq - started,
            "step": 1,
            "reason": "the agent serving this run stopped before it ended; another member of the "
            "pool runs it again from its start",
        }
        try:
            await self.cap.events.emit_marked(RESTARTED, data, during_step=None)
        except BlackboardError as exc:
            log.warning("rerun of request %s not announced: %s", request_id, exc)

    async def _started_seq(self, request_id: str) -> int | None:
        """The sequence number of the request's `started` event (bounded read of its event keys)."""
        tags = TagFilter(all_of=frozenset({self.cap.protocol.request_tag(request_id)}))
        page = await self.cap.blackboard.query(
            self.cap.protocol.event_pattern(request_id),
            tags=tags,
            limit=2 * self.cap.retention.max_events + 10,
        )
        for entry in page.entries:
            identified = self.cap.protocol.identify(entry.key)
            if identified is None or identified[0] != "event":
                continue
            seq, _, kind = identified[1]["event_name"].partition(".")
            if kind == STARTED and seq.isdigit() and len(seq) <= 9:
                return int(seq)
        return None
