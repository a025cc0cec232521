"""The vector half of hybrid recall: embeddings of memory entries in a Chroma collection.

One collection per colony (`{prefix}-{tenant}-{colony}-memory`, cosine space), rows named
`{scope_id}#{entry_id}` with metadata `{"scope", "created_at"}`. Chroma holds vectors only, never
the text: the entry lives in Redis, so a compromised or lost Chroma leaks nothing and changes only
ranking (recall verifies every hit against Redis and `reindex` rebuilds it).

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

__all__ = ["ChromaVectorIndex", "Embedder", "VectorIndex", "collection_name", "ref_of", "split_ref"]

_COLLECTION_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{1,510}[a-zA-Z0-9]$")
# up to this many candidates, a search compares them directly (fetching 100 embeddings from a 10k
# collection takes ~3 ms, 300 ~25 ms); above, it asks for unfiltered nearest neighbours with room
# (10k rows: n=200 ~4 ms, n=1000 ~10 ms, n=5000 ~29 ms)
DIRECT_MAX = 128
UPSERT_BATCH = 256
T = TypeVar("T")
QUERY_CACHE = 256


def ref_of(scope_id: str, entry_id: str) -> str:
    """The Chroma id of an entry."""
    return f"{scope_id}#{entry_id}"


def split_ref(ref: str) -> tuple[str, str]:
    """(scope_id, entry_id) of a Chroma id (entry ids never contain '#')."""
    scope_id, _, entry_id = ref.rpartition("#")
    return scope_id, entry_id


def collection_name(settings: MemorySettings, tenant_id: str, colony_id: str) -> str:
    """The Chroma collection of one colony's memory."""
    name = f"{settings.collection_prefix}-{tenant_id}-{colony_id}-memory"
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

    async def search(self, vector: np.ndarray, candidates: Collection[str], n: int) -> dict[str, float]:
        """Cosine similarity of the (up to) `n` candidates nearest to `vector`, by Chroma id."""
        ...

    async def similarities(self, vector: np.ndarray, refs: Collection[str]) -> dict[str, float]:
        """Cosine similarity of exactly `refs` (those the index holds)."""
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
        """Embed and store entries (replacing rows of the same id)."""
        for start in range(0, len(entries), UPSERT_BATCH):
            chunk = entries[start : start + UPSERT_BATCH]
            vectors = await asyncio.to_thread(self._embed, [e.content for e in chunk])
            ids = [ref_of(e.scope_id, e.entry_id) for e in chunk]
            metadatas = [{"scope": e.scope_id, "created_at": float(e.created_at)} for e in chunk]
            await self._run(lambda c: c.upsert(ids=ids, embeddings=vectors, metadatas=metadatas))  # noqa: B023
        self._count = None

    async def delete(self, refs: Sequence[str]) -> None:
        if refs:
            ids = list(refs)
            await self._run(lambda c: c.delete(ids=ids))
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

    async def _query(self, vector: np.ndarray, n: int) -> dict[str, float]:
        reply = await self._run(
            lambda c: c.query(query_embeddings=[vector], n_results=max(1, n), include=["distances"])
        )
        found_ids = reply["ids"][0] if reply["ids"] else []
        distances = reply["distances"][0] if reply.get("distances") else []
        return {ref: 1.0 - float(d) for ref, d in zip(found_ids, distances, strict=True)}

    async def search(self, vector: np.ndarray, candidates: Collection[str], n: int) -> dict[str, float]:
        """The `n` candidates nearest to `vector`, exact with respect to the candidate set.

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
            found = await self.similarities(vector, candidates)
            return dict(sorted(found.items(), key=lambda kv: kv[1], reverse=True)[:want])
        total = await self.count()
        share = min(1.0, len(candidates) / total) if total else 1.0
        room = max(n * 4, math.ceil(n / share * 2))
        while True:
            hits = await self._query(vector, room)
            kept = {ref: cos for ref, cos in hits.items() if ref in candidates}
            if len(kept) >= want or len(hits) < room:  # enough, or the whole collection was read
                return dict(sorted(kept.items(), key=lambda kv: kv[1], reverse=True)[:want])
            room *= 4

    async def similarities(self, vector: np.ndarray, refs: Collection[str]) -> dict[str, float]:
        if not refs:
            return {}
        ids = list(refs)
        got = await self._run(lambda c: c.get(ids=ids, include=["embeddings"]))
        embeddings = got.get("embeddings")
        if embeddings is None or not len(got["ids"]):
            return {}
        matrix = np.asarray(embeddings, dtype=np.float32)
        norms = np.linalg.norm(matrix, axis=1)
        cosines = matrix @ vector / np.where(norms > 0, norms, 1.0)
        return {ref: float(c) for ref, c in zip(got["ids"], cosines, strict=True)}
