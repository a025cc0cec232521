"""Blackboard throughput and event latency against a bare Redis baseline, side by side in one run.

(a) 64 concurrent writers: raw redis-py SET ops/s vs Blackboard.write ops/s (OCC, tags, events);
(b) batches of 100: a raw pipelined SET batch vs Blackboard.write_many;
(c) event delivery latency p50/p99 with writes at a fixed rate (default 1,000/s).

Goal: both ratios >= 0.5, p99 < 5 ms. Usage:
    python benchmarks/blackboard_throughput.py [--redis-url URL] [--writers 64] [--ops 300]
        [--appendfsync always|everysec|both]
Without --redis-url an embedded redis-server is started in a temporary directory, by default twice:
once with `appendfsync always` (the default of the embedded server: every acknowledged write is
on disk, so no accepted run is lost to a SIGKILL) and once with `everysec` (up to ~1 s of writes
lost), and the figures of both are printed side by side: the cost of the durability default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from colony.blackboard import Blackboard, create_redis
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, EmbeddedRedisSettings

PAYLOAD = {"agent": "agent-42", "status": "running", "step": 17, "notes": "x" * 64}
PAYLOAD_TEXT = json.dumps(PAYLOAD)


async def _timed(fn: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def concurrent_writers(
    client: aioredis.Redis, bb: Blackboard, writers: int, ops: int, rounds: int
) -> dict:
    async def raw() -> None:
        async def one(w: int) -> None:
            for i in range(ops):
                await client.set(f"bench:raw:{w}:{i}", PAYLOAD_TEXT)

        await asyncio.gather(*(one(w) for w in range(writers)))

    async def board() -> None:
        async def one(w: int) -> None:
            for i in range(ops):
                await bb.write(f"w{w}:{i}", PAYLOAD, tags=("bench", f"w{w % 4}"), created_by=f"writer-{w}")

        await asyncio.gather(*(one(w) for w in range(writers)))

    raw_times, bb_times = [], []
    for _ in range(rounds):  # interleaved so both see the same machine load
        raw_times.append(await _timed(raw))
        bb_times.append(await _timed(board))
    total = writers * ops
    raw_rate, bb_rate = total / statistics.median(raw_times), total / statistics.median(bb_times)
    return {"raw_set_ops_s": raw_rate, "blackboard_write_ops_s": bb_rate, "ratio": bb_rate / raw_rate}


async def batches(client: aioredis.Redis, bb: Blackboard, batch: int, count: int, rounds: int) -> dict:
    async def raw() -> None:
        for b in range(count):
            async with client.pipeline(transaction=False) as pipe:
                for i in range(batch):
                    pipe.set(f"bench:rawb:{b}:{i}", PAYLOAD_TEXT)
                await pipe.execute()

    async def board() -> None:
        for b in range(count):
            await bb.write_many(
                {"key": f"b{b}:{i}", "value": PAYLOAD, "tags": ["bench"], "created_by": "batcher"}
                for i in range(batch)
            )

    raw_times, bb_times = [], []
    for _ in range(rounds):
        raw_times.append(await _timed(raw))
        bb_times.append(await _timed(board))
    total = batch * count
    raw_rate, bb_rate = total / statistics.median(raw_times), total / statistics.median(bb_times)
    return {"raw_pipeline_writes_s": raw_rate, "write_many_writes_s": bb_rate, "ratio": bb_rate / raw_rate}


async def event_latency(bb: Blackboard, rate: int, seconds: float) -> dict:
    total = int(rate * seconds)
    sent: dict[str, float] = {}
    latencies: list[float] = []
    subscription = await bb.subscribe("lat:*").start()

    async def receive() -> None:
        async for event in subscription:
            latencies.append(time.perf_counter() - sent[event.key])
            if len(latencies) == total:
                return

    receiver = asyncio.create_task(receive())
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        key = f"lat:{i}"
        sent[key] = time.perf_counter()
        await bb.write(key, i)
    achieved = total / (time.perf_counter() - start)
    await asyncio.wait_for(receiver, 30)
    latencies.sort()
    return {
        "events": total,
        "achieved_rate_s": achieved,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "max_ms": latencies[-1] * 1000,
    }


async def main(args: argparse.Namespace, label: str = "") -> dict:
    settings = BlackboardSettings(events_maxlen=100_000, max_connections=max(128, args.writers * 2))
    client = create_redis(args.redis_url, settings)
    bb = Blackboard(client, f"bench:{uuid.uuid4().hex[:8]}", settings=settings)
    try:
        await client.ping()
        a = await concurrent_writers(client, bb, args.writers, args.ops, args.rounds)
        b = await batches(client, bb, 100, args.batches, args.rounds)
        c = await event_latency(bb, args.rate, args.seconds)
        await client.flushdb()
    finally:
        await client.aclose()
    if label:
        print(f"--- {label}")
    print(
        f"(a) {args.writers} concurrent writers x {args.ops} ops, median of {args.rounds} interleaved rounds"
    )
    print(f"    raw redis-py SET      {a['raw_set_ops_s']:10.0f} ops/s")
    print(
        f"    Blackboard.write      {a['blackboard_write_ops_s']:10.0f} ops/s   "
        f"ratio {a['ratio']:.2f} (goal >= 0.5)"
    )
    print(f"(b) batches of 100 x {args.batches}")
    print(f"    raw pipelined SET     {b['raw_pipeline_writes_s']:10.0f} writes/s")
    print(
        f"    Blackboard.write_many {b['write_many_writes_s']:10.0f} writes/s   "
        f"ratio {b['ratio']:.2f} (goal >= 0.5)"
    )
    print(
        f"(c) event delivery at {args.rate}/s for {args.seconds}s ({c['events']} events, "
        f"achieved {c['achieved_rate_s']:.0f}/s)"
    )
    print(f"    p50 {c['p50_ms']:.2f} ms   p99 {c['p99_ms']:.2f} ms (goal < 5)   max {c['max_ms']:.2f} ms")
    result = {"concurrent": a, "batches": b, "latency": c}
    print(json.dumps(result))
    return result


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-url", help="Redis to measure against (default: start an embedded one)")
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--ops", type=int, default=300, help="writes per writer")
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=1000, help="events per second for the latency test")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--appendfsync",
        choices=["always", "everysec", "both"],
        default="both",
        help="AOF fsync policy of the embedded server (default: both, side by side)",
    )
    args = parser.parse_args()
    if args.redis_url:
        asyncio.run(main(args))
        return
    policies = ["always", "everysec"] if args.appendfsync == "both" else [args.appendfsync]
    results = {}
    for policy in policies:
        server = EmbeddedRedis(
            tempfile.mkdtemp(prefix="colony-bench-"), EmbeddedRedisSettings(appendfsync=policy)
        )
        info = server.start()
        args.redis_url = info.url
        print(f"embedded redis-server at {info.masked_url}, appendfsync {policy}")
        try:
            results[policy] = asyncio.run(main(args, label=f"appendfsync {policy}"))
        finally:
            server.stop()
    if len(results) == 2:
        _side_by_side(results["always"], results["everysec"])


def _side_by_side(always: dict, everysec: dict) -> None:
    rows = [
        ("raw SET ops/s", "concurrent", "raw_set_ops_s", ".0f"),
        ("Blackboard.write ops/s", "concurrent", "blackboard_write_ops_s", ".0f"),
        ("raw pipelined writes/s", "batches", "raw_pipeline_writes_s", ".0f"),
        ("write_many writes/s", "batches", "write_many_writes_s", ".0f"),
        ("event latency p50 ms", "latency", "p50_ms", ".2f"),
        ("event latency p99 ms", "latency", "p99_ms", ".2f"),
    ]
    print("\nappendfsync           always     everysec   always/everysec")
    for name, section, key, fmt in rows:
        a, e = always[section][key], everysec[section][key]
        print(f"{name:22} {a:10{fmt}} {e:12{fmt}} {a / e if e else float('nan'):14.2f}")
    print(json.dumps({"always": always, "everysec": everysec}))


if __name__ == "__main__":
    cli()
