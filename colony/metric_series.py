"""The machinery behind the cluster-wide metric families (colony/metrics.py defines the metrics and
lists the published ones): what a published family is, how one process's series are written for
Redis, and how the series read back (hostile: bounded counts, finite numbers, label arities and
process ids only) become one `colony_cluster_*` family with a series per process."""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """One family every process publishes and the API exports per process as
    `colony_cluster_<rest of name>` (labels: `process`, then `labels`)."""

    metric: Counter | Histogram
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()  # finite upper bounds of a histogram (+Inf is implied)

    @property
    def name(self) -> str:
        """The family name (a counter's without `_total`)."""
        return str(self.metric.describe()[0].name)

    @property
    def kind(self) -> str:
        return "histogram" if isinstance(self.metric, Histogram) else "counter"

    @property
    def cluster_name(self) -> str:
        return cluster_name(self.name)

    @property
    def documentation(self) -> str:
        return f"{self.metric.describe()[0].documentation} One series per Colony process (label process)."


def cluster_name(name: str) -> str:
    """`colony_x` -> `colony_cluster_x`: a published family as the API exports it, per process."""
    return name.replace("colony_", "colony_cluster_", 1)


PUBLICATION_FORMAT = 2  # a publication of another format (another Colony version) is skipped
PROCESS_LABEL = "process"  # the label of the process a `colony_cluster_*` series comes from
MAX_SERIES_PER_FAMILY = 512  # label sets one process may show in one family; more are dropped (logged)
MAX_CLUSTER_SERIES_PER_FAMILY = 8192  # series of one family over all processes; more are dropped
# Processes whose publications one scrape exports: the most recently published ones (registry
# `publications`), so the subset is the same from one scrape to the next (docs/metrics.md, Limits)
MAX_PUBLICATIONS = 512
MAX_REPLICAS = 1024
MAX_LABEL_CHARS = 128
MAX_COUNT = 1e15  # larger "counts" read back from Redis are not believed
# what a process id may hold: it is a label value and a key segment
_PROCESS_ID = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_LABEL_CHARS}}}")
_HOST_CHARS = re.compile(r"[^A-Za-z0-9._-]")
# Drawn once when this module is first imported, i.e. once per process start: a container restarted
# in the same pod has the same hostname and often the same pid, and must not take over (overwrite)
# the publication, and so the series, of the process it replaces.
_START_NONCE = secrets.token_hex(4)


def process_id() -> str:
    """This process's id: its publication key and the `process` label of its `colony_cluster_*`
    series. Host (characters outside [A-Za-z0-9._-] replaced), pid and the start nonce: a restarted
    process is a new process, whatever its host and pid."""
    host = _HOST_CHARS.sub("_", socket.gethostname())[:96] or "host"
    return f"{host}-{os.getpid()}-{_START_NONCE}"


def process_label(value: Any) -> str | None:
    """A process id read back from Redis: [A-Za-z0-9._-], 1 to MAX_LABEL_CHARS characters, else None."""
    return value if isinstance(value, str) and _PROCESS_ID.fullmatch(value) else None


def _counts(cumulative: Sequence[float]) -> list[float]:
    """Per-bucket counts from cumulative ones (what is published: sums of them stay valid)."""
    return [c - (cumulative[i - 1] if i else 0.0) for i, c in enumerate(cumulative)]


def _published_family(spec: Published) -> list[list[Any]]:
    """This process's series of one family: `[label values, value]` for a counter, `[label values,
    per-bucket counts (the last is +Inf), sum]` for a histogram."""
    counters: list[list[Any]] = []
    buckets: dict[tuple[str, ...], list[float]] = {}
    sums: dict[tuple[str, ...], float] = {}
    for family in spec.metric.collect():
        for sample in family.samples:
            values = tuple(str(sample.labels.get(n, "")) for n in spec.labels)
            if spec.kind == "counter" and sample.name.endswith("_total"):
                counters.append([list(values), float(sample.value)])
            elif sample.name.endswith("_bucket"):
                buckets.setdefault(values, []).append(float(sample.value))
            elif sample.name.endswith("_sum"):
                sums[values] = float(sample.value)
    if spec.kind == "counter":
        return counters
    return [[list(v), _counts(c), sums.get(v, 0.0)] for v, c in sorted(buckets.items())]


def _count(value: Any) -> float | None:
    """A count read back from Redis: a finite number in [0, MAX_COUNT], else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and 0.0 <= number <= MAX_COUNT else None


def _label(value: Any) -> str | None:
    """A label value read back from Redis: a short printable string, else None."""
    if isinstance(value, str) and 0 < len(value) <= MAX_LABEL_CHARS and value.isprintable():
        return value
    return None


def _label_values(raw: Any, arity: int) -> tuple[str, ...] | None:
    if not isinstance(raw, list) or len(raw) != arity:
        return None
    values = tuple(
        v if isinstance(v, str) and len(v) <= MAX_LABEL_CHARS and v.isprintable() else None for v in raw
    )
    return None if None in values else values  # type: ignore[return-value]


def _bucket_counts(raw: Any, size: int) -> list[float] | None:
    """Per-bucket counts of a histogram, `size` of them (bounds plus +Inf), each a valid count."""
    if not isinstance(raw, list) or len(raw) != size:
        return None
    counts = [_count(c) for c in raw]
    return None if None in counts else counts  # type: ignore[return-value]


class _PerProcess:
    """One family's series, per process: at most MAX_SERIES_PER_FAMILY label sets of one process and
    MAX_CLUSTER_SERIES_PER_FAMILY in all. Processes are added in a stable order (most recently
    published first), so what a cap drops is the same from one scrape to the next."""

    def __init__(self, spec: Published) -> None:
        self.spec = spec
        self.counters: dict[tuple[str, ...], float] = {}
        self.histograms: dict[tuple[str, ...], tuple[list[float], float]] = {}
        self.dropped = 0

    def _valid(self, entry: Any) -> tuple[tuple[str, ...], Any] | None:
        """(label values, value) of one published series, None when malformed. A histogram's value
        is (per-bucket counts, sum)."""
        spec = self.spec
        if not isinstance(entry, list) or len(entry) != (2 if spec.kind == "counter" else 3):
            return None
        labels = _label_values(entry[0], len(spec.labels))
        if labels is None:
            return None
        if spec.kind == "counter":
            value = _count(entry[1])
            return None if value is None else (labels, value)
        counts, total = _bucket_counts(entry[1], len(spec.buckets) + 1), entry[2]
        if counts is None or isinstance(total, bool) or not isinstance(total, int | float):
            return None
        if not math.isfinite(float(total)):
            return None
        return labels, (counts, float(total))

    def add(self, process: str, series: list[Any]) -> None:
        """One process's published series of this family; malformed ones skipped, a label set
        repeated keeps its first value (a process publishes each once)."""
        found: dict[tuple[str, ...], Any] = {}
        for entry in series[:MAX_SERIES_PER_FAMILY]:
            valid = self._valid(entry)
            if valid is not None:
                found.setdefault(valid[0], valid[1])
        self.dropped += max(0, len(series) - MAX_SERIES_PER_FAMILY)
        table: dict[tuple[str, ...], Any] = self.counters if self.spec.kind == "counter" else self.histograms
        for labels, value in sorted(found.items()):
            if len(table) >= MAX_CLUSTER_SERIES_PER_FAMILY:
                self.dropped += 1
                continue
            table[(process, *labels)] = value

    def family(self) -> Metric:
        spec = self.spec
        if self.dropped:
            log.warning("%s: %d published series over the caps dropped", spec.cluster_name, self.dropped)
        labels = [PROCESS_LABEL, *spec.labels]
        if spec.kind == "counter":
            counter = CounterMetricFamily(spec.cluster_name, spec.documentation, labels=labels)
            for key, value in sorted(self.counters.items()):
                counter.add_metric(list(key), value)
            return counter
        histogram = HistogramMetricFamily(spec.cluster_name, spec.documentation, labels=labels)
        for key, (counts, total) in sorted(self.histograms.items()):
            histogram.add_metric(list(key), _cumulative(spec.buckets, counts), total)
        return histogram


def _cumulative(bounds: Sequence[float], counts: Sequence[float]) -> list[tuple[str, float]]:
    """`(le, cumulative count)` pairs for HistogramMetricFamily, the last one `+Inf`."""
    running, out = 0.0, []
    for bound, count in zip([*bounds, math.inf], counts, strict=True):
        running += count
        out.append((floatToGoString(bound), running))
    return out
