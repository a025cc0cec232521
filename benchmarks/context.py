"""Context management on a real redis-server: what an agent stores and what its prompt holds over a
long run, with and without compaction, and how fast an agent with a long history resumes.

(a) growth: two agents side by side in one run, each driven `--steps` steps (one event and one
    action per step; StructuredActionPolicy on the scripted engine, whose words do not matter
    here). Their streams keep up to 1,000 entries. "compacted" runs under a token budget
    (`context.token_budget`, default 1,000); "baseline" has no budget (the scripted engine has no
    context window), so nothing is compacted. At each mark: the stored policy state, everything
    the agent's scope holds in Redis (`MEMORY USAGE` of its entries and rings; its capped event
    stream apart), and the planner prompt's tokens (characters / 4).
(b) resume: an agent driven `--history` steps under the budget (checkpoints capped at
    `context.checkpoints_kept` when the checkpoint ring is in place), then `Agent.restore` timed in
    a fresh process, with the resident memory that process gained while restoring.

Goals (issue #17): the compacted agent's stored state stops growing once compaction runs (bounded
by the budget and the checkpoint cap) while the baseline's grows with the run; resume < 1 s and
< 50 MB RSS at 10,000 steps. Usage:
    python benchmarks/context.py [--steps 1000] [--history 10000] [--budget 1000] [--json]
An embedded redis-server is started in a temporary directory and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colony import security
from colony.agents import (
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    LocalAgentRuntime,
    action_executor,
)
from colony.blackboard import Blackboard, create_redis
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import ContextSettings, EmbeddedRedisSettings, load_settings
from colony.inference import InferenceRequest
from colony.inference.scripted import ScriptedEngine
from colony.planning import (
    ActionKeySubstringFilter,
    ConsciousnessStream,
    EventContextKeyFilter,
    JSONStreamFormatter,
    StructuredActionPolicy,
)
from colony.planning.compaction import SUMMARISER_SYSTEM

SCOPE = "bench:context"
RESUME_GOAL_S = 1.0
RESUME_GOAL_MB = 50.0


class Sensors(AgentCapability):
    @action_executor()
    async def note(self, text: str) -> str:
        """Write down what the latest reading says."""
        return f"noted: {text}"


def blueprint(agent_id: str, settings: ContextSettings) -> AgentBlueprint:
    streams = [
        ConsciousnessStream.bind(
            name="observations",
            formatter=JSONStreamFormatter.bind(section_title="## Observations"),
            event_filter=EventContextKeyFilter("observation"),
            max_entries=1000,
        ),
        ConsciousnessStream.bind(
            name="activity",
            formatter=JSONStreamFormatter.bind(section_title="## Activity"),
            action_filter=ActionKeySubstringFilter(""),
            max_entries=1000,
        ),
    ]
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(
            agent_id=agent_id, action_policy_blueprints={"consciousness_streams": streams}
        ),
        capabilities=[Sensors.bind()],
        action_policy=StructuredActionPolicy.bind(
            goals=["Watch the sensors and note every reading."], max_tokens=48, context_settings=settings
        ),
    )


def engine() -> ScriptedEngine:
    """Planner: note each reading; summariser: a fixed-size summary (its words do not matter here)."""
    count = {"n": 0}

    def reply(request: InferenceRequest) -> Any:
        if request.messages[0].content == SUMMARISER_SYSTEM:
            return "Summary: sensors s0-s4 read 18-26 C throughout; every reading was noted."
        count["n"] += 1
        return {"action": "note", "parameters": {"text": f"reading {count['n']} normal"}}

    return ScriptedEngine(reply)


def _kind(key: str, keyspace: Any) -> str:
    if key == keyspace.events_key:
        return "events"
    if key.startswith(keyspace.entry_prefix + "agent:archived:"):
        return "archives"
    if key == keyspace.ring_key(Keys.key("action_log")) or key == keyspace.entry_prefix + Keys.key(
        "action_log"
    ):
        return "action_log"
    if key == keyspace.ring_key(Keys.key("checkpoints")):
        return "checkpoints"
    return "state"


async def scope_bytes(agent: Agent) -> dict[str, int]:
    """Bytes Redis holds for the agent's scope (`MEMORY USAGE`), by kind: its state entries and
    context ring, the checkpoint ring, the archived originals compaction set aside, the
    write-ahead action log of the run, and the scope's capped event stream."""
    redis, keyspace = agent.blackboard.redis, agent.blackboard.keyspace
    base = keyspace.entry_prefix[: -len("e:")]
    sizes = dict.fromkeys(("state", "checkpoints", "archives", "action_log", "events"), 0)
    async for key in redis.scan_iter(match=base + "*", count=500):
        sizes[_kind(key, keyspace)] += int(await redis.memory_usage(key, samples=0) or 0)
    return sizes


async def policy_bytes(agent: Agent) -> int:
    entry = await agent.blackboard.read(Keys.key("policy_state"))
    return len(json.dumps(entry.value)) if entry is not None else 0


async def drive(
    runtime: LocalAgentRuntime,
    agent_id: str,
    settings: ContextSettings,
    steps: int,
    marks: set[int],
    scripted: ScriptedEngine,
) -> list[dict[str, Any]]:
    agent = await runtime.spawn(blueprint(agent_id, settings))
    agent.max_steps = steps + 10
    await agent.begin_run({"task": "Watch the sensors"})
    rows = []
    for i in range(1, steps + 1):
        agent.context.append({"observation": f"reading {i}: sensor s{i % 5} reports {18 + i % 9} C"})
        await agent.run_step()
        if i in marks:
            planned = [r for r in scripted.requests if r.messages[0].content != SUMMARISER_SYSTEM]
            prompt = planned[-1].messages[-1].content + planned[-1].messages[0].content
            rows.append(
                {
                    "step": i,
                    "policy_state_bytes": await policy_bytes(agent),
                    "scope_bytes": await scope_bytes(agent),
                    "prompt_tokens": math.ceil(len(prompt) / 4),
                }
            )
    return rows


async def growth(url: str, steps: int, budget: int) -> dict[str, Any]:
    client = create_redis(url)
    marks = {m for m in (50, 100, 200, 300, 500, 750, 1000, 2000, 5000) if m <= steps} | {steps}
    try:
        board = Blackboard(client, SCOPE)
        out: dict[str, Any] = {}
        for name, settings in (
            ("compacted", ContextSettings(token_budget=budget)),
            ("baseline", ContextSettings(token_budget=0)),
        ):
            scripted = engine()
            runtime = LocalAgentRuntime(
                board, colony_id=f"bench{uuid.uuid4().hex[:8]}", engine=scripted, settings=load_settings()
            )
            started = time.perf_counter()
            try:
                out[name] = await drive(runtime, f"agent-{name}", settings, steps, marks, scripted)
            finally:
                await runtime.shutdown()
            out[f"{name}_seconds"] = round(time.perf_counter() - started, 2)
        return out
    finally:
        await client.aclose()


async def build_history(url: str, steps: int, budget: int) -> dict[str, Any]:
    client = create_redis(url)
    colony = f"bench{uuid.uuid4().hex[:8]}"
    try:
        board = Blackboard(client, SCOPE)
        scripted = engine()
        runtime = LocalAgentRuntime(board, colony_id=colony, engine=scripted, settings=load_settings())
        started = time.perf_counter()
        try:
            agent = await runtime.spawn(blueprint("agent-history", ContextSettings(token_budget=budget)))
            agent.max_steps = steps + 10
            await agent.begin_run({"task": "Watch the sensors"})
            for i in range(1, steps + 1):
                agent.context.append({"observation": f"reading {i}: sensor s{i % 5} reports {18 + i % 9} C"})
                await agent.run_step()
            scope = await scope_bytes(agent)
            checkpoints = len(await agent.blackboard.ring(Keys.key("checkpoints")))
            policy = await policy_bytes(agent)
        finally:
            await runtime.shutdown()  # detached: its state stays in Redis for the restore
        return {
            "colony_id": colony,
            "steps": steps,
            "build_seconds": round(time.perf_counter() - started, 2),
            "scope_bytes": scope,
            "policy_state_bytes": policy,
            "checkpoints_held": checkpoints,
        }
    finally:
        await client.aclose()


RESTORE_PROBE = """
import asyncio, json, resource, sys, time
sys.path.insert(0, {root!r})
from colony import security
from colony.agents import Agent
from colony.blackboard import Blackboard, create_redis
from colony.config import load_settings
from colony.inference.scripted import ScriptedEngine
import benchmarks.context  # the blueprint's classes, imported before the clock starts

SETTINGS = load_settings()
security.use_settings(SETTINGS)  # this probe is a process's entry point

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

async def main():
    client = create_redis({url!r})
    board = Blackboard(client, {scope!r})
    await board.read("warm-up")  # the connection, outside the clock
    before = rss_mb()
    started = time.perf_counter()
    agent = await Agent.restore(
        "agent-history", board, colony_id={colony!r}, engine=ScriptedEngine(["{{}}"]), settings=SETTINGS
    )
    seconds = time.perf_counter() - started
    after = rss_mb()
    print(json.dumps({{"seconds": seconds, "rss_before_mb": before, "rss_after_mb": after,
                      "rss_gain_mb": after - before, "steps": agent.current_run.steps}}))
    await client.aclose()

asyncio.run(main())
"""


def restore_in_fresh_process(url: str, colony: str) -> dict[str, Any]:
    root = str(Path(__file__).resolve().parent.parent)
    code = RESTORE_PROBE.format(root=root, url=url, scope=SCOPE, colony=colony)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"restore probe failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    security.use_settings(load_settings())  # this process signs the blueprints of the agents it spawns
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1000, help="steps of the growth comparison")
    parser.add_argument("--history", type=int, default=10_000, help="steps of the agent that is resumed")
    parser.add_argument(
        "--budget", type=int, default=1000, help="context.token_budget of the compacted agents"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="colony-bench-") as tmp:
        server = EmbeddedRedis(tmp, EmbeddedRedisSettings(appendonly=False))
        info = server.start()
        try:
            result: dict[str, Any] = {"growth": asyncio.run(growth(info.url, args.steps, args.budget))}
            history = asyncio.run(build_history(info.url, args.history, args.budget))
            result["history"] = history
            result["resume"] = restore_in_fresh_process(info.url, history["colony_id"])
        finally:
            server.stop()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    g = result["growth"]
    print(f"growth over {args.steps} steps (budget {args.budget} tokens; baseline: no compaction)")
    print(
        f"{'step':>6} | {'policy state B':>14} {'baseline':>9} | {'state+ckpt B':>12} {'baseline':>9} |"
        f" {'archives B':>10} {'baseline':>9} | {'action log B':>12} {'baseline':>9} |"
        f" {'prompt tok':>10} {'baseline':>8}"
    )
    for c, b in zip(g["compacted"], g["baseline"], strict=True):
        cs, bs = c["scope_bytes"], b["scope_bytes"]
        print(
            f"{c['step']:>6} | {c['policy_state_bytes']:>14} {b['policy_state_bytes']:>9} |"
            f" {cs['state'] + cs['checkpoints']:>12} {bs['state'] + bs['checkpoints']:>9} |"
            f" {cs['archives']:>10} {bs['archives']:>9} | {cs['action_log']:>12} {bs['action_log']:>9} |"
            f" {c['prompt_tokens']:>10} {b['prompt_tokens']:>8}"
        )
    print(f"  (driven in {g['compacted_seconds']} s compacted, {g['baseline_seconds']} s baseline)")
    h, r = result["history"], result["resume"]
    print(
        f"history: {h['steps']} steps in {h['build_seconds']} s; bytes {json.dumps(h['scope_bytes'])};"
        f" policy state {h['policy_state_bytes']} B, {h['checkpoints_held']} checkpoints held"
    )
    print(
        f"resume (Agent.restore, fresh process): {r['seconds']:.3f} s (goal < {RESUME_GOAL_S} s);"
        f" RSS gained {r['rss_gain_mb']:.1f} MB (goal < {RESUME_GOAL_MB} MB;"
        f" process {r['rss_after_mb']:.0f} MB with Colony imported)"
    )


if __name__ == "__main__":
    main()
