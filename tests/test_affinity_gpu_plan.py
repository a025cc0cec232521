"""benchmarks/affinity_gpu.py without a GPU: its plan agrees with the simulator's counts, and its
summary adds up each router's requests from per-shape costs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import affinity_gpu
import affinity_sim as sim


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "workload": "zipf",
        "seed": 3,
        "replicas": 3,
        "capacity": 8,
        "agents": 24,
        "pages": 60,
        "group": 3,
        "requests": 900,
        "zipf": 0.8,
        "page_tokens": 100,
        "question_tokens": 10,
        "colony_eviction": "lfu-da",
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_the_plan_prefills_what_the_simulator_counts() -> None:
    args = _args()
    result = affinity_gpu.plan(args)
    trace = sim.make_trace(3, 24, 60, 3, 900, 0.8)

    def size(page: str) -> int:
        return 100

    expected = {
        "prefix-tree": sim.simulate("p", sim.prefix_tree_router(), trace, size, 3, 8, "lru"),
        "colony": sim.simulate("c", sim.colony_router(), trace, size, 3, 8, "lfu-da"),
        "belady (bound)": sim.belady(trace, size, 24),
    }
    for name, counted in result["routers"].items():
        assert sum(n for *_, n in counted) == 900
        for _, cached, new, _ in counted:
            assert cached % 100 == 0 and (new - 10) % 100 == 0 and cached + new == 310
        if name in expected:
            pages_prefilled = sum((new - 10) * n for _, _, new, n in counted)
            assert pages_prefilled == expected[name].prefill_tokens, name
    replicas = {replica for replica, *_ in result["routers"]["colony"]}
    assert replicas <= {"r0", "r1", "r2"} and len(replicas) > 1
    assert {replica for replica, *_ in result["routers"]["belady (bound)"]} == {"pool"}


def test_turns_are_planned_too() -> None:
    result = affinity_gpu.plan(_args(workload="turns", requests=120))
    assert result["workload"].startswith("turns:") and "Zipf" not in result["workload"]
    assert all(sum(n for *_, n in counted) == 120 for counted in result["routers"].values())


def test_the_summary_weighs_each_shape_by_its_requests() -> None:
    routers = {"colony": [["r0", 300, 10, 8], ["r1", 0, 310, 2]], "prefix-tree": [["r0", 0, 310, 10]]}
    timings = {(300, 10): {"wall_ms": 5.0, "kernel_ms": 1.0}, (0, 310): {"wall_ms": 50.0, "kernel_ms": 40.0}}
    rows = affinity_gpu.summarise(routers, timings, "wall_ms")
    assert rows["colony"] == {
        "prefill_s": 0.14,  # 8 x 5 ms + 2 x 50 ms
        "ttft_p50_ms": 5.0,
        "ttft_p90_ms": 50.0,
        "busiest_replica_s": 0.1,
        "prefill_tokens": 8 * 10 + 2 * 310,
    }
    assert rows["prefix-tree"]["prefill_s"] == 0.5 and rows["prefix-tree"]["busiest_replica_s"] == 0.5
    kernel = affinity_gpu.summarise(routers, timings, "kernel_ms")
    assert kernel["colony"]["prefill_s"] == 0.09 and kernel["colony"]["ttft_p90_ms"] == 40.0


def test_belady_keeps_the_pages_of_the_request_it_serves() -> None:
    """X's next use is the farthest when Y comes in, but X is a page of the request being served:
    the bound evicts Z (as a replica would), and Z's next use is then a miss."""
    trace = [("a", ["X"]), ("b", ["Z"]), ("c", ["X", "Y"]), ("b", ["Z"])]
    served: list[tuple[str, list[bool]]] = []
    result = sim.belady(trace, lambda page: 10, 2, served=served)
    assert served == [("pool", [False]), ("pool", [False]), ("pool", [True, False]), ("pool", [False])]
    assert (result.hits, result.prefill_tokens) == (1, 40)


def test_a_percentile_is_the_nearest_rank() -> None:
    assert affinity_gpu._percentile([(2.0, 1), (1.0, 1)], 0.5) == 1.0  # half the requests at 1 ms
    assert affinity_gpu._percentile([(1.0, 1), (2.0, 1)], 0.9) == 2.0
    assert affinity_gpu._percentile([(1.0, 9), (5.0, 1)], 0.9) == 1.0
