"""Every panel of every committed dashboard has data, asked of a real Prometheus.

Prometheus (the Debian package's binary, started the way users start it: --config.file,
--storage.tsdb.path, --web.listen-address) scrapes a real `colony up` cluster every second, with the
metrics-only token (`api.metrics_token`, as the chart's ServiceMonitor) from a credentials file
and a static `cluster` label on the target. The test runs an
echo and an ask, an `analyze` of a tiny folder and a suspend/resume of an agent over HTTP, then
sends every panel target's query, with the dashboard variables substituted as Grafana would, to
Prometheus' HTTP API: each must return at least one series with a number (not NaN). A panel
without data is named in the failure."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from colony import cli, dashboards
from colony.blackboard.redis_server import free_port
from colony.client import ApiError, ColonyClient
from colony.config import ApiSettings, ColonySettings, ServeSettings, VcmSettings
from colony.serve import cluster

CLUSTER = "ci-cluster"
DASHBOARD_FOLDER = Path(__file__).resolve().parents[1] / "helm" / "colony" / "dashboards"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
QUERY_DEADLINE_SECONDS = 60.0  # how long the queries together may wait for scrapes to show data
SCRAPE_TOKEN = "prometheus-only-token"  # api.metrics_token: opens /metrics and nothing else


@pytest.fixture(scope="module")
def colony_up(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ColonySettings, cluster.ClusterInfo]]:
    settings = ColonySettings(
        data_dir=tmp_path_factory.mktemp("colony-prom"),
        serve=ServeSettings(port=free_port(), num_cpus=2, replica_cpus=0.5, heartbeat_seconds=1.0),
        vcm=VcmSettings(allowed_roots=[tmp_path_factory.getbasetemp()]),
        api=ApiSettings(metrics_token=SCRAPE_TOKEN),  # what the chart's ServiceMonitor holds
    )
    info = cluster.up(settings)
    try:
        yield settings, info
    finally:
        cluster.down(settings)


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, colony_up: tuple[ColonySettings, cluster.ClusterInfo]
) -> Iterator[str]:
    """A Prometheus of the test's own scraping the cluster's /metrics; yields its base URL."""
    assert os.access(PROMETHEUS, os.X_OK), (
        "Prometheus is not installed: apt-get install prometheus (.ci/run does it on CI)"
    )
    _settings, info = colony_up
    folder = tmp_path_factory.mktemp("prometheus")
    token = folder / "token"
    token.write_text(SCRAPE_TOKEN)  # the metrics-only token, as the chart's ServiceMonitor has it
    token.chmod(0o600)
    target = httpx.URL(info.url)
    (folder / "prometheus.yml").write_text(
        f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: colony
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials_file: {token}
    static_configs:
      - targets: ["{target.host}:{target.port}"]
        labels:
          cluster: {CLUSTER}
"""
    )
    port = free_port()
    log = (folder / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (folder / "prometheus.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Prometheus did not become ready in 30 s"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def query(url: str, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    return list(body["data"]["result"])


def has_number(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(series["value"][1])) for series in result)


def wait_for(url: str, expr: str, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        result = query(url, expr)
        if has_number(result) or time.monotonic() > deadline:
            return result
        time.sleep(1)


def test_every_dashboard_panel_has_data(
    colony_up: tuple[ColonySettings, cluster.ClusterInfo],
    prometheus: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    settings, info = colony_up
    up = wait_for(prometheus, f'up{{job="colony", cluster="{CLUSTER}"}} == 1', 30)
    assert up, "Prometheus never scraped the cluster's /metrics (token? address?)"
    with ColonyClient(info.url, SCRAPE_TOKEN) as scraper:  # the scrape token reads metrics only
        with pytest.raises(ApiError) as refused:
            scraper.submit("echo", 1)
        assert refused.value.status == 401

    with ColonyClient(info.url, info.token, timeout=120) as client:
        echo = client.run("echo", {"ping": 1})
        assert echo["status"] == "succeeded"
        ask = client.run("ask", {"question": "Name a colour."})
        assert ask["status"] == "succeeded"
        suspended = client.suspend("echo")
        assert suspended["state"] == "suspended"
        resumed = client.resume("echo")
        assert resumed["state"] != "suspended"
        assert client.run("echo", 2)["output"] == 2  # the resumed agent serves again

    folder = tmp_path_factory.mktemp("tiny-analyze")
    (folder / "greet.py").write_text('"""Greetings."""\n\n\ndef greet(name):\n    return "hello " + name\n')
    (folder / "count.py").write_text('"""Counting."""\n\n\ndef count(items):\n    return len(items)\n')
    monkeypatch.setenv("COLONY_DATA_DIR", str(settings.data_dir))
    code = cli.main(["run", "analyze", "--map", str(folder), "--quiet", "--timeout", "300"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "greet.py" in out and "count.py" in out
    # rate() needs an increase after a series' first sample: on a slow machine the first sample of
    # the submit-latency histogram can already hold every submission above (it then reads NaN), so
    # one more run goes in once Prometheus has seen the series
    seen = f'colony_cluster_http_request_seconds_count{{cluster="{CLUSTER}", route="/v1/runs"}}'
    assert wait_for(prometheus, seen, QUERY_DEADLINE_SECONDS), "the submit-latency series never appeared"
    with ColonyClient(info.url, info.token, timeout=120) as client:
        assert client.run("echo", 3)["output"] == 3
    worked = time.monotonic() - started

    deadline = time.monotonic() + QUERY_DEADLINE_SECONDS  # for scrapes to catch up, all queries together
    empty, asked = [], 0
    for path in sorted(DASHBOARD_FOLDER.glob("*.json")):
        document = json.loads(path.read_text())
        for title, expr in dashboards.targets_of(document):
            asked += 1
            # the dashboard's range as of this query: every run above falls inside it, however long
            # the earlier queries waited for scrapes (a window fixed before them let the runs age out)
            window = f"{int(time.monotonic() - started) + 60}s"
            values = {"cluster": CLUSTER, "__rate_interval": window, "__range": window, "__interval": "1s"}
            promql = dashboards.substitute(expr, values)
            result = wait_for(prometheus, promql, max(0.0, deadline - time.monotonic()))
            if not has_number(result):
                empty.append(f"{document['title']} / {title}: {promql} -> {result}")
    # the figures come from other processes (replicas, the control plane) through Redis, a series
    # per process (label `process`)
    checks = {
        f'sum(colony_cluster_runs_completed_total{{cluster="{CLUSTER}", status="succeeded"}})': 4,
        f'sum(colony_cluster_agent_suspensions_total{{cluster="{CLUSTER}", reason="request"}})': 1,
        f'sum(colony_cluster_agent_resumptions_total{{cluster="{CLUSTER}", condition="custom"}})': 1,
        f'sum(colony_cluster_placements_total{{cluster="{CLUSTER}"}})': 3,
        f'sum(colony_replica_inference_ttft_seconds_count{{cluster="{CLUSTER}"}})': 2,
        # one series per process (API, control plane, engine replicas), summed by the dashboards
        f'count(count by (process) (colony_cluster_blackboard_ops_total{{cluster="{CLUSTER}"}}))': 3,
    }
    short = [
        f"{expr} < {least}: {query(prometheus, expr)}"
        for expr, least in checks.items()
        if not wait_for(prometheus, f"{expr} >= {least}", max(0.0, deadline - time.monotonic()))
    ]
    assert asked >= 30
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert not short, "figures other processes observed are missing:\n" + "\n".join(short)
    print(
        f"{asked} panel queries answered; runs {worked:.1f} s, whole test {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )
