"""Every Prometheus metric Colony exports, defined once here.

Names follow Prometheus conventions (`colony_*_total` for counters, `_seconds` for durations);
label values are bounded sets (operation names, never keys or ids).

Cluster-wide figures. A scrape of `/metrics` reaches one API replica, while most figures are
observed in other processes (engine replicas, the control plane, other API replicas). So every
process publishes the families in `PUBLISHED` into Redis (`published_counters()`: counters, and
histograms as bucket counts), and the answering API exports them as `colony_cluster_*`, one series
per process (a `process` label: host, pid and a nonce drawn at process start). They are not summed
here: a sum over processes goes back whenever a process's publication ends (expiry, a restart, the
cap), which Prometheus reads as a counter reset; a series per process simply ends, a restarted
process starts a new one, and the dashboards sum `rate()` over processes. Replica heartbeats give
the per-replica `colony_replica_*` families (engine tokens and latency histograms, pages, agents).
Both are read from Redis at scrape time, so any API replica answers the same. The dashboards
(colony/dashboards.py) read only those families and `colony_agents`. What is read back is treated
as hostile: bounded counts, finite numbers, known names, label arities and process ids only; a
malformed entry is skipped, never an error of /metrics (that machinery: colony/metric_series.py).
docs/metrics.md lists every metric.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from colony.metric_series import (
    MAX_PUBLICATIONS,
    MAX_REPLICAS,
    PROCESS_LABEL,
    PUBLICATION_FORMAT,
    Published,
    _bucket_counts,
    _count,
    _cumulative,
    _label,
    _PerProcess,
    _published_family,
    process_id,
    process_label,
)
from colony.metric_series import MAX_SERIES_PER_FAMILY as MAX_SERIES_PER_FAMILY  # read as metrics.X

log = logging.getLogger(__name__)

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

_OP_CHILDREN: dict[str, tuple[Any, Any]] = {}


def blackboard_op(op: str) -> tuple[Any, Any]:
    """`BLACKBOARD_OPS` and `BLACKBOARD_OP_SECONDS` labelled with `op`, looked up once per op
    (`labels()` costs more than the update; op names are the code's own literals, a bounded set)."""
    children = _OP_CHILDREN.get(op)
    if children is None:
        children = _OP_CHILDREN[op] = (BLACKBOARD_OPS.labels(op), BLACKBOARD_OP_SECONDS.labels(op))
    return children


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
# bounds of every inference latency histogram (TTFT, request duration; process and replica ones)
INFERENCE_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
INFERENCE_TTFT_SECONDS = Histogram(
    "colony_inference_ttft_seconds",
    "Time to first token of inference requests.",
    ["engine"],
    buckets=INFERENCE_LATENCY_BUCKETS,
)
INFERENCE_REQUEST_SECONDS = Histogram(
    "colony_inference_request_seconds",
    "Duration of inference requests, from the call to the last token.",
    ["engine"],
    buckets=INFERENCE_LATENCY_BUCKETS,
)
INFERENCE_PAGE_OPS = Counter(
    "colony_inference_page_ops_total",
    "Page operations on engines (load, evict, swap_out, swap_in).",
    ["engine", "op"],
)

REPLY_LOOPS_STOPPED = Counter(
    "colony_reply_loops_stopped_total",
    "Streamed replies stopped because they had started to repeat themselves (colony.inference.loops).",
)

RUNS_SUBMITTED = Counter(
    "colony_runs_submitted_total", "Runs submitted over the API, by agent kind.", ["agent"]
)
TENANT_RUNS_SUBMITTED = Counter(
    "colony_tenant_runs_submitted_total",
    "Runs (and session turns) submitted over the API by the tenants other than the colony's own.",
    ["tenant"],
)
TENANT_REDIS_BYTES = Gauge(
    "colony_tenant_redis_bytes",
    "Bytes a tenant other than the colony's own holds in Redis, as last weighed by this API process.",
    ["tenant"],
)
TENANT_REFUSALS = Counter(
    "colony_tenant_quota_refusals_total",
    "Calls of a tenant other than the colony's own refused at one of its quotas (429), by quota.",
    ["tenant", "quota"],
)
RUNS_COMPLETED = Counter(
    "colony_runs_completed_total", "Runs that reached a terminal state, by status.", ["status"]
)
_RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RUN_DURATION_SECONDS = Histogram(
    "colony_run_duration_seconds", "Submit-to-terminal time of runs.", buckets=_RUN_BUCKETS
)


def run_ended(status: str, seconds: float) -> None:
    """Count one run's end (by whoever stored its answer: once in the cluster) and its
    submit-to-end time; a status other than succeeded or cancelled counts as failed."""
    label = status if status in ("succeeded", "cancelled") else "failed"
    RUNS_COMPLETED.labels(label).inc()
    RUN_DURATION_SECONDS.observe(max(0.0, seconds))


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
# outcome: executed (first use of a key), replayed (a retry answered from the first), in_flight
# (409: the first still runs), reused (422: another request's key), unknown (409: the first stopped
# without an answer), released (a 5xx: the key freed for a retry to run again)
HTTP_IDEMPOTENT = Counter(
    "colony_http_idempotent_requests_total", "Writes sent with an Idempotency-Key, by outcome.", ["outcome"]
)


PLACEMENTS = Counter(
    "colony_placements_total", "Agent placements by cascade step (hard, soft, retry, suspend).", ["step"]
)
PLACEMENTS_QUEUED = Counter("colony_placements_queued_total", "Placements that had to wait for room.")
AGENT_SUSPENSIONS = Counter("colony_agent_suspensions_total", "Agents suspended, by reason.", ["reason"])
AGENT_RESUMPTIONS = Counter(
    "colony_agent_resumptions_total", "Agents resumed, by condition kind.", ["condition"]
)
AGENT_EVICTIONS = Counter(
    "colony_agent_evictions_total",
    "Idle agents suspended to make room for another (room on demand), by kind (session, other).",
    ["kind"],
)
AGENTS_DELETED = Counter(
    "colony_agents_deleted_total",
    "Agents removed for good with every key of their state (DELETE /v1/sessions/{id}, session retention).",
)

# -- memory (colony/memory) ------------------------------------------------------------------------

_MEMORY_LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

MEMORY_WRITES = Counter(
    "colony_memory_writes_total",
    "Memory entries written, by scope type and outcome (created, or duplicate of a held entry).",
    ["scope_type", "outcome"],
)
MEMORY_INGESTED = Counter(
    "colony_memory_ingested_total", "Source entries a memory scope took in, by scope type.", ["scope_type"]
)
MEMORY_INGESTION_LAG_SECONDS = Histogram(
    "colony_memory_ingestion_lag_seconds",
    "Time from a source entry's write to its ingestion by a subscribing scope.",
    buckets=_MEMORY_LAG_BUCKETS,
)
MEMORY_PRUNED = Counter(
    "colony_memory_pruned_total", "Memory entries removed by maintenance, by reason.", ["reason"]
)
MEMORY_SUMMARIES = Counter(
    "colony_memory_summaries_total",
    "Consolidation summaries: stored, ungrounded (dropped: not backed by their sources) or failed.",
    ["outcome"],
)
MEMORY_RECALL_SECONDS = Histogram(
    "colony_memory_recall_seconds",
    "Latency of memory recalls, by ranking mode.",
    ["mode"],
    buckets=_FAST_BUCKETS,
)

# -- memory blocks (colony/memory/blocks) --------------------------------------------------------------

BLOCK_EDITS = Counter(
    "colony_block_edits_total",
    "Memory block edits, by operation and outcome (applied, repeated: a redone action's edit found "
    "made, or refused: access, limit, conflict, invalid).",
    ["op", "outcome"],
)
BLOCK_EDIT_RETRIES = Counter(
    "colony_block_edit_retries_total",
    "Block edits redone on fresh content, by reason (concurrent: another writer appended first; "
    "compacted: the log was folded meanwhile).",
    ["reason"],
)
BLOCK_COMPACTIONS = Counter(
    "colony_block_compactions_total",
    "Update logs folded into a block's snapshot, by kind (full, or shallow: old history dropped).",
    ["kind"],
)

# -- context management (colony/context) --------------------------------------------------------------

CONTEXT_CHECKPOINTS = Counter(
    "colony_context_checkpoints_total",
    "Agent checkpoints, by operation (created after a step; restored by undo or restore).",
    ["op"],
)
CONTEXT_COMPACTIONS = Counter(
    "colony_context_compactions_total",
    "Context compactions, by stage (masked: large outputs replaced by references; summarized: the "
    "middle summarised by the model; failed: the summariser failed and the masked view was kept; "
    "deferred: items taken out wait for a summary, the prompt's fixed parts alone passing the trigger).",
    ["stage"],
)
CONTEXT_COMPACTED_TOKENS = Counter(
    "colony_context_compacted_tokens_total",
    "Prompt tokens removed from agents' contexts by compaction (estimated before minus after).",
)
ACTION_LOG_REPLAYS = Counter(
    "colony_action_log_replays_total",
    "Recorded results used on resume instead of calling again, and calls made again, by kind "
    "(model, action) and outcome (replayed, reexecuted).",
    ["kind", "outcome"],
)
ACTION_RERUNS = Counter(
    "colony_action_reruns_total",
    "Actions run again by a step redone after a crash, though they had started before (their "
    "result was not recorded), by action and whether it declares effects (declared: the redo "
    "reuses its idempotency key; none: at-least-once, docs/effects.md).",
    ["action", "effects"],
)
SESSION_MESSAGES = Counter(
    "colony_session_messages_total",
    "Messages added to session conversation trees, by role (user, assistant).",
    ["role"],
)


# -- cluster-wide sums: what each process publishes, and how the API adds it up --------------------


PUBLISHED: tuple[Published, ...] = (
    Published(PLACEMENTS, ("step",)),
    Published(PLACEMENTS_QUEUED),
    Published(AGENT_SUSPENSIONS, ("reason",)),
    Published(AGENT_RESUMPTIONS, ("condition",)),
    Published(AGENT_EVICTIONS, ("kind",)),
    Published(AGENTS_DELETED),
    Published(RUNS_SUBMITTED, ("agent",)),
    Published(RUNS_COMPLETED, ("status",)),
    Published(RUN_DURATION_SECONDS, (), _RUN_BUCKETS),
    Published(HTTP_REQUESTS, ("route", "method", "code")),
    Published(HTTP_REQUEST_SECONDS, ("route",), _FAST_BUCKETS),
    Published(BLACKBOARD_OPS, ("op",)),
    Published(BLACKBOARD_OP_ERRORS, ("op", "error")),
    Published(BLACKBOARD_CONFLICTS),
    Published(BLACKBOARD_UPDATE_RETRIES),
    Published(BLACKBOARD_OP_SECONDS, ("op",), _FAST_BUCKETS),
    Published(BLACKBOARD_EVENTS_RECEIVED, ("mode",)),
    Published(BLACKBOARD_EVENT_LAG_SECONDS, (), _FAST_BUCKETS),
    Published(BLACKBOARD_EVENTS_RECLAIMED),
    Published(INFERENCE_REQUESTS, ("engine", "outcome")),
    Published(INFERENCE_TOKENS, ("engine", "kind")),
    Published(INFERENCE_TTFT_SECONDS, ("engine",), INFERENCE_LATENCY_BUCKETS),
    Published(INFERENCE_REQUEST_SECONDS, ("engine",), INFERENCE_LATENCY_BUCKETS),
    Published(INFERENCE_PAGE_OPS, ("engine", "op")),
    Published(REPLY_LOOPS_STOPPED),
    Published(MEMORY_WRITES, ("scope_type", "outcome")),
    Published(MEMORY_INGESTED, ("scope_type",)),
    Published(MEMORY_INGESTION_LAG_SECONDS, (), _MEMORY_LAG_BUCKETS),
    Published(MEMORY_PRUNED, ("reason",)),
    Published(MEMORY_SUMMARIES, ("outcome",)),
    Published(MEMORY_RECALL_SECONDS, ("mode",), _FAST_BUCKETS),
    Published(BLOCK_EDITS, ("op", "outcome")),
    Published(BLOCK_COMPACTIONS, ("kind",)),
    Published(BLOCK_EDIT_RETRIES, ("reason",)),
    Published(CONTEXT_CHECKPOINTS, ("op",)),
    Published(CONTEXT_COMPACTIONS, ("stage",)),
    Published(CONTEXT_COMPACTED_TOKENS),
    Published(ACTION_LOG_REPLAYS, ("kind", "outcome")),
    Published(ACTION_RERUNS, ("action", "effects")),
    Published(SESSION_MESSAGES, ("role",)),
)
PUBLISHED_BY_NAME = {p.name: p for p in PUBLISHED}


def published_counters() -> dict[str, Any]:
    """This process's published families (`PUBLISHED`), for Redis: the API exports them per process
    (`colony_cluster_*`). Keyed by process, so a process publishing twice is counted once."""
    families = {spec.name: _published_family(spec) for spec in PUBLISHED}
    return {"process": process_id(), "format": PUBLICATION_FORMAT, "families": families}


def cluster_families(publications: Iterable[Any]) -> list[Metric]:
    """Every `PUBLISHED` family, one series per process and label set, from `publications` (one per
    process, in the order given: the caller puts the most recently published first). Malformed
    parts, a process id seen before and publications past MAX_PUBLICATIONS are skipped."""
    tables = {spec.name: _PerProcess(spec) for spec in PUBLISHED}
    seen: set[str] = set()
    for publication in publications:
        if len(seen) >= MAX_PUBLICATIONS:
            log.warning("more than %d processes published metrics; the rest not exported", MAX_PUBLICATIONS)
            break
        if not isinstance(publication, dict) or publication.get("format") != PUBLICATION_FORMAT:
            continue
        process, families = process_label(publication.get("process")), publication.get("families")
        if process is None or process in seen or not isinstance(families, dict):
            continue
        seen.add(process)
        for name, table in tables.items():
            series = families.get(name)
            if isinstance(series, list):
                table.add(process, series)
    return [table.family() for table in tables.values()]


# -- per-replica figures from replica heartbeats ---------------------------------------------------

REPLICA_PAGE_OPS = ("hits", "faults", "loads", "swap_ins", "evictions")
REPLICA_TOKEN_KINDS = ("prompt", "cached", "completion")
# heartbeat stats fields of the per-bucket counts and of the sum, by replica latency histogram
REPLICA_LATENCY = {
    "colony_replica_inference_ttft_seconds": ("ttft_histogram", "ttft_seconds_total"),
    "colony_replica_inference_request_seconds": ("request_histogram", "request_seconds_total"),
}
# every per-replica family: its kind, labels and help
REPLICA_FAMILIES: dict[str, tuple[type[Metric], tuple[str, ...], str]] = {
    "colony_replica_inference_tokens": (
        CounterMetricFamily,
        ("replica", "kind"),
        "Tokens processed by each replica's engine (prompt, cached, completion).",
    ),
    "colony_replica_inference_requests": (
        CounterMetricFamily,
        ("replica",),
        "Requests served by each replica's engine.",
    ),
    "colony_replica_inference_ttft_seconds": (
        HistogramMetricFamily,
        ("replica",),
        "Time to first token of each replica's engine.",
    ),
    "colony_replica_inference_request_seconds": (
        HistogramMetricFamily,
        ("replica",),
        "Duration of each replica's inference requests, from the call to the last token.",
    ),
    "colony_replica_agents": (GaugeMetricFamily, ("replica",), "Agents hosted by each replica."),
    "colony_replica_page_ops": (
        CounterMetricFamily,
        ("replica", "op"),
        "Page operations of each replica: hits, faults, loads, swap_ins, evictions.",
    ),
    "colony_replica_resident_pages": (
        GaugeMetricFamily,
        ("replica",),
        "Pages resident in each replica's KV cache.",
    ),
    "colony_replica_swapped_pages": (GaugeMetricFamily, ("replica",), "Pages in each replica's disk tier."),
}


def latency_bucket(seconds: float) -> int:
    """The index of the INFERENCE_LATENCY_BUCKETS bucket (len() of them for +Inf) `seconds` falls in:
    engines count their own requests so (EngineStats), and their heartbeat carries the counts."""
    for index, bound in enumerate(INFERENCE_LATENCY_BUCKETS):
        if seconds <= bound:
            return index
    return len(INFERENCE_LATENCY_BUCKETS)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class ReplicaStatsCollector:
    """Cluster-wide figures read from Redis at scrape time, so the API's /metrics shows what other
    processes did: each replica's engine counters and latency histograms, agents and pages (from its
    heartbeat), and the families every process publishes (`published_counters()`), per process as
    `colony_cluster_*`. The API sets `snapshot` and `published` before each scrape."""

    PAGE_OPS = REPLICA_PAGE_OPS

    def __init__(self) -> None:
        self.snapshot: list[Any] = []  # replica heartbeats
        self.published: list[Any] = []  # one publication per process

    def describe(self) -> list[Metric]:
        """The families (no samples), without reading anything: what registration checks."""
        return [*self._replica_families([]), *cluster_families([])]

    def collect(self) -> Iterator[Metric]:
        try:
            families = [*self._replica_families(self.snapshot), *cluster_families(self.published)]
        except Exception:  # never a failed scrape for what Redis held; the families are still named
            log.exception("cluster metrics could not be read; exported empty")
            families = self.describe()
        yield from families

    def _replica_families(self, snapshot: Iterable[Any]) -> list[Metric]:
        families: dict[str, Any] = {
            name: kind(name, doc, labels=list(labels))
            for name, (kind, labels, doc) in REPLICA_FAMILIES.items()
        }
        seen: set[str] = set()
        for replica in list(snapshot)[:MAX_REPLICAS]:
            info = _dict(replica)
            name = _label(info.get("replica_id"))
            if name is None or name in seen:
                continue
            seen.add(name)
            stats, pages = _dict(info.get("stats")), _dict(info.get("pages"))
            for kind in REPLICA_TOKEN_KINDS:
                value = _count(stats.get(f"{kind}_tokens")) or 0.0
                families["colony_replica_inference_tokens"].add_metric([name, kind], value)
            families["colony_replica_inference_requests"].add_metric(
                [name], _count(stats.get("requests")) or 0.0
            )
            for family_name, (counts_field, sum_field) in REPLICA_LATENCY.items():
                counts = _bucket_counts(stats.get(counts_field), len(INFERENCE_LATENCY_BUCKETS) + 1)
                if counts is not None:
                    buckets = _cumulative(INFERENCE_LATENCY_BUCKETS, counts)
                    families[family_name].add_metric([name], buckets, _count(stats.get(sum_field)) or 0.0)
            families["colony_replica_agents"].add_metric([name], _count(info.get("agents")) or 0.0)
            for op in REPLICA_PAGE_OPS:
                families["colony_replica_page_ops"].add_metric([name, op], _count(pages.get(op)) or 0.0)
            for tier in ("resident", "swapped"):
                value = _count(pages.get(tier)) or 0.0
                families[f"colony_replica_{tier}_pages"].add_metric([name], value)
        return list(families.values())


def family_labels() -> dict[str, tuple[str, ...]]:
    """The labels of every family a dashboard may read (the cluster-wide ones and `colony_agents`),
    by family name: the dashboards keep them (`process` included) when they drop duplicate scrape
    targets, so each process's series is kept once and summed after."""
    labels = {name: spec[1] for name, spec in REPLICA_FAMILIES.items()}
    labels.update({p.cluster_name: (PROCESS_LABEL, *p.labels) for p in PUBLISHED})
    labels["colony_agents"] = ("state",)
    return labels


def exported_names() -> set[str]:
    """Every sample name Colony's /metrics can carry (with `_total`, `_bucket`, `_sum`, `_count`,
    `_created` suffixes): what a dashboard query may name (tests/test_dashboards.py)."""
    own = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
    collected = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for family in (m for c in _COLONY_COLLECTORS for m in c.describe()):
        names.update(family.name + s for s in own.get(family.type, ("",)))
    for family in REPLICA_STATS.describe():
        names.update(family.name + s for s in collected.get(family.type, ("",)))
    return names


REPLICA_STATS = ReplicaStatsCollector()
REGISTRY.register(REPLICA_STATS)
_COLONY_COLLECTORS: tuple[Counter | Gauge | Histogram, ...] = (
    BLACKBOARD_OPS,
    BLACKBOARD_OP_ERRORS,
    BLACKBOARD_CONFLICTS,
    BLACKBOARD_UPDATE_RETRIES,
    BLACKBOARD_OP_SECONDS,
    BLACKBOARD_EVENTS_RECEIVED,
    BLACKBOARD_EVENT_LAG_SECONDS,
    BLACKBOARD_EVENTS_RECLAIMED,
    INFERENCE_REQUESTS,
    INFERENCE_TOKENS,
    INFERENCE_TTFT_SECONDS,
    INFERENCE_REQUEST_SECONDS,
    INFERENCE_PAGE_OPS,
    RUNS_SUBMITTED,
    RUNS_COMPLETED,
    RUN_DURATION_SECONDS,
    AGENTS,
    HTTP_REQUESTS,
    HTTP_REQUEST_SECONDS,
    PLACEMENTS,
    PLACEMENTS_QUEUED,
    AGENT_SUSPENSIONS,
    AGENT_RESUMPTIONS,
    AGENT_EVICTIONS,
    AGENTS_DELETED,
)

# M14 runs scale out (colony/system/runs.py, colony/system/pools.py): per process, not published
RUNS_REJECTED = Counter(
    "colony_runs_rejected_total",
    "Runs refused at submit (HTTP 429) because their agent had as many open as it admits, by agent kind.",
    ["agent"],
)
POOL_MEMBERS = Gauge(
    "colony_pool_members", "Live members of each agent pool (the control plane's view), by pool.", ["pool"]
)
POOL_RESIZES = Counter(
    "colony_pool_resizes_total",
    "Pool members started (grow) or stopped (shrink) by the pool manager.",
    ["direction"],
)

# M14 prefetch (colony/system/host.py): per replica process, not published
PAGES_PREFETCHED = Counter(
    "colony_pages_prefetched_total",
    "Pages a replica brought in for a page-bound agent placed or resumed there, before its first step.",
)
# M17 needed soon (colony/system/host_pages.py): per replica process, not published
NEEDED_SOON_USES = Counter(
    "colony_needed_soon_page_uses_total",
    "Page uses (the first of a run, not its next steps) by why the replica's needed-soon list named "
    "the page just before (none: not named) and whether it was resident (hit) or faulted in (fault).",
    ["named", "outcome"],
)
