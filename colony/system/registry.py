"""The agent registry: which agents exist, where they run and in which state, in Redis.

One entry per agent (COLONY scope), tagged by state and by replica, so "the agents of replica R"
or "the suspended agents" are tag-index lookups, not a scan of one big document. Every entry also
carries its kind's index tag, so listing all agents (or replicas, or publications) reads one index
set, whatever else the Redis holds: no hot path here issues SCAN.

A stopped or failed agent's record expires after `runs.retention_seconds` (the same retention as
finished runs); writing it again in a live state makes it permanent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from colony.agents.models import AgentState
from colony.blackboard import Blackboard, TagFilter
from colony.blackboard.protocol import AgentRegistryProtocol as Keys
from colony.blackboard.protocol import NeededSoonKeys
from colony.config import ColonySettings
from colony.errors import ConcurrentModificationError
from colony.wire.ids import ID_PATTERN

log = logging.getLogger(__name__)

DONE_STATES = frozenset({"stopped", "failed"})  # the agent has ended
ON_DEMAND = "on_demand"  # `AgentRecord.waits` of an agent suspended to make room: resumed when asked for
NOT_HOSTED = DONE_STATES | {"suspended"}  # states in which no replica hosts the agent
HEARTBEAT_MISSES = 5  # a heartbeat lives this many periods
# A process's published metrics outlive it this long: its `colony_cluster_*` series (one per process)
# go on being exported for 15 minutes after it is gone, then end. A series that ends is no counter
# reset (`increase()` over a range still counts it), so what a dashboard sums over processes never
# sees a drop; 15 minutes lets any sane scrape interval see a dead process's last figures, and keeps
# the export small when processes churn (a day of restarts was 512 processes x ~500 samples).
PUBLICATION_RETENTION_SECONDS = 900.0
# Publications one read looks at (those listed first by the index scan) to pick the most recently
# published: far more than a cluster's processes in a retention period (metrics.MAX_PUBLICATIONS)
PUBLICATIONS_READ_LIMIT = 4096


# Pages one replica's needed-soon entry names at most (those of the highest-priority agents first),
# and how long an entry outlives the control plane round that wrote it
NEEDED_SOON_PAGES = 4096
WHY_CHARS = 200  # the longest reason kept for a page needed soon
SOON_PAGE_ID = re.compile(ID_PATTERN)  # what a page id read back may look like (1-128 id characters)
REPLICA_ID = SOON_PAGE_ID  # ... and a replica id in a heartbeat
NEEDED_SOON_TTL_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class SoonSuspended:
    """A page a suspended page-bound agent will need on a replica, as the monitor left it: how
    close its agent's resumption is (`close`, 0 to 1: 1 when its condition holds and it waits
    for room, 0 when nothing says when, e.g. it waits to be asked for; None from a writer that did
    not say) and why, for people."""

    page_id: str
    close: float | None = None
    why: str = ""


class AgentRecord(BaseModel):
    agent_id: str
    role: str | None = None
    agent_type: str = "unbound"
    state: str = "initialized"
    replica: str | None = None
    # what a suspended agent waits for: its condition's kind, or `on_demand` (suspended to make room,
    # resumed only when asked for: an idle session's next message); None while hosted, and for
    # records written before it was kept
    waits: str | None = None
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)


class AgentRegistry:
    def __init__(
        self,
        colony_board: Blackboard,
        *,
        settings: ColonySettings,
        retention_seconds: float | None = None,
    ) -> None:
        """`settings`: the process's settings (a replica's, the API's); `retention_seconds` overrides
        their `runs.retention_seconds`."""
        self.board = colony_board
        self._retention = settings.runs.retention_seconds if retention_seconds is None else retention_seconds
        self._indexed_once = False
        # a process publishes about once per heartbeat period (its loops may call more often); a
        # little less, so a heartbeat that wakes a hair early still publishes
        self._publish_every = 0.9 * settings.serve.heartbeat_seconds
        self._published_at: dict[str, float] = {}
        # one publication write at a time, in the order of the calls (and so of the figures taken
        # before them): an older figure never lands after a newer one of the same process
        self._publishing = asyncio.Lock()

    @property
    def retention_seconds(self) -> float:
        """How long records of ended agents stay (`runs.retention_seconds`)."""
        return self._retention

    async def put(self, record: AgentRecord) -> AgentRecord:
        waits = record.waits if record.state == "suspended" else None
        record = record.model_copy(update={"updated_at": time.time(), "waits": waits})
        tags = {Keys.index_tag("agent"), Keys.state_tag(record.state)}
        if record.replica:
            tags.add(Keys.replica_tag(record.replica))
        if record.state == "suspended" and waits != ON_DEMAND:
            tags.add(Keys.resumable_tag())
        ttl = await self._done_ttl(record) if record.state in DONE_STATES else None
        await self.board.write(
            Keys.agent_key(record.agent_id), record, tags=tags, created_by="registry", ttl_seconds=ttl
        )
        return record

    async def _done_ttl(self, record: AgentRecord) -> float:
        """The retention left to an ended agent's record: counted from when it ended, so rewriting
        the record (e.g. a heartbeat clearing its replica) does not push its expiry back."""
        current = await self.board.read(Keys.agent_key(record.agent_id))
        if current is not None and current.expires_at is not None:
            return max(0.001, current.expires_at - time.time())
        return self.retention_seconds

    async def get(self, agent_id: str) -> AgentRecord | None:
        """The agent's record; None where absent or not readable as one (`_readable`)."""
        entry = await self.board.read(Keys.agent_key(agent_id))
        return _readable(entry) if entry else None

    async def get_many(self, agent_ids: Sequence[str]) -> list[AgentRecord | None]:
        """The records of `agent_ids`, in order (None where absent), in one round trip."""
        entries = await self.board.read_many([Keys.agent_key(agent_id) for agent_id in agent_ids])
        return [_readable(entry) if entry else None for entry in entries]

    async def set_state(self, agent_id: str, state: str) -> AgentRecord | None:
        record = await self.get(agent_id)
        if record is None:
            return None
        return await self.put(record.model_copy(update={"state": state}))

    async def list(
        self, *, state: str | None = None, replica: str | None = None, resumable: bool = False
    ) -> list[AgentRecord]:
        """Records by state and replica; `resumable`: only the suspended agents whose condition the
        resource monitor checks (not those suspended to make room, which wait to be asked for)."""
        if not self._indexed_once:
            await self._index_older_records()
        # The query reads the first tag's index set and filters by the others: the narrowest first.
        # (only suspended records carry the resumable tag, and its set is the small one: the query
        # reads the alphabetically first tag's set, so it goes alone)
        tags = [Keys.resumable_tag()] if resumable else []
        tags += [Keys.state_tag(state)] if state and not resumable else []
        tags += [Keys.replica_tag(replica)] if replica else []
        tags = tags or [Keys.index_tag("agent")]
        entries = [e async for e in self._indexed("agent", tags)]
        records = [r for r in map(_readable, entries) if r is not None]
        return sorted((r for r in records if not state or r.state == state), key=lambda r: r.agent_id)

    async def _index_older_records(self) -> None:
        """Once per process: records written before the `index:agent` tag existed get it. They are
        found through their state tags (SSCAN of those sets, still no keyspace SCAN)."""
        index = Keys.index_tag("agent")
        states = TagFilter(any_of=frozenset(Keys.state_tag(s.value) for s in AgentState))
        async for entry in self.board.iter_query(Keys.pattern("agent"), tags=states):
            if index in entry.tags:
                continue
            ttl = None if entry.expires_at is None else max(0.001, entry.expires_at - time.time())
            with contextlib.suppress(ConcurrentModificationError):  # rewritten meanwhile by `put`
                await self.board.write(
                    entry.key,
                    entry.value,
                    tags=entry.tags | {index},
                    ttl_seconds=ttl,
                    expected_version=entry.version,
                    created_by="registry",
                )
        self._indexed_once = True

    def _indexed(self, template: str, tags: list[str] | None = None) -> Any:
        """Entries of one template through tag index sets (SSCAN of those sets, never SCAN)."""
        tag_filter = TagFilter(all_of=frozenset(tags or [Keys.index_tag(template)]))
        return self.board.iter_query(Keys.pattern(template), tags=tag_filter)

    async def remove(self, agent_id: str) -> bool:
        return await self.board.delete(Keys.agent_key(agent_id))

    # -- pages needed soon on each replica (written by the resource monitor, read by heartbeats) --

    async def put_needed_soon(
        self,
        replica_id: str,
        pages: list[str],
        ttl_seconds: float,
        *,
        close: Sequence[float] | None = None,
        why: Sequence[str] | None = None,
    ) -> None:
        """What the suspended page-bound agents will need on `replica_id`, closest first, with
        how close each page's agent is to resuming and why (`SoonSuspended`), in one entry."""
        value: dict[str, Any] = {"pages": pages[:NEEDED_SOON_PAGES]}
        if close is not None:
            value["close"] = [round(float(c), 4) for c in close[:NEEDED_SOON_PAGES]]
        if why is not None:
            value["why"] = [str(w)[:WHY_CHARS] for w in why[:NEEDED_SOON_PAGES]]
        await self.board.write(
            NeededSoonKeys.soon_key(replica_id), value, ttl_seconds=ttl_seconds, created_by="monitor"
        )

    async def needed_soon(self, replica_id: str) -> list[str]:
        """The pages suspended page-bound agents will need on `replica_id`, closest first (one
        read; what is stored is checked, not trusted: at most `NEEDED_SOON_PAGES` strings)."""
        return [soon.page_id for soon in await self.needed_soon_entries(replica_id)]

    async def needed_soon_entries(self, replica_id: str) -> list[SoonSuspended]:
        """`needed_soon` with how close each page's agent is to resuming and why (one read; a
        closeness or reason missing or malformed is left unknown)."""
        entry = await self.board.read(NeededSoonKeys.soon_key(replica_id))
        value = entry.value if entry is not None and isinstance(entry.value, dict) else {}
        pages, close, why = value.get("pages"), value.get("close"), value.get("why")
        if not isinstance(pages, list):
            return []
        close = close if isinstance(close, list) and len(close) == len(pages) else [None] * len(pages)
        why = why if isinstance(why, list) and len(why) == len(pages) else [""] * len(pages)
        found = []
        for page_id, near, reason in zip(pages[:NEEDED_SOON_PAGES], close, why, strict=False):
            # read back from Redis, so checked like input: a page id as the page sources make them,
            # a closeness in [0, 1] (not a bool), a reason cut to what the writer keeps
            if not isinstance(page_id, str) or not SOON_PAGE_ID.fullmatch(page_id):
                continue
            known = isinstance(near, int | float) and not isinstance(near, bool) and math.isfinite(near)
            closeness = min(1.0, max(0.0, float(near))) if known else None
            found.append(
                SoonSuspended(page_id, closeness, reason[:WHY_CHARS] if isinstance(reason, str) else "")
            )
        return found

    async def clear_needed_soon(self, replica_id: str) -> None:
        await self.board.delete(NeededSoonKeys.soon_key(replica_id))

    # -- liveness: replica heartbeats and the counters processes publish (both with a TTL) --------

    async def beat(self, replica_id: str, info: dict[str, Any], ttl_seconds: float) -> None:
        await self.board.write(
            Keys.replica_key(replica_id),
            info,
            tags={Keys.index_tag("replica")},
            ttl_seconds=ttl_seconds,
            created_by=replica_id,
        )

    async def replicas(self) -> list[dict[str, Any]]:
        """The live replicas' heartbeats (engine and page stats, agent counts): those that are an
        object naming a replica id (found by review: one that was not stopped every placement
        and every monitor round on Serve, which list the replicas by them)."""
        beats = [e.value async for e in self._indexed("replica")]
        return [b for b in beats if isinstance(b, dict) and _replica_named(b.get("replica_id"))]

    async def publish(self, counters: dict[str, Any], created_by: str, *, force: bool = False) -> bool:
        """A process's metrics (`metrics.published_counters()`), exported per process by the API;
        kept `PUBLICATION_RETENTION_SECONDS` after the last one. Skipped (False) when this process
        published less than a heartbeat period ago, unless `force`. Writes go out one at a time in
        call order, so a process's publication in Redis never goes back to an older figure."""
        process = str(counters["process"])
        now = time.monotonic()
        if not force and now - self._published_at.get(process, -math.inf) < self._publish_every:
            return False
        key = Keys.process_key(process)
        tags = {Keys.index_tag("process")}
        async with self._publishing:
            await self.board.write(
                key, counters, tags=tags, ttl_seconds=PUBLICATION_RETENTION_SECONDS, created_by=created_by
            )
        self._published_at[process] = now
        return True

    async def publications(self, limit: int | None = None) -> list[Any]:
        """What processes published, as stored (the reader validates it: colony.metrics treats it
        as hostile): the `limit` most recently published (by Redis' clock), newest first, ties by
        key. So the subset under a cap does not depend on the index scan order, and stays the same
        from one read to the next while at most `limit` processes are publishing (a live process
        publishes every heartbeat period and stays ahead of the ones gone). At most
        PUBLICATIONS_READ_LIMIT entries are looked at."""
        entries = []
        async for entry in self._indexed("process"):
            entries.append(entry)
            if len(entries) >= PUBLICATIONS_READ_LIMIT:
                break
        entries.sort(key=lambda e: (-e.updated_at, e.key))
        return [e.value for e in (entries if limit is None else entries[: max(0, limit)])]


def _replica_named(value: Any) -> bool:
    return isinstance(value, str) and REPLICA_ID.fullmatch(value) is not None


def _readable(entry: Any) -> AgentRecord | None:
    """An entry's AgentRecord, or None (logged) when a writer of Redis left one that is not: found
    by review, one such record made every monitor round raise, so nothing was resumed or re-placed
    while it stood. (A writer of Redis is trusted; a record it spoilt must still not stop the rest.)"""
    try:
        return entry.value_as(AgentRecord)
    except ValueError as exc:
        log.warning("registry: %s is not an agent record, left out (%s)", str(entry.key)[:200], str(exc)[:99])
        return None
