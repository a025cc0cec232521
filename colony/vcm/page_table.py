"""The page table in Redis: every mapped page, its text, and which replicas hold it.

A page record is tagged `replica:{id}` for each replica holding it resident and `swapped:{id}`
for each holding it in its disk tier, so "pages of replica R" is a tag-index lookup. Residency is
never guessed: `reconcile(replica, resident, swapped)` makes the table equal to what that
replica's engine reports, and `drop_replica` forgets a dead one.

Retention: page ids are content hashes, so every map of an edited tree adds pages. Every entry
here (page record, page text, source record) expires `vcm.page_retention_seconds` after it was
last mapped (`map_source`), held (`reconcile`) or used (`touch`); each of those refreshes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, Field

from colony.blackboard import Blackboard, BlackboardEntry, BlackboardScope, TagFilter, scope_id
from colony.blackboard.protocol import VcmProtocol as Keys
from colony.config import ColonySettings
from colony.errors import BatchConflictError, ConcurrentModificationError, PageNotResident
from colony.vcm.page import Page
from colony.vcm.pages import PageInfo, PageSource
from colony.vcm.placement import ReplicaView

RECONCILE_ATTEMPTS = 20


log = logging.getLogger(__name__)


class PageRecord(PageInfo):
    resident_on: list[str] = Field(default_factory=list)
    swapped_on: list[str] = Field(default_factory=list)
    last_access: float = 0.0


class SourceRecord(BaseModel):
    source_id: str
    path: str
    page_tokens: int
    page_ids: list[str]
    mapped_at: float = Field(default_factory=time.time)


def _tags(record: PageRecord) -> set[str]:
    """A page record's tags: its index tag and where it is held (resident / swapped)."""
    return (
        {Keys.index_tag("page")}
        | {Keys.resident_tag(r) for r in record.resident_on}
        | {Keys.swapped_tag(r) for r in record.swapped_on}
    )


class PageTable:
    def __init__(
        self,
        blackboard: Blackboard,
        *,
        settings: ColonySettings,
        tenant_id: str | None = None,
        colony_id: str | None = None,
    ) -> None:
        """`settings`: the process's settings (for `vcm.page_retention_seconds`), whose tenant and
        colony it holds pages of unless `tenant_id` / `colony_id` say otherwise."""
        tenant_id, colony_id = tenant_id or settings.tenant_id, colony_id or settings.colony_id
        self.board = blackboard.scoped(
            scope_id(BlackboardScope.COLONY, tenant_id=tenant_id, colony_id=colony_id, namespace="vcm")
        )
        self._retention = settings.vcm.page_retention_seconds

    @property
    def retention_seconds(self) -> float:
        """How long an entry stays after it was last mapped, held or used."""
        return self._retention

    async def map_source(self, source: PageSource) -> SourceRecord:
        """Cut the source into pages and record them with their text (known pages are kept as they are)."""
        pairs = list(source.pages())
        existing = await self.board.read_many([Keys.page_key(info.page_id) for info, _ in pairs])
        ttl = self.retention_seconds
        writes = []
        for (info, page), known in zip(pairs, existing, strict=True):
            writes.append(
                {
                    "key": Keys.content_key(info.page_id),
                    "value": page.text,
                    "created_by": "vcm",
                    "ttl_seconds": ttl,
                }
            )
            if known is None:
                fresh = PageRecord(**info.model_dump())
                writes.append(
                    {
                        "key": Keys.page_key(info.page_id),
                        "value": fresh,
                        "tags": _tags(fresh),
                        "created_by": "vcm",
                        "ttl_seconds": ttl,
                    }
                )
        for start in range(0, len(writes), 500):
            await self.board.write_many(writes[start : start + 500])
        await self._refresh_known([e for e in existing if e is not None])
        record = SourceRecord(
            source_id=source.source_id,
            path=str(source.root),
            page_tokens=source.page_tokens,
            page_ids=[info.page_id for info, _ in pairs],
        )
        await self.board.write(
            Keys.source_key(source.source_id),
            record,
            tags={Keys.index_tag("source")},
            created_by="vcm",
            ttl_seconds=ttl,
        )
        return record

    async def _refresh_known(self, entries: list[BlackboardEntry]) -> None:
        """Pages mapped again get their retention back; written before the `index:page` tag existed,
        they get that tag too (so `pages()` lists them). A record rewritten meanwhile (reconcile,
        touch) is left alone: that write kept or set its tag and retention."""
        ttl = self.retention_seconds
        await self.board.refresh([e.key for e in entries], ttl)
        writes = [
            {
                "key": e.key,
                "value": e.value,
                "tags": e.tags | {Keys.index_tag("page")},
                "created_by": "vcm",
                "expected_version": e.version,
                "ttl_seconds": ttl,
            }
            for e in entries
            if Keys.index_tag("page") not in e.tags
        ]
        for start in range(0, len(writes), 500):
            with contextlib.suppress(BatchConflictError):
                await self.board.write_many(writes[start : start + 500])

    async def page(self, page_id: str) -> PageRecord | None:
        entry = await self.board.read(Keys.page_key(page_id))
        return entry.value_as(PageRecord) if entry else None

    async def content(self, page_id: str) -> Page:
        """The page as an engine loads it."""
        entry = await self.board.read(Keys.content_key(page_id))
        if entry is None:
            raise PageNotResident(f"page {page_id!r} is not mapped (POST /v1/vcm/sources maps a folder)")
        return Page(page_id=page_id, text=entry.value)

    async def pages(self, *, replica: str | None = None, swapped: bool = False) -> list[PageRecord]:
        """Page records, all or those a replica holds; read through tag index sets, never SCAN."""
        tag = Keys.index_tag("page")
        if replica is not None:
            tag = Keys.swapped_tag(replica) if swapped else Keys.resident_tag(replica)
        tags = TagFilter(all_of=frozenset({tag}))
        entries = [e async for e in self.board.iter_query(Keys.pattern("page"), tags=tags)]
        return sorted((e.value_as(PageRecord) for e in entries), key=lambda r: r.page_id)

    async def holders(self, limit: int = 100_000) -> set[str]:
        """Every replica the table lists a page on (resident or swapped), from at most `limit` page
        records; a record that does not validate is skipped (`colony doctor` reports it)."""
        tags = TagFilter(all_of=frozenset({Keys.index_tag("page")}))
        named: set[str] = set()
        read = 0
        async for entry in self.board.iter_query(Keys.pattern("page"), tags=tags):
            read += 1
            if read > limit:
                log.warning("page table: more than %d pages; their holders were read from the first", limit)
                break
            try:
                record = entry.value_as(PageRecord)
            except ValueError:
                continue
            named.update(record.resident_on, record.swapped_on)
        return named

    async def source(self, source_id: str) -> SourceRecord | None:
        entry = await self.board.read(Keys.source_key(source_id))
        return entry.value_as(SourceRecord) if entry else None

    async def sources(self) -> list[SourceRecord]:
        tags = TagFilter(all_of=frozenset({Keys.index_tag("source")}))
        entries = [e async for e in self.board.iter_query(Keys.pattern("source"), tags=tags)]
        return [e.value_as(SourceRecord) for e in entries]

    async def reconcile(self, replica_id: str, resident: Iterable[str], swapped: Iterable[str] = ()) -> None:
        """Make the table say exactly what the replica's engine reports holding.

        Other replicas (and `touch`) update the same page records concurrently; a write that loses
        its version check is recomputed from a fresh read (setting this replica's membership is
        idempotent), with a short jittered backoff."""
        now_resident, now_swapped = set(resident), set(swapped)
        for attempt in range(RECONCILE_ATTEMPTS):
            try:
                return await self._reconcile_once(replica_id, now_resident, now_swapped)
            except ConcurrentModificationError:
                if attempt == RECONCILE_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(random.uniform(0, 0.01 * (attempt + 1)))

    async def _reconcile_once(self, replica_id: str, now_resident: set[str], now_swapped: set[str]) -> None:
        listed = {r.page_id for r in await self.pages(replica=replica_id)}
        listed |= {r.page_id for r in await self.pages(replica=replica_id, swapped=True)}
        page_ids = sorted(listed | now_resident | now_swapped)
        writes = []
        for page_id, entry in zip(
            page_ids, await self.board.read_many([Keys.page_key(p) for p in page_ids]), strict=True
        ):
            if entry is None:
                continue  # not a mapped page (e.g. an ad-hoc prompt prefix)
            record = entry.value_as(PageRecord)
            mine_resident = {replica_id} if page_id in now_resident else set()
            mine_swapped = {replica_id} if page_id in now_swapped else set()
            resident_on = sorted((set(record.resident_on) - {replica_id}) | mine_resident)
            swapped_on = sorted((set(record.swapped_on) - {replica_id}) | mine_swapped)
            if resident_on == record.resident_on and swapped_on == record.swapped_on:
                continue
            updated = record.model_copy(update={"resident_on": resident_on, "swapped_on": swapped_on})
            writes.append(
                {
                    "key": Keys.page_key(page_id),
                    "value": updated,
                    "tags": _tags(updated),
                    "created_by": replica_id,
                    "expected_version": entry.version,
                    "ttl_seconds": self.retention_seconds,  # held: its retention starts again
                }
            )
        if writes:
            await self.board.write_many(writes)  # one round trip; each write checks its version

    async def drop_replica(self, replica_id: str) -> None:
        """A replica is gone: none of its pages are held any more."""
        await self.reconcile(replica_id, (), ())

    async def touch(self, page_ids: Iterable[str]) -> None:
        """Record that the pages were just used (`last_access`; replicas flush it every heartbeat);
        their retention (and their text's) starts again."""
        ttl, page_ids = self.retention_seconds, list(page_ids)
        for page_id in page_ids:
            await self.board.update(
                Keys.page_key(page_id),
                lambda v: {**v, "last_access": time.time()} if v else v,
                retries=5,
                ttl_seconds=ttl,
            )
        await self.board.refresh([Keys.content_key(p) for p in page_ids], ttl)

    async def views(self, loads: Mapping[str, int], capacity: int | None = None) -> list[ReplicaView]:
        """Placement views of the given replicas from the table."""
        views = []
        for replica_id, load in sorted(loads.items()):
            resident = {r.page_id for r in await self.pages(replica=replica_id)}
            swapped = {r.page_id for r in await self.pages(replica=replica_id, swapped=True)}
            views.append(ReplicaView(replica_id, resident, swapped, load, capacity))
        return views
