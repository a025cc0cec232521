"""benchmarks/affinity_live.py's workload: every router sees the same prompts, and the prompt Ray's
prefix router reads is the one the page engine caches (the page block, then the question)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import affinity_live as live

from colony.inference import InferenceRequest, Page
from colony.inference.engine import prefixed_messages


def test_zipf_and_turns_workloads() -> None:
    zipf = live.make_trace(seed=3, agents=12, pages=6, requests=300, zipf=1.0)
    assert zipf == live.make_trace(seed=3, agents=12, pages=6, requests=300, zipf=1.0)  # seedable
    assert all(agent % 6 == page for agent, page in zipf)  # an agent asks about its own page
    counts = sorted((sum(1 for _, p in zipf if p == page) for page in range(6)), reverse=True)
    assert counts[0] > 2 * counts[-1]  # popular pages are popular
    turns = live.make_trace(seed=3, agents=12, pages=6, requests=24, zipf=1.0, workload="turns")
    assert [agent for agent, _ in turns] == [*range(12), *range(12)]  # agents in a fixed order


def test_the_prompt_ray_reads_is_the_one_the_page_engine_caches() -> None:
    pages = live.make_pages(3, 200)
    requests = live.make_requests([(4, 1), (1, 1)], pages, max_tokens=1)
    first = requests[0]
    assert first.page_ids == ["page-1"] and first.messages[1]["content"] == first.question
    engine_view = prefixed_messages(
        [Page(page_id="page-1", text=pages["page-1"])], InferenceRequest(prompt=first.question)
    )
    assert [m.model_dump() for m in engine_view] == first.messages
    # two agents' calls on one page share the page block as a prefix (what a prefix router matches)
    assert requests[1].messages[0] == first.messages[0] and requests[1].question != first.question


def test_fewest_faults_and_the_prefill_floor() -> None:
    """Belady's faults bound every router: a cycle of 3 pages on 2 slots faults 3 times cold, then
    once every other request; the floor scales the measured page cost to those faults."""
    cycle = [(n % 3, n % 3) for n in range(9)]
    assert live.fewest_faults(cycle, 2) == 6
    assert live.fewest_faults(cycle, 3) == 3  # all fit: the cold loads only
    outcome = live.Outcome("colony", [0.1], 900, 700, faults=7, seconds=1.0, load_tokens=560)
    assert outcome.prefill_floor(6) == 6 * 80 + 140  # 80 tokens a load, 140 of questions
    assert live.Outcome("ray-prefix", [0.1], 900, 700, 7, 1.0).prefill_floor(6) is None
