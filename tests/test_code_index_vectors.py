"""The code index's cosine (colony.context.code_index with an embedder): a definition whose gist is
near the question is scored beside those sharing a word with it, BM25 and cosine are weighed as
documented, `paths` bounds both, and without an embedder (or one that cannot load) the index
ranks by words alone. The real packaged MiniLM is used where the meaning matters."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from colony.config import ColonySettings
from colony.context import code_index
from colony.context.code_index import VECTOR_WEIGHT, CodeIndex
from colony.system import research_worker
from colony.system.research_worker import definition_embedder

FILES = {
    "term.py": [
        "def beep():",
        '    """Ring the terminal bell."""',
        "    print('\\a')",
        "",
        "def user_name(record):",
        '    """The name a record was written by."""',
        "    return record.owner",
    ],
    "colors.py": [
        "def blend(first, second):",
        '    """Mix two colours half and half."""',
        "    return first",
    ],
}


@pytest.fixture(scope="module")
def embed(tmp_path_factory: pytest.TempPathFactory) -> code_index.Embed:
    found = definition_embedder(ColonySettings(data_dir=Path(tmp_path_factory.mktemp("embedder"))))
    assert found is not None
    return found


def test_a_question_sharing_no_word_with_the_code_finds_it_by_meaning(embed: code_index.Embed) -> None:
    question = "How do I make a sound to alert someone at the console?"
    assert CodeIndex(FILES).search(question) == []  # no word in common: words alone find nothing
    hits = CodeIndex(FILES, embed=embed).search(question)
    assert hits and hits[0].definition.name == "beep"


def test_bm25_and_cosine_are_weighed_as_documented() -> None:
    """Score = (1 - w) x BM25 / best BM25 + w x cosine, with a stand-in embedder whose cosines are
    known: the definition sharing the question's words but far in meaning loses to a near one
    with half its BM25 only when the cosine gap outweighs it."""

    def fake(texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            near = "bell" in text or "sound" in text  # the question and beep's gist
            rows.append([1.0, 0.0] if near else [0.0, 1.0])
        return np.array(rows, dtype=np.float32)

    index = CodeIndex(FILES, embed=fake)
    by_words = {h.definition.name: h.score for h in CodeIndex(FILES).search("a name sound")}
    hits = {h.definition.name: h.score for h in index.search("a name sound")}
    assert set(by_words) == {"user_name"}
    assert hits["user_name"] == pytest.approx((1 - VECTOR_WEIGHT) * 1.0 + VECTOR_WEIGHT * 0.0)
    assert hits["beep"] == pytest.approx(VECTOR_WEIGHT * 1.0)
    assert "blend" not in hits  # cosine 0 and no word: scored 0, left out


def test_paths_bound_the_nearest_too(embed: code_index.Embed) -> None:
    index = CodeIndex(FILES, embed=embed)
    question = "How do I make a sound to alert someone at the console?"
    hits = index.search(question, paths=["colors.py"])
    assert hits and {h.definition.path for h in hits} == {"colors.py"}
    assert index.search(question, paths=[]) == []


def test_the_embedding_work_of_a_folder_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code_index, "MAX_EMBEDDED", 2)
    seen: list[int] = []

    def counting(texts: Sequence[str]) -> np.ndarray:
        seen.append(len(texts))
        return np.ones((len(texts), 2), dtype=np.float32) / np.sqrt(2)

    index = CodeIndex(FILES, embed=counting)
    assert seen[0] == 2 and index.vectors is not None and len(index.vectors) == 2
    names = {h.definition.name for h in index.search("Ring the bell of the user")}
    assert "user_name" in names and "beep" in names  # the unembedded one still ranks by its words


def test_an_embedder_that_cannot_load_leaves_the_index_to_words(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(settings: object) -> object:
        raise OSError("model package missing")

    monkeypatch.setattr(research_worker, "get_embedder", broken)
    assert definition_embedder(None) is None
    hits = CodeIndex(FILES, embed=definition_embedder(None)).search("the terminal bell")
    assert [h.definition.name for h in hits] == ["beep"]


def test_a_definition_past_the_bound_is_embedded_when_a_question_reaches_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A folder over MAX_EMBEDDED: a late file's definition that the question's words reach gets
    its cosine (embedded then, kept for the next search), so it is not ranked below an early one
    for want of a vector."""
    monkeypatch.setattr(code_index, "MAX_EMBEDDED", 1)  # only colors.py's `blend` at build
    calls: list[list[str]] = []

    def fake(texts: Sequence[str]) -> np.ndarray:
        calls.append(list(texts))
        return np.array([[1.0, 0.0] if "bell" in t else [0.0, 1.0] for t in texts], dtype=np.float32)

    index = CodeIndex(FILES, embed=fake)
    first = {h.definition.name: h.score for h in index.search("the bell")}
    assert first["beep"] == pytest.approx((1 - VECTOR_WEIGHT) + VECTOR_WEIGHT * 1.0)
    assert len(index.late) == 1 and len(calls) == 3  # build, question, the late definition
    index.search("the bell")
    assert len(calls) == 4  # the question only: the late vector was kept


def test_questions_are_cut_before_embedding_and_stop_words_alone_find_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lengths: list[int] = []

    def fake(texts: Sequence[str]) -> np.ndarray:
        lengths.extend(len(t) for t in texts)
        return np.ones((len(texts), 2), dtype=np.float32) / np.sqrt(2)

    index = CodeIndex(FILES, embed=fake)
    lengths.clear()
    index.search("bell " * 3000)
    assert lengths == [code_index.MAX_QUESTION_CHARS]
    assert index.search("What does this do?") == [] and index.search("???") == []


@pytest.mark.parametrize(
    "answer",
    [
        lambda texts: (_ for _ in ()).throw(MemoryError("no room")),  # raises
        lambda texts: np.ones((len(texts) + 1, 2), dtype=np.float32),  # a row too many
        lambda texts: np.ones(len(texts), dtype=np.float32),  # one dimension
        lambda texts: np.full((len(texts), 2), np.nan, dtype=np.float32),  # not finite
    ],
    ids=["raises", "extra-row", "flat", "nan"],
)
def test_an_embedder_that_fails_or_answers_wrongly_leaves_the_index_to_words(answer) -> None:
    words_alone = [(h.definition.name, h.score) for h in CodeIndex(FILES).search("the terminal bell")]
    built = CodeIndex(FILES, embed=answer)
    assert built.vectors is None
    assert [(h.definition.name, h.score) for h in built.search("the terminal bell")] == words_alone
    calls = 0

    def fails_on_the_question(texts: Sequence[str]) -> np.ndarray:
        nonlocal calls
        calls += 1
        return np.ones((len(texts), 2), dtype=np.float32) / np.sqrt(2) if calls == 1 else answer(texts)

    index = CodeIndex(FILES, embed=fails_on_the_question)
    assert index.vectors is not None
    assert [(h.definition.name, h.score) for h in index.search("the terminal bell")] == words_alone


def test_research_builds_its_index_with_the_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator's and the workers' index (research_worker.code_index) read the meaning too."""
    seen: list[object] = []

    def fake_embedder(settings: object) -> code_index.Embed:
        seen.append(settings)
        return lambda texts: np.ones((len(texts), 2), dtype=np.float32) / np.sqrt(2)

    monkeypatch.setattr(research_worker, "definition_embedder", fake_embedder)
    mapped = SimpleNamespace(files=FILES)
    index = asyncio.run(research_worker.code_index(mapped, {"term.py"}, None))  # type: ignore[arg-type]
    assert index.vectors is not None and seen == [None]
    assert {d.path for d in index.definitions} == {"term.py"}
