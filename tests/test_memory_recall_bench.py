"""The memory-recall benchmark (benchmarks/memory_recall.py) and its data (memory_facts.py).

The data checks hold at the benchmark's real sizes (they are cheap: no model, no server). The
smoke run is the real stack at a tiny size: a real redis-server, a real Chroma server started the
way `colony up` starts it, the packaged embedder; it checks every figure is printed beside its
baselines and goals, and that the paraphrased questions are what hybrid recall is for: keyword
matching alone (the subject's name) does much worse."""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import memory_facts as facts
import memory_recall as bench


def test_the_data_set_is_seeded_and_nested_and_the_questions_paraphrase() -> None:
    small, large = facts.dataset(1000, 500), facts.dataset(10_000, 500)
    assert len(small.entries) == 1000 and len(large.entries) == 10_000
    assert len(small.questions) == 500
    # distinct facts, each answer stored, the 1k set inside the 10k set, asked the same questions
    assert len({f.text for f in large.entries}) == len({f.fact_id for f in large.entries}) == 10_000
    assert {q.answer_id for q in small.questions} <= {f.fact_id for f in small.entries}
    assert {f.fact_id for f in small.entries} <= {f.fact_id for f in large.entries}
    assert small.questions == large.questions
    assert facts.dataset(1000, 500) == small  # seeded: the same every run
    assert facts.dataset(1000, 500, seed=12).questions != small.questions
    assert len({q.relation for q in small.questions}) >= 30  # varied domains, not one template
    # paraphrases: no question shares a content word with its fact beyond the subject's name
    report = facts.overlap_report(small)
    assert report["fraction"] <= 0.05, report["examples"]
    assert bench.tokenizer_overlap(small) <= 0.05
    # hard negatives: a question's subject has many facts in the set, so its name alone is ambiguous
    per_subject = Counter(f.subject for f in small.entries)
    ambiguous = [q for q in small.questions if per_subject[q.subject] >= 10]
    assert len(ambiguous) >= 0.8 * len(small.questions)


def test_overlap_report_catches_a_question_that_repeats_its_fact() -> None:
    fact = facts.Fact("f1", "Ada Quinn", "person", "car", "Ada Quinn owns a blue car.", "What car?")
    echo = facts.Dataset([fact], [facts.Question("Which car does Ada Quinn own?", "f1", "car", "Ada Quinn")])
    para = facts.Dataset([fact], [facts.Question("What vehicle is Ada Quinn's?", "f1", "car", "Ada Quinn")])
    assert facts.overlap_report(echo)["fraction"] == 1.0
    assert facts.overlap_report(para)["fraction"] == 0.0
    assert facts.content_words("Ada Quinn owns cars", drop="Ada Quinn") == {"own", "car"}


def test_the_benchmark_prints_every_figure_beside_its_baselines_and_goals(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--sizes", "150", "--questions", "40", "--redis-url", redis_url]
    report = bench.cli([*argv, "--model-dir", str(tmp_path / "models"), "--json"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report))
    (run,) = report["sizes"]
    assert run["size"] == 150 and run["questions"] == 40
    ingestion, catch_up, recall = run["ingestion"], run["catch_up"], run["recall"]
    for value in (
        ingestion["store_write_many_per_s"],
        ingestion["blackboard_write_many_per_s"],
        catch_up["total_seconds"],
        catch_up["vector_per_s"],
        catch_up["bare_embed_per_s"],
        *(recall[m][k] for m in bench.MODES for k in ("p50_ms", "p99_ms")),
    ):
        assert math.isfinite(value) and value > 0
    # the paraphrases defeat keyword matching; meaning finds them
    assert recall["hybrid"]["recall_at_5"] >= recall["keyword"]["recall_at_5"] + 0.3
    assert recall["vector"]["recall_at_5"] >= recall["keyword"]["recall_at_5"] + 0.3
    assert recall["hybrid"]["recall_at_5"] >= 0.8
    assert recall["hybrid"]["recall_at_1"] <= recall["hybrid"]["recall_at_5"]
    for mode in bench.MODES:  # every miss is attributed to its question's relation
        missed = sum(recall[mode]["misses_at_5_by_relation"].values())
        assert missed == round((1 - recall[mode]["recall_at_5"]) * 40)

    bench.print_report(report)
    text = capsys.readouterr().out
    for expected in (
        "--- 150 entries",
        "Blackboard.write_many",
        "MemoryStore.write_many",
        "goal >= 500",
        "keyword mirror",
        "embedding into Chroma",
        "bare embedder",
        "goal hybrid R@5 >= 0.9",
        "goal p50 <= 50 ms",
        "(keyword index tokens)",
        "load average",
        "OMP_NUM_THREADS=",
    ):
        assert expected in text, expected
    rows = {
        m.group(1): line
        for line in text.splitlines()
        if (m := re.match(r"^\s+(keyword|vector|hybrid)\s+[0-9.]+\s", line))
    }
    assert set(rows) == set(bench.MODES)
    assert "(baseline)" in rows["keyword"] and "(baseline)" in rows["vector"]
    assert "(baseline)" not in rows["hybrid"]
    assert f"{recall['hybrid']['recall_at_5']:6.3f}" in rows["hybrid"]
