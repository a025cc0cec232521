"""Page affinity priced on a GPU: each router's decisions from the simulator, each request's
prefill timed on a GPU.

benchmarks/affinity_sim.py counts prefill tokens. A GPU does not charge by the token alone (a pass
has a fixed cost in kernel launches, and attention grows with the context already cached), so this
prices each router's requests in GPU time, in two steps:

  plan    (CPU; needs colony) runs the simulator's routers on a trace - round-robin, the prefix
          tree, Colony's placement with its engines' eviction, and Belady's pooled bound - and
          writes each request's shape: the tokens of its pages the chosen replica already holds
          (cached) and the tokens it must prefill (its missing pages, then the question). No router
          reads a request before it arrives; Belady reads them all (a bound, not a router).
  replay  (GPU; needs torch and transformers, not colony) times each distinct shape on a
          Llama-shaped model (published shapes, random bf16 weights, nothing downloaded, as
          gpu_page_cost.py): `new` tokens prefilled over `cached` tokens of KV already in GPU
          memory. Each router's requests are then summed: GPU prefill seconds, time to first token
          p50 / p90 (the prefill alone: no queueing, no decode) and the busiest replica's seconds
          (the run's length if the replicas work in parallel).

Only the last position's logits are computed, as a serving engine does. Two clocks for each
shape: the wall time of an eager forward pass (PyTorch launching kernels from Python, so a small
pass costs its launches) and the GPU's kernel time (torch.profiler's sum of kernel durations: what
an engine that removes launch gaps, with CUDA graphs, approaches).

A request's cached pages are taken to sit before its missing ones, as an engine that reuses page
KV wherever the page sits in the prompt would have them; the shape's cost does not depend on which
pages they are.

  python benchmarks/affinity_gpu.py plan --out PLAN.json [--workload zipf|turns] [simulator options]
  python benchmarks/affinity_gpu.py replay PLAN.json [PLAN.json ...] [--models llama-8b,llama-1b]
                                    [--repeats 10] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from gpu_page_cost import add_attention_option, kernel_ms

ROUTERS = ("round-robin", "prefix-tree", "colony", "belady (bound)")
Shape = tuple[int, int]  # (cached tokens, tokens to prefill)


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """The simulator's routers on one trace; per router, how many requests of each shape each
    replica served."""
    import affinity_sim as sim

    if args.workload == "turns":
        trace = sim.make_turns_trace(args.agents, args.pages, args.group, args.requests)
    else:
        trace = sim.make_trace(args.seed, args.agents, args.pages, args.group, args.requests, args.zipf)

    def tokens(page: str) -> int:
        return int(args.page_tokens)

    routers = {
        "round-robin": (sim.round_robin_router(), "lru"),
        "prefix-tree": (sim.prefix_tree_router(), "lru"),
        "colony": (sim.colony_router(), args.colony_eviction),
    }
    counted: dict[str, list[list[Any]]] = {}
    for name in ROUTERS:
        served: list[tuple[str, list[bool]]] = []
        if name in routers:
            router, eviction = routers[name]
            sim.simulate(name, router, trace, tokens, args.replicas, args.capacity, eviction, served=served)
        else:
            sim.belady(trace, tokens, args.replicas * args.capacity, served=served)
        counts: dict[tuple[str, int, int], int] = defaultdict(int)
        for (replica, hits), (_, pages) in zip(served, trace, strict=True):
            cached = sum(tokens(page) for page, hit in zip(pages, hits, strict=True) if hit)
            missing = sum(tokens(page) for page, hit in zip(pages, hits, strict=True) if not hit)
            counts[(replica, cached, missing + args.question_tokens)] += 1
        counted[name] = [[replica, cached, new, n] for (replica, cached, new), n in sorted(counts.items())]
    workload = (
        f"{args.workload}: {args.agents} agents on groups of {args.group} of {args.pages} pages of "
        f"{args.page_tokens} tokens, {args.replicas} replicas x {args.capacity} pages, "
        f"{args.requests} requests, {args.question_tokens}-token questions"
        + (f", Zipf {args.zipf}, seed {args.seed}" if args.workload == "zipf" else "")
    )
    return {"workload": workload, "routers": counted}


def time_shapes(
    model_name: str, shapes: list[Shape], repeats: int, device: str, attention: str = "lower-right"
) -> dict[Shape, dict[str, Any]]:
    """Median wall milliseconds and mean kernel milliseconds of each shape's prefill."""
    import torch
    from gpu_page_cost import SHAPES, _model, _tensors, _timed, cache_from
    from transformers import DynamicCache

    longest = max(cached + new for cached, new in shapes)
    model = _model(model_name, longest + 16, device=device, attention=attention)
    vocab = SHAPES[model_name]["vocab_size"]
    most_cached = max(cached for cached, _ in shapes)
    out: dict[Shape, dict[str, Any]] = {}
    with torch.inference_mode():
        base_layers: list[tuple[Any, Any]] = []
        if most_cached:
            base = DynamicCache()
            model(
                torch.randint(0, vocab, (1, most_cached), device=device), past_key_values=base, use_cache=True
            )
            base_layers = _tensors(base)
        for cached, new in sorted(shapes):
            tokens = torch.randint(0, vocab, (1, new), device=device)
            layers = [(k[:, :, :cached].contiguous(), v[:, :, :cached].contiguous()) for k, v in base_layers]

            def cache_of_page(layers: list[tuple[Any, Any]] = layers, cached: int = cached) -> Any:
                return cache_from(layers) if cached else None

            def prefill(tokens: Any = tokens, cache_of_page: Any = cache_of_page, model: Any = model) -> None:
                model(tokens, past_key_values=cache_of_page(), use_cache=True, logits_to_keep=1)

            # A pass over cached KV rebuilds the cache object from the page's tensors (a copy on the
            # GPU); the copy is timed alone and taken off both clocks.
            copy_wall = statistics.median(_timed(cache_of_page, repeats, device)) if cached else 0.0
            copy_kernel = (kernel_ms(cache_of_page, repeats) or 0.0) if cached else 0.0
            wall = max(statistics.median(_timed(prefill, repeats, device)) - copy_wall, 0.0)
            kernel = kernel_ms(prefill, repeats)
            out[(cached, new)] = {
                "wall_ms": round(wall, 2),
                "kernel_ms": None if kernel is None else round(max(kernel - copy_kernel, 0.0), 2),
            }
            print(f"  {model_name}: cached {cached:>6} new {new:>6}: {out[(cached, new)]}", flush=True)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _percentile(costs: list[tuple[float, int]], q: float) -> float:
    """The q-quantile of costs given as (cost, count)."""
    total = sum(n for _, n in costs)
    seen = 0
    for cost, n in sorted(costs):
        seen += n
        if seen >= q * total:
            return cost
    return 0.0


def summarise(
    routers: dict[str, list[list[Any]]], timings: dict[Shape, dict[str, Any]], clock: str
) -> dict[str, dict[str, Any]]:
    """Per router: GPU prefill seconds, TTFT p50 / p90 ms and the busiest replica's seconds."""
    rows = {}
    for name, counted in routers.items():
        costs = [(float(timings[(cached, new)][clock]), int(n)) for _, cached, new, n in counted]
        per_replica: dict[str, float] = defaultdict(float)
        for (replica, _, _, n), (cost, _) in zip(counted, costs, strict=True):
            per_replica[replica] += cost * n
        rows[name] = {
            "prefill_s": round(sum(cost * n for cost, n in costs) / 1000, 2),
            "ttft_p50_ms": round(_percentile(costs, 0.5), 1),
            "ttft_p90_ms": round(_percentile(costs, 0.9), 1),
            # Belady's bound is one pooled cache: it has no replicas to be busiest of
            "busiest_replica_s": (
                None if set(per_replica) == {"pool"} else round(max(per_replica.values()) / 1000, 2)
            ),
            "prefill_tokens": sum(int(new) * int(n) for _, _, new, n in counted),
        }
    return rows


def replay(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "replay needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu tries it on CPU"
        )
    plans = [json.loads(Path(path).read_text()) for path in args.plans]
    shapes = sorted(
        {(int(c), int(n)) for p in plans for counted in p["routers"].values() for _, c, n, _ in counted}
    )
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(
        f"device: {name}, torch {torch.__version__}; {len(shapes)} shapes, {args.attention} attention",
        flush=True,
    )
    reports = []
    for model_name in args.models.split(","):
        timings = time_shapes(model_name, shapes, args.repeats, args.device, args.attention)
        for p in plans:
            for clock in ("wall_ms", "kernel_ms"):
                if any(t[clock] is None for t in timings.values()):
                    continue
                rows = summarise(p["routers"], timings, clock)
                reports.append(
                    {"model": model_name, "workload": p["workload"], "clock": clock, "routers": rows}
                )
                _print_report(model_name, p["workload"], clock, rows)
    return reports


def _print_report(model_name: str, workload: str, clock: str, rows: dict[str, dict[str, Any]]) -> None:
    print(f"\n{model_name}, {clock.removesuffix('_ms')} clock; {workload}", flush=True)
    print(
        f"{'router':<16} {'prefill tokens':>15} {'GPU prefill s':>14} {'TTFT p50 ms':>12} "
        f"{'TTFT p90 ms':>12} {'busiest replica s':>18}"
    )
    for router, row in rows.items():
        print(
            f"{router:<16} {row['prefill_tokens']:>15,} {row['prefill_s']:>14} {row['ttft_p50_ms']:>12} "
            f"{row['ttft_p90_ms']:>12} {row['busiest_replica_s'] or '-':>18}"
        )
    tree, colony = rows.get("prefix-tree"), rows.get("colony")
    if tree and colony and colony["prefill_s"]:
        print(
            f"prefix-tree / colony: {tree['prefill_s'] / colony['prefill_s']:.2f}x the GPU prefill time, "
            f"{tree['prefill_tokens'] / max(1, colony['prefill_tokens']):.2f}x the prefill tokens",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    p = steps.add_parser("plan", help="route a trace with the simulator's routers (CPU)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workload", choices=["zipf", "turns"], default="zipf")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--capacity", type=int, default=16, help="pages each replica caches")
    p.add_argument("--agents", type=int, default=48)
    p.add_argument("--pages", type=int, default=120)
    p.add_argument("--group", type=int, default=3, help="pages per agent")
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--zipf", type=float, default=0.8)
    p.add_argument("--page-tokens", type=int, default=1024, help="Colony's default page size")
    p.add_argument("--question-tokens", type=int, default=64)
    p.add_argument("--colony-eviction", default="lfu-da")
    r = steps.add_parser("replay", help="time each router's requests on a GPU")
    r.add_argument("plans", nargs="+", type=Path)
    r.add_argument("--models", default="llama-8b,llama-1b")
    r.add_argument("--repeats", type=int, default=10)
    r.add_argument("--device", default="cuda")
    add_attention_option(r, "lower-right")
    r.add_argument("--json", type=Path, help="also write the reports here")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    if args.step == "plan":
        result = plan(args)
        args.out.write_text(json.dumps(result))
        print(f"{args.out}: {result['workload']}")
        for name, counted in result["routers"].items():
            shapes = len({(c, w) for _, c, w, _ in counted})
            print(f"  {name}: {sum(n for *_, n in counted)} requests in {shapes} shapes")
        return
    reports = replay(args)
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()
