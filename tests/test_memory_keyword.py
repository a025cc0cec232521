"""The BM25 keyword index of recall: tokens, scores against the formula, incremental updates,
per-scope statistics and candidate restriction."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from colony.memory.keyword import BM25_B, BM25_K1, KeywordIndex, tokenize


def bm25(query: str, doc: str, corpus: list[str]) -> float:
    """BM25 straight from its definition (Lucene's non-negative idf), for checking the index."""
    docs = [Counter(tokenize(d)) for d in corpus]
    avgdl = sum(sum(d.values()) for d in docs) / len(docs)
    terms = Counter(tokenize(doc))
    length = sum(terms.values())
    total = 0.0
    for term in set(tokenize(query)):
        df = sum(1 for d in docs if term in d)
        if not df or term not in terms:
            continue
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        tf = terms[term]
        total += idf * tf * (BM25_K1 + 1) / (tf + BM25_K1 * (1 - BM25_B + BM25_B * length / avgdl))
    return total


CORPUS = {
    "a": "The deploy pipeline failed because the Redis password was rotated",
    "b": "Deployments run every night; the pipeline deploys to staging first",
    "c": "Alice prefers tea over coffee in the morning",
    "d": "The staging cluster has three Redis replicas and one primary",
    "e": "Coffee machines on the third floor are broken",
}


def build(corpus: dict[str, str] = CORPUS, scope: str = "s") -> KeywordIndex:
    index = KeywordIndex()
    for doc_id, text in corpus.items():
        index.add(scope, doc_id, text)
    return index


def test_tokenize_lowercases_drops_stopwords_and_stems() -> None:
    assert tokenize("The Deploys were DEPLOYED while deploying!") == ["deploy", "deploy", "deploy"]
    assert tokenize("cities") == ["city"]
    assert tokenize("class glass status") == ["class", "glass", "status"]  # no over-stripping
    assert tokenize("the of and") == []
    assert tokenize("Tokyo-2024 café") == ["tokyo", "2024", "café"]


def test_scores_match_the_bm25_formula() -> None:
    index = build()
    corpus = list(CORPUS.values())
    for query in ("redis pipeline", "coffee", "staging redis replicas", "deploy"):
        got = dict(index.search("s", query))
        for doc_id, text in CORPUS.items():
            expected = bm25(query, text, corpus)
            if expected > 0:
                assert got[doc_id] == pytest.approx(expected, rel=1e-9), (query, doc_id)
            else:
                assert doc_id not in got


def test_rare_terms_weigh_more_and_best_match_comes_first() -> None:
    index = build()
    hits = index.search("s", "redis password")
    assert hits[0][0] == "a"  # holds both terms, "password" only here
    assert [d for d, _ in hits] == ["a", "d"]
    assert hits[0][1] > hits[1][1] > 0
    assert index.search("s", "unrelated words entirely") == []
    assert index.search("s", "the of") == []  # stopwords only
    assert index.search("other-scope", "redis") == []


def test_incremental_add_replace_and_remove_keep_statistics_exact() -> None:
    index = build()
    index.add("s", "f", "Redis Redis Redis everywhere")
    corpus = [*CORPUS.values(), "Redis Redis Redis everywhere"]
    assert dict(index.search("s", "redis"))["a"] == pytest.approx(bm25("redis", CORPUS["a"], corpus))
    # re-adding an id replaces its text (no double counting)
    index.add("s", "f", "tea")
    corpus[-1] = "tea"
    assert "f" not in dict(index.search("s", "redis"))
    assert dict(index.search("s", "redis"))["a"] == pytest.approx(bm25("redis", CORPUS["a"], corpus))
    assert index.remove("s", "f") is True
    assert index.remove("s", "f") is False
    assert index.size("s") == len(CORPUS)
    assert dict(index.search("s", "tea coffee")) == pytest.approx(
        {d: bm25("tea coffee", t, list(CORPUS.values())) for d, t in CORPUS.items() if d in ("c", "e")}
    )
    # removing every holder of a term forgets the term
    index.remove("s", "c")
    assert "c" not in dict(index.search("s", "alice"))
    assert index.search("s", "alice") == []
    index.clear("s")
    assert index.size("s") == 0 and index.search("s", "redis") == []


def test_document_statistics_are_per_scope() -> None:
    """A term common in one scope is not made rare (or common) by another scope."""
    index = build(scope="ops")
    for n in range(50):  # "redis" in every doc of another scope
        index.add("chatter", f"x{n}", f"redis note {n}")
    alone = build(scope="ops")
    assert dict(index.search("ops", "redis")) == pytest.approx(dict(alone.search("ops", "redis")))
    assert len(index.search("chatter", "redis")) == 50


def test_search_is_restricted_to_candidates_on_both_paths() -> None:
    index = KeywordIndex()
    for n in range(200):
        index.add("s", f"d{n}", f"redis cluster node {n} " + ("primary" if n % 2 else "replica"))
    full = dict(index.search("s", "redis primary"))
    small = {"d3", "d4", "d5"}  # few candidates: scored one by one
    assert dict(index.search("s", "redis primary", candidates=small)) == pytest.approx(
        {d: full[d] for d in small}
    )
    big = {f"d{n}" for n in range(0, 200, 3)}  # many: postings walked, candidates filtered
    got = dict(index.search("s", "redis primary", candidates=big, limit=500))
    assert got == pytest.approx({d: full[d] for d in big})
    top = index.search("s", "redis primary", candidates=big, limit=5)
    assert len(top) == 5 and all(d in big for d, _ in top)
    assert top[0][1] == max(got.values())
    assert index.search("s", "redis", candidates=set()) == []
    # exact scores of named entries (BM25 is a sum over terms); those sharing no term are absent
    redis_only = dict(index.search("s", "redis"))
    assert index.scores("s", "primary", {"d1", "d2", "missing"}) == pytest.approx(
        {"d1": full["d1"] - redis_only["d1"]}
    )
