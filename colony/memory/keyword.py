"""The keyword half of hybrid recall: an in-process BM25 index per memory scope.

Why in-process: BM25 over a few thousand short entries costs well under a millisecond in Python
and needs no server; the index is derived from Redis (the source of truth) and rebuilt from it when
a process starts or falls behind the scope's event stream, so it can never hold anything Redis does
not. Document statistics (document count, average length, document frequencies) are per scope, as
each scope is its own corpus: a term common in one agent's working memory is not made rare by the
rest of the colony.

Tokens are lowercase words without stopwords, lightly stemmed (plural and -ing/-ed suffixes) so
"deploys" matches "deployed"; the same function tokenises documents and queries, so the stemmer
only has to be consistent, not linguistically right.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable

__all__ = ["BM25_B", "BM25_K1", "KeywordIndex", "tokenize"]

BM25_K1 = 1.2
BM25_B = 0.75

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over
    own same she should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where which while who
    whom why will with would you your yours yourself yourselves""".split()  # noqa: SIM905
)


def _stem(word: str) -> str:
    """A light suffix stemmer: enough to join plural/singular and verb forms of one word."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 4 and word.endswith("ed"):
        return word[:-2]
    return word


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens of `text`, stopwords dropped, lightly stemmed."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


class _ScopeCorpus:
    """BM25 statistics of one scope: term frequencies per document and postings per term."""

    __slots__ = ("docs", "lengths", "postings", "total_length")

    def __init__(self) -> None:
        self.docs: dict[str, Counter[str]] = {}
        self.lengths: dict[str, int] = {}
        self.postings: dict[str, dict[str, int]] = {}
        self.total_length = 0

    def add(self, doc_id: str, text: str) -> None:
        self.remove(doc_id)
        terms = Counter(tokenize(text))
        self.docs[doc_id] = terms
        length = sum(terms.values())
        self.lengths[doc_id] = length
        self.total_length += length
        for term, tf in terms.items():
            self.postings.setdefault(term, {})[doc_id] = tf

    def remove(self, doc_id: str) -> bool:
        terms = self.docs.pop(doc_id, None)
        if terms is None:
            return False
        self.total_length -= self.lengths.pop(doc_id)
        for term in terms:
            posting = self.postings.get(term)
            if posting is not None:
                posting.pop(doc_id, None)
                if not posting:
                    del self.postings[term]
        return True

    def score(self, terms: Iterable[str], candidates: Collection[str] | None) -> dict[str, float]:
        """BM25 of every document (of `candidates`, if given) sharing a term with the query."""
        n = len(self.docs)
        if not n:
            return {}
        avgdl = self.total_length / n or 1.0
        norm_a = BM25_K1 * (1 - BM25_B)
        norm_b = BM25_K1 * BM25_B / avgdl
        weighted: list[tuple[float, dict[str, int]]] = []
        for term in set(terms):
            posting = self.postings.get(term)
            if posting:
                df = len(posting)
                weighted.append((math.log(1 + (n - df + 0.5) / (df + 0.5)), posting))
        if not weighted:
            return {}
        lengths = self.lengths
        scores: dict[str, float] = {}
        by_candidate = candidates is not None and len(candidates) * len(weighted) < sum(
            len(p) for _, p in weighted
        )
        if by_candidate:
            assert candidates is not None
            for doc_id in candidates:
                length = lengths.get(doc_id)
                if length is None:
                    continue
                total = 0.0
                for idf, posting in weighted:
                    tf = posting.get(doc_id)
                    if tf:
                        total += idf * tf * (BM25_K1 + 1) / (tf + norm_a + norm_b * length)
                if total > 0:
                    scores[doc_id] = total
            return scores
        for idf, posting in weighted:
            for doc_id, tf in posting.items():
                if candidates is not None and doc_id not in candidates:
                    continue
                part = idf * tf * (BM25_K1 + 1) / (tf + norm_a + norm_b * lengths[doc_id])
                scores[doc_id] = scores.get(doc_id, 0.0) + part
        return scores


class KeywordIndex:
    """BM25 (k1 1.2, b 0.75) over the entries of many scopes, one corpus per scope.

    Not thread-safe by itself: one asyncio loop uses it (every method is synchronous and short)."""

    def __init__(self) -> None:
        self._scopes: dict[str, _ScopeCorpus] = {}

    def add(self, scope_id: str, entry_id: str, text: str) -> None:
        """Index (or re-index) one entry."""
        self._scopes.setdefault(scope_id, _ScopeCorpus()).add(entry_id, text)

    def remove(self, scope_id: str, entry_id: str) -> bool:
        """Forget one entry; True if it was indexed."""
        corpus = self._scopes.get(scope_id)
        return corpus.remove(entry_id) if corpus is not None else False

    def clear(self, scope_id: str) -> None:
        """Forget a whole scope (before it is rebuilt from Redis)."""
        self._scopes.pop(scope_id, None)

    def size(self, scope_id: str) -> int:
        corpus = self._scopes.get(scope_id)
        return len(corpus.docs) if corpus is not None else 0

    def __contains__(self, ref: tuple[str, str]) -> bool:
        corpus = self._scopes.get(ref[0])
        return corpus is not None and ref[1] in corpus.docs

    def search(
        self,
        scope_id: str,
        query: str,
        *,
        candidates: Collection[str] | None = None,
        limit: int | None = None,
    ) -> list[tuple[str, float]]:
        """Entries of `scope_id` matching `query` by BM25, best first, as (entry_id, score > 0).

        `candidates` restricts the search to those entry ids (the survivors of a recall's logical
        filter): ranking happens among them only, never among entries the filter dropped."""
        corpus = self._scopes.get(scope_id)
        if corpus is None:
            return []
        scores = corpus.score(tokenize(query), candidates)
        if limit is None:
            return sorted(scores.items(), key=lambda item: item[1], reverse=True)
        return heapq.nlargest(limit, scores.items(), key=lambda item: item[1])

    def scores(self, scope_id: str, query: str, entry_ids: Collection[str]) -> dict[str, float]:
        """BM25 of exactly `entry_ids` (0 for those sharing no term): for fusing with vector hits."""
        corpus = self._scopes.get(scope_id)
        if corpus is None:
            return {}
        return corpus.score(tokenize(query), entry_ids)
