"""HTTP run submission: Colony's POST /v1/runs (agent `echo`) vs a bare Ray Serve FastAPI echo,
side by side on one local Ray cluster.

Prints accepted runs/s and submit latency p50/p99 for both, and their ratio; then how many of the
submitted echo runs completed and how fast. Goal: >= 200 runs/s accepted on 2 cores, overhead
<= 2x the bare echo.

Usage: python benchmarks/http_submit.py [--seconds 10] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import httpx
import ray
from fastapi import FastAPI
from ray import serve

from colony.blackboard.redis_server import EmbeddedRedis, free_port
from colony.config import ColonySettings
from colony.serve.app import build_app_with_settings

bare = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=256)
@serve.ingress(bare)
class BareEcho:
    @bare.post("/echo")
    async def echo(self, body: dict) -> dict:
        return {"run_id": "bare", "status": "queued", "input": body.get("input")}


async def load(
    url: str, path: str, headers: dict[str, str], seconds: float, concurrency: int
) -> dict[str, float]:
    latencies: list[float] = []
    ids: list[str] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        n = 0
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            response = await client.post(path, json={"agent": "echo", "input": n}, headers=headers)
            if response.status_code in (200, 202):
                latencies.append(time.perf_counter() - started)
                ids.append(response.json()["run_id"])
            else:
                errors += 1
            n += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "accepted_per_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000,
        "errors": errors,
        "run_ids": ids,  # type: ignore[dict-item]
    }


async def completion(
    url: str, headers: dict[str, str], run_ids: list[str], timeout: float
) -> dict[str, float]:
    started = time.perf_counter()
    pending = set(run_ids)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while pending and time.perf_counter() - started < timeout:
            sample = list(pending)[:50]
            for run_id in sample:
                status = (await client.get(f"/v1/runs/{run_id}", headers=headers)).json()["status"]
                if status in ("succeeded", "failed", "cancelled"):
                    pending.discard(run_id)
            await asyncio.sleep(0.2)
    return {"completed": len(run_ids) - len(pending), "drain_seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    redis = EmbeddedRedis(tempfile.mkdtemp(prefix="colony-bench-"))
    settings = ColonySettings(redis_url=redis.start().url, api_token="bench", engine={"kind": "scripted"})
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app_with_settings(settings=settings), name="colony", route_prefix="/")
        serve.run(BareEcho.bind(), name="bare", route_prefix="/bare")
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": "Bearer bench"}
        httpx.get(f"{url}/v1/agents", headers=headers, timeout=60).raise_for_status()  # built-ins ready
        asyncio.run(load(url, "/bare/echo", {}, 2, args.concurrency))  # warm both paths
        asyncio.run(load(url, "/v1/runs", headers, 2, args.concurrency))
        base = asyncio.run(load(url, "/bare/echo", {}, args.seconds, args.concurrency))
        colony = asyncio.run(load(url, "/v1/runs", headers, args.seconds, args.concurrency))
        done = asyncio.run(completion(url, headers, colony["run_ids"][-200:], 120))  # type: ignore[arg-type]
    finally:
        serve.shutdown()
        ray.shutdown()
        redis.stop()
    ratio = base["accepted_per_s"] / colony["accepted_per_s"]
    print(f"{args.concurrency} concurrent clients, {args.seconds:.0f}s each, 2 CPUs for Ray")
    print(
        f"  bare Serve echo   {base['accepted_per_s']:8.0f} req/s   p50 {base['p50_ms']:6.1f} ms   "
        f"p99 {base['p99_ms']:6.1f} ms"
    )
    print(
        f"  colony POST runs  {colony['accepted_per_s']:8.0f} runs/s  p50 {colony['p50_ms']:6.1f} ms   "
        f"p99 {colony['p99_ms']:6.1f} ms   errors {colony['errors']}"
    )
    print(f"  overhead {ratio:.2f}x the bare echo (goal <= 2x); accepted goal >= 200 runs/s")
    print(f"  last 200 echo runs: {done['completed']:.0f} completed, drained in {done['drain_seconds']:.1f}s")
    summary = {
        "bare": {k: v for k, v in base.items() if k != "run_ids"},
        "colony": {k: v for k, v in colony.items() if k != "run_ids"},
        "overhead": ratio,
        **done,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
