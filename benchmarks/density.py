"""Idle-agent density: many idle `echo`-like agents in one process, on an embedded redis-server.

Spawns N agents (each with the run capability, like the built-in `echo`) through one
LocalAgentRuntime, lets them idle, and prints, for the shared event reader (one XREAD per lane
over every agent's stream, colony/blackboard/event_reader.py) beside the baseline of the same run
(every subscription its own blocking XREAD, `Blackboard(..., shared_events=False)`, with fewer
agents: it needs one Redis connection per agent):

- spawn agents/s, one spawn after another (`LocalAgentRuntime.spawn`) and with --concurrency
  spawns in flight;
- RSS and Redis memory per agent (growth over the spawn, divided by N);
- Redis connections (CLIENT LIST), Redis commands/s (INFO commandstats) and this process's
  CPU-s/s while idle, over --window seconds.

Goals (issue #18): 10,000 idle agents with < 50 Redis connections, idle CPU < 2% of a core,
spawn >= 500 agents/s. Timings on a shared machine vary: compare the columns of one run.

Usage: python benchmarks/density.py [--agents 10000] [--baseline-agents 1000] [--window 5]
                                    [--concurrency 32] [--skip-baseline]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("COLONY_SECRET", "density-benchmark-secret-0123456789abcdef")

import redis

from colony import security
from colony.agents import LocalAgentRuntime
from colony.blackboard import Blackboard, create_redis
from colony.blackboard.event_reader import existing_reader
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, load_settings
from colony.system.builtin import echo_blueprint

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident set now (not the peak)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE


def cpu_seconds() -> float:
    return time.process_time()


@dataclass
class Figures:
    mode: str
    agents: int
    spawn_seq: float = 0.0  # agents/s, one at a time
    spawn_conc: float = 0.0  # agents/s, --concurrency at a time
    rss_per_agent: float = 0.0
    redis_per_agent: float = 0.0
    connections: int = 0
    commands_per_s: float = 0.0
    cpu_per_s: float = 0.0
    lanes: int = 0


async def measure(url: str, mode: str, agents: int, window: float, concurrency: int) -> Figures:
    shared = mode == "shared"
    # the baseline holds one connection per idle agent: its pool must be that large; the shared
    # reader runs with the default pool
    settings = BlackboardSettings(max_connections=agents + 64) if not shared else BlackboardSettings()
    client = create_redis(url, settings)
    admin = redis.Redis.from_url(url, decode_responses=True)
    admin.flushall()
    board = Blackboard(client, "bench:density", settings=settings, shared_events=shared)
    runtime = LocalAgentRuntime(board, colony_id=f"density-{mode}", settings=load_settings())
    figures = Figures(mode, agents)
    try:
        first = agents // 2
        blueprints = [echo_blueprint(f"{mode}-{i}") for i in range(agents)]  # built before the clock
        await runtime.spawn(echo_blueprint(f"{mode}-warm"))  # imports, scripts, pool: not timed
        rss0, mem0 = rss_bytes(), int(admin.info("memory")["used_memory"])

        started = time.perf_counter()
        for blueprint in blueprints[:first]:
            await runtime.spawn(blueprint)
        figures.spawn_seq = first / (time.perf_counter() - started)

        gate = asyncio.Semaphore(concurrency)

        async def spawn(blueprint: object) -> None:
            async with gate:
                await runtime.spawn(blueprint)  # type: ignore[arg-type]

        started = time.perf_counter()
        await asyncio.gather(*(spawn(b) for b in blueprints[first:]))
        figures.spawn_conc = (agents - first) / (time.perf_counter() - started)

        await asyncio.sleep(2.0)  # every subscription joined and its first read issued
        figures.rss_per_agent = (rss_bytes() - rss0) / agents
        figures.redis_per_agent = (int(admin.info("memory")["used_memory"]) - mem0) / agents

        admin.config_resetstat()
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        await asyncio.sleep(window)
        cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
        stats = admin.info("commandstats")
        calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_config")
        figures.commands_per_s = calls / wall
        figures.cpu_per_s = cpu / wall
        figures.connections = len(admin.client_list()) - 1  # less the admin connection
        reader = existing_reader(client)
        figures.lanes = reader.stats()["lanes"] if reader is not None and shared else 0
    finally:
        await runtime.shutdown()
        await board.close()
        admin.close()
    return figures


def report(rows: list[Figures]) -> None:
    def fmt(value: float, unit: str = "") -> str:
        return f"{value:,.0f}{unit}" if value >= 100 else f"{value:,.3f}{unit}"

    lines = [
        ("agents", lambda f: f"{f.agents:,}"),
        ("spawn agents/s (one at a time)", lambda f: fmt(f.spawn_seq)),
        ("spawn agents/s (concurrent)", lambda f: fmt(f.spawn_conc)),
        ("RSS per agent (KB)", lambda f: fmt(f.rss_per_agent / 1024)),
        ("Redis memory per agent (KB)", lambda f: fmt(f.redis_per_agent / 1024)),
        ("Redis connections (CLIENT LIST)", lambda f: f"{f.connections:,}"),
        ("Redis commands/s idle", lambda f: fmt(f.commands_per_s)),
        ("process CPU-s/s idle", lambda f: f"{f.cpu_per_s:.4f}"),
        ("reader lanes", lambda f: str(f.lanes)),
    ]
    width = max(len(name) for name, _ in lines)
    print(f"{'':{width}}  " + "  ".join(f"{r.mode:>18}" for r in rows))
    for name, cell in lines:
        print(f"{name:{width}}  " + "  ".join(f"{cell(r):>18}" for r in rows))
    if len(rows) == 2:
        base, shared = rows
        print()
        print(
            f"connections per agent: baseline {base.connections / base.agents:.3f}, "
            f"shared {shared.connections / shared.agents:.4f}; Redis commands/s per 1,000 idle agents: "
            f"baseline {1000 * base.commands_per_s / base.agents:.1f}, "
            f"shared {1000 * shared.commands_per_s / shared.agents:.2f}; CPU-s/s per 1,000 idle agents: "
            f"baseline {1000 * base.cpu_per_s / base.agents:.4f}, "
            f"shared {1000 * shared.cpu_per_s / shared.agents:.5f}"
        )
        print(
            f"spawn (one at a time): shared {shared.spawn_seq:.0f}/s vs baseline {base.spawn_seq:.0f}/s "
            f"({shared.spawn_seq / base.spawn_seq:.2f}x)"
        )


def main() -> None:
    security.use_settings(load_settings())  # this process signs the blueprints of the agents it spawns
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=10_000, help="idle agents with the shared reader")
    parser.add_argument("--baseline-agents", type=int, default=1_000, help="idle agents, one XREAD each")
    parser.add_argument("--window", type=float, default=5.0, help="seconds the idle figures are taken over")
    parser.add_argument("--concurrency", type=int, default=32, help="spawns in flight (second half)")
    parser.add_argument("--skip-baseline", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as data:
        server = EmbeddedRedis(Path(data))
        info = server.start()
        try:
            rows = []
            if not args.skip_baseline:
                rows.append(
                    asyncio.run(
                        measure(info.url, "baseline", args.baseline_agents, args.window, args.concurrency)
                    )
                )
            rows.append(asyncio.run(measure(info.url, "shared", args.agents, args.window, args.concurrency)))
            report(rows)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
