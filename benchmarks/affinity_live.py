"""Page affinity on real engines: the same page-bound agent workload, side by side in one run, on
2-3 real embedded EngineReplicas (SmolLM2 through xllamacpp, few KV slots each) under Ray Serve,
routed by:

  round-robin            - a page-blind Serve request router (replicas in turn)
  ray-prefix             - Ray Serve's own PrefixCacheAffinityRouter (ray.llm, this Ray's copy): a
                           prefix tree of the prompts it routed, per replica; it reads the prompt
                           (`request.messages`: the page text as a system message, then the question)
  colony                 - Colony's PageAffinityRouter (colony/serve/router.py) over what each engine
                           really holds (`record_routing_stats`), on engines holding pages in slots
                           (colony.inference: faults, pins, the LFU-DA eviction policy)

No variant reads a request before it is sent (the oracle variants that read the trace's next
requests are gone, issue 35); benchmarks/affinity_e2e.py measures the same question end to end,
through Colony's agents, where needed-soon comes from Colony's own state.

The engines: round-robin and ray-prefix send the whole prompt to an engine with automatic prefix
caching, as Ray's router is used in production (llama.cpp picks the slot whose cached prompt shares
the longest prefix, else its least recently used one; `--slots` slots); Colony's variants send the
question and the page ids to the same engine in page mode (`--slots` page slots). Same model,
same prompts, same trace, a fresh deployment (cold caches) per router, and the same page capacity:
`--slots` cached prompts or pages per engine (llama.cpp's host-memory prompt cache, 8 GiB by
default, which would keep every prompt of this workload, is off: `--prompt-cache-mib`).

The workload: `--pages` pages of about `--page-tokens` tokens, `--agents` agents each bound to one
page (several agents per page), each asking its own question, `--concurrency` in flight; requests
drawn with Zipf(`--zipf`) popularity over the pages (an agent of the page chosen at random), or,
with `--workload turns`, the agents taking turns in a fixed order (a pipeline or a round of a group
conversation: the pages come back in a cycle longer than the caches hold).

Reported per router: TTFT p50/p99 (client side: call to answer of a `--max-tokens 1` generation,
so routing, queueing, page faults and prefill included), prefill tokens (tokens the engines
computed: page loads and uncached prompt), cached-token ratio (1 - prefill / prompt tokens) and
page faults (page mode: pages the engine loaded; prefix mode: requests whose page prefix was not
in the chosen slot's cache, i.e. less than half the prompt cached).

Usage (defaults finish in a few minutes on 2 cores):
  python benchmarks/affinity_live.py [--replicas 2] [--slots 2] [--pages 10] [--page-tokens 300]
      [--agents 24] [--requests 48] [--concurrency 3] [--zipf 1.0] [--workload zipf|turns]
      [--variants round-robin ray-prefix colony] (also: ray-prefix/paged, Ray's router on
      Colony's page engine)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from colony.config import EngineSettings
from colony.inference import InferenceRequest, Page
from colony.inference.embedded import EmbeddedEngine
from colony.inference.engine import render_page_prefix
from colony.inference.models import PageLoad
from colony.inference.openai_format import usage_from_result

HALF = 0.5  # prefix mode: a request with less than this share of its prompt cached faulted its page


@dataclass
class LiveRequest:
    """One agent's call. `messages` is the whole prompt (what Ray's prefix router reads and a
    prefix-caching engine is sent); `question` and `page_ids` are what a page engine is sent."""

    messages: list[dict[str, str]]
    question: str
    page_ids: list[str]
    max_tokens: int = 1


# -- workload ---------------------------------------------------------------------------------------


def make_pages(count: int, tokens: int) -> dict[str, str]:
    """Code-like pages of about `tokens` tokens each (~14 tokens a line with SmolLM2's tokenizer)."""
    lines = max(1, tokens // 14)
    return {
        f"page-{p}": "\n".join(f"def helper_{p}_{i}(x): return x * {i} + {p * 7 + i}" for i in range(lines))
        for p in range(count)
    }


def make_trace(
    seed: int, agents: int, pages: int, requests: int, zipf: float, workload: str = "zipf"
) -> list[tuple[int, int]]:
    """(agent, page) pairs: agent a is bound to page a % pages. "zipf": page popularity is
    Zipf-like (in a seeded random order), the agent among the page's agents uniform. "turns": the
    agents take turns in a fixed order (a pipeline, or a round of a multi-agent conversation), so
    the pages come back in a cycle longer than the caches: what LRU-like caches and sticky routers
    lose every page of, and where knowing who runs next pays (KVFlow's case)."""
    if workload == "turns":
        return [(n % agents, (n % agents) % pages) for n in range(requests)]
    rng = random.Random(seed)
    order = list(range(pages))
    rng.shuffle(order)
    weights = [1.0 / (rank + 1) ** zipf for rank in range(pages)]
    bound = {p: [a for a in range(agents) if a % pages == p] or [p] for p in range(pages)}
    chosen = rng.choices(order, weights=weights, k=requests)
    return [(rng.choice(bound[p]), p) for p in chosen]


def make_requests(trace: list[tuple[int, int]], pages: dict[str, str], max_tokens: int) -> list[LiveRequest]:
    requests = []
    for n, (agent, p) in enumerate(trace):
        page_id = f"page-{p}"
        question = f"Agent {agent}, call {n}: which helper returns the largest value for x = {n % 17}?"
        prefix = render_page_prefix([Page(page_id=page_id, text=pages[page_id])])
        messages = [{"role": "system", "content": prefix}, {"role": "user", "content": question}]
        requests.append(LiveRequest(messages, question, [page_id], max_tokens))
    return requests


# -- the replica ------------------------------------------------------------------------------------


class CountingEngine(EmbeddedEngine):
    """The embedded engine, keeping the page loads it made (their prefill tokens are counted)."""

    def __init__(self, settings: EngineSettings, data_dir: str, prompt_cache_mib: int | None) -> None:
        super().__init__(settings, data_dir=data_dir, prompt_cache_mib=prompt_cache_mib)
        self.loads: list[PageLoad] = []

    async def load_page(self, page: Page) -> PageLoad:
        load = await super().load_page(page)
        self.loads.append(load)
        return load

    async def prompt_cached(self, request: LiveRequest) -> dict[str, Any]:
        """Prefix mode: the whole prompt to llama.cpp, which picks the slot (longest cached prefix)."""
        body = {
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "temperature": 0.0,
            "id_slot": -1,
            "cache_prompt": True,
        }
        usage = usage_from_result(await self._call(body))
        faulted = usage.cached_tokens < HALF * usage.prompt_tokens
        return {
            "prompt_tokens": usage.prompt_tokens,
            "prefill_tokens": usage.prompt_tokens - usage.cached_tokens,
            "faults": int(faulted),
        }


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=8, health_check_period_s=5)
class LiveReplica:
    async def __init__(self, pages: dict[str, str], mode: str, engine: dict[str, Any], workdir: str) -> None:
        self.pages = pages
        self.mode = mode
        self.engine = CountingEngine(
            EngineSettings(**engine["settings"]),
            tempfile.mkdtemp(prefix="engine-", dir=workdir),
            engine["prompt_cache_mib"],
        )
        self.in_flight = 0
        await self.engine.start()

    async def _fetch(self, page_id: str) -> Page:
        return Page(page_id=page_id, text=self.pages[page_id])

    async def generate(self, request: LiveRequest, page_ids: list[str] | None = None) -> dict[str, Any]:
        self.in_flight += 1
        try:
            if self.mode == "prefix":
                return await self.engine.prompt_cached(request)
            before = len(self.engine.loads)
            async with self.engine.using_pages(request.page_ids, self._fetch) as faulted:
                response = await self.engine.generate(
                    InferenceRequest(
                        prompt=request.question, page_ids=request.page_ids, max_tokens=request.max_tokens
                    )
                )
            loads = self.engine.loads[before:]  # this request's own faults (and any prefetch meanwhile: rare)
            load_tokens = sum(
                load.prompt_tokens - load.cached_tokens for load in loads if load.page_id in faulted
            )
            usage = response.usage
            return {
                "prompt_tokens": usage.prompt_tokens,
                "prefill_tokens": load_tokens + usage.prompt_tokens - usage.cached_tokens,
                "faults": len(faulted),
                "load_tokens": load_tokens,  # what the page loads cost (the rest is the question)
            }
        finally:
            self.in_flight -= 1

    def record_routing_stats(self) -> dict[str, Any]:
        resident = set(self.engine.resident_pages())
        return {"resident": sorted(resident), "swapped": [], "agents": self.in_flight}


class RoundRobinRouter(FIFOMixin, RequestRouter):
    """Replicas in turn, blind to pages (the baseline)."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        turn = getattr(self, "_turn", 0)
        self._turn = turn + 1
        return [[ordered[turn % len(ordered)]]]


def ray_prefix_router() -> type:
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
        PrefixCacheAffinityRouter,
    )

    return PrefixCacheAffinityRouter


VARIANTS: dict[str, tuple[Callable[[], Any], str, bool]] = {
    # name -> (router class or import path, engine mode)
    "round-robin": (lambda: RoundRobinRouter, "prefix"),
    "ray-prefix": (ray_prefix_router, "prefix"),
    "ray-prefix/paged": (ray_prefix_router, "paged"),  # Ray's router on Colony's page engine
    "colony": (lambda: "colony.serve.router:PageAffinityRouter", "paged"),
}


# -- the driver -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    ttft: list[float]
    prompt_tokens: int
    prefill_tokens: int
    faults: int
    seconds: float
    load_tokens: int = 0  # page mode: what the request-path page loads cost

    def prefill_floor(self, fewest_faults: int) -> int | None:
        """Page mode: the prefill of this run had it faulted only Belady's `fewest_faults` pages
        (its mean page load each) and prefilled its questions as it did: what no router or
        eviction could go below on this trace. None without a page load to measure."""
        if not self.faults or not self.load_tokens:
            return None
        questions = self.prefill_tokens - self.load_tokens
        return round(fewest_faults * self.load_tokens / self.faults) + questions

    def quantile(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def p50(self) -> float:
        return statistics.median(self.ttft)

    @property
    def total_prefill(self) -> int:
        return self.prefill_tokens

    @property
    def cached_ratio(self) -> float:
        return 1.0 - self.total_prefill / max(1, self.prompt_tokens)


def fewest_faults(trace: list[tuple[int, int]], capacity: int) -> int:
    """The fewest page loads any router and eviction could make on this trace: Belady (farthest
    next use evicted) over one pooled cache of every engine's slots, which knows the whole future
    and never splits the cache over replicas. Prefill below its loads is out of anyone's reach."""
    from affinity_sim import belady  # benchmarks/ is on the path when this file runs

    result = belady([(str(agent), [f"page-{p}"]) for agent, p in trace], lambda _page: 1, capacity)
    return result.accesses - result.hits


async def drive(handle: Any, requests: list[LiveRequest], args: argparse.Namespace) -> Outcome:
    """Send the requests in trace order, `--concurrency` in flight."""
    results: list[dict[str, Any]] = []
    ttft: list[float] = []
    cursor = 0

    async def worker() -> None:
        nonlocal cursor
        while cursor < len(requests):
            index, cursor = cursor, cursor + 1
            request = requests[index]
            started = time.perf_counter()
            result = await handle.generate.remote(request, page_ids=request.page_ids)
            ttft.append(time.perf_counter() - started)
            results.append(result)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return Outcome(
        "",
        ttft,
        sum(r["prompt_tokens"] for r in results),
        sum(r["prefill_tokens"] for r in results),
        sum(r["faults"] for r in results),
        time.perf_counter() - started,
        sum(r.get("load_tokens", 0) for r in results),
    )


def run_variant(
    name: str, args: argparse.Namespace, pages: dict[str, str], requests: list[LiveRequest]
) -> Outcome:
    router, mode = VARIANTS[name]
    workdir = Path(tempfile.mkdtemp(prefix="colony-affinity-"))
    settings = {
        # the same page capacity everywhere: a prefix-caching engine caches a prompt in each of its
        # page_slots + 1 slots, a page engine a page in each of its page_slots (its general slot
        # serves page-less requests, none here)
        "page_slots": args.slots if mode == "paged" else args.slots - 1,
        "threads": args.threads,
        "slot_context_tokens": args.page_tokens * 2 + 512,
        "eviction_policy": "lfu-da",
    }
    prompt_cache = None if args.prompt_cache_mib < 0 else args.prompt_cache_mib
    engine = {"settings": settings, "prompt_cache_mib": prompt_cache}
    app_name = "affinity-" + name.replace("+", "-").replace("/", "-")
    deployment = LiveReplica.options(
        num_replicas=args.replicas,
        request_router_config=RequestRouterConfig(
            request_router_class=router(), request_routing_stats_period_s=0.2
        ),
    )
    handle = serve.run(
        deployment.bind(pages, mode, engine, str(workdir)),
        name=app_name,
        route_prefix=None,
    )
    try:
        time.sleep(1.0)  # the routers' first routing stats
        outcome = asyncio.run(drive(handle, requests, args))
    finally:
        serve.delete(app_name)
        shutil.rmtree(workdir, ignore_errors=True)
    outcome.name = name
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4, help="page slots per engine")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per engine")
    parser.add_argument("--pages", type=int, default=16)
    parser.add_argument("--page-tokens", type=int, default=250)
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument(
        "--workload",
        choices=["zipf", "turns"],
        default="zipf",
        help="zipf: popular pages; turns: agents in turn",
    )
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument(
        "--prompt-cache-mib",
        type=int,
        default=0,
        help="llama.cpp's host-memory prompt cache per engine (-1: llama.cpp's default, 8 GiB: far more "
        "than --slots prompts, so the engines no longer have the same capacity)",
    )
    parser.add_argument("--variants", nargs="+", default=["round-robin", "ray-prefix", "colony"])
    args = parser.parse_args()
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")

    import ray

    pages = make_pages(args.pages, args.page_tokens)
    trace = make_trace(args.seed, args.agents, args.pages, args.requests, args.zipf, args.workload)
    requests = make_requests(trace, pages, args.max_tokens)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    try:
        outcomes = [run_variant(name, args, pages, requests) for name in args.variants]
    finally:
        serve.shutdown()
        ray.shutdown()
    print(
        f"{len(requests)} requests, {args.replicas} replicas x {args.slots} page slots, {args.pages} "
        f"pages of ~{args.page_tokens} tokens, {args.agents} agents, concurrency {args.concurrency}, "
        f"{args.workload} workload, seed {args.seed}"
    )
    header = ("router", "TTFT p50", "TTFT p99", "prefill tok", "cached", "faults", "wall s")
    print("{:<22} {:>9} {:>9} {:>12} {:>7} {:>7} {:>7}".format(*header))
    for o in outcomes:
        print(
            f"{o.name:<22} {o.p50 * 1000:>7.0f}ms {o.quantile(0.99) * 1000:>7.0f}ms {o.total_prefill:>12,} "
            f"{o.cached_ratio:>7.1%} {o.faults:>7} {o.seconds:>7.1f}"
        )
    fewest = fewest_faults(trace, args.replicas * args.slots)
    print(
        f"fewest page faults possible on this trace: {fewest} "
        f"(Belady over one pooled cache of {args.replicas} x {args.slots} pages, the whole future known)"
    )
    by_name = {o.name: o for o in outcomes}
    ray_o = by_name.get("ray-prefix")
    floors = [f for o in outcomes if (f := o.prefill_floor(fewest)) is not None]
    if floors and ray_o is not None:
        floor = min(floors)
        print(
            f"prefill floor ~{floor:,} tokens (those faults at the measured page cost, plus the "
            f"questions): at most {ray_o.total_prefill / max(1, floor):.2f}x fewer than ray-prefix is "
            "possible on this trace"
        )
    for name in ("colony",):
        mine = by_name.get(name)
        if ray_o is not None and mine is not None:
            fewer = ray_o.total_prefill / max(1, mine.total_prefill)
            print(
                f"{name} vs ray-prefix: {fewer:.2f}x fewer prefill tokens (goal >= 2x), "
                f"TTFT p50 {mine.p50 * 1000:.0f} vs {ray_o.p50 * 1000:.0f} ms (goal lower)"
            )
    print(
        json.dumps(
            {
                o.name: {
                    "ttft_p50": o.p50,
                    "ttft_p99": o.quantile(0.99),
                    "prefill_tokens": o.total_prefill,
                    "cached_ratio": o.cached_ratio,
                    "faults": o.faults,
                }
                for o in outcomes
            }
        )
    )


if __name__ == "__main__":
    main()
