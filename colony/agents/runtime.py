"""LocalAgentRuntime: agents as asyncio tasks inside one process.

It starts agents from blueprints, drives their runs, suspends them (persist, then drop the
object) and resumes them (rebuild from the blackboard). Ray Serve replicas (M4) host one each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from colony import security
from colony.agents.base import Agent, build_agent
from colony.agents.blueprint import AgentBlueprint
from colony.agents.ended_state import RINGS, clear_ended_state, retire_state
from colony.agents.models import AgentRun, AgentState, ResumptionCondition, ResumptionKind
from colony.agents.state import checkpoints
from colony.agents.state.persistence import STATE_NAMES
from colony.aio import cancel_and_wait
from colony.blackboard import Blackboard
from colony.blackboard.connection import OutageBackoff, redis_answers, retry_unavailable
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import ColonySettings
from colony.errors import (
    AgentNotFound,
    AgentStateConflict,
    BlackboardError,
    BlackboardUnavailable,
    BlueprintTampered,
    ConcurrentModificationError,
)

log = logging.getLogger(__name__)


def _busy(agent: Agent) -> bool:
    """Running a run: RUNNING, or IDLE/INITIALIZED with a run begun but not yet entered."""
    run = agent.current_run
    pending = run is not None and not run.done
    return agent.state is AgentState.RUNNING or (
        pending and agent.state in (AgentState.IDLE, AgentState.INITIALIZED)
    )


def _running(agent_id: str) -> str:
    return (
        f"agent {agent_id} is running a run; wait for its run to end or suspend it "
        "(POST /v1/agents/{id}/suspend), then undo or restore"
    )


DRIVER_FINISH_SECONDS = 10.0  # an idle agent's driver answering its last request: waited this long
MAX_OUTAGE_REDOS = 3  # a run's step cut short by a Redis outage is redone at most this often
RESTORE_ATTEMPTS = 5  # a restore after an outage failing otherwise than by the outage: tries
RETIRE_TRIES = 4  # a one-shot worker's stop failing after its detach: tried again this often


class LocalAgentRuntime:
    """Hosts agents of one tenant/colony in this process."""

    def __init__(
        self,
        blackboard: Blackboard,
        *,
        settings: ColonySettings,
        tenant_id: str = "default",
        colony_id: str = "default",
        **services: Any,
    ) -> None:
        """`settings`: the process's settings, given by whoever starts it (a replica host, a test);
        they reach its agents and their capabilities as the `settings` service."""
        self.blackboard = blackboard
        self.settings = settings
        security.use_settings(settings)  # the blueprints of the agents it hosts are signed with them
        # injected into capabilities that take them (settings=, engine=, ...)
        self.services: dict[str, Any] = {**services, "settings": settings}
        self.tenant_id = tenant_id
        self.colony_id = colony_id
        self._agents: dict[str, Agent] = {}
        self._drivers: dict[str, asyncio.Task[None]] = {}
        # the host's hook (registry, metrics) when an agent is suspended here
        self.on_suspended: Callable[[str, ResumptionCondition], Awaitable[None]] | None = None
        # ... and when an agent is stopped here (registry)
        self.on_stopped: Callable[[str], Awaitable[None]] | None = None
        # the host's prefetch of what an agent about to run here needs (a page-bound agent's pages;
        # None: nothing to fetch), started when the agent is hosted (spawned or resumed) and awaited
        # by its first driver, so its first step finds them resident while the resume itself does
        # not wait for the load
        self.prefetch: Callable[[Agent], Awaitable[None] | None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._resuming: dict[str, tuple[asyncio.Lock, int]] = {}  # one restore of an agent at a time
        self._outage_redos: dict[str, int] = {}  # run id -> redos after a Redis outage
        self._redo_tasks: dict[str, asyncio.Task[None]] = {}  # agent id -> its restore after an outage
        self._redo_from: dict[str, Agent] = {}  # agent id -> the copy that restore drops

    def get(self, agent_id: str) -> Agent:
        try:
            return self._agents[agent_id]
        except KeyError:
            raise AgentNotFound(
                f"agent {agent_id!r} is not hosted by this runtime (suspended or elsewhere?)"
            ) from None

    @property
    def agent_ids(self) -> list[str]:
        return sorted(self._agents)

    def has(self, agent_id: str) -> bool:
        """Whether the agent is hosted here (`agent_ids` sorts them all: a loop over the agents
        that asked it per agent cost a replica of thousands of agents its heartbeat's CPU)."""
        return agent_id in self._agents

    def runs_waiting(self, agent_id: str) -> int:
        """Runs of a hosted agent that come before anything else it does: requests claimed or
        queued here whose run has not begun (its run capabilities' `runs_waiting`), and a run not
        done while the agent is IDLE or INITIALIZED (restored with a run to carry on, before its
        driver enters it; `begin_run` enters RUNNING at once, and a RUNNING agent holds its pages
        anyway). 0 for an agent not hosted. From memory only: the replica host reads it for every
        agent whenever its engine evicts (`ReplicaPages.needed_soon`), under the engine's lock."""
        agent = self._agents.get(agent_id)
        if agent is None:
            return 0
        waiting = 0
        for capability in agent.capabilities.values():
            count = getattr(capability, "runs_waiting", 0)
            waiting += count if isinstance(count, int) else 0
        run = agent.current_run
        if run is not None and not run.done and agent.state in (AgentState.IDLE, AgentState.INITIALIZED):
            waiting += 1
        return waiting

    async def spawn(self, blueprint: AgentBlueprint) -> Agent:
        """Create, record and start an agent."""
        metadata = blueprint.metadata.model_copy(
            update={"tenant_id": self.tenant_id, "colony_id": self.colony_id}
        )
        blueprint = blueprint.model_copy(update={"metadata": metadata})
        agent = build_agent(blueprint, self.blackboard, **self.services)
        try:  # create-only: refused while any agent of that id is stored
            await agent.initialize(blueprint)
        except ConcurrentModificationError:
            # an ended agent of that id (stopped, failed) gives way to this one, its state and
            # expiries cleared; a live one stands (the refusal goes to the caller). Checked only
            # on a refusal, so a fresh id costs no read of its own
            scopes = [c.blackboard for c in agent.capabilities.values()]
            if not await clear_ended_state(agent.blackboard, scopes):
                raise
            await agent.initialize(blueprint)
        await self._activate(agent)
        return agent

    async def start_run(self, agent_id: str, input_data: Any, *, request_id: str | None = None) -> AgentRun:
        """Begin a run and drive it in the background; `wait_for_run` gets its outcome."""
        agent = self.get(agent_id)
        run = await agent.begin_run(input_data, request_id=request_id)
        self._start_driver(agent)
        return run

    async def wait_for_run(self, agent_id: str, run_id: str, timeout: float | None = None) -> AgentRun:
        """The run once it is done, read from the blackboard (survives suspension and restore, and
        waits out a Redis outage with bounded backoff within `timeout`)."""
        board = self.agent_board(agent_id)
        key = AgentStateProtocol.run_key(run_id)
        subscription = await board.subscribe(key).start()
        outage = OutageBackoff(f"waiting for run {run_id}", log)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        entry = await board.read(key)
                        if entry is not None:
                            run = AgentRun.model_validate(entry.value)
                            if run.done:
                                return run
                        await subscription.next(timeout=1.0)
                        outage.recovered()
                    except BlackboardUnavailable as exc:
                        await outage.wait(exc)
        finally:
            subscription.close()

    async def suspend(
        self, agent_id: str, reason: str = "suspended", condition: ResumptionCondition | None = None
    ) -> None:
        """Persist the agent's state, store when it may resume, mark it SUSPENDED, drop the object.

        `condition` defaults to the agent's own request (e.g. CHILDREN_COMPLETED from a blocked
        action), else IMMEDIATE."""
        agent = self._agents.get(agent_id)
        if agent is None:
            raise AgentNotFound(f"agent {agent_id!r} is not hosted here")
        await self._detach(agent_id)
        await agent.stored.reload()  # the cancelled driver may have changed it without hearing back
        if condition is not None or agent.suspension is None:
            immediate = ResumptionCondition(kind=ResumptionKind.IMMEDIATE)
            await agent.stored.record_suspension(condition or immediate)
        await agent.persist()
        if agent.state is not AgentState.SUSPENDED:
            await agent.transition(AgentState.SUSPENDED, reason)
        log.info("agent %s suspended (%s)", agent_id, reason)
        if self.on_suspended is not None and agent.suspension is not None:
            await self.on_suspended(agent_id, agent.suspension.condition)

    async def resume(self, agent_id: str) -> Agent:
        """Rebuild a suspended (or dropped) agent from the blackboard and carry on where it was."""
        if agent_id in self._agents:
            return self._agents[agent_id]
        lock, users = self._resuming.get(agent_id, (asyncio.Lock(), 0))
        self._resuming[agent_id] = (lock, users + 1)
        try:
            async with lock:  # two resumes at once (a monitor round, a placement) make one copy
                if agent_id in self._agents:
                    return self._agents[agent_id]
                return await self._restore(agent_id)
        finally:  # the lock goes when its last user is done (never while one still waits on it)
            lock, users = self._resuming[agent_id]
            if users <= 1:
                del self._resuming[agent_id]
            else:
                self._resuming[agent_id] = (lock, users - 1)

    async def _restore(self, agent_id: str) -> Agent:
        try:
            agent = await Agent.restore(
                agent_id, self.blackboard, tenant_id=self.tenant_id, colony_id=self.colony_id, **self.services
            )
        except BlueprintTampered:  # refused: it ended FAILED; its state leaves after the retention
            await self._retire_refused(agent_id)
            raise
        if agent.stored.terminated and agent.blueprint is not None:
            return await self.spawn(agent.blueprint)  # it ended for good: a fresh agent takes its id
        if agent.suspension is not None:
            await agent.stored.clear_suspension()
        run_pending = agent.current_run is not None and not agent.current_run.done
        # IDLE (or INITIALIZED) with a run pending: a run's beginning and RUNNING are one commit,
        # but state stored by older code, or re-persisted after Redis lost it (`recover_lifecycle`)
        # just before that commit, can hold it; the run is driven on, not left undriven
        if agent.state in (AgentState.SUSPENDED, AgentState.WAITING) or (
            run_pending
            and agent.state
            in (AgentState.IDLE, AgentState.INITIALIZED, AgentState.LOADED, AgentState.UNLOADED)
        ):
            await agent.transition(AgentState.RUNNING if run_pending else AgentState.IDLE, "resumed")
        await self._activate(agent)
        return agent

    async def restore_checkpoint(
        self, agent_id: str, step: int | None, mode: str = "reexecute", run_id: str | None = None
    ) -> checkpoints.RestoreReport:
        """Undo (`step` None) or restore a checkpoint of an agent of this colony (see
        colony.agents.state.checkpoints). A RUNNING agent is refused (AgentStateConflict): its run must
        end or the agent be suspended first. One hosted here (idle, waiting) is detached, rewritten
        from Redis and hosted again: an unfinished restored run is driven on from the checkpoint
        (the next step re-plans from there). One not hosted here is rewritten only."""
        agent = self._agents.get(agent_id)
        if agent is not None:
            if _busy(agent):
                raise AgentStateConflict(_running(agent_id))
            driver = self._drivers.get(agent_id)
            if driver is not None and not driver.done():  # still answering its last run's request
                await asyncio.wait({driver}, timeout=DRIVER_FINISH_SECONDS)
            await self._detach(agent_id)
            await agent.stored.reload()
            if _busy(agent):  # a run began meanwhile: hosted again as it is, and refused
                await self.resume(agent_id)
                raise AgentStateConflict(_running(agent_id))
        stored = await Agent.restore(
            agent_id, self.blackboard, tenant_id=self.tenant_id, colony_id=self.colony_id, **self.services
        )
        try:
            if agent is None and _busy(stored):
                raise AgentStateConflict(_running(agent_id))
            report = await checkpoints.restore_checkpoint(
                stored, step, mode=mode, run_id=run_id, when="now" if agent is not None else "on_resume"
            )
        finally:
            if agent is not None:
                await self.resume(agent_id)
        if agent is not None:
            hosted = self._agents.get(agent_id)
            report.state = hosted.state.value if hosted is not None else report.state
            if hosted is not None:
                await hosted.emit_run_event("checkpoint_restored", {"step": report.step, "mode": mode})
        return report

    async def drop(self, agent_id: str) -> None:
        """Lose the agent object without any goodbye (as a dying replica would); state stays in Redis."""
        agent = self._agents.get(agent_id)
        await self._detach(agent_id)
        if agent is not None:
            del agent

    async def stop(self, agent_id: str) -> None:
        redo = self._redo_tasks.pop(agent_id, None)
        self._redo_from.pop(agent_id, None)
        if redo is not None:  # stopped while being restored after an outage: not brought back
            await cancel_and_wait([redo])
            if agent_id not in self._agents:
                with contextlib.suppress(AgentNotFound, BlackboardError):
                    await self.resume(agent_id)  # to stop it for good, with its goodbye
        agent = self._agents.get(agent_id)
        if agent is None:
            return
        agent.stopping = True  # closed next, for good (a drop for a restore leaves it False)
        await self._detach(agent_id)
        await self._stopped(agent)

    async def _stopped(self, agent: Agent) -> None:
        """A detached agent's stop for good: its lifecycle, its state's retention, the registry."""
        if not agent.stored.terminated:
            await agent.transition(AgentState.STOPPED, "stopped")
        if agent.stored.terminated:  # stopped (or failed) for good: its state leaves after the retention
            await retire_state(agent)
        if self.on_stopped is not None:
            await self.on_stopped(agent.agent_id)

    async def _retire_refused(self, agent_id: str) -> None:
        """Give a refused (FAILED, never built) agent's state its expiry: its entries, capability
        states, context ring and scope stream. Best effort: the refusal stands either way."""
        ttl = self.settings.runs.retention_seconds
        board = self.agent_board(agent_id)
        try:
            keys = [AgentStateProtocol.key(n) for n in STATE_NAMES]
            pattern = AgentStateProtocol.pattern("capability_state")
            keys += [e.key async for e in board.iter_query(pattern)]
            await board.expire(keys, ttl)
            for ring in RINGS:
                await board.expire_ring(AgentStateProtocol.key(ring), ttl)
            await board.expire_scope(ttl)
        except BlackboardError as exc:
            log.warning("state of refused agent %s not given its retention: %s", agent_id, exc)

    def retire(self, agent_id: str) -> None:
        """Stop an agent from inside itself (a one-shot worker whose job is done): the stop runs
        as its own task, since it cancels the agent's tasks, the caller's included."""
        task = asyncio.create_task(_retire(self, agent_id), name=f"{agent_id}-retire")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def shutdown(self) -> None:
        """Detach every agent (state stays in the blackboard)."""
        await cancel_and_wait(list(self._redo_tasks.values()))
        for agent_id in list(self._agents):
            await self._detach(agent_id)

    async def _activate(self, agent: Agent) -> None:
        self._agents[agent.agent_id] = agent
        agent.host = self
        fetching = self.prefetch(agent) if self.prefetch is not None else None
        if fetching is not None:  # the first driver waits for it (`_start_driver`'s `after`)
            self._drivers[agent.agent_id] = asyncio.create_task(
                self._prefetch(agent, fetching), name=f"{agent.agent_id}-prefetch"
            )
        try:
            await agent.start()
        except BaseException:  # not hosted half-started (no request loop, no handlers): the caller
            await self._detach(agent.agent_id)  # sees the error and may try again
            raise
        run = agent.current_run
        if run is not None and not run.done and agent.state is AgentState.RUNNING:
            self._start_driver(agent)

    @staticmethod
    async def _prefetch(agent: Agent, fetching: Awaitable[None]) -> None:
        """The host's prefetch for the agent; a failure is logged, never the run's (its own step
        faults in what is missing, as without a prefetch)."""
        try:
            await fetching
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning(
                "agent %s: prefetch failed; its first step loads what it needs", agent.agent_id, exc_info=True
            )

    def _start_driver(self, agent: Agent) -> None:
        """Drive the agent's current run. A driver still finishing the previous run (answering its
        request after the run ended), or the prefetch begun when the agent was hosted, is let
        finish first: the new run is never left undriven, and never faults what is being fetched."""
        previous = self._drivers.get(agent.agent_id)
        if previous is asyncio.current_task() or (previous is not None and previous.done()):
            previous = None
        self._drivers[agent.agent_id] = asyncio.create_task(
            self._drive(agent, after=previous), name=f"{agent.agent_id}-driver"
        )

    async def _drive(self, agent: Agent, after: asyncio.Task[None] | None = None) -> None:
        run = None
        try:
            if after is not None:
                await asyncio.wait({after})
            run = agent.current_run  # the run this driver drives (a failure fails this one only)
            await agent.run_until_done()
            if agent.suspension is not None:
                await self.suspend(agent.agent_id, agent.suspension.condition.reason or "blocked")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the run fails, with the reason; the agent goes on serving (IDLE)
            if not self.hosts(agent):
                return  # a copy dropped meanwhile (restored from Redis): the restored one carries on
            run = run or agent.current_run
            if isinstance(exc, BlackboardUnavailable):
                await self.await_redis(agent)  # so that what follows is stored, not lost
                # the run's last save (the run already done in memory) is redone like any other
                if run is not None and self.redo_after_outage(agent, run.run_id, run.steps + 1):
                    return
            log.exception("run of agent %s failed inside the agent", agent.agent_id)
            await agent.fail_run(f"the run failed inside the agent: {type(exc).__name__}: {exc}", run)

    def hosts(self, agent: Agent) -> bool:
        """Whether this very copy of the agent is hosted here (a copy dropped for a restore, or
        replaced by its restored self, is not: it must answer and write nothing more)."""
        return self._agents.get(agent.agent_id) is agent

    def redo_after_outage(self, agent: Agent, key: str, step: int | None = None) -> bool:
        """Work cut short by a Redis outage (killed, restarted, paused) is redone rather than the run
        failed: this copy of the agent, whose memory may be ahead of (or behind) what Redis holds,
        is dropped without a write and the agent restored from its last checkpoint, as after a
        replica death (a step's superseded events are announced by a `restarted` event; a run
        whose beginning was stored is driven on, one whose beginning was not is served again).
        At most `MAX_OUTAGE_REDOS` times per `key` (a run or request id); False when that is spent
        or this runtime does not host the agent (the caller then fails the run, with the reason)."""
        if self._agents.get(agent.agent_id) is not agent:
            return False
        done = self._outage_redos.get(key, 0)
        if done >= MAX_OUTAGE_REDOS:
            return False  # spent (and stays spent: the count is kept, bounded below)
        if len(self._outage_redos) >= 1000:  # bounded: forget the oldest counts
            self._outage_redos.pop(next(iter(self._outage_redos)))
        self._outage_redos[key] = done + 1
        log.warning(
            "agent %s: %s was cut short by a Redis outage; restoring the agent from its last "
            "checkpoint to do it again (redo %d of %d)",
            agent.agent_id,
            f"step {step} of {key}" if step is not None else key,
            done + 1,
            MAX_OUTAGE_REDOS,
        )
        previous = self._redo_tasks.get(agent.agent_id)
        if previous is not None and previous.done():
            previous = None
        if previous is not None and self._redo_from.get(agent.agent_id) is agent:
            return True  # a restore of this very copy is already under way
        # (a restore under way that already hosts its new copy, this one, would leave it as it is:
        # this copy's restore follows that one)
        task = asyncio.create_task(
            self._restore_after_outage(agent.agent_id, after=previous, copy=agent),
            name=f"{agent.agent_id}-redo",
        )
        self._redo_tasks[agent.agent_id], self._redo_from[agent.agent_id] = task, agent
        task.add_done_callback(lambda t, a=agent.agent_id: self._forget_redo(a, t))
        return True

    def _forget_redo(self, agent_id: str, task: asyncio.Task[None]) -> None:
        if self._redo_tasks.get(agent_id) is task:  # not a later restore that followed it
            del self._redo_tasks[agent_id]
            self._redo_from.pop(agent_id, None)

    async def _restore_after_outage(
        self, agent_id: str, after: asyncio.Task[None] | None = None, copy: Agent | None = None
    ) -> None:
        """Drop `copy`, then restore: outages are waited out; any other failure is retried a few
        times (with backoff) before it is logged, as the agent is hosted nowhere until it succeeds.
        `after`: a restore of this agent still under way, which this one follows; once it is done,
        another copy than `copy` hosted (that restore's retry made a fresh one) is left as it is."""
        if after is not None:
            try:
                await asyncio.wait({after})
            except asyncio.CancelledError:  # stopped meanwhile: neither restore brings it back
                after.cancel()
                await asyncio.wait({after})  # unwound before the stop goes on
                raise
            hosted = self._agents.get(agent_id)
            if hosted is not None and hosted is not copy:
                return
        await self.drop(agent_id)  # no goodbye: nothing this copy holds is written
        for attempt in range(1, RESTORE_ATTEMPTS + 1):
            try:
                await retry_unavailable(lambda: self.resume(agent_id), f"restoring agent {agent_id}", log)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "agent %s could not be restored after a Redis outage (attempt %d of %d)",
                    agent_id,
                    attempt,
                    RESTORE_ATTEMPTS,
                )
                await asyncio.sleep(min(0.5 * 2**attempt, 10.0))

    @staticmethod
    async def await_redis(agent: Agent, attempts: int = 60) -> None:
        """Wait (bounded backoff, about two minutes at most) until Redis answers again: a run cut
        short by an outage is then redone or stored failed, never left `running`, and no next run
        begins before it is."""
        outage = OutageBackoff(f"agent {agent.agent_id}: waiting for Redis", log)
        for _ in range(attempts):
            if await redis_answers(agent.blackboard.redis):
                outage.recovered()
                return
            await outage.wait(BlackboardUnavailable("ping", "redis"))

    def driver(self, agent_id: str) -> asyncio.Task[None] | None:
        """The task driving the agent's current run, if one was started here (before its first
        run here: the prefetch that run waits for)."""
        return self._drivers.get(agent_id)

    async def _detach(self, agent_id: str) -> None:
        agent = self._agents.pop(agent_id, None)
        driver = self._drivers.pop(agent_id, None)
        if driver is not None:
            await cancel_and_wait([driver])
        if agent is not None:
            await agent.close()

    def agent_board(self, agent_id: str) -> Blackboard:
        """The blackboard scope of an agent of this runtime's colony (hosted here or not)."""
        from colony.blackboard import BlackboardScope, scope_id

        return self.blackboard.scoped(
            scope_id(
                BlackboardScope.AGENT, tenant_id=self.tenant_id, colony_id=self.colony_id, agent_id=agent_id
            )
        )


async def _retire(runtime: LocalAgentRuntime, agent_id: str) -> None:
    """`stop`, whose end is tried again (RETIRE_TRIES, backing off) when it failed after the
    agent was detached (found by review: a Redis blip there left a worker detached but not
    stopped, which nothing stopped again, and its parent waiting for it for good)."""
    agent = runtime._agents.get(agent_id)
    for attempt in range(RETIRE_TRIES + 1):
        try:
            if agent_id in runtime._agents or agent is None:
                await runtime.stop(agent_id)
            else:
                await runtime._stopped(agent)
            return
        except Exception as exc:
            replaced = agent_id in runtime._agents and runtime._agents[agent_id] is not agent  # (restored)
            if attempt == RETIRE_TRIES or replaced:
                log.warning("agent %s: its stop failed, not tried again: %r", agent_id, exc)
                return
            log.info("agent %s: its stop failed (%r); trying again", agent_id, exc)
            await asyncio.sleep(0.2 * 2**attempt)
