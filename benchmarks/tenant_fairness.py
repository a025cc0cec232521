"""Does a tenant flooding the colony slow another one down? (issue 39, quotas)

On a `colony up` of its own (one engine replica, the scripted engine: `echo` runs do not use the
model), the operator makes a run token for each of two tenants, `quiet` and `noisy`. Measured side
by side in one run, in --rounds rounds: the quiet tenant's latency of one `echo` run (submit and
wait for its end in one request, `wait_s`; --quiet-rate runs a second at most) while nothing else
runs (the baseline), then while the
noisy tenant floods: --flooders threads submitting `echo` runs back to back (every answer, 202 or
429, followed at once by the next submit). Printed per round: the quiet tenant's p50 and p99 idle
and flooded and their ratio, and how many of the noisy tenant's submits were admitted and refused
(its quotas: `api.tenant_runs_per_second`, `api.tenant_max_open_runs`); then the median ratio of
the rounds with its spread.

What each side knows: nothing but its own token; the quotas are the defaults. The flooders ignore
Retry-After; the colony holds a tenant's submits over its rate until its next second
(docs/api.md, Quotas), so a flooder that resubmits at once mostly waits.

    python benchmarks/tenant_fairness.py [--runs 60] [--flooders 8] [--rounds 3] [--quiet-rate 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from colony.blackboard.redis_server import free_port
from colony.config import ColonySettings, EngineSettings, ServeSettings
from colony.serve import cluster


def token_of(url: str, admin: str, tenant: str) -> dict[str, str]:
    made = httpx.post(
        f"{url}/v1/tokens",
        json={"tenant": tenant, "verbs": ["read", "run"], "note": "tenant_fairness benchmark"},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=60,
    )
    made.raise_for_status()
    return {"Authorization": f"Bearer {made.json()['token']}"}


def latencies(http: httpx.Client, headers: dict[str, str], runs: int, pace: float = 0.0) -> list[float]:
    """Seconds of `runs` echo runs, one after another, each submitted and waited for in one request,
    started `pace` seconds apart at the most (a quiet tenant's use: not a flood)."""
    held = []
    for n in range(runs):
        began = time.perf_counter()
        if held and pace:
            time.sleep(max(0.0, pace - held[-1]))
            began = time.perf_counter()
        answer = http.post("/v1/runs", json={"agent": "echo", "input": n, "wait_s": 30}, headers=headers)
        if answer.status_code != 200 or answer.json().get("status") != "succeeded":
            raise RuntimeError(f"a quiet run did not succeed: {answer.status_code} {answer.text[:200]}")
        held.append(time.perf_counter() - began)
    return held


def flood(url: str, headers: dict[str, str], threads: int, stop: Any, counts: Any) -> None:
    """The noisy tenant, in a process of its own (its client's work never shares the measuring
    process's interpreter lock): `threads` threads submitting back to back until `stop` is set;
    the answers' statuses counted into `counts`."""
    held: dict[str, int] = {}
    lock = threading.Lock()

    def hammer() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while not stop.is_set():
                status = str(
                    http.post("/v1/runs", json={"agent": "echo", "input": "x"}, headers=headers).status_code
                )
                with lock:
                    held[status] = held.get(status, 0) + 1

    workers = [threading.Thread(target=hammer, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    counts.update(held)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def flooded_latencies(
    url: str, quiet: dict[str, str], flooder: dict[str, str], args: Any, http: httpx.Client
) -> tuple[list[float], dict[str, int]]:
    """The quiet tenant's latencies while `flooder` floods, and the flood's answers by status."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        stop, counts = manager.Event(), manager.dict()
        noisy_process = context.Process(target=flood, args=(url, flooder, args.flooders, stop, counts))
        noisy_process.start()
        time.sleep(2.0)  # the flood under way
        try:
            held = latencies(http, quiet, args.runs, 1 / args.quiet_rate)
        finally:
            stop.set()
            noisy_process.join(60)
        return held, dict(counts)


def one_round(url: str, quiet: dict[str, str], noisy: dict[str, str], args: Any) -> dict[str, Any]:
    """Idle; flooded by the noisy tenant; flooded by requests with a token nobody gave (401: what a
    flood costs before any quota applies)."""
    with httpx.Client(base_url=url, timeout=60) as http:
        idle = latencies(http, quiet, args.runs, 1 / args.quiet_rate)
        flooded, total = flooded_latencies(url, quiet, noisy, args, http)
        stranger = {"Authorization": "Bearer ct-0000000000000000-" + "x" * 43}
        strangers, refused = flooded_latencies(url, quiet, stranger, args, http)
    return {"idle": idle, "flooded": flooded, "noisy": total, "strangers": strangers, "401": refused}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=60, help="quiet runs measured per phase")
    parser.add_argument("--flooders", type=int, default=8, help="threads of the noisy tenant")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quiet-rate", type=float, default=5.0, help="the quiet tenant's runs a second")
    args = parser.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="colony-tenant-fairness-"))
    settings = ColonySettings(
        data_dir=data,
        engine=EngineSettings(kind="scripted"),
        serve=ServeSettings(port=free_port(), num_cpus=2, replicas=1),
    )
    info = cluster.up(settings, echo=False)
    rounds = []
    try:
        quiet, noisy = token_of(info.url, info.token, "quiet"), token_of(info.url, info.token, "noisy")
        with httpx.Client(base_url=info.url, timeout=120) as http:
            latencies(http, quiet, 3)  # each tenant's echo placed and warm
            latencies(http, noisy, 3)
        for n in range(args.rounds):
            rounds.append(one_round(info.url, quiet, noisy, args))
            print(f"round {n + 1} of {args.rounds} done", flush=True)
    finally:
        cluster.down(settings)
        shutil.rmtree(data, ignore_errors=True)
    print()
    print(
        "| round | quiet p50 idle | flooded by the noisy tenant | ratio | flooded by strangers (401) "
        "| ratio | quiet p99 idle / noisy / strangers | noisy admitted / refused (429) | strangers' calls |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ratios, floors = [], []
    for n, held in enumerate(rounds, 1):
        idle = statistics.median(held["idle"])
        flooded, strangers = statistics.median(held["flooded"]), statistics.median(held["strangers"])
        ratios.append(flooded / idle)
        floors.append(strangers / idle)
        p99 = " / ".join(f"{percentile(held[k], 0.99) * 1000:.0f}" for k in ("idle", "flooded", "strangers"))
        print(
            f"| {n} | {idle * 1000:.0f} ms | {flooded * 1000:.0f} ms | {flooded / idle:.2f} | "
            f"{strangers * 1000:.0f} ms | {strangers / idle:.2f} | {p99} ms | "
            f"{held['noisy'].get('202', 0)} / {held['noisy'].get('429', 0)} | {sum(held['401'].values())} |"
        )
    print(
        f"\nmedian ratio (flooded / idle p50) of {len(ratios)} rounds: "
        f"noisy tenant {statistics.median(ratios):.2f} "
        f"(spread {min(ratios):.2f}-{max(ratios):.2f}), strangers (wrong token, 401) "
        f"{statistics.median(floors):.2f} (spread {min(floors):.2f}-{max(floors):.2f}); goal: within 2x "
        f"(issue 39). {args.flooders} flooding threads in another process, default quotas, 2 shared "
        "cores, one engine replica"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
