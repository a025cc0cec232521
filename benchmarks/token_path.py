"""The token path: how much of the embedded engine's token throughput reaches an HTTP client.

Measured side by side in one invocation, on the same question and the default embedded model:

- `engine`: the EmbeddedEngine in this process, its `stream()` consumed directly (no Colony);
- `http`: `ask` runs submitted over HTTP with `"stream": true` to a fresh `colony up` (one engine
  replica, the embedded engine), each run's `token` events read off the submit's answer as a client
  would (`ColonyClient.stream`, one request a run): through Serve's proxy, the API replica, Redis,
  the agent and its run events.

Each is run one request at a time and `--concurrency` at once. Printed per phase: tokens/s (text
pieces per second of wall time, all requests together: the engine's tokens; over HTTP, `token`
events, which carry several tokens each when Redis is busier than the engine, see
colony/agents/reply_stream.py), characters of text per second (what the ratio is taken on, so
that coalesced token events compare) and TTFT p50/p99 (submit to the first token); then the ratio
http/engine and the TTFT overhead (issue
35, deliverable 6: the goal is >= 0.8x the engine's throughput with 8 at once, TTFT overhead <= 20
ms p50). The engine phase runs before the cluster starts, so the two never share the 2 cores; the
ratio is the figure to compare across machines, not the absolute rates.

`--engine-threads N` sets `engine.threads` for both sides (unset: the engine's default, every core
but one).

Usage: python benchmarks/token_path.py [--requests 8] [--concurrency 8] [--engine-threads N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from colony.blackboard.redis_server import free_port
from colony.client import ColonyClient
from colony.config import ColonySettings, EngineSettings, ServeSettings
from colony.inference.embedded import EmbeddedEngine
from colony.inference.models import ChatMessage, InferenceRequest
from colony.serve import cluster
from colony.system.builtin import AskCapability

QUESTION = "Explain in a few sentences what a blackboard system is and why agents share one."
# what an `ask` run sends the engine: its capability's defaults (the built-in binds none)
_ASK = inspect.signature(AskCapability.__init__).parameters
ASK_SYSTEM_PROMPT: str = _ASK["system_prompt"].default
ASK_MAX_TOKENS: int = _ASK["max_tokens"].default


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cpu_by_process() -> dict[str, float]:
    """CPU seconds so far of this process (the in-process engine, or the HTTP client) and of its
    descendants (the cluster: Ray's Serve replicas by deployment, redis-server, the rest)."""
    times = {"this process": sum(os.times()[:2])}
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            command = " ".join(process.cmdline())
            if command.startswith("ray::"):  # Ray titles a worker with what it runs
                label = command.split()[0].removeprefix("ray::").removeprefix("ServeReplica:colony:")
                label = label.split(".")[0]
            else:
                label = "redis-server" if "redis-server" in command else "other"
            times[label] = times.get(label, 0.0) + sum(process.cpu_times()[:2])
    return times


@contextlib.contextmanager
def cpu_spent(into: dict[str, Any]) -> Any:
    """`into["cpu_s"]`: CPU seconds each process spent in the block (the ratio of throughputs moves
    with whatever else runs on a shared box; the CPU spent per token much less)."""
    before = cpu_by_process()
    yield
    after = cpu_by_process()
    into["cpu_s"] = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0.005}


def summary(tokens: int, chars: int, wall: float, ttfts: list[float]) -> dict[str, float]:
    return {
        "requests": len(ttfts),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "chars_per_s": chars / wall if wall > 0 else 0.0,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else float("nan"),
        "ttft_p99_s": percentile(ttfts, 0.99),
    }


async def engine_phase(engine: EmbeddedEngine, requests: int, at_once: int) -> dict[str, float]:
    """`requests` streams of the question straight from the engine, `at_once` at a time, as an
    `ask` run asks it (its system prompt and max_tokens)."""
    request = InferenceRequest(
        messages=[
            ChatMessage(role="system", content=ASK_SYSTEM_PROMPT),
            ChatMessage(role="user", content=QUESTION),
        ],
        max_tokens=ASK_MAX_TOKENS,
    )
    gate = asyncio.Semaphore(at_once)
    ttfts: list[float] = []
    counted = chars = 0

    async def one() -> None:
        nonlocal counted, chars
        async with gate:
            started, first = time.monotonic(), None
            async for chunk in engine.stream(request):
                if chunk.text:
                    counted += 1
                    chars += len(chunk.text)
                    first = first or time.monotonic()
            if first is not None:
                ttfts.append(first - started)

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(requests)))
    return summary(counted, chars, time.monotonic() - started, ttfts)


def http_phase(url: str, token: str, requests: int, at_once: int) -> dict[str, float]:
    """`requests` `ask` runs streamed over HTTP, `at_once` client threads at a time."""
    lock = threading.Lock()
    ttfts: list[float] = []
    counted = [0, 0]
    queue = list(range(requests))

    def client_thread() -> None:
        with ColonyClient(url, token, timeout=600) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    queue.pop()
                started, first, tokens, chars = time.monotonic(), None, 0, 0
                for event in client.stream("ask", {"question": QUESTION}):  # one request, stream: true
                    if event.get("event_type") == "token":
                        tokens += 1
                        chars += len(str((event.get("data") or {}).get("text", "")))
                        first = first or time.monotonic()
                with lock:
                    counted[0] += tokens
                    counted[1] += chars
                    if first is not None:
                        ttfts.append(first - started)

    threads = [threading.Thread(target=client_thread) for _ in range(at_once)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return summary(counted[0], counted[1], time.monotonic() - started, ttfts)


def measure(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    settings = ColonySettings(
        data_dir=data,
        engine=EngineSettings(threads=args.engine_threads),
        serve=ServeSettings(port=free_port(), num_cpus=2, replicas=1),
    )
    results: dict[str, Any] = {}

    async def engine_side() -> None:
        engine = EmbeddedEngine(settings.engine, data_dir=data / "engine")
        try:
            await engine_phase(engine, 1, 1)  # warm: model loaded, caches made
            results["engine_1"] = await engine_phase(engine, args.requests, 1)
            spent: dict[str, Any] = {}
            with cpu_spent(spent):
                results["engine_n"] = await engine_phase(engine, args.requests, args.concurrency)
            results["engine_n"].update(spent)
        finally:
            await engine.close()

    asyncio.run(engine_side())
    print("engine phases done; starting colony up", file=sys.stderr, flush=True)
    info = cluster.up(settings, echo=False)
    try:
        http_phase(info.url, info.token, 1, 1)  # warm
        results["http_1"] = http_phase(info.url, info.token, args.requests, 1)
        spent = {}
        with cpu_spent(spent):
            results["http_n"] = http_phase(info.url, info.token, args.requests, args.concurrency)
        results["http_n"].update(spent)
    finally:
        cluster.down(settings)
    return results


def report(results: dict[str, Any], concurrency: int) -> None:
    for at_once, suffix in ((1, "1"), (concurrency, "n")):
        engine, http = results[f"engine_{suffix}"], results[f"http_{suffix}"]
        ratio = http["chars_per_s"] / engine["chars_per_s"] if engine["chars_per_s"] else float("nan")
        overhead_ms = (http["ttft_p50_s"] - engine["ttft_p50_s"]) * 1000
        events_a_run = http["tokens"] / max(1, http["requests"])
        print(
            f"{at_once} at once: engine {engine['tokens_per_s']:.0f} tokens/s, "
            f"{engine['chars_per_s']:.0f} chars/s (TTFT p50 {engine['ttft_p50_s'] * 1000:.0f} ms)  |  "
            f"ask over HTTP {http['tokens_per_s']:.0f} token events/s ({events_a_run:.0f} a run), "
            f"{http['chars_per_s']:.0f} chars/s "
            f"(TTFT p50 {http['ttft_p50_s'] * 1000:.0f} ms, p99 {http['ttft_p99_s'] * 1000:.0f} ms)  |  "
            f"{ratio:.2f}x the engine, TTFT overhead {overhead_ms:.0f} ms (goal >= 0.8x, <= 20 ms)"
        )


def report_cpu(results: dict[str, Any]) -> None:
    """CPU milliseconds per engine token, `--concurrency` at once: the engine in-process beside the
    whole path over HTTP, by process (tokens over HTTP counted from its text, at the engine's
    characters per token)."""
    engine, http = results["engine_n"], results["http_n"]
    if "cpu_s" not in engine or "cpu_s" not in http or not engine["tokens"]:
        return
    chars_per_token = engine["chars_per_s"] / engine["tokens_per_s"]
    http_tokens = http["chars_per_s"] * http["wall_s"] / chars_per_token
    own = engine["cpu_s"]["this process"] / engine["tokens"] * 1000
    parts = sorted(http["cpu_s"].items(), key=lambda kv: -kv[1])
    total = sum(v for _, v in parts) / http_tokens * 1000
    shown = ", ".join(
        f"{'client' if k == 'this process' else k} {v / http_tokens * 1000:.1f}" for k, v in parts if v > 0.05
    )
    print(f"CPU ms per token: engine in-process {own:.1f}  |  ask over HTTP {total:.1f} ({shown})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=8, help="requests per phase")
    parser.add_argument("--concurrency", type=int, default=8, help="requests at once in the second phase")
    parser.add_argument(
        "--engine-threads", type=int, default=None, help="engine.threads (default: all cores)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="colony-token-path-") as tmp:
        results = measure(args, Path(tmp))
    report(results, args.concurrency)
    report_cpu(results)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
