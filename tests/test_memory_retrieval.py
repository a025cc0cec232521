"""Recall over memory scopes on a real redis-server and a real (in-process) Chroma: filter then
rank, verification against Redis, index catch-up across processes, reindex, relevance fusion."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import chromadb
import numpy as np
import pytest
from chromadb.config import Settings as ChromaSettings

from colony.blackboard import Blackboard, create_redis
from colony.blackboard.protocol import MemoryProtocol
from colony.config import BlackboardSettings, ColonySettings, MemorySettings
from colony.memory.index import ChromaVectorIndex, collection_name, ref_of
from colony.memory.keyword import tokenize
from colony.memory.ranking import (
    KEYWORD_HALF,
    fuse,
    keyword_score,
    mode_weights,
    recency,
    stream_id_after,
    unranked_relevance,
)
from colony.memory.retrieval import MemoryRetriever
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import MemoryQuery, NewMemory, TagFilter

# -- fusion (pure) ---------------------------------------------------------------------------------


def test_fusion_is_bounded_weighted_and_recency_only_scales_down() -> None:
    assert fuse(1.0, 1.0, 1.0, wv=0.7, wk=0.3, wr=0.2) == pytest.approx(1.0)
    assert fuse(-0.4, 0.0, 1.0, wv=0.7, wk=0.3, wr=0.2) == 0.0  # negative cosine counts as 0
    assert fuse(0.5, 0.0, 1.0, wv=0.7, wk=0.3, wr=0.2) == pytest.approx(0.35)
    assert fuse(0.0, 0.5, 1.0, wv=0.7, wk=0.3, wr=0.2) == pytest.approx(0.15)
    assert fuse(0.5, 0.0, 1.0, wv=1.0, wk=0.0, wr=0.2) == pytest.approx(0.5)
    # a very old entry loses at most wr of its relevance
    assert fuse(0.8, 0.0, 0.0, wv=1.0, wk=0.0, wr=0.2) == pytest.approx(0.8 * 0.8)
    assert fuse(0.8, 0.4, 0.5, wv=0.7, wk=0.3, wr=0.2) == pytest.approx((0.56 + 0.12) * 0.9)
    assert fuse(0.3, 0.3, 1.0, wv=0.0, wk=0.0, wr=0.0) == 0.0


def test_keyword_score_saturates_and_recency_halves() -> None:
    assert keyword_score(0.0) == 0.0
    assert keyword_score(KEYWORD_HALF) == pytest.approx(0.5)
    assert keyword_score(100 * KEYWORD_HALF) < 1.0
    assert keyword_score(2.0) < keyword_score(4.0) < keyword_score(8.0)
    assert recency(0.0, 100.0) == 1.0
    assert recency(100.0, 100.0) == pytest.approx(0.5)
    assert recency(300.0, 100.0) == pytest.approx(0.125)
    assert recency(-5.0, 100.0) == 1.0  # clock skew never boosts
    assert unranked_relevance(0.8, 0.5) == pytest.approx(0.4)


def test_mode_weights_and_stream_ids() -> None:
    memory = MemorySettings()
    assert mode_weights("hybrid", memory) == (0.85, 0.15)
    assert mode_weights("vector", memory) == (1.0, 0.0)
    assert mode_weights("keyword", memory) == (0.0, 1.0)
    assert mode_weights("hybrid", memory, vector_available=False) == (0.0, 1.0)
    assert stream_id_after("1700000000000-1", "1700000000000-0")
    assert stream_id_after("1700000000001-0", "1700000000000-9")
    assert not stream_id_after("999-0", "1000-0")  # numeric, not string, order
    assert stream_id_after("5-0", None)


# -- fixtures --------------------------------------------------------------------------------------


class HashEmbedder:
    """Bag of stemmed words hashed into 384 dims: deterministic and fast; texts sharing more words
    are nearer. (The real model is used where meaning matters: test_min_relevance_*)."""

    calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        HashEmbedder.calls += 1
        out = np.zeros((len(texts), 384), dtype=np.float32)
        out[:, 0] = 0.05  # never a zero vector
        for row, text in enumerate(texts):
            for token in tokenize(text):
                out[row, 1 + int(hashlib.sha1(token.encode()).hexdigest()[:8], 16) % 383] += 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
def settings(tmp_path: Path) -> ColonySettings:
    return ColonySettings(data_dir=tmp_path)


@pytest.fixture
async def store(bb: Blackboard, settings: ColonySettings) -> MemoryStore:
    return MemoryStore(bb, settings)


@pytest.fixture
async def other_store(redis_url: str, settings: ColonySettings) -> AsyncIterator[MemoryStore]:
    """A MemoryStore of "another process": its own Redis client on the same server."""
    client = create_redis(redis_url, BlackboardSettings())
    yield MemoryStore(Blackboard(client, "test:other", settings=BlackboardSettings()), settings)
    await client.aclose()


@pytest.fixture(scope="module")
def chroma() -> Any:
    return chromadb.EphemeralClient(settings=ChromaSettings(anonymized_telemetry=False))


def new_index(chroma: Any, embedder: Any = None) -> ChromaVectorIndex:
    return ChromaVectorIndex(chroma, embedder or HashEmbedder(), f"t{uuid.uuid4().hex[:12]}-memory")


@pytest.fixture
def vector(chroma: Any) -> ChromaVectorIndex:
    return new_index(chroma)


@pytest.fixture
def scope() -> str:
    return MemoryScope.agent_ltm_semantic(f"a{uuid.uuid4().hex[:10]}")


async def chroma_has(index: ChromaVectorIndex, *refs: str) -> set[str]:
    coll = await index._coll()
    return set(coll.get(ids=list(refs), include=[])["ids"])


async def write(store: MemoryStore, scope: str, text: str, **fields: Any) -> str:
    outcome = await store.write(scope, NewMemory(content=text, **fields))
    assert outcome.created
    return outcome.entry.entry_id


# -- filter then rank ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["hybrid", "vector", "keyword"])
async def test_filter_then_rank_returns_only_passing_entries_best_first(
    store: MemoryStore, vector: ChromaVectorIndex, settings: ColonySettings, scope: str, mode: str
) -> None:
    """Hundreds of entries nearer to the query fail the tag filter: the best passing one comes first."""
    noise = [NewMemory(content=f"redis password rotation {n}", tags=frozenset({"noise"})) for n in range(300)]
    await store.write_many(scope, noise)
    best = await write(store, scope, "the redis cluster password rotation happened", tags=frozenset({"keep"}))
    weaker = await write(store, scope, "redis cache warmup finished", tags=frozenset({"keep"}))
    await write(store, scope, "lunch menu for tuesday", tags=frozenset({"keep"}))
    await write(store, scope, "quarterly budget review", tags=frozenset({"keep", "finance"}))
    retriever = MemoryRetriever(store, vector, settings=settings)
    await retriever.sync(scope)  # index everything (a recall embeds only a few lagging entries itself)

    q = MemoryQuery(query="redis password rotation", mode=mode, max_results=3)  # type: ignore[arg-type]
    unfiltered = await retriever.recall(q, [scope])
    # unfiltered, the noise is nearer
    assert all("noise" in r.entry.tags for r in unfiltered), [(r.entry.content, r.scores) for r in unfiltered]

    kept = MemoryQuery(
        query="redis password rotation",
        mode=mode,  # type: ignore[arg-type]
        tag_filter=TagFilter(all_of={"keep"}, none_of={"finance"}),
        max_results=3,
    )
    found = await retriever.recall(kept, [scope])
    assert found and all("keep" in r.entry.tags and "finance" not in r.entry.tags for r in found)
    assert found[0].entry.entry_id == best
    if mode != "vector":  # the keyword ranker only returns entries sharing a word
        assert [r.entry.entry_id for r in found[:2]] == [best, weaker]
    assert [r.relevance for r in found] == sorted((r.relevance for r in found), reverse=True)
    assert set(found[0].scores) == {"vector", "keyword", "recency"}
    assert 0 < found[0].relevance <= 1


async def test_dense_filter_excluding_the_nearest_entries(
    store: MemoryStore, vector: ChromaVectorIndex, settings: ColonySettings, scope: str
) -> None:
    """A filter passing most entries (searched without naming them) still never leaks the
    excluded ones, even when they are the nearest."""
    await store.write_many(
        scope,
        [NewMemory(content=f"deploy checklist step {n}", tags=frozenset({"hide"})) for n in range(10)]
        + [
            NewMemory(content=f"deploy notes {n} about other things", tags=frozenset({"ok"}))
            for n in range(90)
        ],
    )
    retriever = MemoryRetriever(store, vector, settings=settings)
    q = MemoryQuery(query="deploy checklist step", tag_filter=TagFilter(none_of={"hide"}), max_results=20)
    found = await retriever.recall(q, [scope])
    assert len(found) == 20 and all(r.entry.tags == {"ok"} for r in found)
    pattern = MemoryQuery(query="deploy checklist step", key_pattern="zz*", max_results=5)
    assert await retriever.recall(pattern, [scope]) == []


async def test_recall_without_text_ranks_by_importance_and_age(
    store: MemoryStore, vector: ChromaVectorIndex, settings: ColonySettings, scope: str
) -> None:
    low = await write(store, scope, "low importance", importance=0.1)
    high = await write(store, scope, "high importance", importance=0.9)
    mid = await write(store, scope, "middling", importance=0.5)
    retriever = MemoryRetriever(store, vector, settings=settings)
    found = await retriever.recall(MemoryQuery(max_results=10), [scope])
    assert [r.entry.entry_id for r in found] == [high, mid, low]
    assert found[0].relevance == pytest.approx(0.9, abs=0.01)
    assert (await retriever.recall(MemoryQuery(max_results=2), [scope]))[-1].entry.entry_id == mid
    # many entries: the best are picked without ranking every one, and they are the same
    await store.write_many(
        scope, [NewMemory(content=f"note {n}", importance=(n * 37 % 100) / 100) for n in range(100)]
    )
    found = await retriever.recall(MemoryQuery(max_results=5), [scope])
    assert [r.entry.importance for r in found] == [0.99, 0.98, 0.97, 0.96, 0.95]
    assert [r.relevance for r in found] == sorted((r.relevance for r in found), reverse=True)
    # a scope selection by type that does not match selects nothing
    assert await retriever.recall(MemoryQuery(scopes=["working"]), [scope]) == []
    every = await retriever.recall(MemoryQuery(scopes=["ltm:semantic"], max_results=200), [scope])
    assert len(every) == settings.memory.max_recall_results == 100  # 103 held; the cap applies


# -- Redis is the truth ----------------------------------------------------------------------------


async def test_entries_gone_from_redis_are_never_returned_and_are_dropped(
    store: MemoryStore, vector: ChromaVectorIndex, settings: ColonySettings, scope: str
) -> None:
    keep = await write(store, scope, "the blue whale is the largest animal")
    vanished = await write(store, scope, "the blue whale sings at night")
    short = await write(store, scope, "the blue whale migrates south", ttl_seconds=1)
    retriever = MemoryRetriever(store, vector, settings=settings)
    q = MemoryQuery(query="blue whale", max_results=10)
    assert {r.entry.entry_id for r in await retriever.recall(q, [scope])} == {keep, vanished, short}
    refs = [ref_of(scope, i) for i in (keep, vanished, short)]
    assert await chroma_has(vector, *refs) == set(refs)

    # deleted behind every index's back: no event, so Chroma and the mirror still hold it
    board = store.board(scope)
    await board.redis.delete(board.keyspace.entry_key(MemoryProtocol.entry_key(vanished)))
    await asyncio.sleep(1.2)  # `short` expires
    for mode in ("hybrid", "vector", "keyword"):
        found = await retriever.recall(q.model_copy(update={"mode": mode}), [scope])
        assert [r.entry.entry_id for r in found] == [keep], mode
    await retriever.drain()
    assert await chroma_has(vector, *refs) == {ref_of(scope, keep)}
    assert (scope, vanished) not in retriever.keyword and (scope, short) not in retriever.keyword


async def test_an_entry_written_while_the_index_lagged_is_found_after_sync(
    store: MemoryStore,
    other_store: MemoryStore,
    vector: ChromaVectorIndex,
    settings: ColonySettings,
    scope: str,
) -> None:
    await write(store, scope, "penguins live in the southern hemisphere")
    retriever = MemoryRetriever(store, vector, settings=settings)
    await retriever.sync(scope)
    late = await write(other_store, scope, "the kiwi is a flightless bird of new zealand")
    assert not await chroma_has(vector, ref_of(scope, late))  # the index lags the write
    found = await retriever.recall(MemoryQuery(query="flightless kiwi bird", mode="vector"), [scope])
    assert found[0].entry.entry_id == late
    assert await chroma_has(vector, ref_of(scope, late))
    stored = await store.board(scope).read(MemoryProtocol.index_position_key())
    assert (stored is not None and stored.value["position"] == await store.latest_position(scope)) or (
        stream_id_after(await store.latest_position(scope), stored.value["position"])
    )
    # a delete is followed too (with its event)
    await other_store.delete(scope, [late])
    await retriever.sync(scope)
    assert not await chroma_has(vector, ref_of(scope, late))


async def test_reindex_rebuilds_a_scope_whose_rows_were_dropped(
    store: MemoryStore, chroma: Any, settings: ColonySettings, scope: str
) -> None:
    vector = new_index(chroma)
    ids = [
        await write(store, scope, f"fact {n}: the {w} is green")
        for n, w in enumerate(["frog", "leaf", "lime"])
    ]
    retriever = MemoryRetriever(store, vector, settings=settings)
    q = MemoryQuery(query="the lime is green", mode="vector")
    assert (await retriever.recall(q, [scope]))[0].entry.entry_id == ids[2]
    (await vector._coll()).delete(where={"scope": scope})  # Chroma lost the scope
    assert await retriever.recall(q, [scope]) == []  # the stored position says it is indexed
    assert await retriever.reindex(scope) == 3
    assert (await retriever.recall(q, [scope]))[0].entry.entry_id == ids[2]
    # a new collection (another generation) is noticed and filled without asking
    fresh = MemoryRetriever(store, new_index(chroma), settings=settings)
    assert (await fresh.recall(q, [scope]))[0].entry.entry_id == ids[2]


# -- another process's writes ----------------------------------------------------------------------


async def test_keyword_index_follows_another_process_and_rebuilds_after_truncation(
    store: MemoryStore, other_store: MemoryStore, settings: ColonySettings, scope: str
) -> None:
    retriever = MemoryRetriever(store, None, settings=settings)  # keyword only (no Chroma)
    q = MemoryQuery(query="zebra", mode="hybrid")
    assert await retriever.recall(q, [scope]) == []
    zebra = await write(other_store, scope, "the zebra migrates at dawn")
    assert [r.entry.entry_id for r in await retriever.recall(q, [scope])] == [zebra]
    await other_store.delete(scope, [zebra])
    assert await retriever.recall(q, [scope]) == []
    assert retriever.keyword.size(scope) == 0

    first = await write(other_store, scope, "the okapi hides in the forest")
    second = await write(other_store, scope, "the okapi has striped legs")
    await retriever.sync(scope)
    assert retriever.keyword.size(scope) == 2
    # meanwhile: a delete and a write whose events are trimmed away before this process reads them
    await other_store.delete(scope, [first])
    hidden = await write(other_store, scope, "the tapir eats fruit")
    board = other_store.board(scope)
    await board.redis.xtrim(board.keyspace.events_key, maxlen=0)
    after = await write(other_store, scope, "the tapir swims well")
    found = await retriever.recall(MemoryQuery(query="okapi tapir", mode="keyword"), [scope])
    assert {r.entry.entry_id for r in found} == {second, hidden, after}
    assert retriever.keyword.size(scope) == 3 and (scope, first) not in retriever.keyword


async def test_vector_index_rebuilds_after_truncation(
    store: MemoryStore,
    other_store: MemoryStore,
    vector: ChromaVectorIndex,
    settings: ColonySettings,
    scope: str,
) -> None:
    retriever = MemoryRetriever(store, vector, settings=settings)
    gone = await write(other_store, scope, "the heron stands in the shallows")
    await retriever.sync(scope)
    await other_store.delete(scope, [gone])
    hidden = await write(other_store, scope, "the ibis wades in the marsh")
    board = other_store.board(scope)
    await board.redis.xtrim(board.keyspace.events_key, maxlen=0)
    await write(other_store, scope, "an unrelated note about taxes")
    await retriever.sync(scope)
    assert await chroma_has(vector, ref_of(scope, hidden), ref_of(scope, gone)) == {ref_of(scope, hidden)}


# -- near duplicates -------------------------------------------------------------------------------


async def test_nearest_feeds_near_duplicate_dedup_at_write(
    store: MemoryStore, vector: ChromaVectorIndex, settings: ColonySettings, scope: str
) -> None:
    retriever = MemoryRetriever(store, vector, settings=settings)
    assert await retriever.nearest(scope, "anything") is None  # empty scope
    original = await write(store, scope, "Backups run nightly at two")
    entry_id, cosine = await retriever.nearest(scope, "backups run nightly at two") or ("", 0.0)
    assert entry_id == original and cosine == pytest.approx(1.0, abs=1e-5)
    # same words, other punctuation: not an exact (hash) duplicate, a near one
    outcome = await store.write(
        scope, NewMemory(content="Backups, run nightly: at two!"), similar=retriever.nearest
    )
    assert not outcome.created and outcome.duplicate_of == original
    other = await store.write(
        scope, NewMemory(content="Invoices are sent monthly"), similar=retriever.nearest
    )
    assert other.created


# -- meaning (the real embedder) -------------------------------------------------------------------

FACTS = [
    "The staging database password is rotated every Monday at 9am.",
    "Alice's favourite drink is green tea with honey.",
    "The office cafeteria closes at 3pm on Fridays.",
    "Photosynthesis converts sunlight into chemical energy in plants.",
    "The Eiffel Tower was completed in 1889 for the World's Fair.",
    "Our football team won the regional championship last season.",
    "Bananas are a good source of potassium.",
    "The printer on floor two jams when the paper tray is overfilled.",
]


@pytest.fixture(scope="module")
def real_embedder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from colony.memory.embedding import get_embedder

    cache = tmp_path_factory.mktemp("models")
    return get_embedder(ColonySettings(data_dir=cache))


async def test_min_relevance_keeps_a_paraphrase_and_drops_unrelated_entries(
    store: MemoryStore, chroma: Any, real_embedder: Any, settings: ColonySettings, scope: str
) -> None:
    ids = [await write(store, scope, fact) for fact in FACTS]
    retriever = MemoryRetriever(store, new_index(chroma, real_embedder), settings=settings)
    question = "When do the credentials of the test DB get changed?"
    ranked = await retriever.recall(MemoryQuery(query=question, max_results=len(FACTS)), [scope])
    assert ranked[0].entry.entry_id == ids[0]
    assert ranked[0].relevance > 0.3
    # no fact shares a word with the question: the keyword ranker abstains (cosine alone ranks)
    assert ranked[0].scores["keyword"] == 0.0
    assert ranked[0].relevance == pytest.approx(ranked[0].scores["vector"], abs=1e-3)
    assert all(r.relevance < 0.3 for r in ranked[1:]), [(r.entry.content, r.relevance) for r in ranked]
    assert ranked[0].relevance - ranked[1].relevance > 0.1
    kept = await retriever.recall(MemoryQuery(query=question, min_relevance=0.3), [scope])
    assert [r.entry.entry_id for r in kept] == [ids[0]]
    drink = await retriever.recall(
        MemoryQuery(query="What does Alice like to drink?", min_relevance=0.3), [scope]
    )
    assert [r.entry.entry_id for r in drink] == [ids[1]]
    assert (
        await retriever.recall(
            MemoryQuery(query="quantum chromodynamics lattice", min_relevance=0.3), [scope]
        )
        == []
    )


def test_collection_names_are_checked() -> None:
    assert collection_name(MemorySettings(), "default", "main") == "colony-default-main-memory-v2"
    with pytest.raises(ValueError, match="collection name"):
        collection_name(MemorySettings(), "bad/tenant", "main")


async def test_a_delete_and_rewrite_of_one_id_between_syncs_keeps_the_new_entry(
    store: MemoryStore,
    other_store: MemoryStore,
    vector: ChromaVectorIndex,
    settings: ColonySettings,
    scope: str,
) -> None:
    """One change batch holds both a delete and a re-write of the same id: what Redis holds wins."""
    retriever = MemoryRetriever(store, vector, settings=settings)
    await other_store.write(scope, NewMemory(content="the lighthouse is painted red", entry_id="beacon"))
    await retriever.sync(scope)
    await other_store.delete(scope, ["beacon"])
    await other_store.write(scope, NewMemory(content="the lighthouse is painted white", entry_id="beacon"))
    await retriever.sync(scope)
    assert (scope, "beacon") in retriever.keyword
    assert await chroma_has(vector, ref_of(scope, "beacon")) == {ref_of(scope, "beacon")}
    found = await retriever.recall(MemoryQuery(query="white lighthouse", mode="keyword"), [scope])
    assert [r.entry.content for r in found] == ["the lighthouse is painted white"]


async def test_a_lost_collection_degrades_to_keywords_then_is_rebuilt(
    store: MemoryStore, chroma: Any, settings: ColonySettings, scope: str
) -> None:
    """Chroma losing the collection (server wiped, collection dropped) never fails a recall: it
    ranks by keywords, and the next recall finds the new collection and refills it from Redis."""
    vector = new_index(chroma)
    retriever = MemoryRetriever(store, vector, settings=settings)
    owl = await write(store, scope, "the snowy owl hunts lemmings")
    await write(store, scope, "the barn owl nests in lofts")
    q = MemoryQuery(query="snowy owl lemmings")
    assert (await retriever.recall(q, [scope]))[0].entry.entry_id == owl
    chroma.delete_collection(vector.name)
    degraded = await retriever.recall(q, [scope])
    assert degraded[0].entry.entry_id == owl and degraded[0].scores["vector"] == 0.0
    recovered = await retriever.recall(q.model_copy(update={"mode": "vector"}), [scope])
    assert recovered[0].entry.entry_id == owl and recovered[0].scores["vector"] > 0.5


# -- over a real Chroma server, as replicas use it -----------------------------------------------------


async def test_two_replicas_share_one_chroma_server(
    tmp_path: Path, store: MemoryStore, other_store: MemoryStore, scope: str
) -> None:
    """Two retrievers (two replicas: their own Redis clients and keyword indexes) on one `chroma
    run` server: one's writes are indexed by the other's recall, a selective filter still finds
    its best match over HTTP, and the index position in Redis is shared (no re-embedding)."""
    from colony.blackboard.redis_server import free_port
    from colony.config import ChromaServerSettings
    from colony.memory.chroma_server import EmbeddedChroma, chroma_client

    settings = ColonySettings(
        data_dir=tmp_path,
        memory=MemorySettings(chroma=ChromaServerSettings(port=free_port(), start_timeout_seconds=60)),
    )
    server = EmbeddedChroma(tmp_path, settings.memory.chroma)
    server.start()
    try:
        name = f"t{uuid.uuid4().hex[:12]}-memory"
        first = MemoryRetriever(
            store, ChromaVectorIndex(chroma_client(settings), HashEmbedder(), name), settings=settings
        )
        second = MemoryRetriever(
            other_store, ChromaVectorIndex(chroma_client(settings), HashEmbedder(), name), settings=settings
        )
        await store.write_many(
            scope,
            [
                NewMemory(content=f"glacier ice core sample {n}", tags=frozenset({"noise"}))
                for n in range(200)
            ],
        )
        wanted = await write(
            other_store, scope, "the glacier ice core was drilled in 1998", tags=frozenset({"keep"})
        )
        await write(other_store, scope, "a glacier hike", tags=frozenset({"keep"}))
        await first.sync(scope)
        q = MemoryQuery(query="glacier ice core sample", tag_filter=TagFilter(all_of={"keep"}), mode="vector")
        found = await first.recall(q, [scope])
        assert found[0].entry.entry_id == wanted and all("keep" in r.entry.tags for r in found)
        calls = HashEmbedder.calls
        found = await second.recall(q, [scope])  # the first replica indexed everything already
        assert found[0].entry.entry_id == wanted
        assert HashEmbedder.calls == calls + 1  # only the query was embedded
        await store.delete(scope, [wanted])
        assert all(r.entry.entry_id != wanted for r in await second.recall(q, [scope]))
        assert not await chroma_has(second.vector, ref_of(scope, wanted))  # type: ignore[arg-type]
    finally:
        server.stop()


async def test_a_recall_never_waits_for_a_large_backlog(
    store: MemoryStore,
    chroma: Any,
    settings: ColonySettings,
    scope: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recall embeds a few lagging entries itself; a larger backlog (or a whole scope to index)
    goes to a background task, and the recall ranks by what is indexed plus keywords meanwhile."""
    from colony.memory import retrieval

    class SlowEmbedder(HashEmbedder):
        """Entries embed slowly (queries do not): the background work is still running while
        the recalls below rank."""

        def embed(self, texts: Sequence[str]) -> np.ndarray:
            if any(t.startswith(("moth species", "a beetle", "a cricket")) for t in texts):
                time.sleep(1.0)
            return super().embed(texts)

    monkeypatch.setattr(retrieval, "INLINE_EMBED", 3)
    vector = new_index(chroma, SlowEmbedder())
    retriever = MemoryRetriever(store, vector, settings=settings)
    await store.write_many(scope, [NewMemory(content=f"moth species {n} flies at night") for n in range(10)])
    q = MemoryQuery(query="moth species flies", max_results=10)
    found = await retriever.recall(q, [scope])  # 10 to index > 3: not now
    assert len(found) == 10 and all(r.scores["vector"] == 0.0 for r in found)  # keywords found them
    await retriever.drain()
    refs = [ref_of(scope, r.entry.entry_id) for r in found]
    assert await chroma_has(vector, *refs) == set(refs)  # the background task indexed them
    few = [await write(store, scope, f"a beetle note {n}") for n in range(2)]
    await retriever.recall(MemoryQuery(query="beetle"), [scope])  # 2 lagging <= 3: embedded inline
    assert await chroma_has(vector, *(ref_of(scope, i) for i in few)) == {ref_of(scope, i) for i in few}
    many = [await write(store, scope, f"a cricket note {n}") for n in range(5)]
    # 5 lagging > 3: not embedded by this recall, yet found by their words
    crickets = await retriever.recall(MemoryQuery(query="cricket note 4"), [scope])
    best_words = max(crickets, key=lambda r: r.scores["keyword"])
    assert best_words.entry.entry_id == many[4] and best_words.scores["vector"] == 0.0
    assert crickets[0].entry.content.startswith("a beetle")  # embedded: ranked by meaning too
    await retriever.drain()
    assert await chroma_has(vector, *(ref_of(scope, i) for i in many)) == {ref_of(scope, i) for i in many}
    await retriever.sync(scope)  # an explicit sync always catches up fully


# -- sentence rows (issue 36), found by the attacking review ---------------------------------------


async def test_a_rewritten_id_keeps_no_rows_of_its_old_text(
    store: MemoryStore, chroma: Any, settings: ColonySettings, scope: str
) -> None:
    vector = new_index(chroma)
    retriever = MemoryRetriever(store, vector, settings=settings)
    old = "Alpha bravo charlie delta echo. Foxtrot golf hotel india juliet. Kilo lima mike november oscar."
    await store.write(scope, NewMemory(content=old, entry_id="note-1"))
    await retriever.sync(scope)
    await store.delete(scope, ["note-1"], created_by="t")
    await store.write(scope, NewMemory(content="Papa quebec romeo sierra tango", entry_id="note-1"))
    await retriever.sync(scope)  # one batch: note-1 deleted and written again
    coll = await vector._coll()
    assert coll.get(where={"ref": ref_of(scope, "note-1")}, include=[])["ids"] == [ref_of(scope, "note-1")]
    hits = await retriever.recall(
        MemoryQuery(query="foxtrot golf hotel india juliet", mode="vector"), [scope]
    )
    assert all(h.scores["vector"] < 0.9 for h in hits)  # the deleted text is not found in the new one


async def test_a_short_fact_is_no_duplicate_of_a_longer_entry_holding_it(
    store: MemoryStore, chroma: Any, settings: ColonySettings, scope: str
) -> None:
    vector = new_index(chroma)
    retriever = MemoryRetriever(store, vector, settings=settings)
    turn = "The user's locker code is 7291. The user swims there on weekday mornings before work."
    await store.write(scope, NewMemory(content=turn, ttl_seconds=3600, tags=frozenset({"turn"})))
    await retriever.sync(scope)
    fact = NewMemory(content="The user's locker code is 7291.", tags=frozenset({"fact"}))
    written = await store.write(scope, fact, similar=retriever.nearest)
    assert written.created and written.entry.content == fact.content


class SlowVector:
    """A vector index whose search takes a Chroma round trip, scoring every candidate alike."""

    async def generation(self) -> str:
        return "g"

    async def embed_query(self, text: str) -> np.ndarray:
        return np.ones(4, dtype=np.float32)

    async def upsert(self, entries: Any) -> None:
        return None

    async def delete(self, refs: Any) -> None:
        return None

    async def drop_scope(self, scope_id: str) -> None:
        return None

    async def search(
        self, vector: Any, candidates: Any, n: int, *, whole_texts: bool = False
    ) -> dict[str, float]:
        await asyncio.sleep(0.3)
        return {ref: 0.9 for ref in list(candidates)[:n]}

    async def similarities(self, vector: Any, refs: Any, *, whole_texts: bool = False) -> dict[str, float]:
        return {ref: 0.9 for ref in refs}


async def test_a_recall_keeps_its_scopes_mirrors_while_others_recall_new_scopes(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a recall waiting on the vector search returned nothing when recalls of
    other scopes evicted its mirror meanwhile (the process's bound on mirrored scopes)."""
    import colony.memory.mirror as mirror_module

    monkeypatch.setattr(mirror_module, "MAX_MIRRORED_SCOPES", 2)  # (512 in a busy replica)
    store = MemoryStore(bb, ColonySettings())
    retriever = MemoryRetriever(store, SlowVector())
    scopes = [MemoryScope.agent_working(f"a{uuid.uuid4().hex[:10]}") for _ in range(3)]
    for scope in scopes:
        await store.write(scope, NewMemory(content="The deploy key is in vault A"))
    query = MemoryQuery(query="deploy key vault")

    async def later(scope: str) -> list[Any]:
        await asyncio.sleep(0.1)
        return await retriever.recall(query, [scope])

    found = await asyncio.gather(retriever.recall(query, [scopes[0]]), later(scopes[1]), later(scopes[2]))
    assert [len(f) for f in found] == [1, 1, 1]
