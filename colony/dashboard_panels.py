"""What each Colony dashboard shows: the panels, as data (rendered by colony/dashboards.py).

Every query reads a cluster-wide family (docs/metrics.md): what every process publishes in Redis,
one series per process (`colony_cluster_*`, summed over processes by the query helpers), each engine
replica's heartbeat (`colony_replica_*`) and the registry (`colony_agents`).
Add or change a panel here, then run `python -m colony.dashboards`.
"""

from __future__ import annotations

from colony.dashboards import Dashboard, Panel, Target, gauge, quantiles, rate


def _in_range(sample: str, by: str) -> Target:
    """A counter's increase over the dashboard's time range, by one label."""
    return Target(rate(sample, (by,), fn="increase", window="$__range"), f"{{{{{by}}}}}")


def _per_second(sample: str, by: tuple[str, ...], legend: str, **matchers: str) -> Target:
    return Target(rate(sample, by, **matchers), legend)


OVERVIEW = Dashboard(
    uid="colony-overview",
    title="Colony / Overview",
    description="Runs submitted and finished, submit latency, run duration, HTTP traffic, agents.",
    panels=(
        Panel(
            "Runs finished in range, by status",
            "Runs that reached a terminal state (succeeded, failed, cancelled) during the time range.",
            (_in_range("colony_cluster_runs_completed_total", "status"),),
            kind="stat",
            width=8,
        ),
        Panel(
            "Runs submitted in range, by agent",
            "Runs the API accepted during the time range (echo, ask, or custom agents).",
            (_in_range("colony_cluster_runs_submitted_total", "agent"),),
            kind="stat",
            width=8,
        ),
        Panel(
            "Agents by state",
            "Agents in the registry now, by lifecycle state.",
            (Target(gauge("colony_agents", ("state",)), "{{state}}"),),
            kind="stat",
            width=8,
        ),
        Panel(
            "Runs submitted / s",
            "Runs accepted by the API, by agent kind.",
            (_per_second("colony_cluster_runs_submitted_total", ("agent",), "{{agent}}"),),
            unit="reqps",
        ),
        Panel(
            "Runs finished / s, by status",
            "Runs reaching succeeded, failed or cancelled.",
            (_per_second("colony_cluster_runs_completed_total", ("status",), "{{status}}"),),
            unit="reqps",
        ),
        Panel(
            "Submit latency",
            "Time the API takes to accept a run (POST /v1/runs): validation and the Redis writes.",
            quantiles("colony_cluster_http_request_seconds", route="/v1/runs"),
            unit="s",
        ),
        Panel(
            "Run duration",
            "Submit-to-terminal time of finished runs.",
            quantiles("colony_cluster_run_duration_seconds"),
            unit="s",
        ),
        Panel(
            "HTTP requests / s, by code",
            "Requests every API replica answered, by status code.",
            (_per_second("colony_cluster_http_requests_total", ("code",), "{{code}}"),),
            unit="reqps",
        ),
        Panel(
            "HTTP latency p95, by route",
            "95th percentile of request latency, per route template.",
            quantiles("colony_cluster_http_request_seconds", ("route",), "{{route}}", qs=(0.95,)),
            unit="s",
        ),
    ),
)

AGENTS = Dashboard(
    uid="colony-agents",
    title="Colony / Agents",
    description="Agents by state and replica, suspensions and resumptions, placements by cascade step.",
    panels=(
        Panel(
            "Agents by state",
            "Agents in the registry, by lifecycle state.",
            (Target(gauge("colony_agents", ("state",)), "{{state}}"),),
        ),
        Panel(
            "Agents per replica",
            "Agents each engine replica hosts (its heartbeat).",
            (Target(gauge("colony_replica_agents", ("replica",)), "{{replica}}"),),
        ),
        Panel(
            "Suspensions / s, by reason",
            "Agents suspended to Redis: make_room (lower priority, room for another), children "
            "(waiting for the agents it spawned), pages (page evicted), request (API), other.",
            (_per_second("colony_cluster_agent_suspensions_total", ("reason",), "{{reason}}"),),
            unit="ops",
        ),
        Panel(
            "Resumptions / s, by condition",
            "Agents the resource monitor resumed, by the condition that held (or replica_lost).",
            (_per_second("colony_cluster_agent_resumptions_total", ("condition",), "{{condition}}"),),
            unit="ops",
        ),
        Panel(
            "Placements / s, by cascade step",
            "Placements by the step of the ResourceExhausted cascade that placed the agent: hard "
            "affinity, soft affinity, retry later, suspend a lower-priority agent.",
            (_per_second("colony_cluster_placements_total", ("step",), "{{step}}"),),
            unit="ops",
        ),
        Panel(
            "Placements that waited for room / s",
            "Placements that found no room at first and had to wait (placement_retry_seconds).",
            (_per_second("colony_cluster_placements_queued_total", (), "queued"),),
            unit="ops",
        ),
        Panel(
            "Suspensions in range, by reason",
            "Suspensions during the time range.",
            (_in_range("colony_cluster_agent_suspensions_total", "reason"),),
            kind="stat",
        ),
        Panel(
            "Placements in range, by step",
            "Placements during the time range, by cascade step.",
            (_in_range("colony_cluster_placements_total", "step"),),
            kind="stat",
        ),
    ),
)

PAGES = Dashboard(
    uid="colony-pages",
    title="Colony / Pages",
    description="Virtual context memory: page hits, faults and evictions, resident and swapped pages "
    "per replica, cached-token ratio.",
    panels=(
        Panel(
            "Page operations / s, by replica",
            "Pages used while resident (hits), faulted in (faults), and evicted, per replica.",
            tuple(
                _per_second("colony_replica_page_ops_total", ("replica",), f"{{{{replica}}}} {op}", op=op)
                for op in ("hits", "faults", "evictions")
            ),
            unit="ops",
        ),
        Panel(
            "Page hit ratio, by replica",
            "Share of page uses that found the page resident (no fault).",
            (
                Target(
                    f"{rate('colony_replica_page_ops_total', ('replica',), op='hits')} / ("
                    f"{rate('colony_replica_page_ops_total', ('replica',), op='hits')} + "
                    f"{rate('colony_replica_page_ops_total', ('replica',), op='faults')})",
                    "{{replica}}",
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Resident pages per replica",
            "Pages held in each replica's KV cache.",
            (Target(gauge("colony_replica_resident_pages", ("replica",)), "{{replica}}"),),
        ),
        Panel(
            "Swapped pages per replica",
            "Pages in each replica's disk tier (swapped out, swapped back in on use).",
            (Target(gauge("colony_replica_swapped_pages", ("replica",)), "{{replica}}"),),
        ),
        Panel(
            "Cached-token ratio, by replica",
            "Share of prompt tokens served from the prefix cache: how well page affinity works.",
            (
                Target(
                    f"{rate('colony_replica_inference_tokens_total', ('replica',), kind='cached')} / "
                    f"{rate('colony_replica_inference_tokens_total', ('replica',), kind='prompt')}",
                    "{{replica}}",
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Engine page operations / s",
            "Page loads, evictions and swaps the engines performed, summed over the cluster.",
            (_per_second("colony_cluster_inference_page_ops_total", ("op",), "{{op}}"),),
            unit="ops",
        ),
    ),
)

ENGINES = Dashboard(
    uid="colony-engines",
    title="Colony / Engines",
    description="Inference: time to first token, request duration, tokens and requests per second.",
    panels=(
        Panel(
            "Time to first token, by replica",
            "p50 and p95 of each replica's time to first token (prompt processing).",
            quantiles("colony_replica_inference_ttft_seconds", ("replica",), "{{replica}}", qs=(0.5, 0.95)),
            unit="s",
        ),
        Panel(
            "Request duration, by replica",
            "p50 and p95 of each replica's inference requests, from the call to the last token.",
            quantiles(
                "colony_replica_inference_request_seconds", ("replica",), "{{replica}}", qs=(0.5, 0.95)
            ),
            unit="s",
        ),
        Panel(
            "Completion tokens / s, by replica",
            "Tokens generated per second by each replica's engine.",
            (
                _per_second(
                    "colony_replica_inference_tokens_total", ("replica",), "{{replica}}", kind="completion"
                ),
            ),
        ),
        Panel(
            "Prompt tokens / s, by replica and kind",
            "Prompt tokens per second (all, and those served from the prefix cache).",
            tuple(
                _per_second(
                    "colony_replica_inference_tokens_total",
                    ("replica",),
                    f"{{{{replica}}}} {kind}",
                    kind=kind,
                )
                for kind in ("prompt", "cached")
            ),
        ),
        Panel(
            "Inference requests / s, by replica",
            "Requests each replica's engine served.",
            (_per_second("colony_replica_inference_requests_total", ("replica",), "{{replica}}"),),
            unit="reqps",
        ),
        Panel(
            "Time to first token, by engine kind",
            "Cluster-wide p50, p95, p99 of time to first token, per engine kind.",
            quantiles("colony_cluster_inference_ttft_seconds", ("engine",), "{{engine}}"),
            unit="s",
        ),
        Panel(
            "Inference requests / s, by outcome",
            "Requests of every engine in the cluster, by engine kind and outcome.",
            (
                _per_second(
                    "colony_cluster_inference_requests_total", ("engine", "outcome"), "{{engine}} {{outcome}}"
                ),
            ),
            unit="reqps",
        ),
    ),
)

BLACKBOARD = Dashboard(
    uid="colony-blackboard",
    title="Colony / Blackboard (Redis)",
    description="Blackboard operations, their latency, errors and conflicts, event delivery and lag.",
    panels=(
        Panel(
            "Operations / s, by kind",
            "Blackboard operations every Colony process made (write, read, query, update, commit, ...).",
            (_per_second("colony_cluster_blackboard_ops_total", ("op",), "{{op}}"),),
            unit="ops",
        ),
        Panel(
            "Operation latency p95, by kind",
            "95th percentile of blackboard operation latency (one Redis round trip or script).",
            quantiles("colony_cluster_blackboard_op_seconds", ("op",), "{{op}}", qs=(0.95,)),
            unit="s",
        ),
        Panel(
            "Event lag",
            "Time from an event's append to its delivery to a subscriber (p50, p95, p99).",
            quantiles("colony_cluster_blackboard_event_lag_seconds"),
            unit="s",
        ),
        Panel(
            "Events delivered / s, by mode",
            "Events delivered to subscribers and consumer groups.",
            (_per_second("colony_cluster_blackboard_events_received_total", ("mode",), "{{mode}}"),),
            unit="ops",
        ),
        Panel(
            "Conflicts and update retries / s",
            "Optimistic-concurrency conflicts, and update() retries after one.",
            (
                _per_second("colony_cluster_blackboard_conflicts_total", (), "conflicts"),
                _per_second("colony_cluster_blackboard_update_retries_total", (), "update retries"),
            ),
            unit="ops",
        ),
        Panel(
            "Reclaimed events / s",
            "Pending events reclaimed from consumers that stopped acknowledging (a replica died "
            "holding them). Failed operations are in colony_cluster_blackboard_op_errors_total "
            "(no series until the first error, so not a panel here).",
            (_per_second("colony_cluster_blackboard_events_reclaimed_total", (), "reclaimed"),),
            unit="ops",
        ),
    ),
)

DASHBOARDS: tuple[Dashboard, ...] = (OVERVIEW, AGENTS, PAGES, ENGINES, BLACKBOARD)
