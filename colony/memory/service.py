"""One memory service per process and Redis: the store plus the recall pipeline.

The embedding model loads once per process and the keyword index is kept per process, so every
capability, the HTTP API and the CLI of one process share them. The vector index is the Chroma
server named by the settings (the same for every replica); when it cannot be reached, recall falls
back to keyword + recency ranking and says so in the log (never silently different results: the
`scores` of each recalled entry show which parts ranked it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

from colony import metrics
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.memory.store import MemoryStore
from colony.memory.types import MemoryQuery, RecalledEntry

log = logging.getLogger(__name__)
_SAFE_NAME = re.compile(r"[a-zA-Z0-9_-]{1,40}")
VECTOR_RETRY_SECONDS = 30.0


def collection_name(settings: ColonySettings) -> str:
    """The Chroma collection of a colony's memory (ids that are not plain names are hashed)."""

    def part(value: str) -> str:
        return value if _SAFE_NAME.fullmatch(value) else hashlib.sha256(value.encode()).hexdigest()[:16]

    from colony.memory.index import ROWS_VERSION  # (numpy and Chroma load only when an index is built)

    tenant, colony = part(settings.tenant_id), part(settings.colony_id)
    return f"{settings.memory.collection_prefix}-{tenant}-{colony}-memory-v{ROWS_VERSION}"


class MemoryService:
    """Store + retriever on one Redis client; build with `memory_service()`."""

    def __init__(self, board: Blackboard, settings: ColonySettings, *, vector: bool = True) -> None:
        self.settings = settings
        self.store = MemoryStore(board, settings)
        self._want_vector = vector
        self._retriever: Any = None
        self._lock = asyncio.Lock()
        self.vector_error: str | None = None
        self._vector_failed_at = 0.0

    async def retriever(self) -> Any:
        """The recall pipeline, built on first use (loads the embedder, connects to Chroma). A
        vector index that could not be reached is tried again `VECTOR_RETRY_SECONDS` later (a
        restarted Chroma server is used again without restarting this process)."""
        if self._retriever is not None:
            if (
                self._retriever.vector is None
                and self._want_vector
                and time.monotonic() - self._vector_failed_at > VECTOR_RETRY_SECONDS
            ):
                async with self._lock:
                    if self._retriever.vector is None:
                        self._retriever.vector = await self._vector_index()
            return self._retriever
        async with self._lock:
            if self._retriever is None:
                from colony.memory.keyword import KeywordIndex
                from colony.memory.retrieval import MemoryRetriever

                vector = await self._vector_index() if self._want_vector else None
                self._retriever = MemoryRetriever(self.store, vector, KeywordIndex(), self.settings)
        return self._retriever

    async def _vector_index(self) -> Any:
        from colony.memory.chroma_server import chroma_client
        from colony.memory.embedding import get_embedder
        from colony.memory.index import ChromaVectorIndex

        def build() -> Any:
            client = chroma_client(self.settings)
            return ChromaVectorIndex(client, get_embedder(self.settings), collection_name(self.settings))

        try:
            index = await asyncio.to_thread(build)
        except Exception as exc:
            self._vector_failed_at = time.monotonic()
            self.vector_error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "memory: no vector index (%s); recall ranks by keywords and recency only until the "
                "index answers again (retried every %.0f s). Start Chroma (`colony up` does) or set "
                "memory.chroma_url.",
                self.vector_error,
                VECTOR_RETRY_SECONDS,
            )
            return None
        self.vector_error = None
        return index

    async def recall(
        self, query: MemoryQuery, scope_ids: Sequence[str], *, distinct: bool = True
    ) -> list[RecalledEntry]:
        """Ranked entries of `scope_ids`; `distinct` keeps one entry per content (a fact copied
        down the hierarchy, working -> stm -> ltm, shows once, at its best relevance)."""
        retriever = await self.retriever()
        started = time.perf_counter()
        try:
            if not distinct or len(scope_ids) < 2:
                return list(await retriever.recall(query, list(scope_ids)))
            wider = query.model_copy(update={"max_results": min(query.max_results * 3, 1000)})
            seen: set[str] = set()
            out: list[RecalledEntry] = []
            for item in await retriever.recall(wider, list(scope_ids)):
                digest = item.entry.content_hash or item.entry.ref
                if digest not in seen:
                    seen.add(digest)
                    out.append(item)
            return out[: query.max_results]
        finally:
            metrics.MEMORY_RECALL_SECONDS.labels(query.mode).observe(time.perf_counter() - started)

    async def reindex(self, scope_id: str) -> int:
        return int(await (await self.retriever()).reindex(scope_id))

    async def sync(self, scope_id: str) -> None:
        await (await self.retriever()).sync(scope_id)

    async def forget_scopes(self, scope_ids: Sequence[str]) -> None:
        """Drop the scopes' rows from the vector index (their agent is deleted for good: its
        entries are gone from Redis already). Without loading the embedder: a process that never
        recalled (the API's) only needs the Chroma client. Nothing to do without a collection."""
        if not self._want_vector:
            return
        if self._retriever is not None and self._retriever.vector is not None:
            for scope_id in scope_ids:
                await self._retriever.vector.drop_scope(scope_id)
            return
        from colony.memory.chroma_server import chroma_client

        def drop() -> None:
            client = chroma_client(self.settings)
            try:
                collection = client.get_collection(collection_name(self.settings))
            except Exception:  # no collection: nothing was ever indexed in this colony
                return
            for scope_id in scope_ids:
                collection.delete(where={"scope": scope_id})

        await asyncio.to_thread(drop)

    async def nearest(self, scope_id: str, text: str) -> tuple[str, float] | None:
        retriever = await self.retriever()
        return await retriever.nearest(scope_id, text)


_services: dict[tuple[int, str, str, int], MemoryService] = {}
MAX_SERVICES = 16


def memory_service(board: Blackboard, settings: ColonySettings) -> MemoryService:
    """The process's MemoryService for this Redis client and colony (created on first use)."""
    key = (id(board.redis), settings.tenant_id, settings.colony_id, id(settings))
    service = _services.get(key)
    if service is None or service.store._root.redis is not board.redis or service.settings is not settings:
        service = MemoryService(board, settings)
        _services[key] = service
        while len(_services) > MAX_SERVICES:  # clients come and go (tests, CLI): keep the newest
            _services.pop(next(iter(_services)))
    return service
