"""MemoryStore: memory entries in the blackboard, the one source of truth.

Each memory scope is a blackboard scope: an entry is `mem:entry:{id}` (the MemoryEntry as JSON, its
tags plus `index:memory`, its TTL as a Redis expiry), `mem:hash:{digest}` maps normalised content to
the entry holding it (exact dedup at write time), `mem:config` describes the scope. Every write and
delete lands on the scope's event stream, which is what ingestion (MemoryCapability) and the derived
indexes (colony.memory.retrieval) follow with `changes()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from colony import metrics
from colony.blackboard import Blackboard, TagFilter
from colony.blackboard.protocol import MemoryProtocol
from colony.blackboard.redis_lock import redis_lock
from colony.config import ColonySettings
from colony.errors import BatchConflictError, ConcurrentModificationError, InvalidArgument
from colony.memory.pruning import PruneOrder
from colony.memory.types import (
    MaintenanceConfig,
    MemoryEntry,
    MemoryQuery,
    MemoryScopeConfig,
    NewMemory,
    WriteOutcome,
    content_hash,
)

Keys = MemoryProtocol
PRUNING_HOLD_SECONDS = 30.0  # the most one cap enforcement holds the scope (a crashed one's ends)
PRUNING_WAIT_SECONDS = 5.0  # waiting for another enforcement of the scope's cap, then leaving it to it
PRUNE_LOOKAHEAD = 16  # extra lowest members read per pruning round (some may be gone already)
ENTRY_PREFIX = "mem:entry:"
Similar = Callable[[str, str], Awaitable[tuple[str, float] | None]]


@dataclass
class ChangeBatch:
    """Entry writes and deletes of a scope after a stream position (see `MemoryStore.changes`)."""

    upserted: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    position: str = "0-0"
    truncated: bool = False


def _id_tuple(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms or 0), int(seq or 0)


def new_entry_id() -> str:
    """Time-ordered, unique: milliseconds then random hex."""
    return f"{int(time.time() * 1000):013d}-{os.urandom(5).hex()}"


class MemoryStore:
    """Reads and writes memory entries of any scope on one Redis (cheap: shares the client)."""

    def __init__(self, blackboard: Blackboard, settings: ColonySettings) -> None:
        self._root = blackboard
        self.settings = settings
        self.limits = self.settings.memory

    def board(self, scope_id: str) -> Blackboard:
        return self._root.scoped(scope_id)

    # -- validation ------------------------------------------------------------------------------

    def _check(self, memory: NewMemory) -> None:
        if not any(not ch.isspace() and unicodedata.category(ch) != "Cf" for ch in memory.content):
            raise InvalidArgument(
                "content: only whitespace or invisible characters; an entry needs text to be recalled by"
            )
        if len(memory.content) > self.limits.max_content_chars:
            raise InvalidArgument(
                f"content: {len(memory.content)} characters; the limit is {self.limits.max_content_chars} "
                "(memory.max_content_chars): store a summary, with the full text in `data` or elsewhere"
            )
        if len(memory.tags) > self.limits.max_tags_per_entry:
            raise InvalidArgument(
                f"tags: {len(memory.tags)} tags; the limit is {self.limits.max_tags_per_entry} "
                "(memory.max_tags_per_entry)"
            )
        if Keys.INDEX_TAG in memory.tags:
            raise InvalidArgument(f"tags: {Keys.INDEX_TAG!r} is reserved")
        payload = len(json.dumps([memory.data, memory.metadata], ensure_ascii=False).encode("utf-8"))
        if payload > self.limits.max_payload_bytes:
            raise InvalidArgument(
                f"data and metadata: {payload} bytes of JSON; the limit is {self.limits.max_payload_bytes} "
                "(memory.max_payload_bytes): keep large payloads elsewhere and store a reference"
            )

    # -- writes ----------------------------------------------------------------------------------

    def _build(self, scope_id: str, memory: NewMemory, created_by: str | None) -> MemoryEntry:
        now = time.time()
        return MemoryEntry(
            entry_id=memory.entry_id or new_entry_id(),
            scope_id=scope_id,
            content=memory.content,
            data=memory.data,
            tags=memory.tags,
            kind=memory.kind,
            created_at=now,
            expires_at=now + memory.ttl_seconds if memory.ttl_seconds else None,
            importance=memory.importance,
            sources=list(memory.sources),
            content_hash=content_hash(memory.content),
            created_by=created_by,
            metadata=dict(memory.metadata),
        )

    async def write(
        self,
        scope_id: str,
        memory: NewMemory,
        *,
        created_by: str | None = None,
        dedup: bool = True,
        similar: Similar | None = None,
        dedup_threshold: float | None = None,
    ) -> WriteOutcome:
        """Store one entry, unless it is already held: an entry of the same id (an idempotent
        retry), of the same normalised content, or (with `similar`) one whose cosine similarity
        reaches `dedup_threshold` (default: the scope's) and that names the same particulars
        (`same_particulars`). The entry and its content-hash key commit together."""
        self._check(memory)
        config = await self.config(scope_id)
        memory = _with_scope_ttl(memory, config)
        board = self.board(scope_id)
        entry = self._build(scope_id, memory, created_by)
        for _attempt in range(5):
            held = await self._held(board, entry, explicit=memory.entry_id is not None, dedup=dedup)
            if held is not None:
                return held
            if dedup and similar is not None:
                threshold = dedup_threshold or (config.maintenance.dedup_threshold if config else 0.95)
                near = await similar(scope_id, entry.content)
                if near is not None and near[1] >= threshold:
                    found = await self.get(scope_id, near[0])
                    if found is not None and same_particulars(found.content, entry.content):
                        return WriteOutcome(entry=found, created=False, duplicate_of=found.entry_id)
            # without dedup, text already held is stored again as its own entry (the hash key
            # keeps naming the first holder); with dedup, the create-only hash key decides
            hashed = dedup or await board.read(Keys.hash_key(entry.content_hash)) is None
            try:
                async with board.transaction() as tx:
                    self._stage(tx, entry, memory.ttl_seconds, created_by, hash_key=hashed)
            except ConcurrentModificationError:
                continue  # the same id or content was stored meanwhile: report that one
            await self.ordered(scope_id, [entry], config)
            await self._keep_cap(scope_id, config)
            return WriteOutcome(entry=entry, created=True)
        raise ConcurrentModificationError(Keys.entry_key(entry.entry_id), 0, -1)

    async def _held(
        self, board: Blackboard, entry: MemoryEntry, *, explicit: bool, dedup: bool
    ) -> WriteOutcome | None:
        """The outcome when the entry is already stored: same id (retry) or same content."""
        if explicit:
            same = await board.read(Keys.entry_key(entry.entry_id))
            if same is not None and (found := _entry(same.value)) is not None:
                return WriteOutcome(entry=found, created=False, duplicate_of=found.entry_id)
        if dedup:
            holder = await board.read(Keys.hash_key(entry.content_hash))
            if holder is not None:
                existing = await board.read(Keys.entry_key(str(holder.value)))
                if existing is not None and (found := _entry(existing.value)) is not None:
                    return WriteOutcome(entry=found, created=False, duplicate_of=found.entry_id)
                # the entry it named is gone: the key is an orphan (only if still that version)
                with contextlib.suppress(ConcurrentModificationError):
                    await board.delete(Keys.hash_key(entry.content_hash), expected_version=holder.version)
        return None

    def _stage(
        self, tx: Any, entry: MemoryEntry, ttl: float | None, created_by: str | None, *, hash_key: bool = True
    ) -> None:
        """Entry and content-hash key, both create-only: of two concurrent writers of the same
        content one commits, the other finds it on its retry."""
        tx.write(
            Keys.entry_key(entry.entry_id),
            entry.model_dump(mode="json"),
            tags={*entry.tags, Keys.INDEX_TAG},
            created_by=created_by,
            ttl_seconds=ttl,
            expected_version=0,
        )
        if not hash_key:
            return
        tx.write(
            Keys.hash_key(entry.content_hash),
            entry.entry_id,
            created_by=created_by,
            ttl_seconds=ttl,
            expected_version=0,
        )

    async def write_many(
        self, scope_id: str, memories: Sequence[NewMemory], *, created_by: str | None = None
    ) -> list[WriteOutcome]:
        """Store many entries in one round trip per chunk: exact dedup (content hash, also within
        the batch) and idempotent ids, no near-duplicate check (that needs the vector index). The
        writes are create-only like `write`'s: against a concurrent writer of the same id or text,
        the entry is reported as held, never stored twice or overwritten."""
        for memory in memories:
            self._check(memory)
        config = await self.config(scope_id)
        memories = [_with_scope_ttl(m, config) for m in memories]
        board = self.board(scope_id)
        entries = [self._build(scope_id, m, created_by) for m in memories]
        holders = await board.read_many([Keys.hash_key(e.content_hash) for e in entries])
        held = await board.read_many(
            [
                Keys.entry_key(str(h.value)) if h is not None else Keys.entry_key(e.entry_id)
                for e, h in zip(entries, holders, strict=True)
            ]
        )
        explicit = await board.read_many([Keys.entry_key(e.entry_id) for e in entries])
        outcomes: list[WriteOutcome] = []
        writes: list[dict[str, Any]] = []
        seen: dict[str, MemoryEntry] = {}
        for entry, memory, holder, holding, same in zip(
            entries, memories, holders, held, explicit, strict=True
        ):
            if memory.entry_id and same is not None and (found := _entry(same.value)) is not None:
                outcomes.append(WriteOutcome(entry=found, created=False, duplicate_of=found.entry_id))
                continue
            if entry.content_hash in seen:
                first = seen[entry.content_hash]
                outcomes.append(WriteOutcome(entry=first, created=False, duplicate_of=first.entry_id))
                continue
            if holder is not None and holding is not None and (found := _entry(holding.value)) is not None:
                outcomes.append(WriteOutcome(entry=found, created=False, duplicate_of=found.entry_id))
                continue
            seen[entry.content_hash] = entry
            ttl = memory.ttl_seconds
            writes.append(
                {
                    "key": Keys.entry_key(entry.entry_id),
                    "value": entry.model_dump(mode="json"),
                    "tags": sorted({*entry.tags, Keys.INDEX_TAG}),
                    "created_by": created_by,
                    "ttl_seconds": ttl,
                    "expected_version": 0,
                }
            )
            writes.append(
                {
                    "key": Keys.hash_key(entry.content_hash),
                    "value": entry.entry_id,
                    "created_by": created_by,
                    "ttl_seconds": ttl,
                    # an orphan key (its entry gone) is taken over at the version read
                    "expected_version": holder.version if holder is not None else 0,
                }
            )
            outcomes.append(WriteOutcome(entry=entry, created=True))
        if writes:
            try:
                await board.write_many(writes)
            except BatchConflictError as exc:
                outcomes = await self._settle_conflicts(board, outcomes, {k for k, _, _ in exc.conflicts})
            await self.ordered(scope_id, [o.entry for o in outcomes if o.created], config)
            await self._keep_cap(scope_id, config)
        return outcomes

    async def _settle_conflicts(
        self, board: Blackboard, outcomes: list[WriteOutcome], conflicted: set[str]
    ) -> list[WriteOutcome]:
        """After concurrent writers won some keys of a batch: an entry whose text another writer
        stored meanwhile is removed again (the other one holds it); a hash key written for an id
        another writer took is removed again. Those outcomes become "held"."""
        settled: list[WriteOutcome] = []
        for outcome in outcomes:
            entry = outcome.entry
            entry_key, hash_key = Keys.entry_key(entry.entry_id), Keys.hash_key(entry.content_hash)
            if not outcome.created or (entry_key not in conflicted and hash_key not in conflicted):
                settled.append(outcome)
                continue
            if entry_key not in conflicted:  # ours was written, the text's hash key is another's
                with contextlib.suppress(ConcurrentModificationError):
                    await board.delete(entry_key, expected_version=1)
                holder = await board.read(hash_key)
                holder_id = str(holder.value) if holder is not None else entry.entry_id
            else:  # the id was taken: ours was not written; a hash key of ours goes again
                if hash_key not in conflicted:
                    with contextlib.suppress(ConcurrentModificationError):
                        await board.delete(hash_key, expected_version=1)
                holder_id = entry.entry_id
            found = await self.get(entry.scope_id, holder_id)
            settled.append(WriteOutcome(entry=found or entry, created=False, duplicate_of=holder_id))
        return settled

    async def _keep_cap(self, scope_id: str, config: MemoryScopeConfig | None) -> None:
        """Writes never leave a configured scope over its cap (whoever writes: a capability, the
        HTTP API, a transformer)."""
        if config is not None and config.max_entries:
            pruned = await self.enforce_cap(scope_id, config.max_entries, config.maintenance)
            if pruned:
                metrics.MEMORY_PRUNED.labels("cap").inc(pruned)

    # -- reads -----------------------------------------------------------------------------------

    async def get(self, scope_id: str, entry_id: str) -> MemoryEntry | None:
        stored = await self.board(scope_id).read(Keys.entry_key(entry_id))
        return _entry(stored.value) if stored is not None else None

    async def get_many(self, refs: Sequence[tuple[str, str]]) -> list[MemoryEntry | None]:
        """Entries by (scope_id, entry_id), in order; None where gone (deleted or expired)."""
        by_scope: dict[str, list[int]] = {}
        for n, (scope, _) in enumerate(refs):
            by_scope.setdefault(scope, []).append(n)
        found: list[MemoryEntry | None] = [None] * len(refs)
        for scope, positions in by_scope.items():
            stored = await self.board(scope).read_many([Keys.entry_key(refs[n][1]) for n in positions])
            for n, item in zip(positions, stored, strict=True):
                found[n] = _entry(item.value) if item is not None else None
        return found

    async def entries(
        self,
        scope_id: str,
        *,
        query: MemoryQuery | None = None,
        limit: int | None = None,
        written_since: float | None = None,
    ) -> list[MemoryEntry]:
        """Every live entry of the scope passing the logical part of `query` (from the scope's
        `index:memory` set; stale members of expired entries are pruned as they are met);
        `written_since`: only those last written at or after that time by Redis' clock (the clock
        of its event stream's ids, so a stream position can be compared with it)."""
        tags = TagFilter(all_of={Keys.INDEX_TAG})
        now = time.time()
        out: list[MemoryEntry] = []
        async for stored in self.board(scope_id).iter_query(Keys.ENTRY_PATTERN, tags=tags, page_size=500):
            if written_since is not None and stored.updated_at < written_since:
                continue
            entry = _entry(stored.value)
            if entry is None or (query is not None and not query.passes(entry, now)):
                continue
            if query is None and entry.expires_at is not None and entry.expires_at <= now:
                continue
            out.append(entry)
            if limit is not None and len(out) >= limit:
                break
        return out

    async def holding(self, scope_id: str, text: str) -> list[str]:
        """Ids of the scope's entries holding `text` (normalised), by its content-hash key."""
        holder = await self.board(scope_id).read(Keys.hash_key(content_hash(text)))
        if holder is None or not isinstance(holder.value, str):
            return []
        return [holder.value] if await self.get(scope_id, holder.value) is not None else []

    async def count(self, scope_id: str) -> int:
        """Live entries of the scope: the index set's size, after pruning members of entries that
        expired (only read when some did)."""
        board = self.board(scope_id)
        index = board.keyspace.tag_key(Keys.INDEX_TAG)
        due = await board.redis.zcount(board.keyspace.expiry_key, "-inf", int(time.time() * 1000))
        if due:
            return len(await self.entries(scope_id))
        return int(await board.redis.scard(index))

    async def tag_counts(self, scope_id: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in await self.entries(scope_id):
            for tag in entry.tags:
                counts[tag] = counts.get(tag, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    # -- deletes and maintenance -------------------------------------------------------------------

    async def delete(self, scope_id: str, entry_ids: Sequence[str], *, created_by: str | None = None) -> int:
        """Forget entries (and their content-hash keys); how many existed."""
        board = self.board(scope_id)
        stored = await board.read_many([Keys.entry_key(i) for i in entry_ids])
        removed = 0
        for entry_id, item in zip(entry_ids, stored, strict=True):
            if item is None:
                continue
            entry = _entry(item.value)
            if await board.delete(Keys.entry_key(entry_id), created_by=created_by):
                removed += 1
            if entry is not None and entry.content_hash:
                holder = await board.read(Keys.hash_key(entry.content_hash))
                if holder is not None and holder.value == entry_id:
                    with contextlib.suppress(ConcurrentModificationError):  # re-created meanwhile
                        await board.delete(
                            Keys.hash_key(entry.content_hash),
                            expected_version=holder.version,
                            created_by=created_by,
                        )
        await PruneOrder(board).remove(entry_ids)
        return removed

    async def enforce_cap(
        self, scope_id: str, max_entries: int, maintenance: MaintenanceConfig | None = None
    ) -> int:
        """Keep at most `max_entries`: the entries with the lowest decayed relevance go first (the
        oldest on ties), taken from the scope's pruning order (colony/memory/pruning.py) in
        O(log n), not by reading the scope. Returns how many went. One enforcement of a scope's
        cap at a time (a lock of the scope): found by review, writers on several replicas each
        counted the same overshoot and each deleted it, so the scope fell below its cap."""
        maintenance = maintenance or MaintenanceConfig()
        board = self.board(scope_id)
        lock = board.keyspace.lock_key("pruning")
        hold, wait = PRUNING_HOLD_SECONDS, PRUNING_WAIT_SECONDS
        async with redis_lock(board.redis, lock, hold_seconds=hold, wait_seconds=wait) as held:
            if not held:  # another writer held it past the wait: the scope's next write keeps the cap
                return 0
            return await self._prune(scope_id, board, max_entries, maintenance)

    async def _prune(
        self, scope_id: str, board: Blackboard, max_entries: int, maintenance: MaintenanceConfig
    ) -> int:
        live = await self.count(scope_id)
        order = PruneOrder(board)
        if order.needs_rebuild(await order.size(), live):
            await order.rebuild(await self.entries(scope_id), maintenance)
        excess, removed = live - max_entries, 0
        while excess > 0:
            ids = await order.lowest(excess + PRUNE_LOOKAHEAD)
            stored = await board.read_many([Keys.entry_key(i) for i in ids])
            gone = [i for i, item in zip(ids, stored, strict=True) if item is None]
            doomed = [i for i, item in zip(ids, stored, strict=True) if item is not None][:excess]
            await order.remove(gone)
            removed += await self.delete(scope_id, doomed, created_by="maintenance")
            excess -= len(doomed)
            if not doomed and not gone:
                break
        return removed

    async def ordered(
        self, scope_id: str, entries: Sequence[MemoryEntry], config: MemoryScopeConfig | None
    ) -> None:
        """Put newly written entries in the scope's pruning order."""
        await PruneOrder(self.board(scope_id)).add(
            entries, config.maintenance if config else MaintenanceConfig()
        )

    # -- configuration ------------------------------------------------------------------------------

    async def configure(self, config: MemoryScopeConfig) -> None:
        await self.board(config.scope_id).write(
            Keys.config_key(), config.model_dump(mode="json"), created_by=config.owner
        )

    async def config(self, scope_id: str) -> MemoryScopeConfig | None:
        stored = await self.board(scope_id).read(Keys.config_key())
        if stored is None:
            return None
        try:
            return MemoryScopeConfig.model_validate(stored.value)
        except ValueError:
            return None

    # -- change feed --------------------------------------------------------------------------------

    async def latest_position(self, scope_id: str) -> str:
        return await self.board(scope_id).latest_event_id()

    async def changes(self, scope_id: str, after: str, count: int = 500) -> ChangeBatch:
        """Entry writes and deletes after stream id `after` (at most `count` events read). A
        follower that stored `after` and finds `truncated` lost events to the stream's cap and must
        rebuild the scope from `entries()`."""
        board = self.board(scope_id)
        events_key = board.keyspace.events_key
        first = await board.redis.xrange(events_key, "-", "+", count=1)
        truncated = bool(first) and after not in ("0", "0-0") and _id_tuple(first[0][0]) > _id_tuple(after)
        if truncated:
            return ChangeBatch(position=after, truncated=True)
        events = await board.events(f"({after}" if after not in ("0", "0-0") else "-", count=count)
        batch = ChangeBatch(position=after)
        for event in events:
            batch.position = event.id
            if not event.key.startswith(ENTRY_PREFIX):
                continue
            entry_id = event.key[len(ENTRY_PREFIX) :]
            if event.op == "write":
                batch.upserted.append(entry_id)
            else:
                batch.deleted.append(entry_id)
        return batch


_PARTICULAR = re.compile(r"\w*\d\w*|[A-Z]\w*")


def same_particulars(a: str, b: str) -> bool:
    """Whether two texts name the same particulars (numbers, names): a near-duplicate by meaning
    that differs in one ("locker code 7291" / "locker code 7292", "Sensor 1" / "Sensor 2") is a
    different fact, and is kept."""
    return {t.lower() for t in _PARTICULAR.findall(a)} == {t.lower() for t in _PARTICULAR.findall(b)}


def _with_scope_ttl(memory: NewMemory, config: MemoryScopeConfig | None) -> NewMemory:
    """An entry written without a TTL lives as long as its scope's TTL says."""
    if memory.ttl_seconds is None and config is not None and config.ttl_seconds:
        return memory.model_copy(update={"ttl_seconds": config.ttl_seconds})
    return memory


def _entry(value: Any) -> MemoryEntry | None:
    """A stored entry, or None for a value that is not one (written by something else)."""
    try:
        return MemoryEntry.model_validate(value)
    except ValueError:
        return None
