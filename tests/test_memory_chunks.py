"""Issue 36, deliverable 1: an entry of several sentences is embedded by sentence too, and scores
the best cosine of its rows, so a question about one detail of a long, chatty entry meets the
sentence that holds it. Real embedder (the packaged MiniLM), Chroma in process."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import chromadb
import numpy as np
import pytest
from chromadb.config import Settings as ChromaSettings

from colony.config import ColonySettings
from colony.memory.embedding import get_embedder
from colony.memory.index import (
    MAX_CHUNKS,
    ChromaVectorIndex,
    chunks_of,
    entry_of_row,
    ref_of,
)
from colony.memory.types import MemoryEntry

SCOPE = "tenant:t:colony:c:agent:a:mem:ltm:episodic"
TURN = (
    "Morning! Sorry, long week. The kids had a bake sale on Tuesday and I ended up making four "
    "trays of brownies. Anyway, the reason I'm writing: my sister's wedding moved to the 14th of "
    "June, in Porto, so I need to rebook the flights. Also the dog finally learned to sit."
)
QUESTION = "When and where is my sister getting married?"


def test_sentences_get_rows_and_short_ones_join_the_next() -> None:
    assert chunks_of("One plain sentence about the weather today.") == []
    assert chunks_of("") == []
    parts = chunks_of(TURN)
    assert len(parts) == 4 and parts[0] == "Morning! Sorry, long week."  # "Morning!" joined the next
    assert any("14th of June, in Porto" in p for p in parts)
    assert chunks_of("First line of notes here\nsecond line of notes here") == [
        "First line of notes here",
        "second line of notes here",
    ]
    many = " ".join(f"Sentence number {n} is here." for n in range(100))
    assert len(chunks_of(many)) == MAX_CHUNKS  # bounded


def test_rows_map_back_to_their_entry() -> None:
    ref = ref_of(SCOPE, "e-1.x")
    assert entry_of_row(ref) == ref
    assert entry_of_row(f"{ref}@3") == ref
    assert entry_of_row("scope@x#entry") == "scope@x#entry"  # an '@' before the entry id is the scope's


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> ChromaVectorIndex:
    embedder = get_embedder(ColonySettings(data_dir=Path(tmp_path_factory.mktemp("embedder"))))
    chroma: Any = chromadb.EphemeralClient(settings=ChromaSettings(anonymized_telemetry=False))
    return ChromaVectorIndex(chroma, embedder, f"t{uuid.uuid4().hex[:12]}-memory-v2")


def _entry(entry_id: str, content: str) -> MemoryEntry:
    return MemoryEntry(scope_id=SCOPE, entry_id=entry_id, content=content, created_at=time.time())


async def test_a_detail_of_a_long_entry_is_found_by_its_sentence(index: ChromaVectorIndex) -> None:
    distractors = [
        _entry(f"d{n}", text)
        for n, text in enumerate(
            [
                "My brother's birthday party is next Saturday at the bowling alley.",
                "We are thinking about a trip to Lisbon in the autumn.",
                "The wedding cake place we liked closed down last year.",
                "I booked a dentist appointment for the 3rd of May.",
            ]
        )
    ]
    long_turn = _entry("turn", TURN)
    await index.upsert([*distractors, long_turn])
    refs = {ref_of(SCOPE, e.entry_id) for e in [*distractors, long_turn]}
    qv = await index.embed_query(QUESTION)
    whole = float(index._embed([TURN])[0] @ qv)

    found = await index.similarities(qv, refs)
    assert set(found) == refs  # one score per entry, never a sentence's row name
    turn_ref = ref_of(SCOPE, "turn")
    best_sentence = max(float(v @ qv) for v in index._embed(chunks_of(TURN)))
    assert found[turn_ref] == pytest.approx(max(whole, best_sentence), abs=1e-4)
    assert found[turn_ref] > whole + 0.05  # the sentence holds the detail better than the whole turn
    assert max(found, key=lambda r: found[r]) == turn_ref

    searched = await index.search(qv, refs, 3)  # the nearest-neighbour path, one result per entry
    assert next(iter(searched)) == turn_ref and len(searched) == 3
    assert all("@" not in ref.rpartition("#")[2] for ref in searched)

    await index.delete([turn_ref])  # the sentences' rows go with it
    coll = await index._coll()
    assert coll.get(where={"ref": turn_ref}, include=[])["ids"] == []
    assert turn_ref not in await index.similarities(qv, refs)
    left = coll.get(where={"scope": SCOPE}, include=["embeddings"])
    assert len(left["ids"]) == len(distractors) and np.asarray(left["embeddings"]).shape[1] == 384


async def test_deleting_many_entries_deletes_every_row_in_bounded_calls(
    index: ChromaVectorIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    from colony.memory import index as index_module

    monkeypatch.setattr(index_module, "UPSERT_BATCH", 16)
    scope = f"{SCOPE}:many{uuid.uuid4().hex[:6]}"
    entries = [
        MemoryEntry(
            scope_id=scope,
            entry_id=f"m{n}",
            content=f"Note {n} is here. It has two sentences.",
            created_at=0.0,
        )
        for n in range(50)
    ]
    await index.upsert(entries)
    coll = await index._coll()
    assert len(coll.get(where={"scope": scope}, include=[])["ids"]) == 150  # a whole row and 2 sentences each
    calls: list[int] = []
    run = index._run

    async def counted(op: Any) -> Any:
        calls.append(1)
        return await run(op)

    monkeypatch.setattr(index, "_run", counted)
    await index.delete([ref_of(scope, e.entry_id) for e in entries])
    assert len(calls) == 4  # 50 entries, 16 a call
    assert coll.get(where={"scope": scope}, include=[])["ids"] == []
