"""Chaos benchmark (issue 12): faults injected into a real `colony up` cluster while runs are in flight.

For each fault: 45 runs are submitted (a mix of `echo` and short `ask` runs; on 2 cores 20-30 of them
are still unfinished when the fault hits, the `in flight` column), the fault is injected
right after their 202s while a background client keeps submitting, then every accepted run is
followed to its end. The table reports, per fault: runs accepted, in flight when the fault hit
(accepted before it, ended after it), rejected (submissions answered with an error), succeeded,
failed (with their reasons), lost (accepted, then unknown to the API), stuck (not ended within the
bound), how long the fault lasted (a kill: the kill itself; a pause: 5 s; a daemon restart: the
kill and the new `colony up`), the seconds from its end until a new run succeeded, whether the
invariant checker (`colony doctor`) was clean afterwards, and whether one `ask` run's event stream,
followed through the fault, ended without repeating anything.

    python benchmarks/chaos.py                      # every fault once, 45 runs submitted each
    python benchmarks/chaos.py --faults redis-kill,engine-kill --runs 60 --repeat 3

The same harness drives `tests/chaos/test_faults.py` (bounded, in CI). The baseline it compares
with is the issue's bar: 0 lost, 0 stuck, recovery <= 15 s, doctor clean.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.redis_server import EmbeddedRedis, RedisRestarts, free_port, process_alive
from colony.client import ApiError, ColonyClient
from colony.config import ColonySettings
from colony.serve.cluster import ClusterInfo, read_state
from colony.system.doctor import DoctorReport, check_invariants

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
RECOVERY_BAR_S = 15.0  # the bar: new runs succeed within this long of the fault's end
ASK = {"question": "Name one colour."}


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


class ChaosCluster:
    """A `colony up` cluster of its own (data dir, port, embedded Redis), driven through the CLI the
    way a user drives it, with the process lookups fault injection needs."""

    def __init__(self, workdir: Path, *, replicas: int = 2, num_cpus: int = 2) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_")}
        self.env.update(
            {
                "COLONY_DATA_DIR": str(self.data_dir),
                "COLONY_SERVE__NUM_CPUS": str(num_cpus),
                "COLONY_SERVE__REPLICAS": str(replicas),
                "COLONY_SERVE__PORT": str(free_port()),
                "COLONY_EMBEDDED_REDIS__SUPERVISE_INTERVAL_SECONDS": "0.2",
                "RAY_USAGE_STATS_ENABLED": "0",
                "OMP_NUM_THREADS": "1",
            }
        )

    def cli(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "colony.cli", *args],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def up(self) -> ClusterInfo:
        done = self.cli("up")
        if done.returncode != 0:
            raise RuntimeError(f"colony up failed: {done.stderr[-3000:]}")
        return self.info()

    def down(self) -> None:
        self.cli("down")

    @property
    def settings(self) -> ColonySettings:
        return ColonySettings(data_dir=self.data_dir)

    def info(self) -> ClusterInfo:
        info = read_state(self.settings)
        if info is None:
            raise RuntimeError(f"no cluster recorded under {self.data_dir}")
        return info

    def client(self, timeout: float = 10.0) -> ColonyClient:
        info = self.info()
        return ColonyClient(info.url, info.token, timeout=timeout)

    def redis_pid(self) -> int:
        status = EmbeddedRedis(self.data_dir).status()
        if status is None:
            raise RuntimeError("the embedded redis-server is not running")
        return status.pid

    def daemon_pid(self) -> int:
        return self.info().pid

    def processes(self, title: str) -> list[int]:
        """Pids of this cluster's processes whose command line contains `title` (Ray names its
        workers `ray::ServeReplica:colony:<Deployment>`): the daemon's session only."""
        session = self.daemon_pid()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if title in cmdline and os.getsid(int(entry.name)) == session:
                    found.append(int(entry.name))
            except (OSError, ProcessLookupError):
                continue
        return sorted(found)

    def replica_pids(self, deployment: str) -> list[int]:
        return self.processes(f"ServeReplica:colony:{deployment}")

    def invariant_report(self, run_ids: list[str], grace_seconds: float = 5.0) -> DoctorReport:
        """The invariant checker's report on the cluster's Redis (what `colony doctor` prints), with
        the accepted runs named: each must still be there, and not stuck."""

        async def check() -> DoctorReport:
            settings = self.settings
            board = Blackboard.connect(scope_id(BlackboardScope.COLONY), settings)
            try:
                return await check_invariants(board, grace_seconds=grace_seconds, run_ids=run_ids)
            finally:
                await board.close()

        return asyncio.run(check())


def redis_restarts(cluster: ChaosCluster) -> int:
    """How often the daemon's supervisor restarted the embedded redis-server (`colony status`)."""
    return RedisRestarts.read(EmbeddedRedis(cluster.data_dir)).restarts


def _kill(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _kill_and_wait(pid: int) -> None:
    _kill(pid)
    wait_until(lambda: not process_alive(pid), 10, step=0.05)


# --- the faults: each returns when the fault has ended -------------------------------------------


def redis_kill(cluster: ChaosCluster) -> None:
    """SIGKILL the embedded redis-server; the daemon's supervisor restarts it (AOF replayed). The
    fault ends with the kill: the restart is part of the recovery time."""
    _kill_and_wait(cluster.redis_pid())


def redis_pause(cluster: ChaosCluster, seconds: float = 5.0) -> None:
    """SIGSTOP the redis-server for `seconds`, then SIGCONT: every client blocks, nothing errors fast."""
    pid = cluster.redis_pid()
    _kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        _kill(pid, signal.SIGCONT)


def _replica_kill(deployment: str, times: int = 1, gap: float = 3.0) -> Callable[[ChaosCluster], None]:
    def inject(cluster: ChaosCluster) -> None:
        for round_ in range(times):
            pids = cluster.replica_pids(deployment)
            if not pids:
                raise RuntimeError(f"no {deployment} replica process found")
            _kill_and_wait(pids[round_ % len(pids)])
            if round_ + 1 < times:
                time.sleep(gap)

    inject.__doc__ = f"SIGKILL a {deployment} replica process" + (f" ({times} times)" if times > 1 else "")
    return inject


def controller_kill(cluster: ChaosCluster) -> None:
    """SIGKILL the Serve controller (a detached actor Ray restarts; replicas keep serving)."""
    pids = cluster.processes("ray::ServeController")
    if not pids:
        raise RuntimeError("no ServeController process found")
    _kill_and_wait(pids[0])


def daemon_restart(cluster: ChaosCluster) -> None:
    """SIGKILL the `colony up` daemon (Ray and Serve die with it; Redis does not), then `colony up`."""
    _kill_and_wait(cluster.daemon_pid())
    cluster.up()


FAULTS: dict[str, Callable[[ChaosCluster], None]] = {
    "redis-kill": redis_kill,
    "redis-pause": redis_pause,
    "engine-kill": _replica_kill("EngineReplica", times=2),
    "system-kill": _replica_kill("AgentSystem"),
    "api-kill": _replica_kill("ColonyAPI"),
    "controller-kill": controller_kill,
    "daemon-restart": daemon_restart,
}


# --- load and accounting -------------------------------------------------------------------------


@dataclass
class FaultResult:
    fault: str
    accepted: int = 0
    in_flight: int = 0  # accepted before the fault began, ended after it: caught by the fault
    rejected: int = 0  # submissions answered with an error (e.g. 503 while Redis is away): not accepted
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    stuck: int = 0
    recovery_s: float | None = None
    fault_s: float = 0.0
    doctor_clean: bool | None = None
    stream_problem: str | None = None  # what was wrong with the followed `ask` run's event stream
    reasons: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)

    def ok(self, recovery_bar: float = RECOVERY_BAR_S) -> bool:
        return (
            self.lost == 0
            and self.stuck == 0
            and self.recovery_s is not None
            and self.recovery_s <= recovery_bar
            and bool(self.doctor_clean)
            and self.stream_problem is None
        )


class Load:
    """Submits runs (mostly `echo`, every `ask_every`-th an `ask`) and remembers the accepted ones."""

    def __init__(self, cluster: ChaosCluster, ask_every: int = 10) -> None:
        self.cluster = cluster
        self.ask_every = ask_every
        self.accepted: list[str] = []
        self.rejected = 0
        self._count = 0
        self._lock = threading.Lock()

    def submit_one(self, client: ColonyClient) -> None:
        with self._lock:
            self._count += 1
            n = self._count
        agent, body = ("ask", ASK) if self.ask_every and n % self.ask_every == 0 else ("echo", {"n": n})
        try:
            run_id = client.submit(agent, body)["run_id"]
        except (ApiError, httpx.HTTPError, RuntimeError):
            with self._lock:
                self.rejected += 1
            return
        self.add(run_id)

    def add(self, run_id: str) -> None:
        with self._lock:
            self.accepted.append(run_id)

    def burst(self, runs: int) -> None:
        with self.cluster.client() as client, ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: self.submit_one(client), range(runs)))

    def trickle(self, stop: threading.Event, interval: float = 0.25) -> threading.Thread:
        """Keep submitting one run every `interval` until `stop` is set (during the fault)."""

        def body() -> None:
            while not stop.is_set():
                with contextlib.suppress(RuntimeError), self.cluster.client(timeout=5) as client:
                    self.submit_one(client)
                stop.wait(interval)

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread


class StreamFollower:
    """Follows one `ask` run's event stream through the fault, the way `colony run` does
    (`ColonyClient.events`: a broken stream is resumed after its last event), and then checks it:
    it reached its terminal event, no event came twice, sequence numbers only grew, and the token
    text, read as docs/api.md says (`restarted` events supersede an abandoned attempt's tokens;
    `colony.run_display.RunDisplay`), is the run's output: nothing repeated, nothing missing."""

    def __init__(self, cluster: ChaosCluster) -> None:
        self.cluster = cluster
        self.run_id: str | None = None
        self.events: list[dict[str, Any]] = []
        self.error: str | None = None
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def start(self, load: Load) -> StreamFollower:
        with self.cluster.client() as client:
            self.run_id = client.submit("ask", ASK)["run_id"]
        load.add(self.run_id)
        self._thread.start()
        return self

    def _follow(self) -> None:
        assert self.run_id is not None
        try:
            info = self.cluster.info()
            with ColonyClient(info.url, info.token, reconnect_seconds=90) as client:
                for event in client.events(self.run_id):
                    self.events.append(event)
        except Exception as exc:  # reported as the stream's problem
            self.error = f"{type(exc).__name__}: {exc}"

    def problem(self, view: dict[str, Any] | None, timeout: float = 60) -> str | None:
        from colony.run_display import RunDisplay

        self._thread.join(timeout)
        if self._thread.is_alive():
            return "the event stream did not end"
        if self.error:
            return f"the event stream failed: {self.error}"
        if not self.events or self.events[-1].get("event_type") not in ("completed", "failed", "cancelled"):
            return "the event stream ended without its terminal event"
        ids = [tuple(int(p) for p in str(e.get("id")).split("-")) for e in self.events]
        if ids != sorted(set(ids)):
            return "an event id came twice or out of order"
        seqs = [e["seq"] for e in self.events if isinstance(e.get("seq"), int)]
        if seqs != sorted(set(seqs)):
            return f"sequence numbers did not only grow: {seqs}"
        if view is not None and view.get("status") == "succeeded":
            display = RunDisplay()
            for event in self.events:
                display.feed(event)
            if display.text.strip() != str(view.get("output", "")).strip():
                return (
                    f"the streamed text {display.text.strip()[:80]!r} is not the output "
                    f"{str(view.get('output'))[:80]!r}"
                )
        return None


def time_to_first_success(cluster: ChaosCluster, budget: float) -> float | None:
    """Seconds until a new `echo` run succeeds end to end (submit, then its result), probing
    every 0.5 s; None if none does within `budget`."""
    started = time.monotonic()
    while time.monotonic() - started < budget:
        try:
            with cluster.client(timeout=5) as client:
                run_id = client.submit("echo", {"probe": True})["run_id"]
                probe_deadline = time.monotonic() + 5
                while time.monotonic() < probe_deadline:
                    view = client.get(run_id)
                    if view["status"] == "succeeded":
                        return time.monotonic() - started
                    if view["status"] in TERMINAL:
                        break
                    time.sleep(0.1)
        except (ApiError, httpx.HTTPError, RuntimeError):
            pass
        time.sleep(0.5)
    return None


def settle(
    cluster: ChaosCluster, run_ids: list[str], result: FaultResult, timeout: float, fault_at: float
) -> dict[str, dict[str, Any]]:
    """Follow every accepted run until it ends or `timeout` passes; count the outcomes (and the
    runs the fault caught: accepted before `fault_at`, a wall-clock time, and not ended by then)."""
    views: dict[str, dict[str, Any]] = {}
    missing: set[str] = set()

    def poll() -> bool:
        try:
            with cluster.client(timeout=5) as client:
                for run_id in run_ids:
                    if views.get(run_id, {}).get("status") in TERMINAL:
                        continue
                    try:
                        views[run_id] = client.get(run_id)
                        missing.discard(run_id)
                    except ApiError as exc:
                        if exc.status != 404:
                            return False
                        missing.add(run_id)
        except (httpx.HTTPError, RuntimeError):
            return False
        return all(views.get(r, {}).get("status") in TERMINAL for r in run_ids)

    wait_until(poll, timeout, step=0.5)
    for run_id in run_ids:
        view = views.get(run_id, {})
        if view.get("created_at", fault_at) < fault_at and (
            view.get("status") not in TERMINAL or view.get("updated_at", 0) >= fault_at
        ):
            result.in_flight += 1
        status = view.get("status")
        result.statuses[run_id] = status or ("lost" if run_id in missing else "unknown")
        if run_id in missing and status is None:
            result.lost += 1
        elif status == "succeeded":
            result.succeeded += 1
        elif status in ("failed", "cancelled"):
            result.failed += 1
            result.reasons[str(views[run_id].get("error") or "(no reason)")[:80]] += 1
        else:
            result.stuck += 1
    return views


def doctor(cluster: ChaosCluster, run_ids: list[str], result: FaultResult, timeout: float) -> None:
    """Ask the invariant checker until it is clean or `timeout` passes (a fault's transient states,
    e.g. a replica not yet known dead, are allowed to settle; what stays is a violation)."""
    report: DoctorReport | None = None

    def clean() -> bool:
        nonlocal report
        try:
            report = cluster.invariant_report(run_ids)
        except Exception as exc:  # the checker could not read: not clean, say why
            result.violations = [f"checker failed: {type(exc).__name__}: {exc}"]
            return False
        return not report.violations

    result.doctor_clean = wait_until(clean, timeout, step=1.0)
    if report is not None and report.violations:
        result.violations = [f"{v.kind} {v.subject}: {v.message}" for v in report.violations]


def run_fault(
    cluster: ChaosCluster,
    name: str,
    *,
    runs: int = 45,
    settle_timeout: float = 90.0,
    recovery_budget: float = 60.0,
    doctor_timeout: float = 30.0,
) -> FaultResult:
    """One fault with `runs` runs in flight; the cluster is left healthy (or the result says not)."""
    result = FaultResult(name)
    load = Load(cluster)
    load.burst(runs)  # the 202s are back; most of these runs are still queued or running
    follower = StreamFollower(cluster).start(load)
    stop = threading.Event()
    trickle = load.trickle(stop)
    started, fault_at = time.monotonic(), time.time()
    try:
        FAULTS[name](cluster)
    finally:
        result.fault_s = time.monotonic() - started
        recovery = time_to_first_success(cluster, recovery_budget)
        stop.set()
        trickle.join(timeout=30)
    result.recovery_s = recovery
    result.accepted, result.rejected = len(load.accepted), load.rejected
    views = settle(cluster, list(load.accepted), result, settle_timeout, fault_at)
    result.stream_problem = follower.problem(views.get(follower.run_id or ""))
    doctor(cluster, list(load.accepted), result, doctor_timeout)
    return result


def table(results: list[FaultResult]) -> str:
    head = (
        "| fault | accepted | in flight | rejected | succeeded | failed | lost | stuck "
        "| fault s | recovery s | doctor | ask stream |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in results:
        recovery = f"{r.recovery_s:.1f}" if r.recovery_s is not None else "never"
        doctor = "clean" if r.doctor_clean else f"{len(r.violations)} violation(s)"
        stream = "ok" if r.stream_problem is None else r.stream_problem[:60]
        lines.append(
            f"| {r.fault} | {r.accepted} | {r.in_flight} | {r.rejected} | {r.succeeded} | {r.failed} "
            f"| {r.lost} | {r.stuck} | {r.fault_s:.1f} | {recovery} | {doctor} | {stream} |"
        )
    reasons = Counter[str]()
    for r in results:
        reasons.update(r.reasons)
    if reasons:
        lines.append("")
        lines.append("failure reasons: " + "; ".join(f"{n}x {why}" for why, n in reasons.most_common(8)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated, from: " + ", ".join(FAULTS)
    )
    parser.add_argument(
        "--runs", type=int, default=45, help="runs submitted right before each fault (default 45)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the faults")
    parser.add_argument("--replicas", type=int, default=2, help="engine replicas (default 2)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/colony-chaos"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.faults.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        parser.error(f"unknown fault(s): {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    cluster = ChaosCluster(args.workdir, replicas=args.replicas)
    print(f"starting a {args.replicas}-replica cluster in {args.workdir} ...", flush=True)
    cluster.up()
    results = []
    try:
        for round_ in range(args.repeat):
            for name in names:
                print(f"round {round_ + 1}: {name}, {args.runs} runs submitted just before ...", flush=True)
                results.append(run_fault(cluster, name, runs=args.runs))
                print(table(results[-1:]).splitlines()[2], flush=True)
    finally:
        cluster.down()
    print()
    print(table(results))
    print(f"\nbaseline (issue 12): lost 0, stuck 0, recovery <= {RECOVERY_BAR_S:.0f} s, doctor clean")
    if args.json:
        print(json.dumps([{**r.__dict__, "reasons": dict(r.reasons), "statuses": None} for r in results]))
    return 0 if all(r.ok() for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
