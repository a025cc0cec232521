"""HTTP run submission: Colony's POST /v1/runs (agent `echo`) vs a bare Ray Serve FastAPI echo,
side by side on one local Ray cluster.

Prints accepted runs/s and submit latency p50/p99 for both, and their ratio; then how many of the
submitted echo runs completed and how fast. Goal: >= 200 runs/s accepted on 2 cores, overhead
<= 2x the bare echo.

Then completed runs/s end to end: each client submits a run and reads its event stream to the
terminal event, again and again, for `echo` (a pool, `runs.echo_pool`, up to --pool-max members)
and for `echo-single` (the same agent served by one agent's loop: what `echo` was before pools);
the pool twice more with one request per run (a submit with `stream: true` answers with the
stream; one with `wait_s` answers with the ended run), beside the bare Serve echo's requests/s
measured in the same run (all interleaved in --rounds slices, so they see the same load from the
rest of the box). Goal: the pool >= 0.5x the bare echo.

Usage: python benchmarks/http_submit.py [--seconds 10] [--concurrency 16] [--pool-max 4]
       [--rounds 3] [--replicas 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import httpx
import ray
import redis as redis_client
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


EXTRA: dict[str, dict[str, Any]] = {"events": {}, "stream": {"stream": True}, "wait": {"wait_s": 30}}


async def end_to_end(
    url: str, agent: str, headers: dict[str, str], seconds: float, concurrency: int, *, mode: str = "events"
) -> dict[str, float]:
    """Completed runs/s: each client submits a run to `agent`, follows it to its end and goes
    again. `mode`: "events", two requests per run (the submit, then its event stream read to the
    terminal event, where the API ends it); "stream", one submit with `stream: true` whose answer
    is that stream; "wait", one submit with `wait_s` whose answer is the ended run."""
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        n = 0
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            body = {"agent": agent, "input": n, **EXTRA[mode]}
            response = await client.post("/v1/runs", json=body, headers=headers)
            n += 1
            if response.status_code != (202 if mode == "events" else 200):
                errors += 1
                continue
            if mode == "wait":
                final = {"succeeded": "completed"}.get(response.json()["status"], "failed")
            else:
                stream = response
                if mode == "events":
                    stream = await client.get(response.json()["events_url"], headers=headers)
                kinds = [line[7:].strip() for line in stream.text.splitlines() if line.startswith("event:")]
                final = kinds[-1] if kinds else "none"
            statuses[final] = statuses.get(final, 0) + 1
            if final == "completed":
                latencies.append(time.perf_counter() - started)

    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "completed_per_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000 if latencies else float("nan"),
        "p99_ms": latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000 if latencies else float("nan"),
        "errors": errors,
        "ended": statuses,  # type: ignore[dict-item]
    }


def merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """End-to-end figures of equal-length slices as one: mean rate, the slices' latency quantiles
    (their median), errors and endings summed."""
    ended: dict[str, int] = {}
    for part in parts:
        for kind, n in part["ended"].items():
            ended[kind] = ended.get(kind, 0) + n
    return {
        "completed_per_s": sum(p["completed_per_s"] for p in parts) / len(parts),
        "p50_ms": statistics.median(p["p50_ms"] for p in parts),
        "p99_ms": statistics.median(p["p99_ms"] for p in parts),
        "errors": sum(p["errors"] for p in parts),
        "ended": ended,
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


def redis_commands(url: str) -> dict[str, int]:
    """Calls of each command the server has processed so far (INFO commandstats; the calls a Lua
    script makes count under their own commands, the script once under evalsha)."""
    client = redis_client.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def commands_since(url: str, before: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in redis_commands(url).items() if n > before.get(k, 0)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pool-max", type=int, default=4, help="runs.echo_pool.max_size")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved slices of the end-to-end phase")
    parser.add_argument(
        "--replicas", type=int, default=1, help="engine replicas (the pool spreads over them)"
    )
    args = parser.parse_args()
    redis = EmbeddedRedis(tempfile.mkdtemp(prefix="colony-bench-"))
    settings = ColonySettings(
        redis_url=(redis_url := redis.start().url),
        api_token="bench",
        engine={"kind": "scripted"},
        runs={"echo_pool": {"max_size": args.pool_max, "min_size": 1}},
        agents={"echo-single": "colony.system.builtin:single_echo_blueprint"},
    )
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(
            build_app_with_settings({"replicas": args.replicas}, settings=settings),
            name="colony",
            route_prefix="/",
        )
        serve.run(BareEcho.bind(), name="bare", route_prefix="/bare")
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": "Bearer bench"}
        httpx.get(f"{url}/v1/agents", headers=headers, timeout=60).raise_for_status()  # built-ins ready
        asyncio.run(load(url, "/bare/echo", {}, 2, args.concurrency))  # warm both paths
        asyncio.run(load(url, "/v1/runs", headers, 2, args.concurrency))
        base = asyncio.run(load(url, "/bare/echo", {}, args.seconds, args.concurrency))
        colony = asyncio.run(load(url, "/v1/runs", headers, args.seconds, args.concurrency))
        done = asyncio.run(completion(url, headers, colony["run_ids"][-200:], 120))  # type: ignore[arg-type]
        # end to end: the pool grows while the warm-up queues runs; the variants side by side
        asyncio.run(end_to_end(url, "echo", headers, 3, args.concurrency))
        # interleaved in --rounds slices, so all see the same load from the rest of the box
        slices: dict[str, list[dict[str, Any]]] = {k: [] for k in ("bare", "pool", "one", "wait", "single")}
        part = args.seconds / args.rounds
        commands_before = redis_commands(redis_url)
        for _ in range(args.rounds):
            slices["bare"].append(asyncio.run(load(url, "/bare/echo", {}, part, args.concurrency)))
            slices["pool"].append(asyncio.run(end_to_end(url, "echo", headers, part, args.concurrency)))
            slices["one"].append(
                asyncio.run(end_to_end(url, "echo", headers, part, args.concurrency, mode="stream"))
            )
            slices["wait"].append(
                asyncio.run(end_to_end(url, "echo", headers, part, args.concurrency, mode="wait"))
            )
            slices["single"].append(
                asyncio.run(end_to_end(url, "echo-single", headers, part, args.concurrency))
            )
        commands = commands_since(redis_url, commands_before)
        bare_e2e = {"accepted_per_s": sum(s["accepted_per_s"] for s in slices["bare"]) / args.rounds}
        pool, one, single = merged(slices["pool"]), merged(slices["one"]), merged(slices["single"])
        wait = merged(slices["wait"])
        ran = sum(f["completed_per_s"] * args.seconds for f in (pool, one, wait, single))
        members = httpx.get(f"{url}/v1/agents", headers=headers, timeout=30).json()
        pool_size = sum(1 for a in members if a["agent_id"].startswith("echo.") and a["state"] != "stopped")
    finally:
        serve.shutdown()
        ray.shutdown()
        redis.stop()
    ratio = base["accepted_per_s"] / colony["accepted_per_s"]
    print(
        f"{args.concurrency} concurrent clients, {args.seconds:.0f}s each, 2 CPUs for Ray, "
        f"{args.replicas} engine replica(s)"
    )
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
    print(
        f"end to end (submit -> terminal event), {args.concurrency} clients, {args.seconds:.0f}s each "
        f"in {args.rounds} interleaved slices:"
    )
    print(f"  bare Serve echo      {bare_e2e['accepted_per_s']:8.1f} req/s")
    variants = (
        ("echo (pool)", pool),
        ("echo (pool), stream", one),
        ("echo (pool), wait_s", wait),
        ("echo-single", single),
    )
    for name, figures in variants:
        print(
            f"  {name:<20} {figures['completed_per_s']:8.1f} completed runs/s "
            f"({figures['completed_per_s'] / bare_e2e['accepted_per_s']:.2f}x the bare echo)   "
            f"p50 {figures['p50_ms']:6.1f} ms   p99 {figures['p99_ms']:6.1f} ms   "
            f"errors {figures['errors']}   ended {figures['ended']}"
        )
    print(f"  echo pool members at the end: {pool_size + 1} (max_size {args.pool_max}); goal >= 0.5x")
    per_run = {k: n / ran for k, n in sorted(commands.items(), key=lambda kv: -kv[1])} if ran else {}
    top = ", ".join(f"{k} {n:.1f}" for k, n in list(per_run.items())[:8])
    print(
        f"  Redis per completed run (the four variants, idle loops included): "
        f"{sum(per_run.values()):.0f} commands, {per_run.get('evalsha', 0.0):.1f} scripts; top: {top}"
    )
    summary = {
        "bare": {k: v for k, v in base.items() if k != "run_ids"},
        "colony": {k: v for k, v in colony.items() if k != "run_ids"},
        "overhead": ratio,
        **done,
        "end_to_end": {
            "bare_req_per_s": bare_e2e["accepted_per_s"],
            "pool": pool,
            "pool_stream": one,
            "pool_wait": wait,
            "single": single,
            "pool_ratio": pool["completed_per_s"] / bare_e2e["accepted_per_s"],
            "pool_stream_ratio": one["completed_per_s"] / bare_e2e["accepted_per_s"],
            "pool_wait_ratio": wait["completed_per_s"] / bare_e2e["accepted_per_s"],
            "single_ratio": single["completed_per_s"] / bare_e2e["accepted_per_s"],
            "pool_members": pool_size + 1,
            "redis_calls_per_run": per_run,
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
