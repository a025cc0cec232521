"""CPU per request, by process: a run of the `echo` pool submitted with `stream: true`, and one
submitted with `wait_s`, beside a bare Ray Serve echo request, measured in one run on one local
Ray cluster (scripted engine).

Throughput ratios on a shared 2-core box move with whatever else runs; the CPU each process spends
per request moves much less, and says where a run's cost is: Serve's proxy, the API replica, the
engine replica (the agents), redis-server, the Colony control plane and the client (this
process). Each figure is read from /proc (psutil) over a phase, divided by the requests completed
in it; no profiler runs. The phases alternate --rounds times. Printed: milliseconds of CPU per
request for each process, the totals, and their ratio (at full CPU use, throughput goes as the
inverse of the total: the ratio is what `http_submit.py`'s end-to-end ratio tends to).

Usage: python benchmarks/http_cpu.py [--seconds 8] [--concurrency 16] [--rounds 2]
       (short phases and many rounds, e.g. --seconds 3 --rounds 8, average out a shared box's drift)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import httpx
import psutil
import ray
from http_submit import BareEcho, end_to_end, load
from ray import serve

from colony.blackboard.redis_server import EmbeddedRedis, free_port
from colony.config import ColonySettings
from colony.serve.app import build_app_with_settings


def cluster_processes() -> dict[str, list[psutil.Process]]:
    """This driver's Ray processes (and redis-server), by what they run."""
    found: dict[str, list[psutil.Process]] = {}
    for process in psutil.Process().children(recursive=True):
        try:
            command = " ".join(process.cmdline())
            name = process.name()
        except psutil.Error:
            continue
        if command.startswith("ray::"):  # Ray titles a worker with the method it runs: the actor only
            label = command.split()[0].removeprefix("ray::").removeprefix("ServeReplica:").split(".")[0]
        elif "redis-server" in name or "redis-server" in command:
            label = "redis-server"
        elif name in ("gcs_server", "raylet"):
            label = name
        else:
            continue
        found.setdefault(label, []).append(process)
    return found


def cpu_seconds(processes: dict[str, list[psutil.Process]]) -> dict[str, float]:
    times: dict[str, float] = {}
    for label, group in processes.items():
        total = 0.0
        for process in group:
            try:
                user, system = process.cpu_times()[:2]
            except psutil.Error:
                continue
            total += user + system
        times[label] = total
    times["client"] = sum(os.times()[:2])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--runs", default="stream,wait", help="how runs are followed: stream, wait, or both (comma-separated)"
    )
    args = parser.parse_args()
    phases = ["bare echo", *(f"{mode} run" for mode in args.runs.split(",") if mode in ("stream", "wait"))]
    redis = EmbeddedRedis(tempfile.mkdtemp(prefix="colony-cpu-"))
    settings = ColonySettings(
        redis_url=redis.start().url,
        api_token="bench",
        engine={"kind": "scripted"},
        runs={"echo_pool": {"max_size": 4, "min_size": 1}},
    )
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows: list[tuple[str, float, dict[str, float]]] = []
    spent: dict[str, float] = {}  # CPU seconds of every process, by phase, over all rounds
    served: dict[str, float] = {}  # requests (runs) completed, by phase, over all rounds
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(
            build_app_with_settings({"replicas": 1}, settings=settings), name="colony", route_prefix="/"
        )
        serve.run(BareEcho.bind(), name="bare", route_prefix="/bare")
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": "Bearer bench"}
        httpx.get(f"{url}/v1/agents", headers=headers, timeout=60).raise_for_status()
        asyncio.run(end_to_end(url, "echo", headers, 4, args.concurrency, mode="stream"))  # the pool grows
        asyncio.run(load(url, "/bare/echo", {}, 2, args.concurrency))
        processes = cluster_processes()
        for _ in range(args.rounds):
            for phase in phases:
                before = cpu_seconds(processes)
                started = time.perf_counter()
                if phase == "bare echo":
                    figures = asyncio.run(load(url, "/bare/echo", {}, args.seconds, args.concurrency))
                    done = figures["accepted_per_s"] * args.seconds
                else:
                    mode = phase.split()[0]
                    figures = asyncio.run(
                        end_to_end(url, "echo", headers, args.seconds, args.concurrency, mode=mode)
                    )
                    done = figures["completed_per_s"] * args.seconds
                elapsed = time.perf_counter() - started
                after = cpu_seconds(processes)
                per = {k: (after[k] - before[k]) / done * 1000 for k in after if done}
                rows.append((phase, done / elapsed, per))
                spent[phase] = spent.get(phase, 0.0) + sum(after[k] - before[k] for k in after)
                served[phase] = served.get(phase, 0.0) + done
    finally:
        serve.shutdown()
        ray.shutdown()
        redis.stop()
    labels = sorted({k for _, _, per in rows for k, v in per.items() if v >= 0.05})
    print(f"ms of CPU per request, {args.concurrency} clients, {args.seconds:.0f}s phases, 2 CPUs for Ray")
    print(
        f"  {'phase':<12} {'req/s':>7} "
        + " ".join(f"{label[:22]:>22}" for label in labels)
        + f" {'total':>7}"
    )
    totals: dict[str, list[float]] = {}
    for phase, rate, per in rows:
        total = sum(per.values())
        totals.setdefault(phase, []).append(total)
        cells = " ".join(f"{per.get(label, 0.0):22.2f}" for label in labels)
        print(f"  {phase:<12} {rate:7.1f} {cells} {total:7.1f}")
    for phase in phases[1:]:
        for bare, run in zip(totals["bare echo"], totals[phase], strict=True):
            print(
                f"  bare echo / {phase}, total CPU: {bare:.1f} / {run:.1f} ms = {bare / run:.2f}x (goal 0.5x)"
            )
    bare = spent["bare echo"] / served["bare echo"] * 1000
    for phase in phases[1:]:  # all rounds together: the box's drift averages out
        run = spent[phase] / served[phase] * 1000
        print(
            f"  all {args.rounds} rounds, bare echo / {phase}, total CPU: {bare:.1f} / {run:.1f} ms "
            f"= {bare / run:.2f}x (goal 0.5x)"
        )


if __name__ == "__main__":
    main()
