"""How recall turns a cosine, a BM25 score and an age into one relevance in [0, 1].

Pure functions, so the fusion can be tested and reasoned about without Redis or Chroma:

    relevance = (wv * max(0, cos) + wk * kw) / (wv + wk) * (1 - wr + wr * recency)
    kw        = bm25 / (bm25 + KEYWORD_HALF)          (saturating: 0 -> 0, KEYWORD_HALF -> 0.5)
    recency   = 0.5 ** (age / half_life)

Why this shape: a reciprocal-rank fusion would rank well but gives no absolute scale, and
`min_relevance` needs one (an entry unrelated to the query must score low whatever else is in the
scope). Cosine is absolute already (MiniLM puts unrelated text near 0.0-0.2, paraphrases at
0.5-0.9); BM25 is not (it grows with query length and idf), so it is squashed by a constant about
the score of one distinctive shared term. Recency only scales relevance down by at most `wr`, so
an old but exact answer still beats a fresh unrelated one.

When no candidate shares a word with the query, the keyword ranker abstains (the recall ranks by
cosine alone, wk = 0): otherwise a pure paraphrase, the case vectors exist for, would be capped at
wv x cosine (0.85 x 0.5 = 0.43 for a typical MiniLM paraphrase; 0.35 with a keyword weight of 0.3,
at the `min_relevance` line).
"""

from __future__ import annotations

from typing import Literal

from colony.config import MemorySettings

__all__ = [
    "KEYWORD_HALF",
    "fuse",
    "keyword_score",
    "mode_weights",
    "recency",
    "stream_id_after",
    "unranked_relevance",
]

# BM25 at which the keyword score is one half: about one distinctive term (idf ~3-5) in common
KEYWORD_HALF = 5.0

Mode = Literal["hybrid", "vector", "keyword"]


def keyword_score(bm25: float, half: float = KEYWORD_HALF) -> float:
    """BM25 squashed into [0, 1)."""
    return bm25 / (bm25 + half) if bm25 > 0 else 0.0


def recency(age_seconds: float, half_life_seconds: float) -> float:
    """1 for a fresh entry, 0.5 at one half-life, toward 0 after."""
    return 0.5 ** (max(0.0, age_seconds) / half_life_seconds)


def mode_weights(
    mode: Mode, settings: MemorySettings, *, vector_available: bool = True
) -> tuple[float, float]:
    """(vector weight, keyword weight) of a recall mode; hybrid without a vector index is keyword."""
    if mode == "keyword" or not vector_available:
        return 0.0, 1.0
    if mode == "vector":
        return 1.0, 0.0
    wv, wk = settings.vector_weight, settings.keyword_weight
    return (wv, wk) if wv + wk > 0 else (0.5, 0.5)


def fuse(cosine: float, keyword: float, recency_factor: float, *, wv: float, wk: float, wr: float) -> float:
    """The relevance of one entry, in [0, 1]."""
    total = wv + wk
    match = (wv * max(0.0, cosine) + wk * keyword) / total if total > 0 else 0.0
    return min(1.0, max(0.0, match * (1.0 - wr + wr * recency_factor)))


def unranked_relevance(decayed_importance: float, recency_factor: float) -> float:
    """Relevance of an entry when the query has no text: its decayed importance times recency."""
    return min(1.0, max(0.0, decayed_importance * recency_factor))


def _stream_id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms or 0), int(seq or 0)


def stream_id_after(candidate: str, current: str | None) -> bool:
    """Whether Redis stream id `candidate` is later than `current` (None or "0" = the start)."""
    if current is None:
        return True
    return _stream_id(candidate) > _stream_id(current)
