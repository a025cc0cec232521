"""The affinity simulator (benchmarks/affinity_sim.py) on a small trace: its bounds hold and
Colony's placement (the cluster's own code) beats the page-blind and prefix-tree routers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import affinity_sim as sim


def test_policies_and_bounds_on_a_small_trace(tmp_path: Path) -> None:
    trace = sim.make_trace(seed=3, agents=24, pages=60, group=3, requests=1500, zipf=0.8)
    assert trace == sim.make_trace(seed=3, agents=24, pages=60, group=3, requests=1500, zipf=0.8)  # seedable
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps({"agent": a, "pages": p}) for a, p in trace))
    loaded, tokens = sim.load_trace(path)
    assert loaded == trace and tokens == {}

    def size(page: str) -> int:
        return 100

    results = {
        name: sim.simulate(name, router, trace, size, 3, 8, eviction)
        for name, router, eviction in [
            ("random", sim.random_router(3), "lru"),
            ("prefix-tree", sim.prefix_tree_router(), "lru"),
            ("colony", sim.colony_router(), "lfu-da"),
        ]
    }
    bound = sim.belady(trace, size, 24)
    static = sim.static_optimum(trace, size, 24)
    assert results["random"].hit_rate < results["prefix-tree"].hit_rate < results["colony"].hit_rate
    assert results["colony"].hit_rate <= static.hit_rate <= bound.hit_rate
    assert results["colony"].prefill_tokens < results["prefix-tree"].prefill_tokens
