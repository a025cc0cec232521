"""Memory blocks on the real stack: append latency (library and HTTP), concurrent appends from many
writers, and stored bytes with and without shallow snapshots, each beside its baseline.

(a) library append: `BlockStore.append` on a real redis-server (load what changed, one Loro commit,
    one Lua append; the log folded into the snapshot every `compact_after_updates`), p50/p99, beside
    the bare Redis writes of the same text (RPUSH + HSET in one pipeline: what storing the edit
    without a CRDT document costs);
(b) HTTP append: `POST /v1/agents/{id}/blocks/{label}/append` through the real FastAPI app under
    uvicorn on a socket, p50/p99, beside `GET /health` on the same server (the HTTP floor);
(c) concurrency: 8 writers (each its own Redis client and BlockStore, as 8 replicas would be) append
    100 lines each at the same time to one shared block; the figure is how many of the 800 lines
    the block holds, beside the 800 sent;
(d) storage: 1,000 small edits (appends, with the oldest lines trimmed to keep the block near its
    limit) with history kept whole, and with shallow snapshots (`history_versions`), in bytes Redis
    holds, beside the final text and beside a whole-value history (every version stored in full,
    as a linear version table keeps it).

Goals (issue #16): 800/800 appends present; library append p50 <= 5 ms; stored size after 1,000
small edits <= 4x the final text + 64 KB. Usage:
    python benchmarks/blocks.py [--appends 500] [--edits 1000] [--writers 8] [--lines 100] [--json]
An embedded redis-server is started in a temporary directory and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colony.blackboard import create_redis
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlockSettings, ColonySettings, EmbeddedRedisSettings
from colony.memory.blocks import OPERATOR, BlockStore, NewBlock, SharedAccess
from tests.api_kit import BareApi

TOKEN = "bench-token"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def stats(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(ms), 3), "p99_ms": round(pct(ms, 0.99), 3), "n": len(ms)}


def settings_for(url: str, **blocks: Any) -> ColonySettings:
    return ColonySettings(redis_url=url, colony_id=f"bench{uuid.uuid4().hex[:8]}", blocks=blocks)


async def library_append(url: str, appends: int) -> dict[str, Any]:
    settings = settings_for(url)
    client = create_redis(url, settings.blackboard)
    store = BlockStore(client, settings)
    await store.create("bench", NewBlock(label="notes", char_limit=100_000))
    bare_key = f"bench-bare:{uuid.uuid4().hex}"
    lib, bare = [], []
    for i in range(appends):  # interleaved: both see the same machine load
        line = f"note {i}: the build on host-{i % 7} finished"
        t0 = time.perf_counter()
        await store.append("bench", "notes", line)
        lib.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        async with client.pipeline(transaction=True) as pipe:
            pipe.rpush(bare_key + ":log", line)
            pipe.hset(bare_key + ":meta", "updated_at", repr(time.time()))
            await pipe.execute()
        bare.append((time.perf_counter() - t0) * 1000)
    view = await store.read("bench", "notes")
    assert view.content.count("\n") == appends, "appends went missing"  # each line ends with a break
    await client.delete(bare_key + ":log", bare_key + ":meta")
    await client.aclose()
    return {"library": stats(lib), "baseline_bare_redis": stats(bare)}


def http_append(url: str, appends: int) -> dict[str, Any]:
    settings = settings_for(url)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with BareApi(settings, TOKEN) as server, httpx.Client(base_url=server.url, headers=headers) as http:
        # `bench` is no agent of this colony: its block is pre-provisioned (docs/blocks.md)
        made = http.post(
            "/v1/agents/bench/blocks?provision=true", json={"label": "notes", "char_limit": 100_000}
        )
        if made.status_code != 201:
            raise RuntimeError(f"creating the block answered {made.status_code}: {made.text[:300]}")
        api, floor = [], []
        for i in range(appends):
            t0 = time.perf_counter()
            answer = http.post("/v1/agents/bench/blocks/notes/append", json={"text": f"note {i}"})
            api.append((time.perf_counter() - t0) * 1000)
            if answer.status_code != 200:
                raise RuntimeError(f"append answered {answer.status_code}: {answer.text[:300]}")
            t0 = time.perf_counter()
            http.get("/health")
            floor.append((time.perf_counter() - t0) * 1000)
        content = http.get("/v1/agents/bench/blocks/notes").json()["content"]
        assert content.count("\n") == appends, "appends went missing"
    return {"http": stats(api), "baseline_http_health": stats(floor)}


async def concurrent_appends(url: str, writers: int, lines: int) -> dict[str, Any]:
    settings = settings_for(url, max_edit_chars=1000)
    clients = [create_redis(url, settings.blackboard) for _ in range(writers)]
    stores = [BlockStore(c, settings) for c in clients]
    await stores[0].create("agent-0", NewBlock(label="board", char_limit=100_000))
    for n in range(1, writers):
        await stores[0].share(OPERATOR, "agent-0", "board", f"agent-{n}", SharedAccess.APPEND_ONLY)

    async def writer(n: int) -> None:
        for i in range(lines):
            await stores[n].append(f"agent-{n}", "board", f"agent-{n} line {i}")

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(n) for n in range(writers)))
    seconds = time.perf_counter() - t0
    content = (await BlockStore(clients[0], settings).read("agent-0", "board")).content
    expected = {f"agent-{n} line {i}" for n in range(writers) for i in range(lines)}
    present = len(expected & set(content.split("\n")))
    for c in clients:
        await c.aclose()
    return {
        "present": present,
        "sent": writers * lines,
        "appends_per_s": round(writers * lines / seconds, 1),
    }


async def storage(url: str, edits: int, keep_versions: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, history in (("whole_history", 1_000_000), ("shallow", keep_versions)):
        settings = settings_for(url, history_versions=max(10, min(history, 100_000)))
        client = create_redis(url, settings.blackboard)
        store = BlockStore(client, settings)
        info = await store.create("bench", NewBlock(label="scratch", char_limit=2000))
        whole_value = 0  # a linear history that stores every version's full text
        for i in range(edits):
            view_chars = (await store.read("bench", "scratch")).chars
            if view_chars > 1800:
                text = (await store.read("bench", "scratch")).content
                first = text.split("\n", 1)[0] + "\n"
                await store.replace("bench", "scratch", first, "")
            outcome = await store.append("bench", "scratch", f"edit {i}: status ok")
            whole_value += outcome.chars
        final = (await store.read("bench", "scratch")).chars
        stored = await store.stored_bytes(info.block_id)
        out[mode] = {
            "stored_bytes": stored,
            "final_text_chars": final,
            "goal_bytes": 4 * final + 64 * 1024,
            "baseline_whole_value_history_bytes": whole_value,
            "versions": (await store.history("bench", "scratch")).head,
        }
        await client.aclose()
    return out


async def run_async(args: argparse.Namespace, url: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    result["library_append"] = await library_append(url, args.appends)
    result["concurrent"] = await concurrent_appends(url, args.writers, args.lines)
    result["storage"] = await storage(url, args.edits, args.keep_versions)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--appends", type=int, default=500)
    parser.add_argument("--edits", type=int, default=1000)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--lines", type=int, default=100)
    parser.add_argument(
        "--keep-versions",
        type=int,
        default=BlockSettings().history_versions,
        help="shallow mode: versions kept",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="colony-bench-") as tmp:
        server = EmbeddedRedis(tmp, EmbeddedRedisSettings(appendonly=False))
        info = server.start()
        try:
            result = asyncio.run(run_async(args, info.url))
            result["http_append"] = http_append(info.url, args.appends)
        finally:
            server.stop()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    lib, http = result["library_append"], result["http_append"]
    print(
        f"library append      p50 {lib['library']['p50_ms']:.2f} ms  p99 {lib['library']['p99_ms']:.2f} ms"
        f"   baseline bare Redis RPUSH+HSET p50 {lib['baseline_bare_redis']['p50_ms']:.2f} ms"
        f"  p99 {lib['baseline_bare_redis']['p99_ms']:.2f} ms   (goal: p50 <= 5 ms)"
    )
    print(
        f"HTTP append         p50 {http['http']['p50_ms']:.2f} ms  p99 {http['http']['p99_ms']:.2f} ms"
        f"   baseline GET /health p50 {http['baseline_http_health']['p50_ms']:.2f} ms"
        f"  p99 {http['baseline_http_health']['p99_ms']:.2f} ms"
    )
    c = result["concurrent"]
    print(
        f"concurrent appends  {c['present']}/{c['sent']} present ({args.writers} writers x {args.lines}),"
        f" {c['appends_per_s']} appends/s   (goal: all present)"
    )
    for mode, s in result["storage"].items():
        print(
            f"storage {mode:<13} {s['stored_bytes']} bytes after {args.edits} edits"
            f" ({s['versions']} versions),"
            f" final text {s['final_text_chars']} chars; goal <= {s['goal_bytes']} bytes;"
            f" baseline whole-value history {s['baseline_whole_value_history_bytes']} bytes"
        )


if __name__ == "__main__":
    main()
