"""Runs submitted over the API, kept entirely in Redis.

Submitting writes a run record (`run:{id}` in the colony's `api` namespace) and an AgentRunProtocol
request (`request:run:{id}`) into the agent's `runs` namespace, where its AgentRunCapability serves
it. A run's status is read from what is there: a result → its status; past its deadline → it is
failed with a timeout (written create-only, so the agent's late answer does not overwrite it);
claimed → running (suspended while its agent is); else queued. Nothing lives in API memory, so
runs survive API restarts.

Retention: every key of a run carries its request tag; when the run ends (answered by its agent,
or cancelled / timed out here) the run's keys and its record expire after `runs.retention_seconds`.
Every run has a deadline (`timeout_s`, else `runs.default_timeout_seconds`), and its request and
record are written with an expiry of that timeout plus the retention: a run nobody ever answers (or
a submit that failed half-way) leaves nothing permanent behind.
A client replaying the events of a run whose events are gone gets a `gap` event and then the run's
terminal event, never an endless stream.

Admission: an agent whose serving declaration (`RunServing`, published in its run scope by its run
capability, read here at most every SERVING_CACHE_SECONDS) bounds `max_concurrent_runs` refuses a
run beyond it with `RunQueueFull` (HTTP 429, Retry-After). The bound is a reservation, not a read:
the run's pending marker is written first (expiring after RESERVE_SECONDS unless the submit goes
on), then the open runs (distinct requests with an open claim or a pending marker) are counted,
and a submit whose count went over the bound deletes its marker and is refused. Two racing
submits each count the other, so the bound is never exceeded; under a burst at the bound both may
be refused where one would have fitted (they retry after Retry-After). An admitted submit writes
the run's record, then its request (last: a failed submit leaves nothing to serve) with its
pending marker again (the request's expiry); a pool's request gets that marker too, which lets an
idle member find it (colony.agents.run_claims). A pool member (`<role>.<hex>`) takes no runs of
its own: submits name the role. docs/scaling.md.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field
from redis.exceptions import RedisError

from colony import metrics
from colony.agents.models import RunServing, new_id
from colony.agents.run_claims import (
    API_INDEXED_WRITER,
    API_WRITER,
    open_runs,
    pending_key,
    pending_write,
    read_serving,
)
from colony.blackboard import AgentRunProtocol, Blackboard, BlackboardEvent, BlackboardScope, scope_id
from colony.blackboard.connection import redis_url_of
from colony.blackboard.protocol import AgentStateProtocol, ApiRunProtocol
from colony.config import ColonySettings, RunsSettings
from colony.errors import (
    AgentNotFound,
    BlackboardUnavailable,
    ConcurrentModificationError,
    InvalidArgument,
    RunNotFound,
    RunQueueFull,
    RunRetired,
)
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.registry import AgentRegistry
from colony.system.run_tree import RunTree, RunTreeReader, end_children
from colony.wire.run_events import STARTED, is_terminal, terminal_event

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")

RunStatusName = Literal["queued", "running", "suspended", "succeeded", "failed", "cancelled"]
ENDED_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})  # a run's end
GAP = "gap"  # event type of the notice that some of a run's events are gone (retention, stream cap)
_EVENT_ID = re.compile(r"(\d{1,20})(?:-(\d{1,20}))?")
_EVENT_ID_MAX = 2**64 - 1  # each part of a stream id is an unsigned 64-bit number
IDLE_SECONDS = 1.0  # an event stream checks the run's state after this long without events
SERVING_CACHE_SECONDS = 2.0  # how long this process trusts an agent's serving declaration it read
SERVING_CACHE_SIZE = 4096  # agents whose declaration is remembered (oldest forgotten first)
RESERVE_SECONDS = 30.0  # a reservation whose submit died before writing its request goes after this


def parse_event_id(text: str) -> tuple[int, int]:
    """A stream event id as (ms, seq); raises InvalidArgument for anything else ("$" included)."""
    match = _EVENT_ID.fullmatch(text) if isinstance(text, str) else None
    parsed = (int(match.group(1)), int(match.group(2) or 0)) if match is not None else None
    if parsed is None or max(parsed) > _EVENT_ID_MAX:  # Redis refuses a part beyond 64 bits
        raise InvalidArgument(
            f"Last-Event-ID {str(text)[:40]!r} is not an event id of this run "
            "(ids look like 1700000000000-0; omit the header to replay from the start)"
        )
    return parsed


class RunRecord(BaseModel):
    run_id: str
    agent: str
    namespace: str = RUNS_NAMESPACE
    created_at: float = Field(default_factory=time.time)
    deadline: float | None = None
    events_from: str = "0-0"
    pages: list[str] = Field(default_factory=list)


class RunView(BaseModel):
    run_id: str
    agent: str
    status: RunStatusName
    output: Any = None
    error: str | None = None
    created_at: float
    updated_at: float


class RunService:
    def __init__(
        self,
        blackboard: Blackboard,
        registry: AgentRegistry,
        *,
        settings: ColonySettings,
        tenant_id: str | None = None,
        colony_id: str | None = None,
        retention_seconds: float | None = None,
    ) -> None:
        """`settings`: the process's settings (the API replica's), whose tenant and colony it serves
        unless `tenant_id` / `colony_id` say otherwise; `retention_seconds` overrides
        `runs.retention_seconds`."""
        self.tenant_id = tenant_id or settings.tenant_id
        self.colony_id = colony_id or settings.colony_id
        self.api_board = blackboard.scoped(ApiRunProtocol.scope(self.tenant_id, self.colony_id))
        self.settings = settings
        self.runs_settings: RunsSettings = settings.runs
        # how long an ended run's keys stay
        retention = settings.runs.retention_seconds if retention_seconds is None else retention_seconds
        self.retention_seconds = retention
        self._root = blackboard
        self.registry = registry
        self._retired: dict[str, None] = {}  # ended runs whose record this process retired (bounded)
        self._serving: dict[tuple[str, str], tuple[float, RunServing]] = {}  # (agent, ns) -> (read at, it)
        self._known: dict[str, float] = {}  # agent -> when its registry record was last found

    def agent_scope(self, agent: str) -> str:
        return scope_id(
            BlackboardScope.AGENT, tenant_id=self.tenant_id, colony_id=self.colony_id, agent_id=agent
        )

    def run_board(self, record: RunRecord) -> Blackboard:
        return self._root.scoped(
            AgentRunProtocol.namespaced_scope(self.agent_scope(record.agent), record.namespace)
        )

    async def submit(
        self,
        agent: str,
        input_data: Any,
        *,
        namespace: str = RUNS_NAMESPACE,
        timeout_s: float | None = None,
        pages: list[str] | None = None,
        run_id: str | None = None,
    ) -> RunRecord:
        """Submit a run (module doc). `run_id` (derived from a request's Idempotency-Key): the run is
        made only if no run of that id exists; else that run is returned as it is (`RunRetired`
        when it ended and was removed), so a retried submit answers the same run, never a second."""
        if run_id is not None:
            try:
                return await self.record(run_id)
            except RunRetired:  # it ran and was removed: not made again
                raise
            except RunNotFound:
                pass
        await self._check_known(agent)
        await self._refuse_pool_member(agent, namespace)
        run_id = run_id or new_id("run")
        timeout = timeout_s or self.runs_settings.default_timeout_seconds
        record = RunRecord(
            run_id=run_id, agent=agent, namespace=namespace, pages=pages or [], deadline=time.time() + timeout
        )
        board = self.run_board(record)
        # The longest a run's request and record may live: answered or not, they go after this.
        life = timeout + self.retention_seconds
        try:
            serving = await self.serving(agent, namespace)
            marked = serving.is_pool or serving.admitted_at_once() is not None
            if serving.admitted_at_once() is not None:  # reserve, then count (the count includes it)
                await board.write(**pending_write(AgentRunProtocol, run_id, RESERVE_SECONDS, API_WRITER))
                await self._admit(board, agent, serving, pending_key(AgentRunProtocol, run_id))
            # where its events start: the shared reader's position when it reads the agent's
            # stream already (a busy agent's: no round trip), else the stream's newest event
            record.events_from = board.read_event_position() or await board.latest_event_id()
            await self._write_run(board, record, input_data, life, marked=marked)
        except RedisError as exc:  # e.g. Redis out of memory: a server-side failure, not the input's
            url = redis_url_of(self._root.redis)
            raise BlackboardUnavailable(f"submit run to {agent!r}", url, exc) from exc
        metrics.RUNS_SUBMITTED.labels(agent if agent in ("echo", "ask") else "custom").inc()
        return record

    async def _refuse_pool_member(self, agent: str, namespace: str) -> None:
        """`InvalidArgument` for a member of a pool (`<role>.<hex>`): submits name the role."""
        role, dot, _ = agent.partition(".")
        if dot and (await self.serving(role, namespace)).is_pool:
            raise InvalidArgument(
                f"agent {agent!r} is a member of the pool {role!r} and serves the pool's runs; "
                f"submit the run to {role!r}"
            )

    async def _write_run(
        self, board: Blackboard, record: RunRecord, input_data: Any, life: float, *, marked: bool
    ) -> None:
        """Write an admitted run's record and its request (with its pending marker when `marked`),
        all expiring after `life`; on failure, delete whatever of them may have been written."""
        run_id = record.run_id
        request_key = AgentRunProtocol.request_key(run_id)
        request = {
            "key": request_key,
            "value": {
                "input": input_data,
                "requester": API_WRITER,
                "agent_id": record.agent,
                "pages": record.pages,
            },
            "tags": [AgentRunProtocol.request_tag(run_id)],
            "created_by": API_WRITER,
            "ttl_seconds": life,
        }
        try:
            # the record first, in the same round trip: once the request exists it may be
            # served, so it comes last.
            # A pool's (or a bounded agent's) request is indexed as pending in the same round
            # trip, the marker first (with the request's expiry): a member that sees the
            # request (by API_INDEXED_WRITER) knows it is indexed; a member that sees the marker
            # first finds no request yet and leaves it, as an admission reservation. The run's
            # tag set gets its expiry in that round trip too: if no one ever answers, nothing
            # of the run outlives `life` but the small marker that it was submitted (known_write)
            writes = (
                [
                    pending_write(AgentRunProtocol, run_id, life, API_WRITER),
                    {**request, "created_by": API_INDEXED_WRITER},
                ]
                if marked
                else [request]
            )
            record_write = {
                "key": ApiRunProtocol.run_key(run_id),
                "value": record,
                "tags": [ApiRunProtocol.agent_tag(record.agent)],  # its agent's runs, listed
                "created_by": API_WRITER,
                "ttl_seconds": life,
            }
            known_write = {  # outlives the record: a retired id answers 410, not 404
                "key": ApiRunProtocol.known_key(run_id),
                "value": {"agent": record.agent, "created_at": record.created_at},
                "created_by": API_WRITER,
                "ttl_seconds": life + self.runs_settings.known_ids_seconds,
            }
            await board.write_group(
                writes,
                tag=AgentRunProtocol.request_tag(run_id),
                ttl_seconds=life,
                first=(self.api_board, [record_write, known_write]),
                outlive=ApiRunProtocol.agent_tag(record.agent),  # its agent's runs index lives as long
            )
        except BaseException:
            # nothing half-submitted stays to be served: the request too, which Redis may have
            # applied though its answer was lost (a member that took it already serves it)
            with contextlib.suppress(Exception):
                await board.delete(request_key)
                await board.delete(pending_key(AgentRunProtocol, run_id))
                await self.api_board.delete(ApiRunProtocol.run_key(run_id))
                await self.api_board.delete(ApiRunProtocol.known_key(run_id))  # never submitted
            raise

    async def _check_known(self, agent: str) -> None:
        """`AgentNotFound` unless the registry has a record of `agent`. One found is remembered
        for SERVING_CACHE_SECONDS, as its serving declaration is (a submit that raced the agent's
        removal by that much is accepted, as one that raced it by less always was: it ends at its
        deadline); one not found is read again at every submit."""
        now = time.monotonic()
        seen = self._known.get(agent)
        if seen is not None and now - seen < SERVING_CACHE_SECONDS:
            return
        if await self.registry.get(agent) is None:
            self._known.pop(agent, None)
            raise AgentNotFound(f"no agent named {agent!r}; GET /v1/agents lists them")
        _remember(self._known, agent, now)

    async def serving(self, agent: str, namespace: str = RUNS_NAMESPACE) -> RunServing:
        """The agent's serving declaration (cached for SERVING_CACHE_SECONDS)."""
        key = (agent, namespace)
        cached = self._serving.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < SERVING_CACHE_SECONDS:
            return cached[1]
        board = self._root.scoped(AgentRunProtocol.namespaced_scope(self.agent_scope(agent), namespace))
        serving = await read_serving(board, AgentRunProtocol)
        _remember(self._serving, key, (now, serving))
        return serving

    async def _admit(self, board: Blackboard, agent: str, serving: RunServing, marker: str) -> None:
        """Check the bound once this run's pending marker (`marker`, its reservation) is stored, so
        that the count includes this run and every concurrent submit's: over the bound, this submit
        deletes its marker and raises `RunQueueFull`. Nothing of the run is served meanwhile: its
        request is written only once it is admitted (an idle member claims only requests that
        exist)."""
        bound = serving.admitted_at_once()
        if bound is not None and await open_runs(board, AgentRunProtocol) > bound:
            with contextlib.suppress(Exception):
                await board.delete(marker)
            metrics.RUNS_REJECTED.labels(agent if agent in ("echo", "ask") else "custom").inc()
            raise RunQueueFull(
                f"agent {agent!r} already has {bound} run(s) open (running or waiting), as many as it "
                "admits (its max_concurrent_runs); retry after the Retry-After delay, or raise "
                "the agent's max_concurrent_runs (runs.echo_pool / runs.ask_pool for the built-ins)",
                retry_after_seconds=1.0,
            )

    async def record(self, run_id: str) -> RunRecord:
        """The run's record; `RunRetired` for a run submitted here whose record was removed after
        the retention, `RunNotFound` for an id never submitted (or forgotten since)."""
        entry, known = await self.api_board.read_many(
            [ApiRunProtocol.run_key(run_id), ApiRunProtocol.known_key(run_id)]
        )
        if entry is not None:
            return entry.value_as(RunRecord)
        if known is not None and isinstance(known.value, dict):
            agent = str(known.value.get("agent", "?"))[:64]
            created = known.value.get("created_at")
            when = (
                time.strftime(" (submitted %Y-%m-%d %H:%M:%S UTC)", time.gmtime(created))
                if isinstance(created, int | float) and not isinstance(created, bool) and 0 < created < 1e11
                else ""
            )
            raise RunRetired(
                f"run {run_id!r} of agent {agent!r}{when} is retired: it ended and its record and result "
                f"were removed after runs.retention_seconds ({self.retention_seconds:g} s)"
            )
        raise RunNotFound(
            f"no run {run_id!r}: no run with that id was submitted over HTTP (an agent's own run id, "
            "the run_id of its checkpoints, is not one: use the checkpoint's request_id)"
        )

    async def get(self, run_id: str) -> RunView:
        record = await self.record(run_id)
        board = self.run_board(record)
        result, claim = await board.read_many(
            [AgentRunProtocol.result_key(run_id), AgentRunProtocol.claim_key(run_id)]
        )
        if result is None and record.deadline is not None and time.time() > record.deadline:
            result = await self._finish(record, "failed", "run timed out after its deadline")
        if result is not None:
            value = result.value
            status = {"succeeded": "succeeded", "cancelled": "cancelled"}.get(value.get("status"), "failed")
            if run_id not in self._retired:  # once per process: the agent retires it too; this
                await self._retire_record(run_id)  # covers a lost call
                _remember(self._retired, run_id, None)
            return RunView(
                run_id=run_id,
                agent=record.agent,
                status=status,
                output=value.get("output"),
                error=value.get("error"),
                created_at=record.created_at,
                updated_at=result.updated_at,
            )
        status: RunStatusName = "queued"
        updated = record.created_at
        if claim is not None:
            status, updated = "running", claim.updated_at
            lifecycle = await self._root.scoped(self.agent_scope(record.agent)).read(
                AgentStateProtocol.key("lifecycle")
            )
            if lifecycle is not None and lifecycle.value.get("state") == "suspended":
                status = "suspended"
        return RunView(
            run_id=run_id, agent=record.agent, status=status, created_at=record.created_at, updated_at=updated
        )

    async def tree(self, run_id: str) -> RunTree:
        """The run and the requests made while it was served (colony.system.run_tree)."""
        record = await self.record(run_id)
        where = {"tenant_id": self.tenant_id, "colony_id": self.colony_id, "namespace": record.namespace}
        return await RunTreeReader(self._root, **where).tree(record.agent, run_id)

    async def cancel(self, run_id: str) -> RunView:
        record = await self.record(run_id)
        await self._finish(record, "cancelled", "cancelled by the client")
        return await self.get(run_id)

    async def _finish(self, record: RunRecord, status: str, error: str) -> Any:
        """End a run from the API side (create-only: an answer already there stands)."""
        board = self.run_board(record)
        try:
            entry = await board.write(
                AgentRunProtocol.result_key(record.run_id),
                {"status": status, "output": None, "error": error, "run_id": None, "steps": 0},
                tags={AgentRunProtocol.request_tag(record.run_id)},
                created_by=API_WRITER,
                expected_version=0,
            )
        except ConcurrentModificationError:
            return await board.read(AgentRunProtocol.result_key(record.run_id))
        metrics.run_ended(status, entry.created_at - record.created_at)  # its end, once: this write's
        # Ended here: its keys (and record) expire after the retention. The agent, if it had
        # claimed it, retires it again once it lets go, covering anything it writes meanwhile.
        await board.expire(
            [], self.retention_seconds, tag=AgentRunProtocol.request_tag(record.run_id), trim_events=True
        )
        await self._retire_record(record.run_id)
        where = {"tenant_id": self.tenant_id, "colony_id": self.colony_id, "namespace": record.namespace}
        await end_children(self._root, **where, agent=record.agent, run_id=record.run_id, writer=API_WRITER)
        return entry

    async def _retire_record(self, run_id: str) -> None:
        await self.api_board.expire([ApiRunProtocol.run_key(run_id)], self.retention_seconds)

    async def check_event_id(self, run_id: str, last_event_id: str | None) -> RunRecord:
        """Refuse a `Last-Event-ID` that is not a stream id ("$" and garbage included) or that lies
        beyond the newest event of the run's stream (InvalidArgument; the API answers 400), so a
        replay can never wait forever for events that will not come. Raises RunNotFound too.
        The run's record, for `events(..., record=)`."""
        record = await self.record(run_id)
        if last_event_id is None:
            return record
        wanted = parse_event_id(last_event_id)
        newest = await self.run_board(record).last_generated_event_id()
        if newest is not None and wanted > parse_event_id(newest):
            raise InvalidArgument(
                f"Last-Event-ID {last_event_id!r} is later than the newest event of run {run_id!r} "
                f"({newest}); send the id of an event this run's stream handed out"
            )
        return record

    async def events(
        self, run_id: str, last_event_id: str | None = None, *, record: RunRecord | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event id, event) pairs of the run, from the start or after `last_event_id`, ending with
        its terminal event; see `event_batches`."""
        batches = self.event_batches(run_id, last_event_id, record=record)
        async with contextlib.aclosing(batches):
            async for batch in batches:
                for pair in batch:
                    yield pair

    async def event_batches(
        self,
        run_id: str,
        last_event_id: str | None = None,
        *,
        record: RunRecord | None = None,
        first_wait: float | None = None,
        hold_started: float | None = None,
    ) -> AsyncIterator[list[tuple[str, dict[str, Any]]]]:
        """The run's (event id, event) pairs, from the start or after `last_event_id`, ending with
        its terminal event, in batches: the events that arrived together (a run's last step, its
        answer and its terminal event are written at once) come in one list, so a stream can send
        them in one message. A run ended by the API (cancel, timeout) gets a terminal event here.
        With `first_wait`, an empty batch comes first if no event arrives within that many
        seconds (a stream then sends its head without them). With `hold_started`, a batch that
        ends with the run's `started` event is held that many seconds at most for what follows
        (it goes as soon as another event comes): most runs' first step follows within tens of
        milliseconds, and one message for both costs a stream's path through Serve one item less.

        When the run has ended but its remaining events are gone (trimmed or expired), the stream
        sends a `gap` event and then a terminal event built from the run's result, and ends.
        `last_event_id` is checked first (see `check_event_id`), unless
        the caller did and passes the `record` that check returned."""
        if record is None or record.run_id != run_id:
            record = await self.check_event_id(run_id, last_event_id)
        board = self.run_board(record)
        subscription = board.subscribe(f"*:run:{run_id}*", from_id=last_event_id or record.events_from)
        batch: list[tuple[str, dict[str, Any]]] = []
        try:
            while True:
                wait = IDLE_SECONDS
                if batch and not subscription.ready():
                    if hold_started is not None and batch[-1][1].get("event_type") == STARTED:
                        wait, hold_started = hold_started, None  # once: `started` and what follows
                    else:
                        yield batch
                        batch = []
                if first_wait is not None:
                    event = await subscription.next(timeout=first_wait)
                    first_wait = None
                    if event is None:
                        yield []  # nothing yet
                        continue
                else:
                    event = await subscription.next(timeout=wait)
                if event is None and batch:  # held long enough
                    yield batch
                    batch = []
                    continue
                if event is None:
                    ending = await self._after_quiet_spell(record, subscription.last_id)
                    if ending:
                        yield [*batch, *ending]
                        return
                    continue
                pair = await self._stream_pair(board, run_id, event)
                if pair is None:
                    continue
                batch.append(pair)
                if is_terminal(pair[1]):
                    yield batch
                    return
        finally:
            subscription.close()

    async def _stream_pair(
        self, board: Blackboard, run_id: str, event: BlackboardEvent
    ) -> tuple[str, dict[str, Any]] | None:
        """What a change to the run's keys adds to its event stream: an event the agent wrote (its
        value read when the change does not carry it), the terminal event of a run the API ended
        (cancel, timeout: a result written here); None for anything else."""
        if event.op != "write":
            return None
        if event.key == AgentRunProtocol.result_key(run_id):
            if event.created_by != API_WRITER:
                return None  # the agent's terminal event follows its result
            entry = await board.read(event.key)
            status = entry.value.get("status", "failed") if entry else "failed"
            ended = {
                "event_type": status if status == "cancelled" else "failed",
                "data": {"error": entry.value.get("error") if entry else None},
                "request_id": run_id,
            }
            return event.id, ended
        identified = AgentRunProtocol.identify(event.key)
        if identified is None or identified[0] != "event":
            return None
        value = event.value  # carried by the event (the agent writes it so), else read
        if not isinstance(value, dict):
            entry = await board.read(event.key)
            if entry is None or not isinstance(entry.value, dict):
                return None
            value = entry.value
        return event.id, value

    async def _after_quiet_spell(self, record: RunRecord, position: str) -> list[tuple[str, dict[str, Any]]]:
        """No event for a while: a run past its deadline is failed (timed out) here, and a run
        whose events are gone gets its ending (`_gap`); empty while the run may go on."""
        if record.deadline is not None and time.time() > record.deadline:
            await self._finish(record, "failed", "run timed out after its deadline")
        return await self._gap(record, position)

    async def _gap(self, record: RunRecord, position: str) -> list[tuple[str, dict[str, Any]]]:
        """After a quiet spell: if the run has ended (its result is at least IDLE_SECONDS old, so its
        terminal event had time to arrive) and yet no terminal event came, its events are gone:
        a `gap` event and the terminal event from the result. Empty while the run may go on."""
        board = self.run_board(record)
        run_id = record.run_id
        result = await board.read(AgentRunProtocol.result_key(run_id))
        if result is None:
            if await board.read(AgentRunProtocol.request_key(run_id)) is not None:
                return []  # queued or running: its events are still to come
            value: dict[str, Any] = {"status": "failed", "error": "the run's result is gone (retention)"}
        elif time.time() - result.updated_at < IDLE_SECONDS:
            return []
        else:
            value = result.value
        newest = await board.last_generated_event_id() or position
        status = value.get("status")
        kind = terminal_event(status)
        gap = {
            "event_type": GAP,
            "data": {"after": position, "reason": "events of this run are gone (retention or stream cap)"},
            "request_id": run_id,
        }
        terminal = {
            "event_type": kind,
            "data": {"output": value.get("output"), "error": value.get("error")},
            "request_id": run_id,
        }
        return [(newest, gap), (newest, terminal)]


def event_time(event: dict[str, Any]) -> float:
    """An event's `ts` when it is a plausible time (an agent writes it: any JSON), else now."""
    ts = event.get("ts")
    if isinstance(ts, int | float) and not isinstance(ts, bool) and 0 < ts < 1e11:  # finite, sane
        return float(ts)
    return time.time()


def _remember(cache: dict[K, V], key: K, value: V) -> None:
    """Put `key` last in a bounded cache (SERVING_CACHE_SIZE entries; the oldest go first)."""
    cache.pop(key, None)
    cache[key] = value
    if len(cache) > SERVING_CACHE_SIZE:
        cache.pop(next(iter(cache)))
