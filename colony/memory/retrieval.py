"""Recall: filter memory entries exactly, then rank the survivors by meaning, words and age.

Redis is the only source of truth. Two derived indexes serve ranking:

- a per-process mirror of each recalled scope (colony/memory/mirror.py): the metadata the logical
  filter needs (tags, created_at, expires_at, importance) and a BM25 keyword index of the text,
  caught up from the scope's event stream before every recall (a write by any process is seen by
  the next recall of every other). Filtering runs over it in memory: a recall never re-reads every
  entry from Redis.
- the shared Chroma collection (colony.memory.index), followed the same way; its position per scope
  is stored in Redis (`MemoryProtocol.index_position_key`, with the collection's id, so a recreated
  collection is rebuilt) and only moves forward, so any process may catch it up.

The entries finally returned are read from Redis and checked again: an entry Redis no longer holds
(deleted, expired) is never returned even if an index still has it, and its index rows are dropped.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from colony.blackboard.protocol import MemoryProtocol
from colony.config import ColonySettings
from colony.errors import ConcurrentModificationError
from colony.memory.index import VectorIndex, ref_of, split_ref
from colony.memory.keyword import KeywordIndex
from colony.memory.mirror import CHANGES_BATCH, EntryMeta, ScopeMirror, ScopeMirrors
from colony.memory.ranking import (
    fuse,
    keyword_score,
    mode_weights,
    recency,
    stream_id_after,
    unranked_relevance,
)
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import MaintenanceConfig, MemoryQuery, RecalledEntry

__all__ = ["EntryMeta", "MemoryRetriever"]

log = logging.getLogger(__name__)

# (Chroma-style ref, relevance, (cosine, keyword score, recency))
Ranked = tuple[str, float, tuple[float, float, float]]

RANK_POOL_MIN = 30  # candidates each ranker contributes to fusion, at least
VERIFY_SLACK = 4  # extra entries read from Redis per verification round (some may be gone)
# entries a recall (or a write's dedup check) embeds itself when the vector index lags; a larger
# backlog is embedded in the background (the local model embeds ~70-100 entries/s on 2 cores)
INLINE_EMBED = 256


class _Candidates(Collection[str]):
    """Chroma refs of a filter's survivors, answered from the per-scope id sets (no string per
    entry is built unless iterated, which a search does only for a few candidates)."""

    def __init__(self, by_scope: dict[str, set[str]]) -> None:
        self.by_scope = by_scope
        self._len = sum(len(ids) for ids in by_scope.values())

    def __contains__(self, ref: object) -> bool:
        if not isinstance(ref, str):
            return False
        scope_id, entry_id = split_ref(ref)
        ids = self.by_scope.get(scope_id)
        return ids is not None and entry_id in ids

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        for scope_id, ids in self.by_scope.items():
            for entry_id in ids:
                yield ref_of(scope_id, entry_id)


def _has_logic(query: MemoryQuery) -> bool:
    return any(
        v is not None for v in (query.tag_filter, query.key_pattern, query.time_range, query.max_age_seconds)
    )


class MemoryRetriever:
    """Recall over memory scopes (see the module docstring); one per process is enough."""

    def __init__(
        self,
        store: MemoryStore,
        vector: VectorIndex | None,
        keyword: KeywordIndex | None = None,
        settings: ColonySettings | None = None,
    ) -> None:
        self.store = store
        self.vector = vector
        self.keyword = keyword or KeywordIndex()
        self.settings = settings or store.settings
        self.mirrors = ScopeMirrors(store, self.keyword, on_evict=self._evicted)
        self._vector_locks: dict[str, asyncio.Lock] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._syncing: dict[str, asyncio.Task[None]] = {}

    def _evicted(self, scope_id: str) -> None:
        """A scope's mirror left this process: its vector lock and finished sync task go too."""
        self._vector_locks.pop(scope_id, None)
        if (task := self._syncing.get(scope_id)) is None or task.done():
            self._syncing.pop(scope_id, None)

    # -- the shared vector index ---------------------------------------------------------------

    async def _vector_position(self, scope_id: str, generation: str) -> str | None:
        """How far the vector index has followed the scope; None if never (in this collection)."""
        stored = await self.store.board(scope_id).read(MemoryProtocol.index_position_key())
        value = stored.value if stored is not None and isinstance(stored.value, dict) else {}
        if value.get("collection") != generation or not isinstance(value.get("position"), str):
            return None
        return str(value["position"])

    async def _advance_vector(self, scope_id: str, generation: str, position: str) -> None:
        """Store the index position; only forward (within one collection generation)."""

        def forward(current: Any) -> dict[str, str]:
            if (
                isinstance(current, dict)
                and current.get("collection") == generation
                and isinstance(current.get("position"), str)
                and not stream_id_after(position, current["position"])
            ):
                return current
            return {"collection": generation, "position": position}

        board = self.store.board(scope_id)
        try:
            await board.update(MemoryProtocol.index_position_key(), forward, created_by="memory-index")
        except ConcurrentModificationError:  # others kept moving it; they are ahead or will be
            log.debug("memory scope %s: index position contended", scope_id)

    async def _upsert_vectors(self, scope_id: str, entry_ids: Sequence[str]) -> None:
        assert self.vector is not None
        ids = list(dict.fromkeys(entry_ids))
        found = await self.store.get_many([(scope_id, i) for i in ids])
        live = [e for e in found if e is not None]
        gone = [ref_of(scope_id, i) for i, e in zip(ids, found, strict=True) if e is None]
        if live:
            await self.vector.upsert(live)
        if gone:
            await self.vector.delete(gone)

    async def _sync_vector(self, scope_id: str, inline: int | None = None) -> None:
        """Catch the vector index up. With `inline` (a recall, a write's dedup check), at most that
        many entries are embedded here; more work (a backlog, a reindex) moves to a background task
        and the caller ranks with the index as it is (verification keeps that correct; entries not
        yet embedded are still found by keywords)."""
        if self.vector is None:
            return
        lock = self._vector_locks.setdefault(scope_id, asyncio.Lock())
        if inline is not None and lock.locked():
            return  # another task is catching this scope up
        async with lock:
            generation = await self.vector.generation()
            position = await self._vector_position(scope_id, generation)
            if position is None:
                if inline is not None and await self.store.count(scope_id) > inline:
                    return self._sync_in_background(scope_id)
                await self._reindex(scope_id, generation)
                return
            while True:
                batch = await self.store.changes(scope_id, position, CHANGES_BATCH)
                if batch.truncated:
                    if inline is not None and await self.store.count(scope_id) > inline:
                        return self._sync_in_background(scope_id)
                    log.info("memory scope %s: events trimmed past the vector index; reindexing", scope_id)
                    await self._reindex(scope_id, generation)
                    return
                written = list(dict.fromkeys(batch.upserted))
                if inline is not None:
                    if len(written) > inline:
                        return self._sync_in_background(scope_id)
                    inline -= len(written)
                # a rewritten id's rows go first too: its new text may have fewer sentence rows
                deleted = set(batch.deleted)
                if deleted:
                    await self.vector.delete([ref_of(scope_id, i) for i in deleted])
                if written:
                    await self._upsert_vectors(scope_id, written)  # as Redis holds them now
                if batch.upserted or batch.deleted:
                    await self._advance_vector(scope_id, generation, batch.position)
                if batch.position == position:
                    return
                position = batch.position

    def _sync_in_background(self, scope_id: str) -> None:
        """Catch the scope's vector index up in a task of its own (one per scope at a time)."""
        running = self._syncing.get(scope_id)
        if running is not None and not running.done():
            return
        log.info("memory scope %s: vector index behind; catching up in the background", scope_id)
        task = asyncio.get_running_loop().create_task(self._sync_vector(scope_id))
        self._syncing[scope_id] = task
        self._track(task, "catching the vector index up")

    async def _reindex(self, scope_id: str, generation: str) -> int:
        assert self.vector is not None
        position = await self.store.latest_position(scope_id)
        await self.vector.drop_scope(scope_id)
        entries = await self.store.entries(scope_id)
        await self.vector.upsert(entries)
        await self._advance_vector(scope_id, generation, position)
        return len(entries)

    # -- public ----------------------------------------------------------------------------------

    async def sync(self, scope_id: str) -> None:
        """Catch this process's keyword index and the shared vector index up with the scope."""
        await self.mirrors.sync(scope_id)
        await self._sync_vector(scope_id)

    async def reindex(self, scope_id: str) -> int:
        """Rebuild the scope's vector rows (and this process's keyword index) from Redis; returns
        how many entries were embedded."""
        mirror = self.mirrors.get(scope_id)
        async with mirror.lock:
            await self.mirrors.rebuild(scope_id, mirror)
        if self.vector is None:
            return 0
        async with self._vector_locks.setdefault(scope_id, asyncio.Lock()):
            return await self._reindex(scope_id, await self.vector.generation())

    async def nearest(self, scope_id: str, text: str) -> tuple[str, float] | None:
        """The scope's entry most similar to `text` and its cosine (near-duplicate check at write)."""
        if self.vector is None:
            return None
        mirror = await self.mirrors.sync(scope_id)
        await self._sync_vector(scope_id, INLINE_EMBED)
        if not mirror.meta:
            return None
        now = time.time()
        live = {i for i, m in mirror.meta.items() if m.expires_at is None or m.expires_at > now}
        query = await self.vector.embed_query(text)
        # whole texts only: a short fact is no duplicate of a longer entry holding its sentence
        hits = await self.vector.search(query, _Candidates({scope_id: live}), 1, whole_texts=True)
        if not hits:
            return None
        ref, cosine = max(hits.items(), key=lambda kv: kv[1])
        return split_ref(ref)[1], cosine

    async def recall(self, query: MemoryQuery, scope_ids: Sequence[str]) -> list[RecalledEntry]:
        """Entries of `scope_ids` passing the query's logical filter, ranked (see the module
        docstring), above `min_relevance`, at most `max_results` (and memory.max_recall_results);
        their scopes' mirrors are kept while it reads them (`ScopeMirrors.pinned`)."""
        scopes = [s for s in dict.fromkeys(scope_ids) if _scope_selected(query, s)]
        if not scopes:
            return []
        with self.mirrors.pinned(scopes):
            return await self._recall(query, scopes)

    async def _recall(self, query: MemoryQuery, scopes: list[str]) -> list[RecalledEntry]:
        text = (query.query or "").strip()
        use_vector = self.vector is not None and bool(text) and query.mode != "keyword"
        # the query's embedding (the slowest step) is computed while the indexes catch up
        embedding = (
            asyncio.ensure_future(self.vector.embed_query(text)) if use_vector and self.vector else None
        )
        try:
            mirrors = await asyncio.gather(*(self.mirrors.sync(s) for s in scopes))
            if use_vector:
                try:
                    await asyncio.gather(*(self._sync_vector(s, INLINE_EMBED) for s in scopes))
                except Exception:  # a Chroma outage degrades ranking, never recall itself
                    log.warning("memory: vector index unavailable; ranking by keywords only", exc_info=True)
                    use_vector = False
            now = time.time()
            candidates, narrowed = self._filter(query, scopes, mirrors, now)
            if not any(candidates.values()):
                return []
            limit = min(query.max_results, self.settings.memory.max_recall_results)
            if text:
                vector_embedding = embedding if use_vector else None
                ranked = await self._rank_text(
                    query, text, candidates, narrowed, vector_embedding, limit, now
                )
            else:
                top = limit * 2 + RANK_POOL_MIN
                ranked = await self._rank_unranked(candidates, mirrors, scopes, now, top)
                found = await self._verify(
                    query, [r for r in ranked if r[1] >= query.min_relevance], limit, now
                )
                if len(found) >= limit or len(ranked) < top:
                    return found
                # many of the best were gone from Redis: rank every candidate
                ranked = await self._rank_unranked(candidates, mirrors, scopes, now, None)
            ranked = [r for r in ranked if r[1] >= query.min_relevance]
            return await self._verify(query, ranked, limit, now)
        finally:
            if embedding is not None and not embedding.done():
                embedding.cancel()
            elif embedding is not None and not embedding.cancelled():
                embedding.exception()  # retrieved: a failure was logged by _embedding or is moot

    @staticmethod
    async def _embedding(task: asyncio.Future[np.ndarray] | None) -> np.ndarray | None:
        if task is None:
            return None
        try:
            return await task
        except Exception:  # the query's embedding failed: rank by keywords
            log.warning("memory: embedding the query failed; ranking by keywords only", exc_info=True)
            return None

    # -- recall steps ----------------------------------------------------------------------------

    def _filter(
        self, query: MemoryQuery, scopes: list[str], mirrors: Sequence[ScopeMirror], now: float
    ) -> tuple[dict[str, set[str]], bool]:
        """Entry ids per scope passing the logical part of the query; whether any live one failed.
        Entries found expired are dropped from the indexes on the way."""
        logic = _has_logic(query)
        out: dict[str, set[str]] = {}
        narrowed = False
        for scope_id, mirror in zip(scopes, mirrors, strict=True):
            expired = [
                i for i in mirror.expiring if (m := mirror.meta.get(i)) is None or (m.expires_at or 0) <= now
            ]
            for entry_id in expired:
                self.mirrors.unindex(mirror, scope_id, entry_id)
            if expired and self.vector is not None:
                self._spawn_delete([ref_of(scope_id, i) for i in expired])
            if logic:
                kept = {i for i, m in mirror.meta.items() if query.passes(m, now)}  # type: ignore[arg-type]
                narrowed = narrowed or len(kept) < len(mirror.meta)
            else:
                kept = set(mirror.meta)
            out[scope_id] = kept
        return out, narrowed

    async def _rank_text(
        self,
        query: MemoryQuery,
        text: str,
        candidates: dict[str, set[str]],
        narrowed: bool,
        embedding: asyncio.Future[np.ndarray] | None,
        limit: int,
        now: float,
    ) -> list[Ranked]:
        """Fuse the vector and keyword rankers' best `pool` candidates each (the scores either
        lacks for the other's picks are computed exactly, so fusion sees both for every one)."""
        memory = self.settings.memory
        pool = max(RANK_POOL_MIN, limit * 3)
        # keywords first: they are ranked while the query's embedding is still being computed
        bm25 = self._keyword_pool(text, candidates, narrowed, pool) if query.mode != "vector" else {}
        qv = await self._embedding(embedding)
        wv, wk = mode_weights(query.mode, memory, vector_available=qv is not None)
        cosines: dict[str, float] = {}
        if wv > 0 and qv is not None and self.vector is not None:
            try:
                searched, known = await asyncio.gather(
                    self.vector.search(qv, _Candidates(candidates), pool),
                    self.vector.similarities(qv, list(bm25)) if wk > 0 else _nothing(),
                )
                cosines = {**known, **searched}
            except Exception:
                log.warning("memory: vector search failed; ranking by keywords only", exc_info=True)
                wv, wk = 0.0, 1.0
        if wk > 0 and not bm25 and query.mode == "vector":  # the vector ranker was not available
            bm25 = self._keyword_pool(text, candidates, narrowed, pool)
        if wk > 0 and wv > 0 and not bm25:
            wv, wk = 1.0, 0.0  # no candidate shares a word with the query: the keyword ranker abstains
        union = set(cosines) | set(bm25)
        if wk > 0:
            by_scope: dict[str, set[str]] = {}
            for ref in union - set(bm25):
                scope_id, entry_id = split_ref(ref)
                by_scope.setdefault(scope_id, set()).add(entry_id)
            for scope_id, ids in by_scope.items():
                for entry_id, score in self.keyword.scores(scope_id, text, ids).items():
                    bm25[ref_of(scope_id, entry_id)] = score
        half_life, wr = memory.recency_half_life_seconds, memory.recency_weight
        ranked: list[Ranked] = []
        for ref in union:
            scope_id, entry_id = split_ref(ref)
            meta = self.mirrors.meta(scope_id, entry_id)
            if meta is None:
                continue
            cos, kw = cosines.get(ref, 0.0), keyword_score(bm25.get(ref, 0.0))
            rec = recency(now - meta.created_at, half_life)
            ranked.append((ref, fuse(cos, kw, rec, wv=wv, wk=wk, wr=wr), (max(0.0, cos), kw, rec)))
        ranked.sort(key=lambda r: r[1], reverse=True)
        return ranked

    def _keyword_pool(
        self, text: str, candidates: dict[str, set[str]], narrowed: bool, pool: int
    ) -> dict[str, float]:
        """BM25 of the best `pool` candidates of each scope sharing a word with the query."""
        bm25: dict[str, float] = {}
        for scope_id, ids in candidates.items():
            for entry_id, score in self.keyword.search(
                scope_id, text, candidates=ids if narrowed else None, limit=pool
            ):
                bm25[ref_of(scope_id, entry_id)] = score
        return bm25

    async def _rank_unranked(
        self,
        candidates: dict[str, set[str]],
        mirrors: Sequence[ScopeMirror],
        scopes: list[str],
        now: float,
        top: int | None,
    ) -> list[Ranked]:
        """No query text: decayed importance (the scope's maintenance) times recency, best `top`.

        Both factors decay exponentially with age, so log(relevance) = log(importance) + k x
        created_at + a constant of the scope: the best `top` of each scope are picked on that key
        without computing every entry's relevance."""
        configs = await asyncio.gather(*(self.store.config(s) for s in scopes))
        half_life = self.settings.memory.recency_half_life_seconds
        ranked: list[tuple[float, float, str, float]] = []
        for scope_id, mirror, config in zip(scopes, mirrors, configs, strict=True):
            maintenance = config.maintenance if config is not None else MaintenanceConfig()
            per_minute = 1.0 - maintenance.decay_rate
            metas = [m for i in candidates[scope_id] if (m := mirror.meta.get(i)) is not None]
            if top is not None and len(metas) > top:
                k = -math.log(0.5) / half_life - math.log(per_minute) / 60.0  # decay_rate < 1
                metas = heapq.nlargest(
                    top,
                    metas,
                    key=lambda m: (math.log(m.importance) if m.importance > 0 else -1e300) + k * m.created_at,
                )
            for meta in metas:
                age = max(0.0, now - meta.created_at)
                rec = recency(age, half_life)
                decayed = meta.importance * per_minute ** (age / 60.0)
                ranked.append(
                    (unranked_relevance(decayed, rec), meta.created_at, ref_of(scope_id, meta.entry_id), rec)
                )
        ranked.sort(reverse=True)  # most relevant first, the newest on ties
        return [(ref, relevance, (0.0, 0.0, rec)) for relevance, _, ref, rec in ranked]

    async def _verify(
        self, query: MemoryQuery, ranked: list[Ranked], limit: int, now: float
    ) -> list[RecalledEntry]:
        """Read the best entries from Redis until `limit` are confirmed live and passing."""
        out: list[RecalledEntry] = []
        stale: list[str] = []
        cursor = 0
        while len(out) < limit and cursor < len(ranked):
            chunk = ranked[cursor : cursor + (limit - len(out)) + VERIFY_SLACK]
            cursor += len(chunk)
            entries = await self.store.get_many([split_ref(ref) for ref, _, _ in chunk])
            for (ref, relevance, (cos, kw, rec)), entry in zip(chunk, entries, strict=True):
                if entry is None:
                    stale.append(ref)
                    continue
                if not query.passes(entry, now):
                    continue
                scores = {"vector": round(cos, 6), "keyword": round(kw, 6), "recency": round(rec, 6)}
                out.append(RecalledEntry(entry=entry, relevance=round(relevance, 6), scores=scores))
                if len(out) >= limit:
                    break
        if stale:
            self._forget(stale)
        return out

    def _forget(self, refs: Iterable[str]) -> None:
        """Drop entries Redis no longer holds from this process's mirror and from Chroma."""
        refs = list(refs)
        for ref in refs:
            scope_id, entry_id = split_ref(ref)
            self.mirrors.forget(scope_id, entry_id)
        if self.vector is not None:
            self._spawn_delete(refs)

    def _spawn_delete(self, refs: list[str]) -> None:
        assert self.vector is not None
        self._track(
            asyncio.get_running_loop().create_task(self.vector.delete(refs)), "dropping stale vector rows"
        )

    def _track(self, task: asyncio.Task[None], what: str) -> None:
        """Keep a background task referenced until done, and log its failure."""
        self._pending.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._pending.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                log.warning("memory: %s failed: %s", what, finished.exception())

        task.add_done_callback(done)

    async def drain(self) -> None:
        """Wait for background index work (tests, shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)


async def _nothing() -> dict[str, float]:
    return {}


def _scope_selected(query: MemoryQuery, scope_id: str) -> bool:
    """Whether `query.scopes` (scope types or full ids; None = all) selects this scope."""
    if query.scopes is None:
        return True
    if scope_id in query.scopes:
        return True
    try:
        return MemoryScope.scope_type(scope_id) in query.scopes
    except ValueError:
        return False
