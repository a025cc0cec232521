"""Keyspace scale: echo run latency and the agent listing with 0 vs N unrelated keys in the same Redis.

Hot paths (submitting and starting a run, reading its events and result, listing agents) read
index sets, never SCAN the keyspace, so their cost must not grow with what else the Redis holds.
This runs two embedded redis-servers, each with a ReplicaHost hosting `echo` plus a few agents
in-process (as tests/test_api.py does), loads N unrelated keys into one of them (DEBUG POPULATE,
else pipelined SET), then times echo runs (submit, follow the events to the terminal one),
`registry.list()`, and `GET /v1/agents` through the in-process API (the FastAPI app over httpx's
ASGI transport, with the token, on the same Redis) on both, interleaved call by call so load from
elsewhere on the machine falls on both alike. Prints both figures and their ratio (goal <= 1.2x)
and the loaded server's SCAN/KEYS calls while measuring (goal 0).

Usage: python benchmarks/keyspace_scale.py [--keys 1000000] [--runs 60] [--lists 60] [--agents 3]
(COLONY_SECRET or a secret file is needed, as for any host: agents' blueprints are signed)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable

import httpx
from redis.exceptions import ResponseError

from colony.api.app import ApiServices, create_app
from colony.blackboard import Blackboard, create_redis
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, ColonySettings, EmbeddedRedisSettings
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.runs import RunService

TERMINAL = {"completed", "failed", "cancelled"}
TOKEN = "keyspace-bench-token"


async def echo_run(runs: RunService, n: int) -> None:
    """Submit one echo run and follow its events to the terminal one (what an SSE client does)."""
    record = await runs.submit("echo", {"n": n})
    async for _, event in runs.events(record.run_id):
        if event.get("event_type") in TERMINAL:
            if event["event_type"] != "completed":
                raise RuntimeError(f"echo run {record.run_id} ended {event['event_type']}: {event}")
            return
    raise RuntimeError(f"echo run {record.run_id} ended without a terminal event")


async def timed_pair(
    empty: Callable[[int], Awaitable[object]], full: Callable[[int], Awaitable[object]], count: int
) -> tuple[list[float], list[float]]:
    """Milliseconds of `count` calls on each side, interleaved (alternating which goes first) so
    that load from elsewhere on the machine falls on both sides alike; 3 warm-up calls each."""
    for i in range(3):
        await empty(-1 - i)
        await full(-1 - i)
    out: tuple[list[float], list[float]] = ([], [])
    for i in range(count):
        order = ((0, empty), (1, full)) if i % 2 == 0 else ((1, full), (0, empty))
        for side, fn in order:
            started = time.perf_counter()
            await fn(i)
            out[side].append((time.perf_counter() - started) * 1000)
    return out


async def populate(bb: Blackboard, keys: int) -> float:
    """Load `keys` unrelated keys; seconds it took."""
    started = time.perf_counter()
    try:
        await bb.redis.execute_command("DEBUG", "POPULATE", keys, "unrelated")
    except ResponseError:  # DEBUG disabled (enable-debug-command no): pipelined SETs
        batch = 10_000
        for start in range(0, keys, batch):
            async with bb.redis.pipeline(transaction=False) as pipe:
                for i in range(start, min(keys, start + batch)):
                    pipe.set(f"unrelated:{i}", "x")
                await pipe.execute()
    return time.perf_counter() - started


async def scan_calls(bb: Blackboard) -> int:
    stats = await bb.redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("scan", "keys"))


def summary(ms: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(ms), "mean": statistics.fmean(ms)}


async def colony_on(server: EmbeddedRedis, agents: int) -> tuple[Blackboard, ReplicaHost, RunService]:
    """A redis-server with a ReplicaHost hosting `echo` and `agents - 1` more, and a RunService
    (built with the colony's settings, as the API replica does)."""
    info = server.start()
    settings = ColonySettings(redis_url=info.url, colony_id=f"bench{uuid.uuid4().hex[:6]}")
    bb = Blackboard(create_redis(info.url, BlackboardSettings()), "bench")
    host = ReplicaHost(settings, "replica-b", engine=ScriptedEngine(["ok"]))
    await host.start(bb)
    await host.ensure_agent(echo_blueprint())
    for i in range(agents - 1):
        await host.ensure_agent(echo_blueprint(f"echo{i}"))
    assert host.registry is not None
    runs = RunService(
        bb, host.registry, tenant_id=settings.tenant_id, colony_id=settings.colony_id, settings=settings
    )
    return bb, host, runs


def api_client(host: ReplicaHost, runs: RunService) -> httpx.AsyncClient:
    """The HTTP API in-process over the colony's Redis (what GET /v1/agents costs minus the socket)."""
    assert host.registry is not None
    app = create_app(ApiServices(runs=runs, registry=host.registry, token=TOKEN))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://colony")


async def get_agents(client: httpx.AsyncClient, expected: int) -> None:
    response = await client.get("/v1/agents", headers={"Authorization": f"Bearer {TOKEN}"})
    if response.status_code != 200 or len(response.json()) != expected:
        raise RuntimeError(f"GET /v1/agents answered {response.status_code}: {response.text[:200]}")


async def main(args: argparse.Namespace) -> None:
    """Two identical colonies, each on its own redis-server; one server also holds the unrelated
    keys. Every measurement alternates between them, so both see the same machine."""
    with tempfile.TemporaryDirectory() as tmp:
        no_aof = EmbeddedRedisSettings(appendonly=False)
        servers = [EmbeddedRedis(f"{tmp}/empty", no_aof), EmbeddedRedis(f"{tmp}/full", no_aof)]
        try:
            (bb0, host0, runs0), (bb1, host1, runs1) = [await colony_on(s, args.agents) for s in servers]
            listed = len(await host1.registry.list())
            loaded_s = await populate(bb1, args.keys)
            await asyncio.sleep(args.settle)  # let the server finish growing its hash table
            dbsize = await bb1.redis.dbsize()
            await bb1.redis.config_resetstat()
            run0, run1 = await timed_pair(
                lambda i: echo_run(runs0, i), lambda i: echo_run(runs1, i), args.runs
            )
            list0, list1 = await timed_pair(
                lambda _i: host0.registry.list(), lambda _i: host1.registry.list(), args.lists
            )
            async with api_client(host0, runs0) as api0, api_client(host1, runs1) as api1:
                http0, http1 = await timed_pair(
                    lambda _i: get_agents(api0, listed), lambda _i: get_agents(api1, listed), args.lists
                )
            scans = await scan_calls(bb1)
            for host, bb in ((host0, bb0), (host1, bb1)):
                await host.close()
                await bb.close()
        finally:
            for server in servers:
                server.stop()

    print(f"keyspace_scale: {listed} agents listed; {args.keys} unrelated keys loaded in {loaded_s:.1f}s")
    print(
        f"  (dbsize {dbsize}); {args.runs} echo runs and {args.lists} listings of each kind per side, "
        "interleaved"
    )
    print(f"  {'':28}{'0 keys':>12}{f'{args.keys} keys':>14}{'ratio':>8}")
    figures = (
        ("echo run", (run0, run1)),
        ("registry.list()", (list0, list1)),
        ("GET /v1/agents", (http0, http1)),
    )
    for what, (a, b) in figures:
        sa, sb = summary(a), summary(b)
        for stat in ("p50", "mean"):
            label = f"{what} {stat} (ms)"
            print(f"  {label:28}{sa[stat]:12.2f}{sb[stat]:14.2f}{sb[stat] / sa[stat]:7.2f}x")
    print(f"  SCAN/KEYS calls on the loaded server while measuring: {scans} (goal 0); ratio goal <= 1.2x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="unrelated keys to load")
    parser.add_argument("--runs", type=int, default=60, help="echo runs timed per side")
    parser.add_argument("--lists", type=int, default=60, help="registry listings timed per side")
    parser.add_argument("--agents", type=int, default=3, help="agents in the registry")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait after loading")
    asyncio.run(main(parser.parse_args()))
