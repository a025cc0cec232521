"""Medians and spread of several benchmarks/affinity_e2e.py results (one OUT.json per seed).

  python benchmarks/affinity_e2e_report.py OUT-seed1.json OUT-seed2.json OUT-seed3.json [--markdown]

Files of the same trace (variants run in separate invocations) are merged into one run. Groups
the runs by workload (the generated trace's name, or the trace file), and prints per
variant the median of each figure over the seeds with its range (min-max), then colony's ratio to
ray-prefix per seed (prefill tokens ray/colony: above 1 means colony prefilled fewer; TTFT p50
colony/ray: below 1 means colony answered sooner) and their median.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

FIGURES = ("prefill_tokens", "prompt_tokens", "cached_ratio", "ttft_p50_s", "ttft_p99_s", "failed")


def workload_of(result: dict[str, Any]) -> str:
    found = re.search(r"\.(sessions|zipf|team)-\d+\.trace\.jsonl$", str(result.get("trace", "")))
    return found.group(1) if found else Path(str(result.get("trace", "trace"))).stem


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    median = statistics.median(values)
    fmt = (lambda v: f"{v:.3f}") if max(abs(v) for v in values) < 10 else (lambda v: f"{v:,.0f}")
    return f"{fmt(median)} ({fmt(min(values))}-{fmt(max(values))})"


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    variants: dict[str, dict[str, list[float]]] = {}
    ratios: dict[str, list[float]] = {"prefill ray/colony": [], "ttft_p50 colony/ray": []}
    for result in results:
        for name, figures in result["variants"].items():
            for figure in FIGURES:
                if figures.get(figure) is not None:
                    variants.setdefault(name, {}).setdefault(figure, []).append(float(figures[figure]))
        paged = [v for v in result["variants"].values() if v.get("page_loads") and v.get("page_load_tokens")]
        if paged:  # Belady's loads at the measured page cost, plus the least other prefill measured
            cost = sum(v["page_load_tokens"] for v in paged) / sum(v["page_loads"] for v in paged)
            rest = min(v["prefill_tokens"] - v["page_load_tokens"] for v in paged)
            floor = result["offline_optimum"]["belady_page_loads"] * cost + rest
            variants.setdefault("floor (Belady)", {}).setdefault("prefill_tokens", []).append(floor)
        ray, mine = result["variants"].get("ray-prefix"), result["variants"].get("colony")
        if ray and mine and mine["prefill_tokens"] and mine["ttft_p50_s"] and ray["ttft_p50_s"]:
            ratios["prefill ray/colony"].append(ray["prefill_tokens"] / mine["prefill_tokens"])
            ratios["ttft_p50 colony/ray"].append(mine["ttft_p50_s"] / ray["ttft_p50_s"])
    return {"seeds": len(results), "variants": variants, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args()
    by_trace: dict[str, dict[str, Any]] = {}
    for path in args.results:  # runs of one trace (variants run apart) count as one seed
        result = json.loads(path.read_text())
        merged = by_trace.setdefault(str(result.get("trace")), {**result, "variants": {}})
        merged["variants"].update(result["variants"])
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for result in by_trace.values():
        by_workload.setdefault(workload_of(result), []).append(result)
    for workload, results in by_workload.items():
        summary = summarise(results)
        first = results[0]
        print(
            f"\n{workload}: {summary['seeds']} seeds, {first['requests']} requests by "
            f"{first['agents']} agents over {first['pages']} files; median (min-max)"
        )
        head = ("variant", *FIGURES)
        rows = [
            (name, *(spread(figs.get(f, [])) for f in FIGURES)) for name, figs in summary["variants"].items()
        ]
        if args.markdown:
            print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
            for row in rows:
                print("| " + " | ".join(row) + " |")
        else:
            for row in (head, *rows):
                print(f"{row[0]:<18}" + "".join(f"{cell:>26}" for cell in row[1:]))
        for name, values in summary["ratios"].items():
            if values:
                print(f"{name}: {spread(values)} per seed: {', '.join(f'{v:.2f}' for v in values)}")


if __name__ == "__main__":
    main()
