"""The control plane: where agents are placed, stopped, suspended and resumed (and taken back to a
checkpoint: `undo`, `restore`), and the resource monitor loop that resumes suspended agents and
re-places those of dead replicas.

It runs inside the `AgentSystem` Serve deployment over `ServeReplicas`, and in-process over
`LocalReplicas` (tests, one-process tools). Everything it knows is read from Redis or asked of
the replicas, so a restarted control plane picks up where the last one was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from colony import metrics, security
from colony.agents import Agent, AgentBlueprint
from colony.agents.state.checkpoints import MODES, pick, read_checkpoints, restore_checkpoint
from colony.agents.state.persistence import LIFECYCLE
from colony.aio import cancel_and_wait
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.connection import OutageBackoff
from colony.config import ColonySettings
from colony.errors import (
    AgentNotFound,
    AgentStateConflict,
    BlackboardUnavailable,
    InvalidArgument,
    ReplicaUnavailable,
)
from colony.system.agent_purge import purge_agent
from colony.system.monitor import ResumptionMonitor
from colony.system.placement import AgentPlacer, Placement
from colony.system.registry import NOT_HOSTED, AgentRecord, AgentRegistry
from colony.system.removal import SessionSweeper
from colony.system.replicas import ReplicaDirectory, as_directory
from colony.vcm import PageTable
from colony.wire.tenants import NOBODY, local_name, tenant_of

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost

log = logging.getLogger(__name__)


REWIND_REASON = "restoring a checkpoint"


def _busy_message(agent_id: str) -> str:
    return (
        f"agent {agent_id!r} is running a run; wait for its run to end or suspend it "
        "(POST /v1/agents/{id}/suspend), then undo or restore"
    )


async def _lifecycle(board: Blackboard) -> str | None:
    """The agent's lifecycle state from its own scope (the source of truth, not the registry)."""
    entry = await board.read(LIFECYCLE)
    value = entry.value if entry is not None and isinstance(entry.value, dict) else {}
    state = value.get("state")
    return state if isinstance(state, str) else None


async def _previous_state(board: Blackboard) -> str | None:
    """The state the agent left when it was last moved (after a suspension: what it was doing)."""
    entry = await board.read(LIFECYCLE)
    value = entry.value if entry is not None and isinstance(entry.value, dict) else {}
    previous = value.get("previous")
    return previous if isinstance(previous, str) else None


class PoolTicker(Protocol):
    """What the control loop calls once per round to size agent pools (colony.system.pools)."""

    async def tick(self) -> None: ...


class ControlPlane:
    def __init__(
        self,
        blackboard: Blackboard,
        replicas: Mapping[str, ReplicaHost] | ReplicaDirectory,
        settings: ColonySettings,
    ) -> None:
        self.settings = settings
        security.use_settings(settings)  # blueprints it places and reads are signed with its secret
        self.blackboard = blackboard
        self.directory = as_directory(replicas)
        colony_scope = scope_id(
            BlackboardScope.COLONY, tenant_id=settings.tenant_id, colony_id=settings.colony_id
        )
        self.registry = AgentRegistry(blackboard.scoped(colony_scope), settings=settings)
        self.pages = PageTable(blackboard, settings=settings)
        serve = settings.serve
        self.placer = AgentPlacer(
            self.directory,
            max_agents_per_replica=serve.max_agents_per_replica,
            memory_per_replica_mb=serve.replica_memory_mb,
            retry_seconds=serve.placement_retry_seconds,
        )
        lock = self.placer.lock  # placements and resumptions never interleave
        self.monitor = ResumptionMonitor(
            blackboard,
            self.directory,
            self.registry,
            page_table=self.pages,
            max_agents_per_replica=serve.max_agents_per_replica,
            memory_per_replica_mb=serve.replica_memory_mb,
            period=serve.monitor_period_seconds,
            tenant_id=settings.tenant_id,
            colony_id=settings.colony_id,
            lock=lock,
        )
        self.sessions = SessionSweeper(
            blackboard, self.registry, tenant_id=settings.tenant_id, colony_id=settings.colony_id
        )
        self._loop: asyncio.Task[None] | None = None
        # the agent pools' sizing round (colony.system.pools), run after each monitor round
        self.pools: PoolTicker | None = None

    async def place(self, blueprint: AgentBlueprint | str, *, wait: bool = True) -> Placement | AgentRecord:
        """Host an agent: where it already runs (its record), else through the placement cascade
        (a known but suspended or orphaned agent resumes with its state). `wait=False`: only where
        there is room now, without waiting for room and without suspending other agents
        (ResourceExhausted at once when no replica has room): for a caller that can try again
        later (a pool growing) and must not hold the lock explicit resumes and rounds wait on."""
        bp = AgentBlueprint.from_text(blueprint) if isinstance(blueprint, str) else blueprint
        # checked under the lock the monitor's rounds hold: a round that is re-placing this very
        # agent (its replica died) finishes first, and this call then finds it hosted rather than
        # starting a second copy of it on another replica
        async with self.placer.lock:
            record = await self.registry.get(bp.metadata.agent_id)
            if record is not None and record.replica and record.state not in NOT_HOSTED:
                live = {port.replica_id for port in await self.directory.ports()}
                # a replica whose heartbeat lapsed but whose process lives still hosts it (found by
                # review: placed again, the agent ran twice): gone only as the monitor judges
                if record.replica in live or not await self.monitor.gone([record.replica]):
                    return record
            try:
                return await self.placer.place_locked(bp, wait=wait)
            finally:  # the monitor's views lack this placement (and any suspension it made room with)
                self.monitor.invalidate()

    async def place_instance(self, name: str, agent_id: str) -> AgentRecord:
        """Host another tenant's own instance `agent_id` of catalog agent `name` (made on first use,
        colony.system.catalog.tenant_blueprint); its record. AgentNotFound for a name that is not
        in the catalog, or an id that is not of another tenant."""
        from colony.system.catalog import tenant_blueprint  # here: the catalog imports the agents

        home = self.settings.tenant_id
        if tenant_of(agent_id, home) in (home, NOBODY) or local_name(agent_id, home) != name:
            raise AgentNotFound(f"{agent_id!r} is no tenant's instance of catalog agent {name!r}")
        try:
            blueprint = tenant_blueprint(self.settings, name, agent_id)
        except KeyError:
            raise AgentNotFound(
                f"no catalog agent named {name!r}; GET /v1/agents/catalog lists them"
            ) from None
        placed = await self.place(blueprint)
        return placed if isinstance(placed, AgentRecord) else await self._hosted(agent_id)

    async def _hosted(self, agent_id: str) -> AgentRecord:
        record = await self.registry.get(agent_id)
        if record is None:
            raise AgentNotFound(f"no agent named {agent_id!r}; GET /v1/agents lists them")
        return record

    async def stop(self, agent_id: str) -> bool:
        record = await self._hosted(agent_id)
        if record.replica is None:
            return False
        return await self.directory.port(record.replica).stop_agent(agent_id)

    async def suspend(self, agent_id: str, reason: str = "request") -> AgentRecord:
        """Suspend an agent until `resume()` (a CUSTOM condition)."""
        record = await self._hosted(agent_id)
        if record.state == "suspended":
            return record
        if record.state in NOT_HOSTED or record.replica is None:
            raise AgentStateConflict(
                f"agent {agent_id!r} is {record.state}; only a hosted agent can be suspended"
            )
        if not await self.directory.port(record.replica).suspend_agent(agent_id, reason, None):
            raise AgentStateConflict(
                f"agent {agent_id!r} is not on replica {record.replica} any more; try again"
            )
        self.monitor.note_left(record.replica, agent_id)
        return await self._hosted(agent_id)

    async def resume(self, agent_id: str) -> AgentRecord:
        """Resume a suspended agent now (meets a CUSTOM condition, or any other one early): one
        placement decision and the resume on the chosen replica, not a whole monitor round
        (`ResumptionMonitor.resume_now`). With no room anywhere, room is made on demand: an idle
        session agent, or an idle agent of a lower priority, is suspended (`AgentPlacer.victims`).
        When none can be (every agent busy or more important) it stays suspended, its request
        noted: the monitor resumes it when room appears (the record says `suspended` meanwhile)."""

        async def make_room(priority: int, exclude: list[str]) -> str:
            suspended = await self.placer.make_room_locked(priority, exclude=exclude)
            self.monitor.invalidate()
            return suspended

        resumed = await self.monitor.resume_now(agent_id, make_room=make_room)
        return resumed if resumed is not None else await self._hosted(agent_id)

    async def delete(self, agent_id: str) -> int:
        """Remove an agent for good (`DELETE /v1/sessions/{id}`): stopped where it is hosted (a run
        in progress ends with it), then every key of its scopes and its blocks deleted
        (`agent_purge.purge_agent`), its registry record last; the number of keys deleted.
        AgentNotFound for an agent the registry does not know (a second delete). Under the
        placement lock: no placement, resume or monitor round brings it back meanwhile."""
        async with self.placer.lock:
            record = await self._hosted(agent_id)
            if record.replica is not None and record.state not in NOT_HOSTED:
                with contextlib.suppress(ReplicaUnavailable):  # its replica is gone: nothing hosts it
                    await self.directory.port(record.replica).stop_agent(agent_id)
            purged = await purge_agent(self.blackboard, agent_id, settings=self.settings)
            deleted = purged.count
            await self.registry.remove(agent_id)
            self.monitor.forget(agent_id)
            self.monitor.invalidate()
        metrics.AGENTS_DELETED.inc()
        log.info("agent %s deleted (%d keys)", agent_id, deleted)
        return deleted

    async def sweep_sessions(self) -> list[str]:
        """Delete the session agents idle longer than `context.session_idle_retention_seconds`
        (`SessionSweeper`; at most a batch a sweep, every few minutes); the ids deleted."""
        retention = self.settings.context.session_idle_retention_seconds
        if not self.sessions.due(retention):
            return []
        gone = []
        for agent_id in await self.sessions.expired(retention):
            try:
                await self.delete(agent_id)
            except AgentNotFound:
                continue  # deleted meanwhile
            gone.append(agent_id)
        if gone:
            log.info("%d idle sessions deleted (idle past the retention)", len(gone))
        return gone

    async def undo(self, agent_id: str) -> dict[str, Any]:
        """Bring an agent back to the checkpoint before its newest (see `restore`)."""
        return await self.restore(agent_id, None)

    async def restore(
        self, agent_id: str, step: int | None, mode: str = "reexecute", run_id: str | None = None
    ) -> dict[str, Any]:
        """Bring an agent back to a kept checkpoint (colony.agents.state.checkpoints); `step` None: undo.

        A RUNNING agent is refused (409: wait for its run to end or suspend it). A hosted one
        (idle, waiting) is suspended through its replica, rewritten from Redis here (an agent object
        no host runs: set, persisted, fenced as always) and resumed by the monitor, which drives an
        unfinished restored run on from the checkpoint; a suspended one is rewritten only and stays
        suspended. The report (`RestoreReport`) lists what the discarded steps did that is not
        undone, and the agent's registry record after it."""
        if mode not in MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        record = await self._hosted(agent_id)
        board = self.blackboard.scoped(
            scope_id(
                BlackboardScope.AGENT,
                tenant_id=self.settings.tenant_id,
                colony_id=self.settings.colony_id,
                agent_id=agent_id,
            )
        )
        state = await _lifecycle(board)
        if state == "running":
            raise AgentStateConflict(_busy_message(agent_id))
        if state is None or state in ("stopped", "failed"):
            raise AgentStateConflict(
                f"agent {agent_id!r} is {state or 'not stored'}; only an agent that is idle, waiting or "
                "suspended can go back to a checkpoint"
            )
        kept = [c for c, _ in await read_checkpoints(board)]
        pick(kept, agent_id, step, run_id)  # no such checkpoint: refused before anything moves
        hosted = state != "suspended" and record.replica is not None
        if hosted:
            assert record.replica is not None
            if not await self.directory.port(record.replica).suspend_agent(agent_id, REWIND_REASON, None):
                raise AgentStateConflict(
                    f"agent {agent_id!r} is not on replica {record.replica} any more; try again"
                )
        try:
            if hosted and await _previous_state(board) == "running":  # a run began meanwhile
                raise AgentStateConflict(_busy_message(agent_id))
            agent = await Agent.restore(
                agent_id,
                self.blackboard,
                tenant_id=self.settings.tenant_id,
                colony_id=self.settings.colony_id,
                settings=self.settings,
            )
            agent.settings = self.settings
            report = await restore_checkpoint(
                agent, step, mode=mode, run_id=run_id, when="now" if hosted else "on_resume"
            )
        finally:
            if hosted:  # hosted again whatever happened (the monitor places it)
                self.monitor.request_resume(agent_id)
                await self.monitor.tick()
        after = await self._hosted(agent_id)
        return {
            **report.model_dump(mode="json"),
            "state": after.state,
            "record": after.model_dump(mode="json"),
        }

    async def publish(self) -> None:
        """This process's metrics for the API's /metrics (at most once per heartbeat period)."""
        await self.registry.publish(metrics.published_counters(), "control")

    def start(self) -> None:
        """Start the resource monitor loop (idempotent)."""
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._run(), name="resource-monitor")

    async def _run(self) -> None:
        """The `_resource_monitor_loop`: a monitor round (resumptions, dead replicas), a pool round
        (sizes, re-opened claims, nudged requests) and a counter publication every
        `serve.monitor_period_seconds`. Each goes on when another fails: a monitor round that
        keeps failing must not leave the pools' waiting requests unnudged."""
        outage = OutageBackoff("resource monitor", log)
        while True:
            failed = False
            for name, step in self._rounds():
                try:
                    await step()
                except BlackboardUnavailable as exc:  # logged once per outage; the next round retries
                    outage.note(exc)
                    failed = True
                except Exception:
                    log.exception("resource monitor: the %s round failed", name)
            if not failed:
                outage.recovered()
            await asyncio.sleep(self.monitor.period)

    def _rounds(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        rounds: list[tuple[str, Callable[[], Awaitable[None]]]] = [("monitor", self.monitor.tick)]
        if self.pools is not None:
            rounds.append(("pool", self.pools.tick))
        return [*rounds, ("sessions", self.sweep_sessions), ("metrics", self.publish)]

    async def close(self) -> None:
        if self._loop is not None:
            await cancel_and_wait([self._loop])
