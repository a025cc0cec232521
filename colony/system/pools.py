"""Agent pools: a role whose runs are served by several identical member agents (`RunServing`
mode `pool`, docs/scaling.md), sized by the control plane.

The role's own agent (e.g. `echo`) is the first member and is placed like any agent; the others
are named `<role>.<hex>` (a `.` no user agent name has, so none can collide) and built from the
role's blueprint with their run capability on the role's run scope, where every member sees every
request and the create-only claim gives each to exactly one. The `PoolManager` is the control
loop's `pools` (`ControlPlane.pools`): once per monitor round, for each pool it

1. re-opens the open claims of agents gone for good (their registry record is missing or ended:
   stopped by a shrink, failed; a member whose replica died is re-placed by the monitor and serves
   its claims itself, and a live agent's claim is never re-opened, listed or not): the request goes
   back to the pending index first, then the claim is deleted and the request written again, so an
   idle member claims it and nothing is stranded if a step fails half-way;
2. grows the pool while open unclaimed requests per live member exceed `scale_up_queue_depth`, up
   to `max_size`: the new member goes into the member list first (a versioned write), then it is
   placed through `ControlPlane.place(wait=False)`: only where a replica has room now, never
   waiting for room nor suspending other agents (no room: the next round tries again);
3. stops (`ControlPlane.stop`) members idle for `idle_seconds` (no claim held, and their lifecycle
   state unchanged that long: a run moves it), never the role's own agent nor below `min_size`;
   a member leaves the list only once its stop took effect;
4. nudges requests pending longer than NUDGE_SECONDS (every member was busy, or a member's pick-up
   failed) by writing them again, which wakes the idle members.

The member list lives in Redis (the colony scope's `pools` namespace), so a restarted control
plane knows its members; it is only ever changed by a versioned write (two pool managers, e.g. an
old and a new control plane, never lose each other's changes: the loser skips the round). A member
listed without a registry record is being placed; it counts as gone only after PLACING_SECONDS.
Everything else it reads is the pool's run scope: its tag indexes (open
claims, pending requests), never a keyspace SCAN.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from colony import metrics
from colony.agents import AgentBlueprint, AgentRunCapability
from colony.agents.blueprint import Blueprint, CapabilitySpec, serving_of
from colony.agents.models import RunServing
from colony.agents.run_claims import count_tag, pending_key, pending_requests, pending_tag
from colony.blackboard import (
    AgentRunProtocol,
    Blackboard,
    BlackboardEntry,
    BlackboardScope,
    TagFilter,
    scope_id,
)
from colony.blackboard.connection import OutageBackoff
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import BlackboardUnavailable, ColonyError, ConcurrentModificationError, ResourceExhausted
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.registry import DONE_STATES, AgentRecord

if TYPE_CHECKING:
    from colony.system.control import ControlPlane

log = logging.getLogger(__name__)

POOLS_NAMESPACE = "pools"
NUDGE_SECONDS = 2.0  # a request pending this long while a member is idle is written again
NUDGE_PAGE = 64  # oldest pending markers one nudge round looks at (reservations passed over)
PLACING_SECONDS = 60.0  # a listed member with no registry record this long was never placed
OPEN_CLAIMS_READ = 1000  # open claims one round reads per pool (members x their queue: far fewer)


def member_blueprint(blueprint: AgentBlueprint, member_id: str) -> AgentBlueprint:
    """The role's blueprint for another member: its own id, its run capability on the role's run
    scope (scope_id = the role's agent id)."""
    role = blueprint.metadata.agent_id
    capabilities: list[Blueprint[Any] | CapabilitySpec] = []
    for spec in blueprint.capabilities:
        inner = spec.blueprint if isinstance(spec, CapabilitySpec) else spec
        if isinstance(inner.cls, type) and issubclass(inner.cls, AgentRunCapability):
            inner = Blueprint(inner.cls, {**inner.kwargs, "scope_id": role})
            spec = spec.model_copy(update={"blueprint": inner}) if isinstance(spec, CapabilitySpec) else inner
        capabilities.append(spec)
    metadata = blueprint.metadata.model_copy(update={"agent_id": member_id, "parent_id": role})
    return blueprint.model_copy(update={"metadata": metadata, "capabilities": capabilities})


def new_member_id(role: str) -> str:
    return f"{role}.{secrets.token_hex(4)}"


def pool_blueprints(blueprints: Mapping[str, AgentBlueprint]) -> dict[str, AgentBlueprint]:
    """The pools among the colony's agents (`serving.mode == "pool"`)."""
    return {name: bp for name, bp in blueprints.items() if serving_of(bp).is_pool}


class PoolState:
    """What the manager remembers of one pool between rounds (last nudges)."""

    def __init__(self) -> None:
        self.nudged: dict[str, float] = {}  # request -> when it was last written again


class PoolManager:
    """Sizes the agent pools once per control-loop round (`tick`); see the module docstring."""

    def __init__(self, control: ControlPlane, blueprints: Mapping[str, AgentBlueprint]) -> None:
        self.control = control
        self.pools = pool_blueprints(blueprints)
        settings = control.settings
        self.ids = {"tenant_id": settings.tenant_id, "colony_id": settings.colony_id}
        self.board: Blackboard = control.blackboard.scoped(
            scope_id(BlackboardScope.COLONY, namespace=POOLS_NAMESPACE, **self.ids)
        )
        self.retention = settings.runs.retention_seconds
        self._state = {name: PoolState() for name in self.pools}
        self._outage = OutageBackoff("pool manager", log)

    def run_board(self, role: str) -> Blackboard:
        agent_scope = scope_id(BlackboardScope.AGENT, agent_id=role, **self.ids)
        return self.control.blackboard.scoped(AgentRunProtocol.namespaced_scope(agent_scope, RUNS_NAMESPACE))

    async def members(self, role: str) -> list[str]:
        """The pool's members, the role's own agent first."""
        return [role, *(await self._listed(role))[0]]

    async def _listed(self, role: str) -> tuple[dict[str, float], int]:
        """The stored member list (member -> when it was listed) and its version (0: none yet).
        Untrusted content: anything but member ids of this role is ignored."""
        entry = await self.board.read(f"members:{role}")
        if entry is None:
            return {}, 0
        value = entry.value
        if isinstance(value, list):  # the earlier format: ids only
            value = {m: 0.0 for m in value if isinstance(m, str)}
        listed: dict[str, float] = {}
        if isinstance(value, dict):
            for member, at in value.items():
                if isinstance(member, str) and member.startswith(f"{role}.") and isinstance(at, int | float):
                    listed[member] = float(at)
        return listed, entry.version

    async def _save(self, role: str, members: dict[str, float], version: int) -> int:
        """Write the member list over the version read (ConcurrentModificationError when another
        manager changed it meanwhile); the new version."""
        written = await self.board.write(
            f"members:{role}",
            {m: at for m, at in members.items() if m != role},
            created_by="control",
            expected_version=version,
        )
        return written.version

    async def tick(self) -> None:
        """One sizing round over every pool; a pool whose round fails is logged, the others go on."""
        for role, blueprint in self.pools.items():
            try:
                await self.size(role, blueprint)
                self._outage.recovered()
            except BlackboardUnavailable as exc:
                self._outage.note(exc)
                return
            except Exception:
                log.exception("sizing round of pool %s failed", role)

    async def size(self, role: str, blueprint: AgentBlueprint) -> None:
        serving = serving_of(blueprint)
        state = self._state.setdefault(role, PoolState())
        now = time.time()
        listed, version = await self._listed(role)
        records: dict[str, AgentRecord | None] = {role: await self.control.registry.get(role)}
        for member in listed:
            records[member] = await self.control.registry.get(member)
        if records[role] is None:
            return  # the role's agent is not placed yet (ensure_builtins places it)
        gone = {
            m
            for m, at in listed.items()
            if (records[m] is None and now - at > PLACING_SECONDS)
            or (records[m] is not None and records[m].state in DONE_STATES)  # type: ignore[union-attr]
        }
        board = self.run_board(role)
        claimants = await self._open_claimants(board)
        placing = {m for m, at in listed.items() if records[m] is None and now - at <= PLACING_SECONDS}
        await self._reopen(board, await self._claims_of_ended(claimants, records, placing))
        pool = {m: at for m, at in listed.items() if m not in gone}
        try:
            if gone:
                version = await self._save(role, pool, version)
            pending = await count_tag(board, pending_tag(AgentRunProtocol))
            pool, version = await self._grow(role, blueprint, serving, pool, version, pending)
            live = [role, *pool]
            busy = set(claimants.values())
            if pending == 0:
                live = await self._shrink(role, serving, pool, version, busy, now)
            else:
                await self._nudge(board, live, busy, state)
        except ConcurrentModificationError:
            log.info("pool %s: its member list changed meanwhile (another pool manager); next round", role)
            return
        metrics.POOL_MEMBERS.labels(role).set(len(live))

    async def _claims_of_ended(
        self, claimants: dict[str, str], records: dict[str, AgentRecord | None], placing: set[str]
    ) -> set[str]:
        """The open claims whose claimant has ended for good: its registry record is missing or in
        a done state. Whether it is listed as a member does not matter: a live agent (even one the
        list lost) is serving its claims, and re-opening them would run them twice. A member still
        being placed (`placing`: listed, no record yet, for less than PLACING_SECONDS) may already
        serve what it claimed: its claims wait until it has a record or counts as gone."""
        ended: set[str] = set()
        known = dict(records)
        for request_id, who in claimants.items():
            if who in placing:
                continue
            if who not in known:
                known[who] = await self.control.registry.get(who)
            record = known[who]
            if record is None or record.state in DONE_STATES:
                ended.add(request_id)
        return ended

    async def _open_claimants(self, board: Blackboard) -> dict[str, str]:
        """Open (unanswered) claims of the pool's run scope: request id -> the member holding it."""
        tags = TagFilter(all_of=frozenset({AgentRunProtocol.open_claims_tag()}))
        page = await board.query(AgentRunProtocol.pattern("claim"), tags=tags, limit=OPEN_CLAIMS_READ)
        held: dict[str, str] = {}
        for entry in page.entries:
            value = entry.value
            who = value.get("agent_id") if isinstance(value, dict) else value
            if isinstance(who, str):
                held[AgentRunProtocol.parse("claim", entry.key)["request_id"]] = who
        return held

    async def _reopen(self, board: Blackboard, request_ids: set[str]) -> None:
        """Requests claimed by agents gone for good: answered ones just leave the open index; the
        others are claimable again (pending marker first, then the claim deleted, then the request
        written again so the idle members hear of it: a failure between the steps leaves the
        request pending or still claimed by the gone agent, which the next round re-opens, never
        neither). The member that claims it serves it from the start, after its stored events
        (their numbering goes on; a `restarted` event supersedes what the gone member streamed)."""
        for request_id in request_ids:
            claim_key = AgentRunProtocol.claim_key(request_id)
            claim, result = await board.read_many([claim_key, AgentRunProtocol.result_key(request_id)])
            if claim is None:
                continue
            if result is not None:  # answered, not retired: out of the open index, with its expiry
                await board.write(claim_key, claim.value, created_by="control", ttl_seconds=self.retention)
                continue
            request = await board.read(AgentRunProtocol.request_key(request_id))
            if request is not None:
                await board.write(**self._marker(request))  # pending before the claim goes
            try:
                await board.delete(claim_key, expected_version=claim.version)
            except ConcurrentModificationError:
                continue  # rewritten meanwhile (answered, retired): not ours to re-open
            if request is None:
                continue  # gone (expired): nothing to serve
            log.info("request %s re-opened: the pool member holding it is gone", request_id)
            await self._requeue(board, request_id)

    @staticmethod
    def _marker(request: BlackboardEntry) -> dict[str, Any]:
        """The pending marker of a stored request, as a `write` call (the request's expiry)."""
        request_id = AgentRunProtocol.parse("request", request.key)["request_id"]
        ttl = None if request.expires_at is None else max(1.0, request.expires_at - time.time())
        return {
            "key": pending_key(AgentRunProtocol, request_id),
            "value": {"request_id": request_id, "at": time.time()},
            "tags": [pending_tag(AgentRunProtocol), AgentRunProtocol.request_tag(request_id)],
            "created_by": "control",
            "ttl_seconds": ttl,
        }

    async def _requeue(self, board: Blackboard, request_id: str) -> None:
        """Put a request back in the pending index and write it again (same value, tags and expiry),
        which delivers a request event to every member: an idle one claims it."""
        request = await board.read(AgentRunProtocol.request_key(request_id))
        if request is None:
            return
        ttl = None if request.expires_at is None else max(1.0, request.expires_at - time.time())
        writes: list[dict[str, Any]] = [
            self._marker(request),
            {
                "key": request.key,
                "value": request.value,
                "tags": list(request.tags),
                "created_by": request.created_by,
                "ttl_seconds": ttl,
            },
        ]
        await board.write_many(writes)

    async def _grow(
        self,
        role: str,
        blueprint: AgentBlueprint,
        serving: RunServing,
        pool: dict[str, float],
        version: int,
        pending: int,
    ) -> tuple[dict[str, float], int]:
        """Add members up to `min_size`, and while open unclaimed requests per live member exceed
        the threshold (up to `max_size`). Each new member is listed (versioned write) before it is
        placed, so a placed member is never missing from the list; placed with `wait=False`: only
        where there is room now (no wait under the placement lock, no agent suspended for it)."""
        size = len(pool) + 1  # the role's agent too
        deep = pending / size > serving.scale_up_queue_depth
        wanted = min(serving.max_size, math.ceil(pending / serving.scale_up_queue_depth)) if deep else 0
        wanted = max(wanted, serving.min_size)
        members = dict(pool)
        for _ in range(wanted - size):
            if len(members) + 1 >= serving.max_size:
                break
            member = new_member_id(role)
            members[member] = time.time()
            version = await self._save(role, members, version)
            try:
                await self.control.place(member_blueprint(blueprint, member), wait=False)
            except ResourceExhausted as exc:  # no room now: unlisted again, the next round tries
                log.info("pool %s did not grow: %s", role, exc)
                members.pop(member)
                version = await self._save(role, members, version)
                break
            except ColonyError as exc:  # e.g. a replica away mid-call: listed; if never placed, it
                log.info("pool %s did not grow: %s", role, exc)  # goes after PLACING_SECONDS
                break
            metrics.POOL_RESIZES.labels("grow").inc()
            log.info("pool %s grew to %d members (%d requests waiting)", role, len(members) + 1, pending)
        return members, version

    async def _idle_since(self, member: str) -> float | None:
        """When the member's lifecycle state last changed while it is idle (a run moves it to
        running and back), None while it is not idle (running, waiting, suspended, unknown)."""
        agent_scope = scope_id(BlackboardScope.AGENT, agent_id=member, **self.ids)
        entry = await self.control.blackboard.scoped(agent_scope).read(AgentStateProtocol.key("lifecycle"))
        value = entry.value if entry is not None and isinstance(entry.value, dict) else {}
        if entry is None or value.get("state") != "idle":
            return None
        return entry.updated_at

    async def _shrink(
        self, role: str, serving: RunServing, pool: dict[str, float], version: int, busy: set[str], now: float
    ) -> list[str]:
        """Stop members idle for `idle_seconds` (never the role's agent, never below min_size); a
        member leaves the list only once its stop took effect (`ControlPlane.stop` said so)."""
        members = dict(pool)
        idle: list[tuple[float, str]] = []
        for member in pool:
            if member == role or member in busy:
                continue
            since = await self._idle_since(member)
            if since is not None and now - since >= serving.idle_seconds:
                idle.append((since, member))
        for _, member in sorted(idle):
            if len(members) + 1 <= serving.min_size:
                break
            try:
                stopped = await self.control.stop(member)
            except ColonyError as exc:
                log.info("pool %s: member %s not stopped: %s", role, member, exc)
                continue
            if not stopped:  # not where its record said (moving, suspended): listed still
                log.info("pool %s: member %s not stopped (not on its replica now)", role, member)
                continue
            await self._keep_streams(role)
            members.pop(member)
            version = await self._save(role, members, version)
            metrics.POOL_RESIZES.labels("shrink").inc()
            log.info("pool %s shrank to %d members (%s idle)", role, len(members) + 1, member)
        return [role, *members]

    async def _keep_streams(self, role: str) -> None:
        """A stopped member gives its scopes' event streams the retention expiry (retire_state),
        its run capability's scope included: that is the pool's shared one, which lives on."""
        board = self.run_board(role)
        async with board.guard("keep pool streams"):
            await board.redis.persist(board.keyspace.events_key)
            await board.redis.persist(board.keyspace.expiry_key)

    async def _nudge(self, board: Blackboard, live: list[str], busy: set[str], state: PoolState) -> None:
        """Requests pending for NUDGE_SECONDS while a member is idle are written again; a pending
        marker whose request is claimed already (its claimer did not drop it) is dropped."""
        if all(member in busy for member in live):
            return
        now = time.time()
        candidates = await pending_requests(board, AgentRunProtocol, limit=NUDGE_PAGE)
        keys = [
            key
            for request_id in candidates
            for key in (
                pending_key(AgentRunProtocol, request_id),
                AgentRunProtocol.claim_key(request_id),
                AgentRunProtocol.request_key(request_id),
            )
        ]
        entries = await board.read_many(keys)  # one round trip for the page
        nudged = 0
        for n, request_id in enumerate(candidates):
            marker, claim, request = entries[3 * n : 3 * n + 3]
            if marker is None or now - marker.created_at < NUDGE_SECONDS:
                continue
            if claim is not None:
                await board.delete(marker.key)
                continue
            if request is None:  # a reservation whose request is not written yet (or a submit that
                continue  # died: it expires): passed over, not in the way of the requests behind it
            if now - state.nudged.get(request_id, 0.0) < NUDGE_SECONDS:
                continue
            state.nudged[request_id] = now
            if len(state.nudged) > 10_000:
                state.nudged.pop(next(iter(state.nudged)))
            await self._requeue(board, request_id)
            nudged += 1
            if nudged >= len(live):  # one per member a round
                return
