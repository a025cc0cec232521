"""The vector half of hybrid recall: embeddings of memory entries in a Chroma collection.

One collection per colony (`{prefix}-{tenant}-{colony}-memory-v{ROWS_VERSION}`, cosine space). An
entry has a row named `{scope_id}#{entry_id}` (its whole text) and, when it holds more than one
sentence, a row per sentence, `{scope_id}#{entry_id}@{n}` (`chunks_of`), each with metadata
`{"scope", "created_at", "ref"}` (`ref`: the entry's own row name). An entry scores the best cosine
of its rows: a question about one detail of a long, chatty entry (a user's multi-sentence turn)
meets the sentence that holds it, where the whole entry's embedding averages the detail away with
the rest (and MiniLM reads only its first 256 tokens). Chroma holds vectors only, never the text:
the entry lives in Redis, so a compromised or lost Chroma leaks nothing and changes only ranking
(recall verifies every hit against Redis and `reindex` rebuilds it). A collection of an earlier
row layout is left alone: the new name is a new generation, which catch-up fills from Redis.

Embeddings are always computed here, by the embedder we were given (the packaged local model), and
handed to Chroma explicitly: the collection has no embedding function, so Chroma never reaches for
its default one (which downloads a model at run time and fails offline).

Chroma's client is synchronous (HTTP or the in-process Rust bindings): every call runs in a worker
thread so an event loop serving other agents is never blocked on it.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from colony.config import MemorySettings
from colony.errors import InvalidArgument
from colony.memory.types import MemoryEntry

__all__ = [
    "ChromaVectorIndex",
    "Embedder",
    "VectorIndex",
    "chunks_of",
    "collection_name",
    "entry_of_row",
    "ref_of",
    "split_ref",
]

_COLLECTION_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{1,510}[a-zA-Z0-9]$")
# up to this many candidates, a search compares them directly (fetching 100 embeddings from a 10k
# collection takes ~3 ms, 300 ~25 ms); above, it asks for unfiltered nearest neighbours with room
# (10k rows: n=200 ~4 ms, n=1000 ~10 ms, n=5000 ~29 ms)
DIRECT_MAX = 128
UPSERT_BATCH = 256
T = TypeVar("T")
QUERY_CACHE = 256
ROWS_VERSION = 2  # the row layout (2: an entry's sentences have rows of their own)
MAX_CHUNKS = 32  # sentence rows of one entry, at most (the first ones)
MIN_CHUNK_WORDS = 4  # a shorter sentence joins the one after it
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_CHUNK = "@"  # between an entry's row name and a sentence's number (never in an entry id)


def ref_of(scope_id: str, entry_id: str) -> str:
    """The Chroma id of an entry."""
    return f"{scope_id}#{entry_id}"


def chunks_of(text: str) -> list[str]:
    """The sentences of `text` that get rows of their own, beside the whole text's: [] for a text
    of one sentence (its row is the whole). Sentences of fewer than MIN_CHUNK_WORDS words join
    the next; at most MAX_CHUNKS."""
    merged: list[str] = []
    for sentence in _SENTENCE_END.split(text.strip()):
        sentence = sentence.strip()
        if not sentence:
            continue
        if merged and len(merged[-1].split()) < MIN_CHUNK_WORDS:
            merged[-1] = f"{merged[-1]} {sentence}"
        else:
            merged.append(sentence)
    return merged[:MAX_CHUNKS] if len(merged) > 1 else []


def entry_of_row(row: str) -> str:
    """The entry's row name (`ref_of`) of a Chroma row id, a sentence's or the whole text's."""
    head, sep, tail = row.rpartition(_CHUNK)
    return head if sep and tail.isdigit() and "#" in head else row


def _best_by_entry(
    rows: Sequence[str], cosines: Sequence[float], whole_texts: bool = False
) -> dict[str, float]:
    """Each entry's best cosine over its rows (`whole_texts`: its whole text's row only)."""
    best: dict[str, float] = {}
    for row, cosine in zip(rows, cosines, strict=True):
        ref = entry_of_row(row)
        if whole_texts and ref != row:
            continue
        if cosine > best.get(ref, -2.0):
            best[ref] = cosine
    return best


def split_ref(ref: str) -> tuple[str, str]:
    """(scope_id, entry_id) of a Chroma id (entry ids never contain '#')."""
    scope_id, _, entry_id = ref.rpartition("#")
    return scope_id, entry_id


def collection_name(settings: MemorySettings, tenant_id: str, colony_id: str) -> str:
    """The Chroma collection of one colony's memory."""
    name = f"{settings.collection_prefix}-{tenant_id}-{colony_id}-memory-v{ROWS_VERSION}"
    if not _COLLECTION_NAME.match(name):
        raise InvalidArgument(
            f"Chroma collection name {name!r} is not valid (letters, digits, '.', '_', '-'; 3-512 "
            "characters): use a tenant and colony id made of those characters"
        )
    return name


@runtime_checkable
class Embedder(Protocol):
    """What the index needs of an embedder (colony.memory.embedding.LocalEmbedder is one)."""

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class VectorIndex(Protocol):
    """A derived, rebuildable index of entry embeddings, shared by every process of a colony."""

    async def generation(self) -> str:
        """Changes when the index is recreated (then stored index positions no longer apply)."""
        ...

    async def embed_query(self, text: str) -> np.ndarray: ...

    async def upsert(self, entries: Sequence[MemoryEntry]) -> None: ...

    async def delete(self, refs: Sequence[str]) -> None: ...

    async def drop_scope(self, scope_id: str) -> None: ...

    async def search(
        self, vector: np.ndarray, candidates: Collection[str], n: int, *, whole_texts: bool = False
    ) -> dict[str, float]:
        """Cosine similarity of the (up to) `n` candidates nearest to `vector`, by entry (its best
        row; `whole_texts`: its whole text's row only)."""
        ...

    async def similarities(
        self, vector: np.ndarray, refs: Collection[str], *, whole_texts: bool = False
    ) -> dict[str, float]:
        """Cosine similarity of exactly `refs` (those the index holds), as `search` scores them."""
        ...


class ChromaVectorIndex:
    """A VectorIndex on a chromadb client (HttpClient for a shared server, or an in-process one)."""

    def __init__(self, client: Any, embedder: Embedder, collection: str) -> None:
        if not _COLLECTION_NAME.match(collection):
            raise InvalidArgument(f"Chroma collection name {collection!r} is not valid")
        self.client = client
        self.embedder = embedder
        self.name = collection
        self._collection: Any = None
        self._lock = asyncio.Lock()
        self._count: tuple[float, int] | None = None
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()

    @classmethod
    def for_colony(
        cls, client: Any, embedder: Embedder, settings: MemorySettings, tenant_id: str, colony_id: str
    ) -> ChromaVectorIndex:
        return cls(client, embedder, collection_name(settings, tenant_id, colony_id))

    async def _coll(self) -> Any:
        if self._collection is None:
            async with self._lock:
                if self._collection is None:
                    self._collection = await asyncio.to_thread(
                        self.client.get_or_create_collection,
                        self.name,
                        embedding_function=None,
                        metadata={"hnsw:space": "cosine"},
                    )
        return self._collection

    async def _run(self, op: Callable[[Any], T]) -> T:
        """Run `op(collection)` in a worker thread; after a failure the collection is looked up
        again on the next call (it may have been recreated, or the server restarted empty)."""
        coll = await self._coll()
        try:
            return await asyncio.to_thread(op, coll)
        except Exception:
            self._collection = None
            raise

    async def generation(self) -> str:
        return str((await self._coll()).id)

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.asarray(self.embedder.embed(list(texts)), dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms > 0, norms, 1.0)

    async def embed_query(self, text: str) -> np.ndarray:
        """The embedding of a query (recently asked ones are remembered: lenses repeat theirs)."""
        cached = self._queries.get(text)
        if cached is not None:
            self._queries.move_to_end(text)
            return cached
        vector = (await asyncio.to_thread(self._embed, [text]))[0]
        self._queries[text] = vector
        while len(self._queries) > QUERY_CACHE:
            self._queries.popitem(last=False)
        return vector

    async def upsert(self, entries: Sequence[MemoryEntry]) -> None:
        """Embed and store entries, a row for the whole text and one per sentence (replacing rows
        of the same id; an entry's text never changes, so neither do its rows)."""
        rows: list[tuple[str, str, dict[str, Any]]] = []
        for entry in entries:
            ref = ref_of(entry.scope_id, entry.entry_id)
            meta = {"scope": entry.scope_id, "created_at": float(entry.created_at), "ref": ref}
            rows.append((ref, entry.content, meta))
            rows += [(f"{ref}{_CHUNK}{n}", text, meta) for n, text in enumerate(chunks_of(entry.content), 1)]
        for start in range(0, len(rows), UPSERT_BATCH):
            batch = rows[start : start + UPSERT_BATCH]
            vectors = await asyncio.to_thread(self._embed, [text for _, text, _ in batch])
            ids = [row for row, _, _ in batch]
            metadatas = [meta for _, _, meta in batch]
            await self._run(lambda c: c.upsert(ids=ids, embeddings=vectors, metadatas=metadatas))  # noqa: B023
        self._count = None

    async def delete(self, refs: Sequence[str]) -> None:
        """Delete entries' rows, their sentences' too (UPSERT_BATCH entries a call: a filter
        naming thousands of ids is slow to build and match)."""
        for start in range(0, len(refs), UPSERT_BATCH):
            where = {"ref": {"$in": list(refs[start : start + UPSERT_BATCH])}}
            await self._run(lambda c: c.delete(where=where))  # noqa: B023
            self._count = None

    async def drop_scope(self, scope_id: str) -> None:
        await self._run(lambda c: c.delete(where={"scope": scope_id}))
        self._count = None

    async def count(self) -> int:
        """Rows in the collection (cached a few seconds: it only sizes a search's first try)."""
        now = asyncio.get_running_loop().time()
        if self._count is None or now - self._count[0] > 5.0:
            self._count = (now, int(await self._run(lambda c: c.count())))
        return self._count[1]

    async def _query(self, vector: np.ndarray, n: int, whole_texts: bool) -> tuple[dict[str, float], int]:
        """The entries of the `n` rows nearest to `vector` (each at its best row), and how many rows
        came back (fewer than `n`: the whole collection was read)."""
        reply = await self._run(
            lambda c: c.query(query_embeddings=[vector], n_results=max(1, n), include=["distances"])
        )
        found_ids = reply["ids"][0] if reply["ids"] else []
        distances = reply["distances"][0] if reply.get("distances") else []
        return _best_by_entry(found_ids, [1.0 - float(d) for d in distances], whole_texts), len(found_ids)

    async def search(
        self, vector: np.ndarray, candidates: Collection[str], n: int, *, whole_texts: bool = False
    ) -> dict[str, float]:
        """The `n` candidates nearest to `vector`, exact with respect to the candidate set (an entry
        at its best row; `whole_texts`: at its whole text's row, as a near-duplicate check wants).

        Chroma's own filtered search (`ids=` or `where=` on a query) is not used: on chromadb 1.5
        its HNSW search drops most allowed rows when the filter is selective (3 allowed of 300 rows
        returned 1), so a filter would silently lose the best match. Instead: a few candidates are
        compared directly (their embeddings fetched); otherwise the unfiltered nearest neighbours
        are asked for with head room for the filter's share, and the room grows until it holds `n`
        candidates (then no candidate outside it can be nearer) or the whole collection."""
        if not candidates or n <= 0:
            return {}
        want = min(n, len(candidates))
        if len(candidates) <= DIRECT_MAX:
            found = await self.similarities(vector, candidates, whole_texts=whole_texts)
            return dict(sorted(found.items(), key=lambda kv: kv[1], reverse=True)[:want])
        total = await self.count()
        share = min(1.0, len(candidates) / total) if total else 1.0
        room = max(n * 4, math.ceil(n / share * 2))
        while True:
            hits, read = await self._query(vector, room, whole_texts)
            kept = {ref: cos for ref, cos in hits.items() if ref in candidates}
            if len(kept) >= want or read < room:  # enough, or the whole collection was read
                return dict(sorted(kept.items(), key=lambda kv: kv[1], reverse=True)[:want])
            room *= 4

    async def similarities(
        self, vector: np.ndarray, refs: Collection[str], *, whole_texts: bool = False
    ) -> dict[str, float]:
        """Each entry's best cosine over its rows (the whole text's and its sentences'; with
        `whole_texts`, the whole text's alone)."""
        if not refs:
            return {}
        where = {"ref": {"$in": list(refs)}}
        got = await self._run(lambda c: c.get(where=where, include=["embeddings"]))
        embeddings = got.get("embeddings")
        if embeddings is None or not len(got["ids"]):
            return {}
        matrix = np.asarray(embeddings, dtype=np.float32)
        norms = np.linalg.norm(matrix, axis=1)
        cosines = matrix @ vector / np.where(norms > 0, norms, 1.0)
        return _best_by_entry(got["ids"], [float(c) for c in cosines], whole_texts)
