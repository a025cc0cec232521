"""This process's mirror of memory scopes: the metadata recall filters on, and the keyword index.

A recall never re-reads every entry of a scope from Redis: each scope it touches is mirrored here
(tags, times, importance per entry, and the entry's text in the BM25 index) and caught up before the
recall with `MemoryStore.changes`, so a write by any process is seen by the next recall of every
other. A new mirror, or one whose stream position was trimmed away, is rebuilt from
`MemoryStore.entries`. Mirrors are kept for the most recently recalled scopes, bounded by scopes
and by entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from colony.memory.keyword import KeywordIndex
from colony.memory.store import MemoryStore
from colony.memory.types import MemoryEntry

__all__ = ["EntryMeta", "ScopeMirror", "ScopeMirrors"]

log = logging.getLogger(__name__)

MAX_MIRRORED_SCOPES = 512  # scopes whose mirror a process keeps (least recently recalled go first)
MAX_MIRRORED_ENTRIES = 200_000  # ... and entries in them all (~3 KB each with the keyword index)
CHANGES_BATCH = 500


@dataclass(slots=True)
class EntryMeta:
    """What the logical filter needs of an entry; duck-types MemoryEntry for `MemoryQuery.passes`."""

    entry_id: str
    tags: frozenset[str]
    created_at: float
    expires_at: float | None
    importance: float

    @classmethod
    def of(cls, entry: MemoryEntry) -> EntryMeta:
        return cls(entry.entry_id, entry.tags, entry.created_at, entry.expires_at, entry.importance)

    def age_seconds(self, now: float | None = None) -> float:
        return max(0.0, (now or time.time()) - self.created_at)


@dataclass
class ScopeMirror:
    """This process's view of one scope: entry metadata and the stream position it reflects."""

    position: str | None = None
    meta: dict[str, EntryMeta] = field(default_factory=dict)
    expiring: set[str] = field(default_factory=set)  # ids of entries with a TTL
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ScopeMirrors:
    """The mirrors of one process, least recently used first."""

    def __init__(
        self, store: MemoryStore, keyword: KeywordIndex, *, on_evict: Callable[[str], None] = lambda _: None
    ) -> None:
        self.store = store
        self.keyword = keyword
        self.on_evict = on_evict  # told of each scope whose mirror is dropped
        self._mirrors: OrderedDict[str, ScopeMirror] = OrderedDict()
        self._pins: Counter[str] = Counter()  # scopes a recall is reading now: never evicted

    @contextlib.contextmanager
    def pinned(self, scope_ids: Iterable[str]) -> Iterator[None]:
        """Keep these scopes' mirrors for the block (found by review: a recall waiting on the vector
        search lost every candidate when another recall's new scope evicted its mirror)."""
        held = list(dict.fromkeys(scope_ids))
        self._pins.update(held)
        try:
            yield
        finally:
            self._pins.subtract(held)
            for scope_id in held:
                if self._pins[scope_id] <= 0:
                    del self._pins[scope_id]

    def get(self, scope_id: str) -> ScopeMirror:
        """The scope's mirror (new and empty if not held), now the most recently used; the least
        recently used ones not pinned make room (the bounds may be passed while all are pinned)."""
        mirror = self._mirrors.get(scope_id)
        if mirror is None:
            mirror = self._mirrors[scope_id] = ScopeMirror()
            mirrored = sum(len(m.meta) for m in self._mirrors.values())
            while len(self._mirrors) > MAX_MIRRORED_SCOPES or mirrored > MAX_MIRRORED_ENTRIES:
                evicted = next((s for s in self._mirrors if s != scope_id and not self._pins[s]), None)
                if evicted is None:
                    break
                mirrored -= len(self._mirrors.pop(evicted).meta)
                self.keyword.clear(evicted)
                self.on_evict(evicted)
        else:
            self._mirrors.move_to_end(scope_id)
        return mirror

    def index(self, mirror: ScopeMirror, scope_id: str, entry: MemoryEntry) -> None:
        mirror.meta[entry.entry_id] = EntryMeta.of(entry)
        if entry.expires_at is not None:
            mirror.expiring.add(entry.entry_id)
        else:
            mirror.expiring.discard(entry.entry_id)
        self.keyword.add(scope_id, entry.entry_id, entry.content)

    def unindex(self, mirror: ScopeMirror, scope_id: str, entry_id: str) -> None:
        mirror.meta.pop(entry_id, None)
        mirror.expiring.discard(entry_id)
        self.keyword.remove(scope_id, entry_id)

    async def rebuild(self, scope_id: str, mirror: ScopeMirror) -> None:
        """Refill the mirror from the scope's entries (and the position before reading them)."""
        position = await self.store.latest_position(scope_id)
        entries = await self.store.entries(scope_id)
        mirror.meta.clear()
        mirror.expiring.clear()
        self.keyword.clear(scope_id)
        for entry in entries:
            self.index(mirror, scope_id, entry)
        mirror.position = position

    async def sync(self, scope_id: str) -> ScopeMirror:
        """The scope's mirror, caught up with every write and delete made so far."""
        mirror = self.get(scope_id)
        async with mirror.lock:
            if mirror.position is None:
                await self.rebuild(scope_id, mirror)
            while True:
                assert mirror.position is not None
                batch = await self.store.changes(scope_id, mirror.position, CHANGES_BATCH)
                if batch.truncated:
                    log.info("memory scope %s: events trimmed past the keyword index; rebuilding", scope_id)
                    await self.rebuild(scope_id, mirror)
                    continue
                # a batch loses the order of a delete and a re-write of one id: written ids are
                # read back, and what Redis holds now decides
                written = list(dict.fromkeys(batch.upserted))
                for entry_id in set(batch.deleted).difference(written):
                    self.unindex(mirror, scope_id, entry_id)
                if written:
                    current = await self.store.get_many([(scope_id, i) for i in written])
                    for entry_id, entry in zip(written, current, strict=True):
                        if entry is None:
                            self.unindex(mirror, scope_id, entry_id)
                        else:
                            self.index(mirror, scope_id, entry)
                if batch.position == mirror.position:
                    return mirror
                mirror.position = batch.position

    def meta(self, scope_id: str, entry_id: str) -> EntryMeta | None:
        """The mirrored metadata of an entry (None when the scope is not mirrored or lacks it)."""
        mirror = self._mirrors.get(scope_id)
        return mirror.meta.get(entry_id) if mirror is not None else None

    def forget(self, scope_id: str, entry_id: str) -> None:
        """Drop an entry Redis no longer holds (nothing when its scope is not mirrored)."""
        mirror = self._mirrors.get(scope_id)
        if mirror is not None:
            self.unindex(mirror, scope_id, entry_id)
