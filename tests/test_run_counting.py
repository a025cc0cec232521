"""A finished run is counted once in the whole cluster, however many API processes read it.

Each API process exports its own counters (`colony_cluster_*` has one series per process and the
dashboards sum them), so a run whose end were counted by every API replica that reads it would be
counted once per replica. Here several RunService instances (one per API process) share one real
Redis and read the same runs: `colony_runs_completed_total` and `colony_run_duration_seconds` grow
by exactly one per run, whichever reads it first, concurrently or in turn, also after a restart."""

from __future__ import annotations

import asyncio
import time
import uuid

from prometheus_client import REGISTRY

from colony.blackboard import AgentRunProtocol, Blackboard
from colony.blackboard.protocol import ApiRunProtocol
from colony.system.registry import AgentRecord, AgentRegistry
from colony.system.runs import RunService

RETENTION = 120.0


def completed(status: str) -> float:
    return REGISTRY.get_sample_value("colony_runs_completed_total", {"status": status}) or 0.0


def durations() -> float:
    return REGISTRY.get_sample_value("colony_run_duration_seconds_count") or 0.0


async def _cluster(bb: Blackboard, replicas: int) -> list[RunService]:
    """`replicas` API processes' RunServices on one colony (its own id: no other test's runs)."""
    colony_id = f"c{uuid.uuid4().hex[:8]}"
    registry = AgentRegistry(bb.scoped(f"colony:{colony_id}:registry"), retention_seconds=RETENTION)
    await registry.put(AgentRecord(agent_id="echo", agent_type="echo", state="idle"))
    return [
        RunService(bb, registry, colony_id=colony_id, retention_seconds=RETENTION) for _ in range(replicas)
    ]


async def _answered(service: RunService, status: str = "succeeded") -> str:
    """A run submitted through `service` and answered the way its agent answers (the result key)."""
    record = await service.submit("echo", {"n": 1}, timeout_s=60)
    await service.run_board(record).write(
        AgentRunProtocol.result_key(record.run_id),
        {"status": status, "output": 1, "error": None, "run_id": record.run_id, "steps": 1},
        tags={AgentRunProtocol.request_tag(record.run_id)},
        created_by="echo",
        expected_version=0,
    )
    return record.run_id


async def test_a_run_read_by_every_api_replica_is_counted_once(bb: Blackboard) -> None:
    api_a, api_b, api_c = await _cluster(bb, 3)
    run_id = await _answered(api_a)
    before, before_durations = completed("succeeded"), durations()
    for service in (api_b, api_a, api_c, api_b, api_a):  # each replica reads it, some twice
        assert (await service.get(run_id)).status == "succeeded"
    assert completed("succeeded") - before == 1.0
    assert durations() - before_durations == 1.0
    # an API process started later (a restarted replica, an empty memory) does not count it again
    (restarted,) = [RunService(bb, api_a.registry, colony_id=api_a.colony_id, retention_seconds=RETENTION)]
    assert (await restarted.get(run_id)).status == "succeeded"
    assert completed("succeeded") - before == 1.0


async def test_replicas_reading_at_the_same_moment_count_a_run_once(bb: Blackboard) -> None:
    services = await _cluster(bb, 4)
    runs = [await _answered(services[0]) for _ in range(5)]
    before = completed("succeeded")
    views = await asyncio.gather(*(s.get(run) for run in runs for s in services for _ in range(2)))
    assert {v.status for v in views} == {"succeeded"}
    assert completed("succeeded") - before == len(runs)


async def test_a_run_ended_by_the_api_is_counted_once_and_the_marker_expires_with_the_run(
    bb: Blackboard,
) -> None:
    api_a, api_b = await _cluster(bb, 2)
    record = await api_a.submit("echo", {"n": 2}, timeout_s=60)
    before = completed("cancelled")
    assert (await api_a.cancel(record.run_id)).status == "cancelled"
    assert (await api_b.get(record.run_id)).status == "cancelled"
    assert (await api_b.cancel(record.run_id)).status == "cancelled"
    assert completed("cancelled") - before == 1.0
    marker = await api_a.api_board.read(ApiRunProtocol.counted_key(record.run_id))
    assert marker is not None and marker.expires_at is not None
    assert 0 < marker.expires_at - time.time() <= RETENTION + 1  # it goes with the run's retention
