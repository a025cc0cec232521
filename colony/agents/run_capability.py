"""AgentRunCapability: an agent serves AgentRunProtocol requests (runs submitted over the API
or by AgentHandle), one at a time, and answers each with a result and a terminal event; a run
that fails inside the agent, or an outage of Redis, never stops it serving the next one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from colony.agents.blueprint import serving_of
from colony.agents.capability import AgentCapability, CapabilityMode
from colony.agents.events import event_handler
from colony.agents.hooks import HookContext, HookType, Pointcut
from colony.agents.models import AgentRun, RunServing, RunStatus
from colony.agents.run_claims import (
    API_INDEXED_WRITER,
    PickedUp,
    claim_value,
    pending_key,
    publish_serving,
    retire_serving,
    scope_at_start,
    serving_key,
)
from colony.agents.run_counting import RunCounting
from colony.agents.run_event_writer import RunEventWriter
from colony.agents.run_pool import PoolMember
from colony.agents.run_retention import RequestRetention
from colony.agents.step_spans import StepSpans
from colony.agents.stored_events import StoredEvents
from colony.blackboard import (
    Blackboard,
    BlackboardEntry,
    BlackboardEvent,
    BlackboardScope,
    TagFilter,
)
from colony.blackboard.connection import OutageBackoff, redis_answers, retry_unavailable
from colony.blackboard.protocol import AgentRunProtocol, RequestResultProtocol
from colony.config import ColonySettings
from colony.errors import (
    AgentUsageError,
    BlackboardError,
    BlackboardUnavailable,
    ConcurrentModificationError,
)
from colony.wire.run_events import STARTED, terminal_event

if TYPE_CHECKING:
    from colony.agents.base import Agent

log = logging.getLogger(__name__)

TRIES_WHILE_UP = 3  # a blackboard error while Redis answers is retried this often before it fails a run


PICKED_UP_FRESH_SECONDS = 0.5  # a pick-up's read older than this (the member was held up) is read again


class AgentRunCapability(AgentCapability):
    """Serves AgentHandle requests of one namespace: runs the agent, streams events, writes the result.

    Nothing about the requests is held only in memory. A request is claimed (create-only
    `claim:...`) before it is queued; the run serving it carries its `request_id`; events are
    numbered from what is already stored. So after a restart `start()` finds every claimed
    request without a result, adopts the one the restored run is serving and queues the others
    in claim order: none is lost, none runs twice, and event numbers go on where they were.

    A restored run goes on from its last checkpoint (the steps it had persisted), so what those
    steps emitted stands and is not emitted again; the step it was in when its host died runs
    again. If that step had already emitted events (e.g. `ask`'s tokens), they are superseded:
    one `restarted` event says which (`supersedes_after`), and the redo's events carry the next
    `attempt`. A request re-served before its run began gets no second `started` event.

    Every key a request leaves carries its request tag; once answered, the claim is rewritten with
    its expiry and without tags (out of the open claims index) and all the request's other keys
    (and an HTTP run's record) expire after `runs.retention_seconds`.
    Finding open claims and counting a request's events read tag index sets, never a keyspace SCAN.

    A pool member (the blueprint's `serving.mode == "pool"`, docs/scaling.md) shares its run scope
    with the other members: it claims a request only while it has none (a busy member leaves it to
    the idle ones), drops the request's pending marker in the commit of its claim, and, each time it
    becomes idle, picks up the oldest request nobody could claim (the pending index,
    colony.agents.run_claims).
    """

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        namespace: str,
        protocol: type[RequestResultProtocol] = AgentRunProtocol,
        blackboard: Blackboard | None = None,
        scope: BlackboardScope = BlackboardScope.AGENT,
        one_shot: bool = False,
        settings: ColonySettings | None = None,
    ) -> None:
        super().__init__(
            agent,
            scope_id,
            blackboard=blackboard,
            scope=scope,
            namespace=namespace,
            capability_key=f"runs.{namespace}",
        )
        self.namespace = namespace
        self.protocol = protocol
        self.one_shot = one_shot  # a worker with one job: the agent stops once it is answered
        self.active_request: str | None = None
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.serving = RunServing()  # the agent's blueprint's, read at start()
        self._claiming = False  # a pool member's claim is in flight: it takes no second one meanwhile
        self._taken: str | None = None  # the request `_work` serves now (its run begun or not yet)
        # its collaborators: the request's events and answer, retention, counting, pool membership
        self.events = RunEventWriter(self)
        self.retention = RequestRetention(self, settings)
        self.counting = RunCounting()
        self.pool = PoolMember(self)
        # requests a pick-up claimed, with what serving them reads and when that was read (run_pool)
        self._picked_up: dict[str, tuple[float, PickedUp]] = {}
        self.spans = StepSpans(agent, self) if agent is not None else None  # (timings of each step)
        if agent is not None:
            agent.hooks.register(
                Pointcut.for_instance(agent, "run_step"), HookType.AFTER, self._after_step, owner=self
            )

    async def start(self) -> None:
        agent = self._agent()
        self.serving = serving_of(agent.blueprint)
        # the role's declaration (only its own agent speaks for the role; pool members do not) and
        # the sizes of the claim indexes, at once: a fresh agent (most starts) reads no index
        declares = self._owns_scope and self.serving != RunServing()
        reading = scope_at_start(self.blackboard, self.protocol)
        if declares:
            publish = publish_serving(self.blackboard, self.protocol, self.serving, agent.agent_id)
            scope, _ = await asyncio.gather(reading, publish)
        else:
            scope = await reading
            if self._owns_scope and scope.declared:  # left by an earlier agent of this id that
                # declared a pool or a bound: this one serves with the default, so the API must not
                # keep admitting by the old declaration until its retention passes
                await self.blackboard.delete(serving_key(self.protocol))
        claims = (
            [e async for e in self._open_claims() if _claimant(e.value) == agent.agent_id]
            if scope.open_claims
            else []
        )
        claims.sort(key=lambda e: (e.created_at, e.key))
        request_ids = [self.protocol.parse("claim", e.key)["request_id"] for e in claims]
        read = await self.blackboard.read_many(
            [key for r in request_ids for key in (self.protocol.result_key(r), self.protocol.request_key(r))]
        )
        run = agent.current_run
        restored: AgentRun | None = None
        for request_id, result, request in zip(request_ids, read[0::2], read[1::2], strict=True):
            self.counting.note(request_id, request)
            if result is not None:  # answered before a restart could retire it
                await self.events.end_stream(request_id, result)
                await self.retention.retire(request_id)
            elif run is not None and not run.done and run.request_id == request_id:
                restored = run  # adopted below, once no other request is made active
            else:
                self._enqueue(request_id)  # a done run unanswered is answered from the run, not re-run
        if restored is not None and restored.request_id is not None:
            # the host drives the restored run; _after_step answers
            await self.events.announce_restart(restored, await self.events.adopt(restored.request_id))
        self._tasks.append(asyncio.create_task(self._work(), name=f"{agent.agent_id}-{self.name}-requests"))
        if self.serving.is_pool and scope.pending:
            await self.pool.pick_up()  # requests that came while no member was free (a later one
            # reaches this member's event handler, which starts after this)

    async def emit(self, event_type: str, data: Any = None) -> None:
        """Write the next event of the active request (`RunEventWriter.emit`): what the agent's
        `emit_run_event` calls."""
        await self.events.emit(event_type, data)

    @property
    def retention_seconds(self) -> float:
        """How long an answered request's keys stay (`RequestRetention`)."""
        return self.retention.retention_seconds

    @property
    def max_events(self) -> int:
        """Events one request may store (`RequestRetention`)."""
        return self.retention.max_events

    def _open_claims(self) -> AsyncIterator[BlackboardEntry]:
        """Every open claim of this run scope (whoever holds it), read from the open-claims index."""
        open_claims = TagFilter(all_of=frozenset({self.protocol.open_claims_tag()}))
        return self.blackboard.iter_query(self.protocol.pattern("claim"), tags=open_claims)

    @property
    def _owns_scope(self) -> bool:
        """Serving its own agent's scope (not a pool member on its role's)."""
        return self.mode is CapabilityMode.LOCAL

    async def close(self) -> None:
        """Stop serving; when the agent is stopped for good (`Agent.stopping`, set by the runtime's
        stop) the role's serving declaration gets the retention expiry (a stopped agent leaves
        nothing permanent; the next start writes it again, without one). A copy dropped for a
        restore or replaced, and a yielded copy (another live copy holds the agent), leave it
        alone; should an expiry land on a live copy's declaration anyway, every member serving a
        run takes it off again (`pool.keep_serving`)."""
        await super().close()
        await self.retention.drain()
        agent = self._agent()
        if self._owns_scope and self.serving != RunServing() and agent.stopping and not agent.stored.yielded:
            with contextlib.suppress(BlackboardError):
                await retire_serving(self.blackboard, self.protocol, self.retention.retention_seconds)

    @event_handler(pattern="request:*")
    async def on_request(self, event: BlackboardEvent) -> dict[str, Any] | None:
        identified = self.protocol.identify(event.key)
        if event.op != "write" or identified is None or identified[0] != "request":
            return None
        request_id = identified[1]["request_id"]
        agent = self._agent()
        if agent.stored.yielded:  # another live copy serves this agent: it claims the request, not us
            return None
        if self.serving.is_pool and self.busy:
            # indexed whoever wrote it (the API marks its requests only when it knows the role is a
            # pool, and says so by its writer; an AgentHandle never does): an idle member takes
            # it, or this one once idle
            if event.created_by != API_INDEXED_WRITER:
                await self.pool.mark_pending(request_id)
            return None
        if self.serving.is_pool:  # maybe an older pending request than this one (a pick-up)
            claimed = await self.pool.claim_first_here(agent, request_id, event)
        else:
            claimed = request_id if await self._claim(agent, request_id) else None
        if claimed is None:
            return None
        return {"request": claimed, "namespace": self.namespace}

    @property
    def busy(self) -> bool:
        """Serving, queued or claiming a request."""
        return self._claiming or bool(self._queued) or self.active_request is not None

    @property
    def runs_waiting(self) -> int:
        """Requests claimed (or being claimed) here whose run has not begun yet: queued, or taken
        for serving while the run before it ends. From memory, no Redis read: the replica host
        asks under its engine's lock which agents run next (`LocalAgentRuntime.runs_waiting`)."""
        waiting = self._queue.qsize() + int(self._claiming)
        if self._taken is not None:
            run = self.agent.current_run if self.agent is not None else None
            waiting += int(run is None or run.request_id != self._taken)
        return waiting

    async def _claim(self, agent: Agent, request_id: str) -> bool:
        """Claim and queue a request; False when another claim was there first."""
        self._claiming = True
        try:
            # a Redis outage pauses the claim (and so this feed), it does not drop the request; a
            # claim already there (an event replayed after a restart, or another worker's) is not
            # ours. The value names this copy, so a retried claim never mistakes another copy's.
            # A pool's (or a bounded agent's) claim takes the request out of the pending index in
            # the same commit (the API's admission marker, if any)
            indexed = self.serving.is_pool or self.serving.admitted_at_once() is not None
            claimed = await self._create_once(
                self.protocol.claim_key(request_id),
                claim_value(agent),
                tags={self.protocol.request_tag(request_id), self.protocol.open_claims_tag()},
                what=f"agent {agent.agent_id}: claim of request {request_id}",
                drop=pending_key(self.protocol, request_id) if indexed else None,
            )
            if claimed:
                self._enqueue(request_id)
            return claimed
        finally:
            self._claiming = False

    async def _create_once(
        self,
        key: str,
        value: Any,
        *,
        tags: set[str],
        what: str,
        value_in_event: bool = False,
        drop: str | None = None,
    ) -> bool:
        """Create-only write that waits out a Redis outage. True when `value` is stored, including a
        retried write Redis had applied though its answer was lost; False when another value was
        there first. `drop`: a key deleted in the same commit, only if the write is applied.

        A conflict is always judged by the stored value, even on the first try: the Redis client
        itself sends a command again when its answer was lost (redis-py's retry, inside one call),
        and that second send finds the first one's value. Every value written here is this copy's
        own (a claim names its holder; an event its sequence number and attempt)."""
        writer = self.agent.agent_id if self.agent else None

        async def create() -> None:
            if drop is None:
                await self.blackboard.write(
                    key,
                    value,
                    tags=tags,
                    created_by=writer,
                    expected_version=0,
                    value_in_event=value_in_event,
                )
                return
            async with self.blackboard.transaction() as tx:
                tx.write(key, value, tags=tags, created_by=writer, expected_version=0)
                tx.delete(drop, created_by=writer)

        try:
            await retry_unavailable(create, what, log, answers=self._redis_answers)
        except ConcurrentModificationError:
            stored = await retry_unavailable(
                lambda: self.blackboard.read(key), what, log, answers=self._redis_answers
            )
            return stored is not None and stored.value == value
        return True

    async def _redis_answers(self) -> bool:
        timeout = min(1.0, self.blackboard.settings.op_timeout_seconds)
        return await redis_answers(self.blackboard.redis, timeout)

    def _agent(self) -> Agent:
        if self.agent is None:
            raise AgentUsageError("AgentRunCapability serves requests for an agent; build it with agent=...")
        return self.agent

    def _enqueue(self, request_id: str) -> None:
        if request_id not in self._queued:
            self._queued.add(request_id)
            self._queue.put_nowait(request_id)

    async def _work(self) -> None:
        """Serve queued requests one at a time, never over a run the agent is still finishing."""
        agent = self._agent()
        backoff = OutageBackoff(f"agent {agent.agent_id}: requests of {self.namespace}", log)
        run = agent.current_run
        if self.one_shot and run is not None and run.done and self._queue.empty() and agent.host is not None:
            # a worker brought back after its job was answered (found by review: its stop failed
            # half-way, it was placed again idle, and its parent waited for it to stop for good);
            # stopped once its start is over, so the stop finds it whole (no handler left running)
            await agent.started.wait()
            if self._queue.empty():
                agent.host.retire(agent.agent_id)
                return
        while True:
            request_id = await self._queue.get()
            self._taken = request_id
            try:
                failures_while_up = 0
                while True:  # a Redis outage before the run begins: the same request again, later
                    try:
                        await self._serve_queued(agent, request_id)
                        backoff.recovered()
                        break
                    except BlackboardUnavailable as exc:
                        # an operation that timed out while Redis was paused finds it answering
                        # again: tried again a few times before it counts as this request's failure
                        if await self._redis_answers():
                            failures_while_up += 1
                            if failures_while_up >= TRIES_WHILE_UP:
                                raise  # not an outage: this request failed (ended failed, below)
                        if self.active_request == request_id:
                            self.active_request = None
                            self._idle.set()
                        await backoff.wait(exc)
            except Exception as exc:  # one bad request must not stop this agent serving the next ones
                log.warning("request %s of %s failed outside its run: %r", request_id, agent.agent_id, exc)
                await self._fail_request(request_id, f"{type(exc).__name__}: {exc}")
            finally:
                self._queued.discard(request_id)
                self._picked_up.pop(request_id, None)
                self._taken = None
            if self.serving.is_pool and not self._queued:
                await self.pool.pick_up()

    def _hosted(self, agent: Agent) -> bool:
        """False once the host dropped this copy (to restore the agent from Redis): it must neither
        serve nor answer a request; the claims stay open for the copy that replaces it."""
        return agent.host is None or agent.host.hosts(agent)

    async def _serve_queued(self, agent: Agent, request_id: str) -> None:
        await self._idle.wait()
        if not self._hosted(agent):
            return
        while agent.current_run is not None and not agent.current_run.done:  # noqa: ASYNC110 - set by other code paths
            await asyncio.sleep(0.05)
        read_at, picked = self._picked_up.pop(request_id, (0.0, None))
        if picked is not None and time.monotonic() - read_at < PICKED_UP_FRESH_SECONDS:
            # read with its claim (a pick-up) just before: its marker is gone
            result, request, declaration, events = (
                picked.result,
                picked.request,
                picked.declaration,
                picked.events,
            )
            marker = None
        else:
            # one round trip for the four, and the names of the request's stored events (a fresh
            # request has none: its adoption then reads nothing more)
            (result, request, declaration, marker), events = await self.blackboard.read_many_and_tagged(
                [
                    self.protocol.result_key(request_id),
                    self.protocol.request_key(request_id),
                    serving_key(self.protocol),
                    pending_key(self.protocol, request_id),
                ],
                self.protocol.request_tag(request_id),
                self.protocol.event_pattern(request_id),
            )
        await self.pool.keep_serving(declaration)
        self.counting.note(request_id, request)
        if marker is not None:  # written after the claim dropped it (a busy member's, a re-open's):
            await self.pool.drop(request_id)  # it would count against max_concurrent_runs
        if result is not None:
            await self.retention.retire(request_id)  # ended by its requester before it was served
            return
        if request is None:  # gone (a submit that failed half-way, or expired): nothing to serve
            log.info("request %s of %s is gone; not served", request_id, agent.agent_id)
            await self.retention.retire(request_id)
            return
        run = agent.current_run
        if run is not None and run.done and run.request_id == request_id:
            # its run ended, then the host died before the answer was stored: answer from the run
            # (running it again would do its work twice and stream all its events again)
            await self.events.adopt(request_id)
            await self._respond(request_id, run.status, run.output, run.error, run.run_id, run.steps)
            return
        await self._serve(request_id, request, StoredEvents() if events == [] else None)

    async def _fail_request(self, request_id: str, reason: str) -> None:
        """End a request whose serving raised (e.g. an input Redis would not store in an event) as
        failed with the reason, and leave the capability idle; never raises."""
        self.events.begin(request_id)  # never the previous request's
        try:
            with contextlib.suppress(Exception):
                await self.events.adopt(request_id)  # numbering goes on after what this request stored
            if not self.counting.noted(request_id):  # failed before its request was read: read it
                with contextlib.suppress(Exception):  # now, so its end is counted if it is a run
                    self.counting.note(
                        request_id, await self.blackboard.read(self.protocol.request_key(request_id))
                    )
            message = f"the agent could not serve this run: {reason}"[:2000]
            await self._respond(request_id, RunStatus.FAILED, None, message, None, 0)
        except Exception as exc:
            log.error("request %s could not be ended as failed: %r", request_id, exc)
        finally:
            self.active_request = None
            self._idle.set()

    async def _serve(
        self, request_id: str, request: BlackboardEntry | None, stored: StoredEvents | None = None
    ) -> None:
        agent = self._agent()
        input_data = request.value.get("input") if request is not None else None
        stored = await self.events.adopt(request_id, stored)
        if not stored.started:  # re-served after a restart before its run began: one `started`
            await self.emit(STARTED, {"input": input_data})
        else:
            await self.pool.announce_rerun(request_id, stored)
        try:
            if agent.host is not None:
                await agent.host.start_run(agent.agent_id, input_data, request_id=request_id)
            else:
                await agent.run(input_data, request_id=request_id)
        except Exception as exc:
            if not self._hosted(agent):
                return  # dropped for a restore meanwhile: the restored copy serves this request
            run = agent.current_run
            begun = run is not None and run.request_id == request_id
            host = agent.host
            if isinstance(exc, BlackboardUnavailable) and host is not None:
                # whether the run's beginning was stored or not (a write Redis applied though its
                # answer was lost), the agent restored from Redis knows: it drives the run on, or
                # serves the request again; this copy, which may be wrong about it, goes
                await host.await_redis(agent)
                if host.redo_after_outage(agent, request_id):
                    return
            if not begun and isinstance(exc, BlackboardUnavailable):
                raise  # not begun, Redis away (or paused): `_work` serves it again once it answers
            if run is not None and run.request_id == request_id and self.active_request == request_id:
                # begun, then raised inside the agent (no host drives it): the run fails, answered
                await agent.fail_run(f"the run failed inside the agent: {type(exc).__name__}: {exc}")
            if self.active_request == request_id:
                reason = f"{type(exc).__name__}: {exc}"
                await self._respond(request_id, RunStatus.FAILED, None, reason, None, 0)
            return
        await self._await_answer(request_id)

    async def _await_answer(self, request_id: str) -> None:
        """Wait until the request is answered: by `_after_step` when the run ends, by `run_ended`
        when it raised inside the agent, or here when the driver ended without either (the run
        done but unanswered: answered from the run; the run not done: it is waiting or suspended,
        and whoever drives it next answers)."""
        agent = self._agent()
        driver = agent.host.driver(agent.agent_id) if agent.host is not None else None
        if driver is not None and not driver.done():
            idle = asyncio.create_task(self._idle.wait())
            try:
                await asyncio.wait({idle, driver}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                idle.cancel()
        run = agent.current_run
        if (
            self.active_request == request_id
            and run is not None
            and run.request_id == request_id
            and run.done
        ):
            await self.run_ended(run)
        await self._idle.wait()

    async def run_ended(self, run: AgentRun) -> None:
        """The run ended outside a step (it raised inside the agent, see `Agent.fail_run`): answer
        its request if it is the one being served."""
        if not self._hosted(self._agent()):
            return  # a copy its host dropped answers nothing: its restored copy does
        if self.active_request is not None and run.request_id == self.active_request:
            await self._respond(self.active_request, run.status, run.output, run.error, run.run_id, run.steps)

    async def _respond(
        self,
        request_id: str,
        status: RunStatus,
        output: Any,
        error: str | None,
        run_id: str | None,
        steps: int,
        step: dict[str, Any] | None = None,
    ) -> None:
        """Answer the request (with the run's last `step` event, when given; `events.store_answer`)."""
        kind = terminal_event(status)
        value = {"status": status.value, "output": output, "error": error, "run_id": run_id, "steps": steps}
        retired = False
        try:
            # create-only: a result already there (cancelled or timed out by the requester) stands,
            # and no terminal event follows. A Redis outage delays the answer; it never loses it.
            # (whoever stores the result counts the run's end: `counting.count_answer`, run_counting)
            data = {"output": output, "error": error}
            retired = await self.events.store_answer(request_id, value, kind, data, step)
        except ConcurrentModificationError:
            pass
        except Exception as exc:  # e.g. an output Redis cannot store: the run still ends, as failed
            reason = f"its result could not be stored: {type(exc).__name__}: {exc}"
            await self.events.store_failure(request_id, reason)
        finally:
            self.active_request = None
            self._idle.set()
        if not retired:  # not in the answer's round trip (`events.store_answer`): on its own
            await self.retention.retire(request_id)
        agent = self.agent
        if self.one_shot and agent is not None and agent.host is not None:
            agent.host.retire(agent.agent_id)

    async def _after_step(self, ctx: HookContext, result: Any) -> None:
        agent = self._agent()
        run = agent.current_run
        if self.active_request is None or run is None or run.request_id != self.active_request:
            return
        action = agent.last_result.model_dump(mode="json") if agent.last_result else None
        # after the step is persisted: a checkpoint, never superseded (during_step None); the last
        # step's event goes with the answer, in its commit
        step = {"step": run.steps, "name": agent.last_action, "action": action}
        if self.spans is not None:
            step.update(self.spans.take())
        if run.done:
            await self._respond(
                self.active_request, run.status, run.output, run.error, run.run_id, run.steps, step
            )
            return
        await self.events.emit_step(step)
        if await self.blackboard.read(self.protocol.result_key(self.active_request)):
            await agent.cancel_run("the requester ended the run (cancelled or timed out)")
        if run.done:
            await self._respond(self.active_request, run.status, run.output, run.error, run.run_id, run.steps)


def _claimant(value: Any) -> str | None:
    """The agent id a claim names: `{"agent_id": ..., "holder": ...}` (a copy's claim), or the bare
    agent id claims were before copies were told apart."""
    if isinstance(value, dict):
        value = value.get("agent_id")
    return value if isinstance(value, str) else None
