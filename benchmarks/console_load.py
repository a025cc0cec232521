"""How fast does the web console's colony view load with 1,000 agents? (issue 38)

On a `colony up` of its own (one engine replica, the scripted engine: the model plays no part in
loading a page), headless Chromium (the Debian package, driven by Playwright) opens the console's
colony view (`/ui/#/`, logged in) --loads times and waits until the view shows every agent
(the `all: N` count and the agents' table). Measured twice, side by side in one run: with the
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
from pathlib import Path

from colony.blackboard.redis_server import free_port
from colony.client import ColonyClient
from colony.config import ColonySettings, EngineSettings, ServeSettings
from colony.serve import cluster

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def load_times(url: str, token: str, expected: int, loads: int) -> list[float]:
    """Seconds from navigation to the colony view listing `expected` agents, `loads` times."""
    from playwright.sync_api import expect, sync_playwright

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
                page.goto(f"{url}/ui/#/")
                expect(page.locator("#states")).to_contain_text(f"all: {expected}", timeout=60_000)
                expect(page.locator("#agents tbody tr").first).to_be_visible()
                times.append(time.perf_counter() - started)
        finally:
            browser.close()
    return times


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
            builtins = len(client.agents())
            baseline = load_times(info.url, info.token, builtins, args.loads)
            baseline_listing = listing_time(client, args.loads)
            began = time.monotonic()
            started = start_sessions(info.url, info.token, args.agents, args.concurrency)
            print(f"{started} sessions started in {time.monotonic() - began:.0f} s", flush=True)
            total = len(client.agents())
            loaded = load_times(info.url, info.token, total, args.loads)
            full_listing = listing_time(client, args.loads)
    finally:
        cluster.down(settings)
        shutil.rmtree(data, ignore_errors=True)
    print()
    print(f"| agents | colony view loaded (median of {args.loads}) | GET /v1/agents |")
    print("|---|---|---|")
    print(f"| {builtins} (baseline: the built-ins) | {spread(baseline)} | {baseline_listing * 1000:.0f} ms |")
    print(f"| {total} | {spread(loaded)} | {full_listing * 1000:.0f} ms |")
    print(
        "\ngoal: under 1 s with 1,000 agents (issue 38); 2 shared cores, one engine replica, scripted engine"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
