"""Grafana dashboards, generated from Python: the one source of truth for what each panel shows.

Like Ray's own dashboards, panels are declared as data (colony/dashboard_panels.py) and rendered
here into Grafana JSON, templated on a `datasource` variable (any Prometheus) and a `cluster`
variable (the values of the `cluster` label the scrape config attaches), every query filtered by
`cluster=~"$cluster"`. `python -m colony.dashboards` writes helm/colony/dashboards/*.json, which the
chart ships as ConfigMaps for Grafana's sidecar; tests/test_dashboards.py fails when the committed
files differ from what this renders, and tests/test_dashboards_prometheus.py runs every query
against a real Prometheus scraping a real cluster.

Queries read only cluster-wide families (`colony_cluster_*`, `colony_replica_*`, `colony_agents`:
the same whichever API replica answers a scrape). `colony_cluster_*` has one series per process
(label `process`): a counter's `rate()`/`increase()` is taken per process series (a process that
restarted or whose publication expired starts or ends a series, never a counter reset) and summed
after. When Prometheus scrapes several targets of one cluster (a ServiceMonitor lists every endpoint
behind the API Service), each returns the same figures: every query first keeps one copy per series
(`max by (cluster, <the family's labels, process included>)`), then sums, so nothing is counted twice.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colony.metrics import family_labels

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
CLUSTER_MATCHER = 'cluster=~"$cluster"'
# the Grafana variables a query may use; tests substitute them to run the queries
VARIABLES = ("cluster", "__rate_interval", "__range", "__interval")
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "helm" / "colony" / "dashboards"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    width: int = 12  # of Grafana's 24 columns
    height: int = 8


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)

    @property
    def file_name(self) -> str:
        return f"{self.uid}.json"


# -- query builders ------------------------------------------------------------------------------


def family_of(sample: str) -> str:
    """The family of a sample name (`colony_x_total` -> `colony_x`)."""
    for suffix in _SUFFIXES:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def selector(sample: str, **matchers: str) -> str:
    """`sample{cluster=~"$cluster", label="value", ...}`: every selector carries the cluster filter."""
    parts = [CLUSTER_MATCHER, *(f'{name}="{value}"' for name, value in sorted(matchers.items()))]
    return f"{sample}{{{', '.join(parts)}}}"


def _dedup(sample: str, expr: str) -> str:
    """One copy of each series, whatever number of scrape targets returned it."""
    family = family_of(sample)
    labels = family_labels().get(family)
    if labels is None:
        raise KeyError(f"{sample}: not a cluster-wide family colony.metrics exports")
    keep = ["cluster", *labels, *(["le"] if sample.endswith("_bucket") else [])]
    return f"max by ({', '.join(keep)}) ({expr})"


def _aggregate(expr: str, by: Sequence[str]) -> str:
    return f"sum by ({', '.join(by)}) ({expr})" if by else f"sum({expr})"


def rate(
    sample: str,
    by: Sequence[str] = (),
    *,
    fn: str = "rate",
    window: str = "$__rate_interval",
    **matchers: str,
) -> str:
    """Per-second rate (or `fn="increase"` over `window`) of a counter, summed by `by`."""
    return _aggregate(_dedup(sample, f"{fn}({selector(sample, **matchers)}[{window}])"), by)


def gauge(sample: str, by: Sequence[str] = (), **matchers: str) -> str:
    """A gauge summed by `by`."""
    return _aggregate(_dedup(sample, selector(sample, **matchers)), by)


def quantile(q: float, histogram: str, by: Sequence[str] = (), **matchers: str) -> str:
    """The q-quantile of a histogram family over `$__rate_interval`, by `by`."""
    return f"histogram_quantile({q}, {rate(f'{histogram}_bucket', ('le', *by), **matchers)})"


def quantiles(
    histogram: str,
    by: Sequence[str] = (),
    legend: str = "",
    qs: Sequence[float] = (0.5, 0.95, 0.99),
    **matchers: str,
) -> tuple[Target, ...]:
    """Quantile targets (p50, p95 and p99 unless `qs` says) of one histogram, legend `<legend> pNN`."""
    prefix = f"{legend} " if legend else ""
    return tuple(Target(quantile(q, histogram, by, **matchers), f"{prefix}p{round(q * 100)}") for q in qs)


# -- rendering -----------------------------------------------------------------------------------


def _variables() -> list[dict[str, Any]]:
    query = "label_values(colony_agents, cluster)"
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "options": [],
            "refresh": 1,
            "regex": "",
        },
        {
            "name": "cluster",
            "label": "Cluster",
            "type": "query",
            "datasource": DATASOURCE,
            "definition": query,
            "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {},
            "hide": 0,
            "options": [],
            "refresh": 2,
            "regex": "",
            "sort": 1,
        },
    ]


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + index),
                "datasource": DATASOURCE,
                "expr": target.expr,
                "legendFormat": target.legend or "__auto",
                "range": panel.kind == "timeseries",
                "instant": panel.kind != "timeseries",
            }
            for index, target in enumerate(panel.targets)
        ],
    }
    if panel.kind == "timeseries":
        rendered["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        rendered["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return rendered


def render(dashboard: Dashboard) -> dict[str, Any]:
    """The Grafana JSON model of one dashboard (panels laid out left to right, top to bottom)."""
    panels, x, y, row_height = [], 0, 0, 0
    for panel_id, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        panels.append(_panel(panel, panel_id, x, y))
        x, row_height = x + panel.width, max(row_height, panel.height)
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["colony"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": _variables()},
        "panels": panels,
        "version": 1,
    }


def rendered_files() -> dict[str, str]:
    """File name -> JSON text of every dashboard, exactly as committed."""
    from colony.dashboard_panels import DASHBOARDS

    return {d.file_name: json.dumps(render(d), indent=2) + "\n" for d in DASHBOARDS}


def targets_of(document: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(panel title, query) of every panel target of a rendered dashboard."""
    return [(p["title"], t["expr"]) for p in document.get("panels", []) for t in p.get("targets", [])]


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """A query with Grafana's variables (`$name`, `${name}`) replaced, as Grafana sends it."""
    missing = [name for name in VARIABLES if name not in values]
    if missing:
        raise KeyError(f"no value for the dashboard variables {missing}")

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values[name] if name in values else match.group(0)

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m colony.dashboards [--out DIR] [--check]`: write (or compare) the dashboards."""
    parser = argparse.ArgumentParser(prog="python -m colony.dashboards", description=main.__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the JSON files")
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered_files().items():
        path = args.out / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and stale:
        print(f"stale dashboards in {args.out}: {', '.join(stale)}; run python -m colony.dashboards")
        return 1
    for name in stale:
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
