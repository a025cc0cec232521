"""Every Prometheus metric Colony exports, defined once here.

Names follow Prometheus conventions (`colony_*_total` for counters, `_seconds` for durations);
label values are bounded sets (operation names, never keys or ids).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

BLACKBOARD_OPS = Counter(
    "colony_blackboard_ops_total",
    "Blackboard operations by kind (write, read, delete, query, update, commit, ...).",
    ["op"],
)
BLACKBOARD_OP_ERRORS = Counter(
    "colony_blackboard_op_errors_total",
    "Blackboard operations that failed, by kind and error class.",
    ["op", "error"],
)
BLACKBOARD_CONFLICTS = Counter(
    "colony_blackboard_conflicts_total",
    "Optimistic-concurrency conflicts (stale expected_version, changed transaction read set).",
)
BLACKBOARD_UPDATE_RETRIES = Counter(
    "colony_blackboard_update_retries_total",
    "Retries of Blackboard.update() after a conflict.",
)
BLACKBOARD_OP_SECONDS = Histogram(
    "colony_blackboard_op_seconds",
    "Latency of blackboard operations.",
    ["op"],
    buckets=_FAST_BUCKETS,
)
BLACKBOARD_EVENTS_RECEIVED = Counter(
    "colony_blackboard_events_received_total",
    "Blackboard events delivered to subscribers and consumers.",
    ["mode"],
)
BLACKBOARD_EVENT_LAG_SECONDS = Histogram(
    "colony_blackboard_event_lag_seconds",
    "Time from an event's append to its delivery to a subscriber.",
    buckets=_FAST_BUCKETS,
)
BLACKBOARD_EVENTS_RECLAIMED = Counter(
    "colony_blackboard_events_reclaimed_total",
    "Pending events reclaimed from consumers that stopped acknowledging.",
)

INFERENCE_REQUESTS = Counter(
    "colony_inference_requests_total",
    "Inference requests by engine kind and outcome.",
    ["engine", "outcome"],
)
INFERENCE_TOKENS = Counter(
    "colony_inference_tokens_total",
    "Tokens processed by engine kind and kind of token (prompt, cached, completion).",
    ["engine", "kind"],
)
INFERENCE_TTFT_SECONDS = Histogram(
    "colony_inference_ttft_seconds",
    "Time to first token of inference requests.",
    ["engine"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
INFERENCE_PAGE_OPS = Counter(
    "colony_inference_page_ops_total",
    "Page operations on engines (load, evict, swap_out, swap_in).",
    ["engine", "op"],
)

RUNS_SUBMITTED = Counter(
    "colony_runs_submitted_total", "Runs submitted over the API, by agent kind.", ["agent"]
)
RUNS_COMPLETED = Counter(
    "colony_runs_completed_total", "Runs that reached a terminal state, by status.", ["status"]
)
RUN_DURATION_SECONDS = Histogram(
    "colony_run_duration_seconds",
    "Submit-to-terminal time of runs.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
AGENTS = Gauge("colony_agents", "Agents in the registry, by lifecycle state.", ["state"])
HTTP_REQUESTS = Counter(
    "colony_http_requests_total",
    "HTTP requests by route template, method and status code.",
    ["route", "method", "code"],
)
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def http_method_label(method: str) -> str:
    """The `method` label of HTTP_REQUESTS: a standard method, else OTHER (an unauthenticated
    client may send any token as a method; label values must stay a fixed, small set)."""
    return method if method in HTTP_METHODS else "OTHER"


HTTP_REQUEST_SECONDS = Histogram(
    "colony_http_request_seconds", "HTTP request latency by route template.", ["route"], buckets=_FAST_BUCKETS
)


class ReplicaStatsCollector:
    """Cluster-wide figures read from Redis at scrape time, so the API's /metrics shows what other
    processes did: each replica's engine counters, agents and pages (from its heartbeat), and the
    counters every process publishes (`published_counters()`), summed over processes as
    `colony_cluster_*`."""

    PAGE_OPS = ("hits", "faults", "loads", "swap_ins", "evictions")

    def __init__(self) -> None:
        self.snapshot: list[dict[str, object]] = []  # replica heartbeats, set before each scrape
        self.published: list[dict[str, object]] = []  # one publication per process

    def collect(self):  # type: ignore[no-untyped-def]
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        tokens = CounterMetricFamily(
            "colony_replica_inference_tokens",
            "Tokens processed by each replica's engine.",
            labels=["replica", "kind"],
        )
        requests = CounterMetricFamily(
            "colony_replica_inference_requests",
            "Requests served by each replica's engine.",
            labels=["replica"],
        )
        ttft = CounterMetricFamily(
            "colony_replica_inference_ttft_seconds",
            "Summed time to first token of each replica's engine (divide by requests for the mean).",
            labels=["replica"],
        )
        agents = GaugeMetricFamily(
            "colony_replica_agents", "Agents hosted by each replica.", labels=["replica"]
        )
        page_ops = CounterMetricFamily(
            "colony_replica_page_ops",
            "Page operations of each replica: hits, faults, loads, swap_ins, evictions.",
            labels=["replica", "op"],
        )
        resident = GaugeMetricFamily(
            "colony_replica_resident_pages", "Pages resident in each replica's KV cache.", labels=["replica"]
        )
        swapped = GaugeMetricFamily(
            "colony_replica_swapped_pages", "Pages in each replica's disk tier.", labels=["replica"]
        )
        for replica in self.snapshot:
            name = str(replica.get("replica_id"))
            stats = replica.get("stats") or {}
            pages = replica.get("pages") or {}
            assert isinstance(stats, dict) and isinstance(pages, dict)
            for kind in ("prompt", "cached", "completion"):
                tokens.add_metric([name, kind], float(stats.get(f"{kind}_tokens", 0)))
            requests.add_metric([name], float(stats.get("requests", 0)))
            ttft.add_metric([name], float(stats.get("ttft_seconds_total", 0.0)))
            agents.add_metric([name], float(replica.get("agents", 0)))  # type: ignore[arg-type]
            for op in self.PAGE_OPS:
                page_ops.add_metric([name, op], float(pages.get(op, 0)))
            resident.add_metric([name], float(pages.get("resident", 0)))
            swapped.add_metric([name], float(pages.get("swapped", 0)))
        return [tokens, requests, ttft, agents, page_ops, resident, swapped, *self._cluster_counters()]

    def _cluster_counters(self):  # type: ignore[no-untyped-def]
        from prometheus_client.core import CounterMetricFamily

        sums: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for publication in self.published:
            for sample in publication.get("samples") or []:  # type: ignore[attr-defined]
                labels = tuple(sorted(sample["labels"].items()))
                series = sums.setdefault(sample["name"], {})
                series[labels] = series.get(labels, 0.0) + float(sample["value"])
        families = []
        for counter, label_names in PUBLISHED_COUNTERS:
            (description,) = counter.describe()
            name = description.name  # the family name, without _total
            family = CounterMetricFamily(
                name.replace("colony_", "colony_cluster_", 1),
                f"{description.documentation} Summed over every Colony process.",
                labels=list(label_names),
            )
            for labels, value in sorted(sums.get(name + "_total", {}).items()):
                values = dict(labels)
                family.add_metric([values.get(n, "") for n in label_names], value)
            families.append(family)
        return families


PLACEMENTS = Counter(
    "colony_placements_total", "Agent placements by cascade step (hard, soft, retry, suspend).", ["step"]
)
PLACEMENTS_QUEUED = Counter("colony_placements_queued_total", "Placements that had to wait for room.")
AGENT_SUSPENSIONS = Counter("colony_agent_suspensions_total", "Agents suspended, by reason.", ["reason"])
AGENT_RESUMPTIONS = Counter(
    "colony_agent_resumptions_total", "Agents resumed, by condition kind.", ["condition"]
)

PUBLISHED_COUNTERS: tuple[tuple[Counter, tuple[str, ...]], ...] = (
    (PLACEMENTS, ("step",)),
    (PLACEMENTS_QUEUED, ()),
    (AGENT_SUSPENSIONS, ("reason",)),
    (AGENT_RESUMPTIONS, ("condition",)),
)


def published_counters() -> dict[str, object]:
    """This process's control-plane counters, for its heartbeat: the API sums them over processes
    (`colony_cluster_*`). Keyed by process so a process publishing twice is counted once."""
    import os
    import socket

    samples = [
        {"name": sample.name, "labels": dict(sample.labels), "value": sample.value}
        for counter, _labels in PUBLISHED_COUNTERS
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    ]
    return {"process": f"{socket.gethostname()}-{os.getpid()}", "samples": samples}


REPLICA_STATS = ReplicaStatsCollector()
REGISTRY.register(REPLICA_STATS)
