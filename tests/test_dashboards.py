"""The Grafana dashboards and the cluster-wide metrics they read.

Committed JSON equals what colony/dashboards.py renders; every query parses as PromQL, filters by
the `cluster` variable and names only series Colony's /metrics exports from Redis (the same whichever
API replica answers); what processes publish is exported per process (histograms too), and no
exported counter series ever goes back: not when a process restarts with the same host and pid, not
when a publication expires, not under the cap on publications (review finding M4); hostile
publications or heartbeats never break a scrape. tests/test_dashboards_prometheus.py runs the
queries for real."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from colony import dashboards, metrics
from colony.blackboard import Blackboard
from colony.config import ColonySettings, ServeSettings, load_settings
from colony.inference import InferenceRequest
from colony.inference.scripted import ScriptedEngine
from colony.system.registry import AgentRegistry

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "helm" / "colony" / "dashboards"
EXPECTED_FILES = {
    "colony-overview.json",
    "colony-agents.json",
    "colony-pages.json",
    "colony-engines.json",
    "colony-blackboard.json",
}
VALUES = {"cluster": "ci-cluster", "__rate_interval": "1m", "__range": "1h", "__interval": "15s"}


def committed() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(FOLDER.glob("*.json"))}


def selectors(expr: str) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def test_committed_dashboards_equal_the_generated_ones() -> None:
    rendered = dashboards.rendered_files()
    assert set(rendered) == EXPECTED_FILES
    assert {p.name for p in FOLDER.glob("*.json")} == EXPECTED_FILES
    for name, text in rendered.items():
        assert (FOLDER / name).read_text() == text, f"{name} is stale: run python -m colony.dashboards"
    check = subprocess.run(
        [sys.executable, "-m", "colony.dashboards", "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_check_mode_names_a_stale_file(tmp_path: Path) -> None:
    assert dashboards.main(["--out", str(tmp_path)]) == 0
    (tmp_path / "colony-pages.json").write_text("{}\n")
    assert dashboards.main(["--out", str(tmp_path), "--check"]) == 1
    assert (tmp_path / "colony-pages.json").read_text() == "{}\n"  # --check writes nothing


def test_every_dashboard_is_templated_on_datasource_and_cluster() -> None:
    for name, document in committed().items():
        variables = {v["name"]: v for v in document["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        cluster = variables["cluster"]
        assert cluster["type"] == "query" and cluster["includeAll"] and cluster["allValue"] == ".*"
        assert cluster["query"]["query"].startswith("label_values(colony_agents")
        assert cluster["query"]["query"].endswith(", cluster)")
        assert cluster["datasource"]["uid"] == "${datasource}"
        assert document["panels"], name
        ids = [p["id"] for p in document["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        for panel in document["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
            assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


def test_every_query_parses_filters_by_cluster_and_names_cluster_wide_series() -> None:
    exported = metrics.exported_names()
    cluster_wide = set(metrics.family_labels())
    seen: set[str] = set()
    for name, document in committed().items():
        for title, expr in dashboards.targets_of(document):
            query = dashboards.substitute(expr, VALUES)
            assert "$" not in query, f"{name} / {title}: a variable is left in {query}"
            found = selectors(query)  # raises on a query that does not parse
            assert found, f"{name} / {title}: no metric in {query}"
            for sel in found:
                assert sel.name in exported, f"{name} / {title}: {sel.name} is not a metric Colony exports"
                assert dashboards.family_of(sel.name) in cluster_wide, f"{title}: {sel.name} is per process"
                cluster = [m for m in sel.matchers.matchers if m.name == "cluster"]
                assert [(str(m.op), m.value) for m in cluster] == [
                    (str(promql_parser.MatchOp.Re), "ci-cluster")
                ], f"{name} / {title}: {sel} is not filtered by cluster=~$cluster"
                seen.add(sel.name)
    # the dashboards cover what the issue asks for
    for wanted in (
        "colony_cluster_runs_completed_total",
        "colony_cluster_http_request_seconds_bucket",
        "colony_cluster_run_duration_seconds_bucket",
        "colony_agents",
        "colony_cluster_agent_suspensions_total",
        "colony_cluster_agent_resumptions_total",
        "colony_cluster_placements_total",
        "colony_replica_page_ops_total",
        "colony_replica_resident_pages",
        "colony_replica_swapped_pages",
        "colony_replica_inference_tokens_total",
        "colony_replica_inference_ttft_seconds_bucket",
        "colony_cluster_blackboard_ops_total",
        "colony_cluster_blackboard_event_lag_seconds_bucket",
    ):
        assert wanted in seen, f"no dashboard reads {wanted}"


def test_a_query_naming_an_unknown_metric_or_missing_the_filter_is_caught() -> None:
    """The checks above can fail: a made-up family is refused by the generator, and the selector
    walk sees a selector without the cluster matcher."""
    with pytest.raises(KeyError):
        dashboards.rate("colony_cluster_no_such_thing_total")
    (bare,) = selectors("sum(rate(colony_cluster_blackboard_ops_total[1m]))")
    assert not [m for m in bare.matchers.matchers if m.name == "cluster"]
    with pytest.raises(KeyError):
        dashboards.substitute("rate(x[$__rate_interval])", {"cluster": "a"})


def _publication(process: str, value: float) -> dict[str, Any]:
    """A publication with one series in every published family (what a busy process sends)."""
    families: dict[str, Any] = {}
    for spec in metrics.PUBLISHED:
        labels = ["x"] * len(spec.labels)
        if spec.kind == "counter":
            families[spec.name] = [[labels, value]]
        else:
            counts = [0.0] * (len(spec.buckets) + 1)
            counts[1] = value
            families[spec.name] = [[labels, counts, value * 0.5]]
    return {"process": process, "format": metrics.PUBLICATION_FORMAT, "families": families}


def _heartbeat(replica: str) -> dict[str, Any]:
    engine = ScriptedEngine(["hi there"])
    return {
        "replica_id": replica,
        "agents": 2,
        "stats": engine.stats().model_dump(mode="json"),
        "pages": {
            "hits": 3,
            "faults": 1,
            "loads": 1,
            "swap_ins": 0,
            "evictions": 0,
            "resident": 1,
            "swapped": 0,
        },
    }


def _scrape(snapshot: list[Any], published: list[Any]) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """What a scrape of a collector holding these shows: sample name -> labels -> value."""
    collector = metrics.ReplicaStatsCollector()
    collector.snapshot, collector.published = snapshot, published
    registry = CollectorRegistry()
    registry.register(collector)
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_every_dashboard_series_is_in_a_real_scrape_of_the_collector() -> None:
    scraped = _scrape([_heartbeat("r1")], [_publication("p1", 1.0)])
    for document in committed().values():
        for title, expr in dashboards.targets_of(document):
            for sel in selectors(dashboards.substitute(expr, VALUES)):
                if sel.name != "colony_agents":  # the registry gauge, set by the /metrics route
                    assert sel.name in scraped, f"{title}: {sel.name} is not in a scrape"


def test_publications_are_exported_per_process_histograms_included() -> None:
    scraped = _scrape([], [_publication("p1", 2.0), _publication("p2", 3.0)])
    assert scraped["colony_cluster_runs_completed_total"] == {
        (("process", "p1"), ("status", "x")): 2.0,
        (("process", "p2"), ("status", "x")): 3.0,
    }
    buckets = scraped["colony_cluster_run_duration_seconds_bucket"]
    assert buckets[(("le", "0.01"), ("process", "p1"))] == 0.0
    assert buckets[(("le", "0.05"), ("process", "p2"))] == 3.0
    assert buckets[(("le", "+Inf"), ("process", "p2"))] == 3.0
    assert scraped["colony_cluster_run_duration_seconds_count"] == {
        (("process", "p1"),): 2.0,
        (("process", "p2"),): 3.0,
    }
    assert scraped["colony_cluster_run_duration_seconds_sum"][(("process", "p2"),)] == 1.5
    assert scraped["colony_cluster_http_request_seconds_count"][(("process", "p1"), ("route", "x"))] == 2.0


def test_dashboard_queries_keep_the_process_label_until_they_sum() -> None:
    """Each process's series is de-duplicated across scrape targets with its `process` label kept
    (else two processes with equal figures would count once) and rate() is taken per series."""
    expr = dashboards.rate("colony_cluster_runs_completed_total", ("status",))
    assert expr == (
        "sum by (status) (max by (cluster, process, status) "
        '(rate(colony_cluster_runs_completed_total{cluster=~"$cluster"}[$__rate_interval])))'
    )
    for document in committed().values():
        for title, query in dashboards.targets_of(document):
            if "colony_cluster_" in query:
                assert "max by (cluster, process" in query, f"{title}: {query}"


async def test_replica_latency_is_a_real_histogram() -> None:
    engine = ScriptedEngine(["one two three"])
    for _ in range(3):
        await engine.generate(InferenceRequest(prompt="hello"))
    stats = engine.stats()
    assert sum(stats.ttft_histogram) == 3 and sum(stats.request_histogram) == 3
    heartbeat = {"replica_id": "r1", "stats": stats.model_dump(mode="json"), "pages": {}}
    scraped = _scrape([heartbeat], [])
    assert scraped["colony_replica_inference_ttft_seconds_count"] == {(("replica", "r1"),): 3.0}
    assert (
        scraped["colony_replica_inference_request_seconds_bucket"][(("le", "+Inf"), ("replica", "r1"))] == 3.0
    )
    assert scraped["colony_replica_inference_requests_total"] == {(("replica", "r1"),): 3.0}


def test_hostile_publications_and_heartbeats_never_break_a_scrape() -> None:
    good = _publication("p1", 1.0)
    families = dict(good["families"])
    families["colony_runs_completed"] = [
        [["x"], float("nan")],
        [["x"], -5],
        [["x"], True],
        [["x"], 1e300],
        [["x", "extra"], 1.0],
        [["\x1b[31mred"], 1.0],
        [["y" * 1000], 1.0],
        "junk",
        [["ok"], 2.0],
    ]
    families["colony_run_duration_seconds"] = [
        [[], [1.0] * 3, 1.0],
        [[], [math.inf] * 13, 1.0],
        [[], [1.0] * 13, "x"],
    ]
    families["colony_placements"] = [[[f"step-{i}"], 1.0] for i in range(metrics.MAX_SERIES_PER_FAMILY + 50)]
    hostile = [
        {**good, "families": families},
        _publication("p1", 50.0),  # the same process id again: the first one stands
        _publication("bad id", 1.0),
        _publication("\x1b[31mred", 1.0),
        _publication('a"b', 1.0),
        _publication("p" * 129, 1.0),
        {**_publication("p9", 1.0), "process": 9},
        {"process": "old", "samples": [{"name": "colony_placements_total", "labels": {}, "value": 1}]},
        {"process": "p3", "format": 2, "families": ["not", "a", "dict"]},
        None,
        7,
        "text",
        {"format": 2, "families": {"colony_runs_completed": {"a": 1}}},
    ]
    heartbeats: list[Any] = [
        {"replica_id": "r1", "stats": "junk", "pages": [1, 2]},
        {"replica_id": {"nested": 1}},
        {"replica_id": "r2", "agents": float("nan"), "stats": {"ttft_histogram": [1, 2], "requests": -1}},
        {"replica_id": "r3", "stats": {"ttft_histogram": ["a"] * 14}, "pages": {"hits": "many"}},
        None,
    ]
    scraped = _scrape(heartbeats, hostile)
    assert scraped["colony_cluster_runs_completed_total"] == {(("process", "p1"), ("status", "ok")): 2.0}
    assert "colony_cluster_run_duration_seconds_bucket" not in scraped  # every entry malformed
    assert len(scraped["colony_cluster_placements_total"]) == metrics.MAX_SERIES_PER_FAMILY
    assert scraped["colony_replica_agents"] == {
        (("replica", "r1"),): 0.0,
        (("replica", "r2"),): 0.0,
        (("replica", "r3"),): 0.0,
    }
    assert scraped["colony_replica_inference_requests_total"][(("replica", "r2"),)] == 0.0
    assert "colony_replica_inference_ttft_seconds_bucket" not in scraped  # wrong lengths, not numbers


async def test_processes_publish_through_redis_and_the_sum_counts_each_once(bb: Blackboard) -> None:
    """Several processes publish into Redis (a publication per process, rewritten, not added);
    the reader sums what it finds, a hostile entry in the index included, without failing."""
    settings = ColonySettings(serve=ServeSettings(heartbeat_seconds=30.0))
    registry = AgentRegistry(bb.scoped(f"colony:{uuid.uuid4().hex[:8]}"), settings=settings)
    assert await registry.publish(_publication("host-1", 1.0), "a")
    assert not await registry.publish(_publication("host-1", 9.0), "a")  # within a heartbeat period
    assert await registry.publish(_publication("host-1", 2.0), "a", force=True)  # replaces its own
    assert await registry.publish(_publication("host-2", 3.0), "b")
    await registry.publish({"process": "host-3", "format": 2, "families": {"colony_placements": "x"}}, "c")
    found = await registry.publications(limit=metrics.MAX_PUBLICATIONS)
    assert len(found) == 3 and len(await registry.publications(limit=1)) == 1
    scraped = _scrape([], found)
    assert scraped["colony_cluster_runs_completed_total"] == {
        (("process", "host-1"), ("status", "x")): 2.0,
        (("process", "host-2"), ("status", "x")): 3.0,
    }


async def test_no_series_goes_back_whichever_api_replica_answers(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two API replicas answer scrapes in turn: the one answering exports its own figures from
    memory and publishes them at once, so the other, answering next, never shows less for it (a
    drop would read as a counter reset in Prometheus)."""
    from types import SimpleNamespace

    from colony.api.routes.health import published_of

    settings = ColonySettings(serve=ServeSettings(heartbeat_seconds=30.0))
    registry = AgentRegistry(bb.scoped(f"colony:{uuid.uuid4().hex[:8]}"), settings=settings)
    services: Any = SimpleNamespace(registry=registry)
    done = {"api-a": 0.0, "api-b": 5.0}  # what each API process has counted so far
    seen: list[dict[str, float]] = []
    for answering in ("api-a", "api-a", "api-b", "api-a", "api-b"):
        done["api-a"] += 10.0  # api-a is the busy one
        monkeypatch.setattr(metrics, "published_counters", lambda who=answering: _publication(who, done[who]))
        scraped = _scrape([], await published_of(services))
        series = scraped["colony_cluster_runs_completed_total"]
        seen.append({dict(labels)["process"]: value for labels, value in series.items()})
    # the answering replica counts itself fresh, the other as it last published (when it answered)
    assert seen == [
        {"api-a": 10.0},
        {"api-a": 20.0},
        {"api-a": 20.0, "api-b": 5.0},
        {"api-a": 40.0, "api-b": 5.0},
        {"api-a": 40.0, "api-b": 5.0},
    ], seen


# -- review finding M4: no exported counter series may ever go back ------------------------------

Scrape = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _decreases(before: Scrape, after: Scrape) -> list[str]:
    """Every counter-like sample (`_total`, `_bucket`, `_count`, `_sum`) exported in both scrapes
    whose value went down: what Prometheus would take for a counter reset."""
    found = []
    for name, series in before.items():
        if not name.endswith(("_total", "_bucket", "_count", "_sum")):
            continue
        for labels, value in series.items():
            later = after.get(name, {}).get(labels)
            if later is not None and later < value:
                found.append(f"{name}{dict(labels)}: {value} -> {later}")
    return found


# A process of its own: fixed host name and pid (as a container restarted in the same pod gets),
# counts `count` finished runs and publishes once into the scope, the way every Colony process does.
_RESTARTED_PROCESS = """
import asyncio, os, socket, sys
socket.gethostname = lambda: "colony-api-7d9f-x2"
os.getpid = lambda: 7
from colony import metrics
from colony.blackboard import Blackboard, create_redis
from colony.config import BlackboardSettings, load_settings
from colony.system.registry import AgentRegistry


async def main() -> None:
    url, scope, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    metrics.RUNS_COMPLETED.labels("succeeded").inc(count)
    for _ in range(count):
        metrics.RUN_DURATION_SECONDS.observe(0.2)
    settings = BlackboardSettings()
    client = create_redis(url, settings)
    registry = AgentRegistry(
        Blackboard(client, scope, settings=settings), retention_seconds=60.0, settings=load_settings()
    )
    await registry.publish(metrics.published_counters(), "test", force=True)
    await client.aclose()
    print(metrics.process_id())


asyncio.run(main())
"""


async def test_a_process_restarted_with_the_same_host_and_pid_never_makes_a_series_go_back(
    bb: Blackboard, redis_url: str
) -> None:
    """A container restarted inside its pod keeps its host name and (often) its pid; the restarted
    process has counted less than the one it replaces. It must not take over that one's publication
    (the old series would drop from 10 to 3): it is a new process, with series of its own."""
    scope = f"colony:{uuid.uuid4().hex[:8]}"
    registry = AgentRegistry(bb.scoped(scope), retention_seconds=60.0, settings=load_settings())

    def start(count: int) -> str:
        done = subprocess.run(
            [sys.executable, "-c", _RESTARTED_PROCESS, redis_url, scope, str(count)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip()

    first = start(10)
    before = _scrape([], await registry.publications())
    second = start(3)
    after = _scrape([], await registry.publications())
    assert first.startswith("colony-api-7d9f-x2-7-") and second.startswith("colony-api-7d9f-x2-7-")
    assert first != second, "a restarted process must get a process id of its own"
    runs = after["colony_cluster_runs_completed_total"]
    assert runs[(("process", first), ("status", "succeeded"))] == 10.0  # the old one's series stays
    assert runs[(("process", second), ("status", "succeeded"))] == 3.0
    assert not _decreases(before, after)


async def test_a_publication_expiring_never_makes_a_remaining_series_go_back(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process gone for longer than the retention: its publication expires and its series end;
    every series still exported keeps its value (a sum over processes would have dropped)."""
    from colony.system import registry as registry_module

    registry = AgentRegistry(
        bb.scoped(f"colony:{uuid.uuid4().hex[:8]}"), retention_seconds=60.0, settings=load_settings()
    )
    monkeypatch.setattr(registry_module, "PUBLICATION_RETENTION_SECONDS", 0.5)
    await registry.publish(_publication("gone-1", 2.0), "a", force=True)
    monkeypatch.setattr(registry_module, "PUBLICATION_RETENTION_SECONDS", 86400.0)
    await registry.publish(_publication("live-1", 3.0), "b", force=True)
    before = _scrape([], await registry.publications())
    assert {dict(k)["process"] for k in before["colony_cluster_runs_completed_total"]} == {"gone-1", "live-1"}
    deadline = time.monotonic() + 10
    while len(await registry.publications()) > 1:
        assert time.monotonic() < deadline, "the short-lived publication never expired"
        await asyncio.sleep(0.1)
    after = _scrape([], await registry.publications())
    assert after["colony_cluster_runs_completed_total"] == {(("process", "live-1"), ("status", "x")): 3.0}
    assert not _decreases(before, after)


async def test_past_the_cap_two_scrapes_in_a_row_export_the_same_processes(
    bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More publications than MAX_PUBLICATIONS: the scrape exports the most recently published ones
    (whatever order the index scan lists them in), so the answer does not jitter from one scrape
    to the next while the live processes publish again; and no series goes back."""
    from types import SimpleNamespace

    from colony.api.routes.health import published_of

    monkeypatch.setattr(metrics, "MAX_PUBLICATIONS", 5)
    registry = AgentRegistry(
        bb.scoped(f"colony:{uuid.uuid4().hex[:8]}"), retention_seconds=60.0, settings=load_settings()
    )
    processes = [f"proc-{i:03d}" for i in range(150)]  # past Redis' small-set encoding too
    for index, process in enumerate(processes):
        await registry.publish(_publication(process, float(index)), "p", force=True)
        if index >= len(processes) - 6:
            await asyncio.sleep(0.01)  # the newest ones a few ms apart (Redis' clock counts ms)
    monkeypatch.setattr(metrics, "published_counters", lambda: _publication("api-own", 1.0))
    services: Any = SimpleNamespace(registry=registry)

    def exported(scraped: Scrape) -> set[str]:
        return {dict(k)["process"] for k in scraped["colony_cluster_runs_completed_total"]}

    first = _scrape([], await published_of(services))
    for process in processes[-4:]:  # the live ones publish again meanwhile
        await registry.publish(_publication(process, 1000.0), "p", force=True)
    second = _scrape([], await published_of(services))
    third = _scrape([], await published_of(services))
    assert exported(first) == {"api-own", *processes[-4:]}, exported(first)
    assert exported(second) == exported(first) == exported(third)
    assert not _decreases(first, second) and not _decreases(second, third)
