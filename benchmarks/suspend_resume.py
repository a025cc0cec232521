"""Suspend and resume of an idle agent over HTTP, for a 1 KB and a 1 MB agent state, beside the
baseline of a bare Redis read of the same state size, and where the time of a resume goes.

One local Ray cluster (2 CPUs) runs the Colony Serve app (scripted engine: the model plays no part
in a suspension) on an embedded redis-server; two user agents (`sr-1k`, `sr-1m`, this module's
`state_agent`, importable by the replicas through PYTHONPATH) hold a capability state of that
size beside the run capability an idle service agent has (`echo`'s). Each round POSTs
/v1/agents/{id}/suspend then /v1/agents/{id}/resume and times each. The breakdown is measured in
the same run, in this process, on the same Redis:

- `redis GET`: a bare read of a string of the state's size (the floor of "one state read");
- `Agent.restore`: rebuilding the agent from its scope (every state entry read, objects built);
- `host resume`: `ReplicaHost.resume_agent` (restore, event handlers started, registry written);
- `control resume`: `ControlPlane.resume` over that in-process host (the placement decision too);
- `monitor round`: what an explicit resume cost before M14, a whole monitor round (every replica
  asked for its snapshot, orphans and every suspended agent looked at, the views read again after);
- `HTTP resume` minus `control resume`: the HTTP, proxy and Serve handle hops of the API
  (`GET agent`, one HTTP request answered from one Redis read, is their floor).

Usage: python benchmarks/suspend_resume.py [--rounds 30] [--sizes 1024,1048576]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from colony.agents import (
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    AgentRunCapability,
    AgentType,
    ScriptedActionPolicy,
)
from colony.blackboard import Blackboard

SIZES = {"sr-1k": 1024, "sr-1m": 1024 * 1024}  # agent id -> bytes of its capability state


class StateCapability(AgentCapability):
    """Holds `size` bytes of state, persisted with the agent and read back on every resume."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        size: int = 1024,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.blob = "x" * size

    def get_state(self) -> dict[str, Any]:
        return {"blob": self.blob}

    def set_state(self, state: dict[str, Any]) -> None:
        self.blob = str(state.get("blob", ""))


def state_agent(agent_id: str) -> AgentBlueprint:
    """An idle service agent (the run capability, like `echo`) with a state of `SIZES[agent_id]`
    bytes (1 KB for an id not listed)."""
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="state"),
        capabilities=[
            StateCapability.bind(size=SIZES.get(agent_id, 1024)),
            AgentRunCapability.bind(namespace="runs"),
        ],
        action_policy=ScriptedActionPolicy.bind(steps=[]),
    )


ROWS = (  # over HTTP (Serve), then in this process, biggest first
    "suspend",
    "resume",
    "GET agent",
    "monitor round",
    "control resume",
    "host resume",
    "Agent.restore",
    "redis GET",
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(values, 0.5), 2), "p99_ms": round(pct(values, 0.99), 2)}


async def timed(rounds: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    out = []
    for _ in range(rounds):
        started = time.perf_counter()
        await call()
        out.append(time.perf_counter() - started)
    return out


async def over_http(url: str, token: str, agent_id: str, rounds: int) -> dict[str, list[float]]:
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    suspends, resumes, reads = [], [], []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        for i in range(rounds + 3):  # the first 3 warm the path
            started = time.perf_counter()
            (await client.post(f"/v1/agents/{agent_id}/suspend")).raise_for_status()
            middle = time.perf_counter()
            answer = await client.post(f"/v1/agents/{agent_id}/resume")
            answer.raise_for_status()
            done = time.perf_counter()
            assert answer.json()["state"] != "suspended", answer.text
            (await client.get(f"/v1/agents/{agent_id}")).raise_for_status()
            if i >= 3:
                suspends.append(middle - started)
                resumes.append(done - middle)
                reads.append(time.perf_counter() - done)
    return {"suspend": suspends, "resume": resumes, "GET agent": reads}


async def in_process(redis_url: str, size: int, rounds: int) -> dict[str, list[float]]:
    """The same suspend/resume without HTTP or Serve: a ControlPlane over one in-process host."""
    from colony.blackboard import create_redis
    from colony.config import ColonySettings
    from colony.inference.scripted import ScriptedEngine
    from colony.system.control import ControlPlane
    from colony.system.host import ReplicaHost

    settings = ColonySettings(redis_url=redis_url, colony_id=f"sr{uuid.uuid4().hex[:6]}")
    client = create_redis(redis_url, settings.blackboard)
    board = Blackboard(client, "colony:bench", settings=settings.blackboard)
    host = ReplicaHost(settings, "r0", engine=ScriptedEngine(["ok"]))
    await host.start(board)
    control = ControlPlane(board, {"r0": host}, settings)
    host.spawner = control.place
    agent_id = "sr-1m" if size >= 1024 * 1024 else "sr-1k"
    out: dict[str, list[float]] = {}
    try:
        await control.place(state_agent(agent_id))
        raw = create_redis(redis_url, settings.blackboard)
        await raw.set("bench:blob", "x" * size)
        out["redis GET"] = await timed(rounds, lambda: raw.get("bench:blob"))
        await raw.delete("bench:blob")
        await raw.aclose()
        await control.suspend(agent_id)
        assert host.runtime is not None
        runtime = host.runtime
        out["Agent.restore"] = await timed(
            rounds,
            lambda: Agent.restore(
                agent_id,
                board,
                tenant_id=settings.tenant_id,
                colony_id=settings.colony_id,
                **runtime.services,
            ),
        )
        host_times, control_times = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            await host.resume_agent(agent_id)
            host_times.append(time.perf_counter() - started)
            await control.suspend(agent_id)
            started = time.perf_counter()
            await control.resume(agent_id)
            control_times.append(time.perf_counter() - started)
            await control.suspend(agent_id)
        out["host resume"], out["control resume"] = host_times, control_times
        monitor = control.monitor
        rounds_times = []
        for _ in range(rounds):  # the explicit resume before M14: a whole monitor round
            started = time.perf_counter()
            monitor.request_resume(agent_id)
            await monitor.tick()
            rounds_times.append(time.perf_counter() - started)
            await control.suspend(agent_id)
        out["monitor round"] = rounds_times
    finally:
        await control.close()
        await host.close()
        await client.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sizes", default="1024,1048576", help="state sizes in bytes (1024 and/or 1048576)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    agents = {("sr-1m" if s >= 1024 * 1024 else "sr-1k"): s for s in sizes}
    # the replicas import this module (the user agents' factory) through PYTHONPATH
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, here)
    import ray
    from ray import serve

    from colony.blackboard.redis_server import EmbeddedRedis, free_port
    from colony.config import ColonySettings, EngineSettings
    from colony.serve.app import build_app_with_settings

    redis = EmbeddedRedis(Path(tempfile.mkdtemp(prefix="colony-sr-")))
    redis_url = redis.start().url
    settings = ColonySettings(
        redis_url=redis_url,
        api_token="bench",
        engine=EngineSettings(kind="scripted"),
        agents=dict.fromkeys(agents, "suspend_resume:state_agent"),
    )
    port = free_port()
    results: dict[str, dict[str, dict[str, float]]] = {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app_with_settings(settings=settings), name="colony", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        import httpx

        deadline = time.monotonic() + 120
        while True:
            answer = httpx.get(f"{url}/v1/agents", headers={"Authorization": "Bearer bench"}, timeout=60)
            listed = answer.json() if answer.status_code == 200 else []
            if not set(agents) - {a.get("agent_id") for a in listed}:
                break
            assert time.monotonic() < deadline, f"the benchmark agents were not placed: {answer.text[:500]}"
            time.sleep(0.2)
        for agent_id, size in agents.items():
            http = asyncio.run(over_http(url, "bench", agent_id, args.rounds))
            local = asyncio.run(in_process(redis_url, size, args.rounds))
            results[agent_id] = {name: summary(v) for name, v in {**http, **local}.items()}
    finally:
        serve.shutdown()
        ray.shutdown()
        redis.stop()
    print(f"suspend/resume of an idle agent, {args.rounds} rounds each, 2 CPUs for Ray, scripted engine")
    for agent_id, rows in results.items():
        print(f"  {agent_id} (state {agents[agent_id]} bytes)")
        for name in ROWS:
            row = rows[name]
            print(f"    {name:<16} p50 {row['p50_ms']:8.2f} ms   p99 {row['p99_ms']:8.2f} ms")
        ratio = rows["resume"]["p50_ms"] / max(rows["redis GET"]["p50_ms"], 1e-6)
        hops = rows["resume"]["p50_ms"] - rows["control resume"]["p50_ms"]
        print(
            f"    HTTP resume p50 = {ratio:.1f}x the bare Redis read of the state; HTTP, proxy and "
            f"Serve hops about {hops:.1f} ms of it (goal: resume p50 <= 50 ms at 1 MB)"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
