"""How fast do the web console's pages load with 1,000 agents? (issue 38)

On a `colony up` of its own (one engine replica, the scripted engine: the model plays no part in
loading a page), headless Chromium (the Debian package, driven by Playwright) opens three of the
console's pages --loads times each, logged in, and waits until each is drawn: the colony view
(`/ui/#/`: every agent counted, the agents' table), the `assistant` agent's view (profile, runs,
blocks, checkpoints; after one `assistant` run) and its memory view (the map drawn, the recall
form). Measured twice, side by side in one run: with the
built-in agents only (the baseline), then after --agents chat sessions were started (each one a
real agent: placed, then suspended to Redis as the replica's room runs out). Printed: the median
load time and its spread, and `GET /v1/agents` alone for each.

    python benchmarks/console_load.py [--agents 1000] [--loads 7] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from colony.blackboard.redis_server import free_port
from colony.client import ColonyClient
from colony.config import ColonySettings, EngineSettings, ServeSettings
from colony.serve import cluster

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def colony_ready(expected: int) -> Callable[[Any], None]:
    """The colony view is loaded: every agent counted, the agents' table drawn."""

    def ready(page: Any) -> None:
        from playwright.sync_api import expect

        expect(page.locator("#states")).to_contain_text(f"all: {expected}", timeout=60_000)
        expect(page.locator("#agents tbody tr").first).to_be_visible()

    return ready


def agent_ready(page: Any) -> None:
    """The agent view is loaded: its profile, runs, blocks and checkpoints drawn."""
    from playwright.sync_api import expect

    for part in (
        "#profile table",
        "#runs table, #runs p",
        "#blocks table, #blocks p",
        "#checkpoints table, #checkpoints p",
    ):
        expect(page.locator(part).first).to_be_visible(timeout=60_000)


def memory_ready(page: Any) -> None:
    """The memory view is loaded: the map drawn, the recall form shown."""
    from playwright.sync_api import expect

    expect(page.locator("#memory-graph")).to_be_visible(timeout=60_000)
    expect(page.locator("#recall")).to_be_visible()


def load_times(url: str, token: str, route: str, ready: Callable[[Any], None], loads: int) -> list[float]:
    """Seconds from navigation to `route` (a console hash route) until `ready(page)`, `loads` times."""
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context()
            context.add_init_script(f"sessionStorage.setItem('colony.token', {token!r})")
            page = context.new_page()
            for _ in range(loads):
                page.goto("about:blank")
                started = time.perf_counter()
                page.goto(f"{url}/ui/{route}")
                ready(page)
                times.append(time.perf_counter() - started)
        finally:
            browser.close()
    return times


def page_times(url: str, token: str, agents: int, loads: int) -> dict[str, list[float]]:
    """Load times of the colony view, the `assistant` agent's view and its memory view."""
    return {
        "colony view": load_times(url, token, "#/", colony_ready(agents), loads),
        "agent view (assistant)": load_times(url, token, "#/agents/assistant", agent_ready, loads),
        "memory view (assistant)": load_times(url, token, "#/agents/assistant/memory", memory_ready, loads),
    }


def listing_time(client: ColonyClient, loads: int) -> float:
    times = []
    for _ in range(loads):
        started = time.perf_counter()
        client.agents()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def start_sessions(url: str, token: str, count: int, concurrency: int) -> int:
    started = [0]
    lock = threading.Lock()

    def work(share: int) -> None:
        with ColonyClient(url, token, timeout=120) as client:
            for _ in range(share):
                try:
                    client.sessions.start()
                except Exception as exc:  # counted as not started; the figure says how many were
                    print(f"  a session did not start: {exc}", file=sys.stderr)
                    continue
                with lock:
                    started[0] += 1
                    if started[0] % 100 == 0:
                        print(f"  {started[0]} sessions started", flush=True)

    shares = [count // concurrency + (1 if n < count % concurrency else 0) for n in range(concurrency)]
    threads = [threading.Thread(target=work, args=(s,)) for s in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return started[0]


def spread(times: list[float]) -> str:
    return (
        f"{statistics.median(times) * 1000:.0f} ms (min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--loads", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="colony-console-load-"))
    settings = ColonySettings(
        data_dir=data,
        engine=EngineSettings(kind="scripted"),
        serve=ServeSettings(port=free_port(), num_cpus=2, replicas=1),
    )
    info = cluster.up(settings, echo=False)
    try:
        with ColonyClient(info.url, info.token, timeout=120) as client:
            client.run("assistant", {"task": "Remember that my name is Dana."})  # a run, blocks, memory
            builtins = len(client.agents())
            baseline = page_times(info.url, info.token, builtins, args.loads)
            baseline_listing = listing_time(client, args.loads)
            began = time.monotonic()
            started = start_sessions(info.url, info.token, args.agents, args.concurrency)
            print(f"{started} sessions started in {time.monotonic() - began:.0f} s", flush=True)
            total = len(client.agents())
            loaded = page_times(info.url, info.token, total, args.loads)
            full_listing = listing_time(client, args.loads)
    finally:
        cluster.down(settings)
        shutil.rmtree(data, ignore_errors=True)
    print()
    print(
        f"| page (median of {args.loads} loads, min-max) | {builtins} agents (baseline: the built-ins) "
        f"| {total} agents |"
    )
    print("|---|---|---|")
    for name in baseline:
        print(f"| {name} | {spread(baseline[name])} | {spread(loaded[name])} |")
    print(f"| `GET /v1/agents` alone | {baseline_listing * 1000:.0f} ms | {full_listing * 1000:.0f} ms |")
    print(
        "\ngoal: under 1 s with 1,000 agents (issue 38); 2 shared cores, one engine replica, scripted engine"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
