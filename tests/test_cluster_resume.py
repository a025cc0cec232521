"""Issue 17's exactly-once acceptance on a real `colony up` with two engine replicas: the replica
process hosting an agent is killed (SIGKILL) in the middle of a three-action step; the agent is
re-placed, its run ends `succeeded`, each action that had finished ran exactly once (its result
came from the write-ahead action log) and the one cut off ran again once, with the same
idempotency key. The executions are counted by the capability in the cluster's Redis, with the pid
of the process each ran in, so the test knows which process to kill and that the retry ran elsewhere.

The agent is a user package (on PYTHONPATH, as a user brings one) whose policy books three items
in one step: the action log is what keeps the two finished bookings from running again when the
step is redone (the step was never persisted).
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Iterator

import pytest
import redis
from cluster_kit import user_package_cluster

from colony.client import ColonyClient
from colony.config import ColonySettings
from colony.serve import cluster

PACKAGE = "colony_resume_booker"
MODULE = textwrap.dedent(
    '''
    """An agent whose one step books items a, b and c; the first execution of `b` hangs (it waits
    to be killed). Every execution is counted in Redis with its idempotency key and pid."""

    import asyncio
    import os
    from typing import Any

    from colony.agents import (
        Agent,
        AgentBlueprint,
        AgentCapability,
        AgentMetadata,
        AgentRunCapability,
        AgentType,
        action_executor,
    )
    from colony.agents.policy import ActionPolicy, ActionPolicyIterationResult
    from colony.agents.state.action_log import current_idempotency_key
    from colony.system.builtin import RUNS_NAMESPACE


    class Ledger(AgentCapability):
        @action_executor(effects=("external",))
        async def book(self, item: str) -> dict[str, Any]:
            """Book `item` (counted in Redis)."""
            redis = self.blackboard.redis
            base = f"resume-test:{self.agent.agent_id}"
            count = await redis.hincrby(f"{base}:count", item, 1)
            await redis.rpush(f"{base}:runs:{item}", f"{os.getpid()} {current_idempotency_key()}")
            if item == "b" and count == 1:
                await asyncio.sleep(3600)  # the test kills this process now
            return {"item": item, "count": count}


    class BatchPolicy(ActionPolicy):
        async def execute_iteration(self, state: Any) -> ActionPolicyIterationResult:
            outputs = []
            for item in ("a", "b", "c"):
                result = await self.agent.dispatcher.dispatch("book", {"item": item})
                outputs.append(result.output)
            return ActionPolicyIterationResult(action="book", done=True, output=outputs)


    def booker(agent_id: str) -> AgentBlueprint:
        return AgentBlueprint(
            agent_class=Agent,
            metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="booker"),
            capabilities=[Ledger.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
            action_policy=BatchPolicy.bind(),
        )
    '''
)


@pytest.fixture(scope="module")
def resume_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ColonySettings, cluster.ClusterInfo]]:
    with user_package_cluster(tmp_path_factory, PACKAGE, MODULE, {"booker": "booker"}) as made:
        yield made


def _executions(store: redis.Redis, item: str) -> list[tuple[int, str]]:
    rows = [row.decode().split(" ", 1) for row in store.lrange(f"resume-test:booker:runs:{item}", 0, -1)]
    return [(int(pid), key) for pid, key in rows]


def test_a_killed_replica_mid_step_reruns_only_the_action_it_cut_off(resume_cluster) -> None:
    _settings, info = resume_cluster
    store = redis.Redis.from_url(info.redis_url)
    try:
        with ColonyClient(info.url, info.token, timeout=120) as client:
            hosted = {a["agent_id"]: a.get("replica") for a in client.agents()}
            assert hosted.get("booker"), hosted
            run_id = client.submit("booker", None)["run_id"]
            deadline = time.monotonic() + 120
            while not _executions(store, "b") and time.monotonic() < deadline:
                time.sleep(0.2)
            [(victim, first_key)] = _executions(store, "b")  # b started (and hangs) in `victim`
            assert [pid for pid, _ in _executions(store, "a")] == [victim]
            os.kill(victim, signal.SIGKILL)  # the replica process hosting the agent, mid-step

            deadline = time.monotonic() + 420
            run = client.get(run_id)
            while run["status"] not in ("succeeded", "failed", "cancelled") and time.monotonic() < deadline:
                time.sleep(1)
                run = client.get(run_id)
            assert run["status"] == "succeeded", run
            a, b, c = (_executions(store, item) for item in "abc")
            assert len(a) == 1 and len(c) == 1, (a, c)  # finished before the kill: never again
            assert len(b) == 2, b  # cut off by the kill, then once more
            (_, b_first), (b_pid, b_again) = b
            assert b_again == b_first == first_key and b_pid != victim  # same key, another process
            assert c[0][0] == b_pid
            assert a[0][1] != first_key
            assert [o["item"] for o in run["output"]] == ["a", "b", "c"]
            assert run["output"][0] == {"item": "a", "count": 1}  # a's recorded result, replayed
            assert run["output"][1] == {"item": "b", "count": 2}
    finally:
        store.close()
