"""Memory recall over the real stack: ingestion, index catch-up, and Recall@1/@5 with latency for
keyword-only, vector-only and hybrid ranking, side by side in one run.

The data is benchmarks/memory_facts.py: generated facts and questions that paraphrase them (a
question shares only its subject's name with its fact), with hard negatives (the same subjects'
other facts) so a name alone does not find the answer. Per size (default 1,000 and 10,000 entries,
the same questions at each):

(a) ingestion: `MemoryStore.write_many` into one scope (entries/s, no model consolidation), beside
    a bare `Blackboard.write_many` of the same entries (what the store adds: dedup reads, hash keys);
(b) index catch-up: `MemoryRetriever.sync` (the keyword mirror, then embedding every entry into
    Chroma), reported separately, beside the bare embedder on the same texts;
(c) recall: every question asked in each mode (interleaved, so all see the same machine load):
    Recall@1, Recall@5 and p50/p99 latency of `MemoryRetriever.recall` (which includes its catch-up
    check against Redis, the query embedding, Chroma and verification of the hits in Redis). Each
    question is new to each mode's retriever: no timed recall reuses a cached query embedding.

Goals (issue #15): hybrid Recall@5 >= 0.9; recall p50 <= 50 ms at 10k entries on 2 cores;
ingestion >= 500 entries/s. Usage:
    python benchmarks/memory_recall.py [--sizes 1000,10000] [--questions 500] [--batch 500]
        [--redis-url URL] [--chroma-url URL] [--json]
Without --redis-url / --chroma-url an embedded redis-server and Chroma server are started in a
temporary directory (the way `colony up` starts them) and stopped at the end. Everything is local:
the embedder is the packaged all-MiniLM-L6-v2; nothing is downloaded. OMP_NUM_THREADS defaults to 1
(as in a Ray replica); set it to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# One BLAS thread unless told otherwise, set before numpy loads: what a Ray replica gets (Ray sets
# OMP_NUM_THREADS to the CPUs assigned to a worker, 1 when none are) and what .ci/run sets. On a
# busy 2-core machine two BLAS threads made one query embedding ~25x slower (they wait on each
# other); the setting in force is printed with the figures.
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import memory_facts as facts

from colony.blackboard import Blackboard, create_redis
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, ColonySettings
from colony.memory.chroma_server import EmbeddedChroma, client_settings
from colony.memory.embedding import get_embedder
from colony.memory.index import ChromaVectorIndex
from colony.memory.keyword import KeywordIndex, tokenize
from colony.memory.retrieval import MemoryRetriever
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import MemoryQuery, NewMemory

MODES = ("keyword", "vector", "hybrid")
GOAL_RECALL_AT_5 = 0.9
GOAL_P50_MS = 50.0
GOAL_P50_AT = 10_000
GOAL_INGEST_PER_S = 500.0
BLAS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
EMBED_BASELINE_SAMPLE = 1000  # texts the bare embedder is timed on (its rate does not depend on size)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _progress(message: str) -> None:
    """Where a long run is (stderr, so --json output stays one document)."""
    print(f"[memory_recall] {message}", file=sys.stderr, flush=True)


def tokenizer_overlap(data: facts.Dataset) -> float:
    """Fraction of questions sharing a keyword-index token (colony.memory.keyword.tokenize) with
    their fact, the subject's name excluded: what the keyword ranker could match on besides names."""
    texts = {f.fact_id: f.text for f in data.entries}
    shared = 0
    for q in data.questions:
        name = set(tokenize(q.subject))
        if (set(tokenize(q.text)) - name) & (set(tokenize(texts[q.answer_id])) - name):
            shared += 1
    return shared / max(1, len(data.questions))


async def ingest(
    store: MemoryStore, board: Blackboard, scope_id: str, data: facts.Dataset, batch: int
) -> dict[str, float]:
    """(a): the store's write_many, then a bare blackboard write_many of the same values."""
    memories = [
        NewMemory(content=f.text, entry_id=f.fact_id, tags=frozenset({"bench", f"kind:{f.kind}"}))
        for f in data.entries
    ]
    started = time.perf_counter()
    created = 0
    for start in range(0, len(memories), batch):
        outcomes = await store.write_many(scope_id, memories[start : start + batch], created_by="bench")
        created += sum(o.created for o in outcomes)
    store_s = time.perf_counter() - started
    if created != len(memories):
        raise RuntimeError(f"ingestion created {created} of {len(memories)} entries")
    raw = board.scoped(f"{board.scope_id}:raw")
    values = [{"content": m.content, "entry_id": m.entry_id, "tags": sorted(m.tags)} for m in memories]
    started = time.perf_counter()
    for start in range(0, len(values), batch):
        await raw.write_many(
            {"key": f"raw:{v['entry_id']}", "value": v, "tags": ["bench"], "created_by": "bench"}
            for v in values[start : start + batch]
        )
    raw_s = time.perf_counter() - started
    return {
        "entries": len(memories),
        "batch": batch,
        "store_write_many_per_s": len(memories) / store_s,
        "store_seconds": store_s,
        "blackboard_write_many_per_s": len(memories) / raw_s,
    }


async def catch_up(
    store: MemoryStore, retriever: MemoryRetriever, scope_id: str, data: facts.Dataset
) -> dict:
    """(b): keyword mirror alone (a vector-less retriever), then the full sync (mirror + embedding
    every entry into Chroma); the bare embedder on a sample of the same texts as the baseline."""
    started = time.perf_counter()
    await MemoryRetriever(store, None, KeywordIndex(), store.settings).sync(scope_id)
    keyword_s = time.perf_counter() - started
    started = time.perf_counter()
    await retriever.sync(scope_id)
    total_s = time.perf_counter() - started
    vector_s = max(1e-9, total_s - keyword_s)
    embedder = get_embedder(store.settings)
    sample = [f.text for f in data.entries[:EMBED_BASELINE_SAMPLE]]
    started = time.perf_counter()
    await asyncio.to_thread(embedder.embed, sample)
    bare_s = time.perf_counter() - started
    return {
        "keyword_seconds": keyword_s,
        "total_seconds": total_s,
        "vector_per_s": len(data.entries) / vector_s,
        "bare_embed_per_s": len(sample) / bare_s,
    }


async def recall(
    retrievers: dict[str, MemoryRetriever], scope_id: str, data: facts.Dataset
) -> dict[str, dict]:
    """(c): every question in every mode, interleaved. Each mode has its own retriever and vector
    index object (one Chroma collection): the index remembers recent query embeddings, and a mode
    must not be timed on an embedding another mode just computed. Each retriever first answers a
    few warm-up queries that are not questions (untimed; its keyword mirror is built then)."""
    for mode, retriever in retrievers.items():
        for n in range(3):
            await retriever.recall(
                MemoryQuery(query=f"warm-up query {n}", max_results=5, mode=mode), [scope_id]
            )
    hits1 = dict.fromkeys(MODES, 0)
    hits5 = dict.fromkeys(MODES, 0)
    latencies: dict[str, list[float]] = {m: [] for m in MODES}
    misses: dict[str, dict[str, int]] = {m: {} for m in MODES}  # relation -> questions missed at 5
    for q in data.questions:
        for mode in MODES:
            query = MemoryQuery(query=q.text, max_results=5, mode=mode)
            started = time.perf_counter()
            found = await retrievers[mode].recall(query, [scope_id])
            latencies[mode].append(time.perf_counter() - started)
            ids = [r.entry.entry_id for r in found]
            hits1[mode] += ids[:1] == [q.answer_id]
            hits5[mode] += q.answer_id in ids[:5]
            if q.answer_id not in ids[:5]:
                misses[mode][q.relation] = misses[mode].get(q.relation, 0) + 1
    n = max(1, len(data.questions))
    return {
        mode: {
            "recall_at_1": hits1[mode] / n,
            "recall_at_5": hits5[mode] / n,
            "p50_ms": _percentile(latencies[mode], 0.50) * 1000,
            "p99_ms": _percentile(latencies[mode], 0.99) * 1000,
            "mean_ms": statistics.fmean(latencies[mode]) * 1000 if latencies[mode] else float("nan"),
            "misses_at_5_by_relation": dict(sorted(misses[mode].items(), key=lambda kv: (-kv[1], kv[0]))),
        }
        for mode in MODES
    }


async def run_size(
    size: int, args: argparse.Namespace, redis_url: str, chroma: Any, settings: ColonySettings
) -> dict:
    data = facts.dataset(size, args.questions, args.seed)
    bb_settings = BlackboardSettings(events_maxlen=max(100_000, size * 4))
    client = create_redis(redis_url, bb_settings)
    tag = uuid.uuid4().hex[:10]
    board = Blackboard(client, f"bench:{tag}", settings=bb_settings)
    store = MemoryStore(board, settings)
    scope_id = MemoryScope.agent_ltm_semantic(f"bench-{tag}", colony_id=f"bench{tag}")
    collection = f"bench-{tag}-memory"
    retrievers = {
        mode: MemoryRetriever(
            store, ChromaVectorIndex(chroma, get_embedder(settings), collection), KeywordIndex(), settings
        )
        for mode in MODES
    }
    try:
        result: dict[str, Any] = {"size": len(data.entries), "questions": len(data.questions)}
        _progress(f"{size} entries: ingesting")
        result["ingestion"] = await ingest(store, board, scope_id, data, args.batch)
        _progress(f"{size} entries: catching the indexes up (embedding every entry)")
        result["catch_up"] = await catch_up(store, retrievers["hybrid"], scope_id, data)
        _progress(f"{size} entries: {result['catch_up']['total_seconds']:.0f} s; recalling")
        load_before = os.getloadavg()[0]
        result["recall"] = await recall(retrievers, scope_id, data)
        # the machine's load while recalling (1-minute averages): latency on a shared box is only
        # comparable between runs at similar load
        result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        return result
    finally:
        for retriever in retrievers.values():
            await retriever.drain()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(chroma.delete_collection, collection)
        await client.aclose()


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """The Redis and Chroma URLs to use: those given, else embedded servers in a temp dir."""
    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        redis_server = chroma_server = None
        try:
            redis_url = args.redis_url
            if redis_url is None:
                redis_server = EmbeddedRedis(Path(tmp) / "data")
                redis_url = redis_server.start().url
            chroma_url = args.chroma_url
            if chroma_url is None:
                chroma_server = EmbeddedChroma(Path(tmp) / "data")
                chroma_url = chroma_server.start().url
            yield redis_url, chroma_url
        finally:
            if chroma_server is not None:
                chroma_server.stop()
            if redis_server is not None:
                redis_server.stop()


def http_client(url: str) -> Any:
    import chromadb

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SystemExit(f"--chroma-url {url!r} is not an http(s)://host:port URL")
    ssl = parts.scheme == "https"
    return chromadb.HttpClient(
        host=parts.hostname, port=parts.port or (443 if ssl else 80), ssl=ssl, settings=client_settings()
    )


async def main(args: argparse.Namespace) -> dict:
    sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    data = facts.dataset(max(sizes), args.questions, args.seed)
    quality = facts.overlap_report(data)
    report: dict[str, Any] = {
        "cpus": os.cpu_count(),
        # the embedder's BLAS threads (see the top of the module)
        "blas_threads_env": {k: os.environ.get(k) for k in BLAS_ENV},
        "questions": len(data.questions),
        "relations": len({q.relation for q in data.questions}),
        "overlap_fraction": quality["fraction"],
        "overlap_fraction_keyword_tokens": tokenizer_overlap(data),
        "goals": {
            "hybrid_recall_at_5": GOAL_RECALL_AT_5,
            "p50_ms_at": [GOAL_P50_MS, GOAL_P50_AT],
            "ingest_per_s": GOAL_INGEST_PER_S,
        },
        "sizes": [],
    }
    with tempfile.TemporaryDirectory(prefix="memory-bench-models-") as models:
        settings = ColonySettings(data_dir=Path(models))
        if args.model_dir:
            settings.memory.embedder_cache_dir = Path(args.model_dir)
        started = time.perf_counter()
        get_embedder(settings)
        report["embedder_load_seconds"] = time.perf_counter() - started
        with servers(args) as (redis_url, chroma_url):
            chroma = http_client(chroma_url)
            for size in sizes:
                report["sizes"].append(await run_size(size, args, redis_url, chroma, settings))
    return report


def _mark(ok: bool) -> str:
    return "met" if ok else "NOT met"


def print_report(report: dict) -> None:
    goals = report["goals"]
    print(
        f"memory recall benchmark: {report['questions']} paraphrased questions over "
        f"{report['relations']} relations, {report['cpus']} CPUs"
    )
    print(
        f"    questions sharing a content word with their fact (name excluded): "
        f"{report['overlap_fraction']:.1%} (generator's words), "
        f"{report['overlap_fraction_keyword_tokens']:.1%} (keyword index tokens)"
    )
    threads = ", ".join(f"{k}={v or 'unset'}" for k, v in report["blas_threads_env"].items())
    print(f"    embedder load {report['embedder_load_seconds']:.1f} s; {threads}")
    for result in report["sizes"]:
        size, ing, cat, rec = result["size"], result["ingestion"], result["catch_up"], result["recall"]
        print(f"--- {size} entries")
        print(f"(a) ingestion, batches of {ing['batch']}")
        print(f"    Blackboard.write_many   {ing['blackboard_write_many_per_s']:9.0f} entries/s   (baseline)")
        print(
            f"    MemoryStore.write_many  {ing['store_write_many_per_s']:9.0f} entries/s   "
            f"goal >= {goals['ingest_per_s']:.0f}: "
            f"{_mark(ing['store_write_many_per_s'] >= goals['ingest_per_s'])}"
        )
        print("(b) index catch-up (MemoryRetriever.sync)")
        print(f"    keyword mirror          {cat['keyword_seconds']:9.2f} s")
        print(
            f"    keyword + vector        {cat['total_seconds']:9.2f} s   "
            f"embedding into Chroma {cat['vector_per_s']:.0f} entries/s "
            f"(bare embedder {cat['bare_embed_per_s']:.0f} texts/s)"
        )
        load = result.get("load_average", [float("nan")] * 2)
        print(
            f"(c) recall of {result['questions']} questions, max_results 5 "
            f"(load average {load[0]:.1f} -> {load[1]:.1f} on {report['cpus']} CPUs)"
        )
        print(f"    {'mode':8}  {'R@1':>6}  {'R@5':>6}  {'p50 ms':>8}  {'p99 ms':>8}")
        for mode in MODES:
            r = rec[mode]
            label = "(baseline)" if mode != "hybrid" else ""
            print(
                f"    {mode:8}  {r['recall_at_1']:6.3f}  {r['recall_at_5']:6.3f}  "
                f"{r['p50_ms']:8.1f}  {r['p99_ms']:8.1f}  {label}"
            )
        hybrid = rec["hybrid"]
        worst = list(hybrid.get("misses_at_5_by_relation", {}).items())[:6]
        if worst:
            print("    hybrid misses at 5, by relation: " + ", ".join(f"{r} {k}" for r, k in worst))
        print(
            f"    goal hybrid R@5 >= {goals['hybrid_recall_at_5']}: "
            f"{_mark(hybrid['recall_at_5'] >= goals['hybrid_recall_at_5'])}"
        )
        p50_goal, p50_at = goals["p50_ms_at"]
        if size >= p50_at:
            print(
                f"    goal p50 <= {p50_goal:.0f} ms at {p50_at} entries: "
                f"{_mark(hybrid['p50_ms'] <= p50_goal)}"
            )
        else:
            print(
                f"    goal p50 <= {p50_goal:.0f} ms applies at {p50_at} entries "
                f"(here {hybrid['p50_ms']:.1f} ms)"
            )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000,10000", help="entries per run, comma separated")
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--batch", type=int, default=500, help="entries per write_many call")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--chroma-url", default=None)
    parser.add_argument("--model-dir", default=None, help="where the model is unpacked (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    return parser.parse_args(argv)


def cli(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    report = asyncio.run(main(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return report


if __name__ == "__main__":
    cli()
