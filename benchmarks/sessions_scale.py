"""Room on demand at scale: N chat sessions on one `colony up` (one engine replica, the default
`serve.max_agents_per_replica`, the scripted engine standing in for the model), each started and
answering one message, then a `colony run analyze` on the full colony.

Every session past the replica's room suspends the least recently active idle session to Redis
(colony.system.placement); the sessions stay there, idle, and a message resumes one. Printed:

- sessions/s (start + one turn each, --concurrency clients at once), failures and their reasons;
- Redis per idle session: keys and bytes (MEMORY USAGE of every key holding the session's id, for
  a sample of sessions), and the growth of `used_memory` over the run divided by N (which also
  counts each session's run records in the API namespace and the registry's index sets);
- the first sessions answered again at the end (resumed from Redis), and the analyze run's exit
  code and time: it needs room for its coordinator and workers among N idle sessions;
- the time of `DELETE /v1/sessions/{id}` among N sessions, and the keys it left (0).

Baseline (before M16): from the 53rd session `POST /v1/sessions` answered 503 "no replica has room
(serve.max_agents_per_replica=64)" after 5.4 s, and `colony run analyze` failed; ~49 Redis keys
and ~66 KB per session.

Usage: python benchmarks/sessions_scale.py [--sessions 10000] [--concurrency 4] [--sample 20]
                                           [--analyze PATH] [--keep-cluster]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import redis

from colony.blackboard.redis_server import free_port
from colony.client import ColonyClient
from colony.config import ColonySettings, EngineSettings, ServeSettings, VcmSettings
from colony.serve import cluster

BASELINE = (
    "before M16: sessions past the 52nd refused (503 after 5.4 s), analyze failed; "
    "~49 Redis keys, ~66 KB per session"
)


class Tally:
    """What the client threads did, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = 0
        self.failures: collections.Counter[str] = collections.Counter()
        self.ids: list[str] = []

    def ok(self, session_id: str) -> None:
        with self.lock:
            self.done += 1
            self.ids.append(session_id)

    def failed(self, why: str) -> None:
        with self.lock:
            self.failures[why[:160]] += 1


def worker(url: str, token: str, count: int, tally: Tally, started: float, total: int) -> None:
    with ColonyClient(url, token, timeout=120) as client:
        for _ in range(count):
            try:
                session_id = client.sessions.start()["session_id"]
                reply = client.sessions.reply(session_id, "hello, are you there?")
                if not reply.get("message", {}).get("content"):
                    raise RuntimeError(f"empty reply: {reply}")
            except Exception as exc:
                tally.failed(f"{type(exc).__name__}: {exc}")
                continue
            tally.ok(session_id)
            if tally.done % 500 == 0:
                rate = tally.done / (time.monotonic() - started)
                print(f"  {tally.done}/{total} sessions, {rate:.1f}/s", file=sys.stderr, flush=True)


def per_session(r: redis.Redis, session_ids: list[str]) -> tuple[float, float]:
    """Mean keys and bytes (MEMORY USAGE) of the keys naming each sampled session."""
    keys_total = bytes_total = 0
    for session_id in session_ids:
        for key in r.scan_iter(match=f"*{session_id}*", count=5000):
            keys_total += 1
            bytes_total += int(r.memory_usage(key) or 0)
    n = max(1, len(session_ids))
    return keys_total / n, bytes_total / n


def delete_some(url: str, token: str, r: redis.Redis, session_ids: list[str]) -> tuple[float, int]:
    """DELETE each of `session_ids`: the mean time of one, and the keys naming them left after."""
    started = time.monotonic()
    with ColonyClient(url, token, timeout=300) as client:
        for session_id in session_ids:
            client.sessions.delete(session_id)
    took = (time.monotonic() - started) / max(1, len(session_ids))
    return took, sum(1 for s in session_ids for _ in r.scan_iter(match=f"*{s}*", count=5000))


def analyze(settings: ColonySettings, folder: Path) -> tuple[int, float, str]:
    env = {**os.environ, "COLONY_DATA_DIR": str(settings.data_dir)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "colony.cli", "run", "analyze", "--map", str(folder), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    took = time.monotonic() - started
    if done.returncode != 0:
        return done.returncode, took, (done.stderr or done.stdout)[-400:]
    try:  # what the report says it analysed
        stats = json.loads(done.stdout).get("stats", {})
    except ValueError:
        stats = {}
    return done.returncode, took, json.dumps(stats)[:400]


def sample_folder(root: Path) -> Path:
    """A few small Python files to analyze (pages of their own)."""
    folder = root / "analyze-me"
    folder.mkdir()
    for name in ("alpha", "beta", "gamma"):
        body = "".join(f"def {name}_{n}(value):\n    return value + {n}\n\n\n" for n in range(120))
        (folder / f"{name}.py").write_text(f'"""{name.title()} helpers."""\n\n\n{body}')
    return folder


def run(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    settings = ColonySettings(
        data_dir=data,
        engine=EngineSettings(kind="scripted"),
        serve=ServeSettings(port=free_port(), num_cpus=2, replicas=1),
        vcm=VcmSettings(allowed_roots=[data, *([Path(args.analyze).resolve()] if args.analyze else [])]),
    )
    info = cluster.up(settings, echo=False)
    r = redis.Redis.from_url(info.redis_url)
    try:
        memory_before = int(r.info("memory")["used_memory"])
        tally = Tally()
        started = time.monotonic()
        share = [args.sessions // args.concurrency] * args.concurrency
        for n in range(args.sessions % args.concurrency):
            share[n] += 1
        threads = [
            threading.Thread(target=worker, args=(info.url, info.token, k, tally, started, args.sessions))
            for k in share
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        memory_after = int(r.info("memory")["used_memory"])
        sample = tally.ids[: args.sample // 2] + tally.ids[-(args.sample - args.sample // 2) :]
        keys, size = per_session(r, sample)
        with ColonyClient(info.url, info.token, timeout=120) as client:
            suspended = len([a for a in client.agents() if a.get("state") == "suspended"])
            again_started = time.monotonic()
            again = [client.sessions.reply(s, "and again?") for s in tally.ids[:3]]
            again_s = (time.monotonic() - again_started) / max(1, len(again))
        folder = Path(args.analyze) if args.analyze else sample_folder(data)
        code, analyze_s, tail = analyze(settings, folder)
        delete_s, left = delete_some(info.url, info.token, r, tally.ids[:3])
        return {
            "sessions": args.sessions,
            "answered": tally.done,
            "failures": dict(tally.failures),
            "seconds": elapsed,
            "rate": tally.done / elapsed if elapsed else 0.0,
            "suspended": suspended,
            "keys_per_session": keys,
            "bytes_per_session": size,
            "used_memory_per_session": (memory_after - memory_before) / max(1, tally.done),
            "resume_turn_s": again_s,
            "analyze_exit": code,
            "analyze_s": analyze_s,
            "analyze_tail": tail,
            "delete_s": delete_s,
            "delete_left": left,
        }
    finally:
        r.close()
        if not args.keep_cluster:
            cluster.down(settings)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=10_000, help="sessions started, one turn each")
    parser.add_argument("--concurrency", type=int, default=4, help="clients at once")
    parser.add_argument("--sample", type=int, default=20, help="sessions whose keys are measured")
    parser.add_argument("--analyze", help="folder for `colony run analyze` (default: 3 small files)")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sessions-scale-") as data:
        out = run(args, Path(data))
    print(
        f"sessions: {out['answered']}/{out['sessions']} started and answered in {out['seconds']:.0f} s "
        f"({out['rate']:.1f} sessions/s, {args.concurrency} clients, 1 replica, 2 CPUs, scripted engine, "
        f"max_agents_per_replica={ServeSettings().max_agents_per_replica}); {out['suspended']} suspended"
    )
    if out["failures"]:
        print(f"  failures: {out['failures']}")
    print(
        f"Redis per idle session: {out['keys_per_session']:.1f} keys, "
        f"{out['bytes_per_session'] / 1024:.1f} KB (keys naming it); used_memory growth "
        f"{out['used_memory_per_session'] / 1024:.1f} KB per session"
    )
    print(f"a turn of one of the first sessions (resumed from Redis): {out['resume_turn_s'] * 1000:.0f} ms")
    code = out["analyze_exit"]
    verdict = f"succeeded ({out['analyze_tail']})" if code == 0 else f"exit {code}: {out['analyze_tail']}"
    print(f"colony run analyze afterwards: {verdict} in {out['analyze_s']:.1f} s")
    print(
        f"DELETE /v1/sessions/{{id}} (a SCAN of the keyspace): {out['delete_s'] * 1000:.0f} ms each; "
        f"{out['delete_left']} keys of the deleted sessions left"
    )
    print(f"baseline: {BASELINE}")


if __name__ == "__main__":
    main()
