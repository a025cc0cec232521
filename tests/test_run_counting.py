"""A run's end is counted once in the whole cluster, when it ends, by whoever stored its result.

Each process exports its own counters (`colony_cluster_*` has one series per process and the
dashboards sum them). A run is counted by the process whose create-only write stored its result:
the agent that answered it (on its engine replica), or the API process that ended it (cancel,
timeout). Reading it counts nothing: here several RunService instances (one per API process) share
one real Redis with a real replica host serving `echo`, and `colony_runs_completed_total` and
`colony_run_duration_seconds` grow by exactly one per run, read by every replica, concurrently, or
by none."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from colony.agents import run_capability
from colony.blackboard import AgentRunProtocol, Blackboard
from colony.config import ColonySettings, load_settings
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.registry import AgentRecord
from colony.system.runs import RunService

RETENTION = 120.0


def completed(status: str) -> float:
    return REGISTRY.get_sample_value("colony_runs_completed_total", {"status": status}) or 0.0


def durations() -> float:
    return REGISTRY.get_sample_value("colony_run_duration_seconds_count") or 0.0


@pytest.fixture
async def apis(bb: Blackboard, redis_url: str) -> AsyncIterator[list[RunService]]:
    """Three API processes' RunServices on one colony (its own id: no other test's runs), with a
    replica host serving `echo` and a registered agent nobody serves (`sleepy`)."""
    settings = ColonySettings(redis_url=redis_url, colony_id=f"c{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "replica-a", engine=ScriptedEngine(["unused"]))
    await host.start(bb)
    await host.ensure_agent(echo_blueprint())
    assert host.registry is not None
    await host.registry.put(AgentRecord(agent_id="sleepy", state="idle"))
    yield [
        RunService(
            bb,
            host.registry,
            colony_id=settings.colony_id,
            retention_seconds=RETENTION,
            settings=load_settings(),
        )
        for _ in range(3)
    ]
    await host.close()


async def ended(service: RunService, run_id: str) -> str:
    async with asyncio.timeout(20):
        while (view := await service.get(run_id)).status not in ("succeeded", "failed", "cancelled"):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    return view.status


async def test_a_run_is_counted_once_by_its_answer_however_many_replicas_read_it(
    apis: list[RunService],
) -> None:
    api_a, api_b, api_c = apis
    before, before_durations = completed("succeeded"), durations()
    run_id = (await api_a.submit("echo", {"n": 1}, timeout_s=60)).run_id
    assert await ended(api_b, run_id) == "succeeded"
    for service in (api_b, api_a, api_c, api_b, api_a):  # each replica reads it, some twice
        assert (await service.get(run_id)).status == "succeeded"
    events = [e async for e in api_c.events(run_id)]  # and streams it to its end
    assert events[-1][1]["event_type"] == "completed"
    assert completed("succeeded") - before == 1.0
    assert durations() - before_durations == 1.0


async def test_runs_nobody_reads_are_counted_when_they_end(apis: list[RunService]) -> None:
    """Before, a run's first reader counted it: one never read was never counted."""
    api_a, _, _ = apis
    before = completed("succeeded")
    records = await asyncio.gather(*(api_a.submit("echo", n, timeout_s=60) for n in range(5)))
    async with asyncio.timeout(20):
        while completed("succeeded") - before < len(records):  # noqa: ASYNC110 - nothing reads the runs
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    assert completed("succeeded") - before == len(records)


async def test_replicas_reading_at_the_same_moment_add_nothing(apis: list[RunService]) -> None:
    runs = [(await apis[0].submit("echo", n, timeout_s=60)).run_id for n in range(5)]
    for run_id in runs:
        await ended(apis[0], run_id)
    before = completed("succeeded")
    views = await asyncio.gather(*(s.get(run) for run in runs for s in apis for _ in range(2)))
    assert {v.status for v in views} == {"succeeded"}
    assert completed("succeeded") == before


async def test_a_run_ended_by_the_api_is_counted_once_by_the_replica_that_ended_it(
    apis: list[RunService],
) -> None:
    api_a, api_b, _ = apis
    record = await api_a.submit("sleepy", {"n": 2}, timeout_s=60)
    before = completed("cancelled")
    assert (await api_a.cancel(record.run_id)).status == "cancelled"
    assert (await api_b.get(record.run_id)).status == "cancelled"
    assert (await api_b.cancel(record.run_id)).status == "cancelled"  # its write finds the result: no count
    assert completed("cancelled") - before == 1.0
    # a run past its deadline is ended (failed) by the first read after it, counted once
    timed = await api_a.submit("sleepy", {"n": 3}, timeout_s=0.2)
    failed = completed("failed")
    await asyncio.sleep(0.4)
    assert {(await s.get(timed.run_id)).status for s in apis} == {"failed"}
    assert completed("failed") - failed == 1.0


async def test_a_request_another_agent_sent_is_not_an_api_run(bb: Blackboard, apis: list[RunService]) -> None:
    """Only runs submitted over the API count; an AgentHandle's request to an agent does not."""
    record = await apis[0].submit("echo", "warm", timeout_s=60)
    await ended(apis[0], record.run_id)
    board = apis[0].run_board(record)
    before = completed("succeeded")
    await board.write(
        AgentRunProtocol.request_key("handle-req-9"),
        {"input": "x", "requester": "some-agent"},
        tags={AgentRunProtocol.request_tag("handle-req-9")},
        created_by="some-agent",
    )
    async with asyncio.timeout(20):
        while await board.read(AgentRunProtocol.result_key("handle-req-9")) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert completed("succeeded") == before


async def test_a_run_whose_terminal_event_fails_after_its_result_is_counted(
    apis: list[RunService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: the answer stored one write at a time, its result written and its terminal
    event then refused, went uncounted (the failure path found the result there and counted
    nothing). The run ended when its result was stored: it counts then."""
    from colony.agents import run_event_writer
    from colony.agents.run_event_writer import RunEventWriter

    real_retry = run_event_writer.retry_unavailable
    store_event = RunEventWriter.store_event

    async def one_commit_fails(operation: Any, what: str, *args: Any, **kwargs: Any) -> Any:
        if what.startswith("answer of request"):
            raise RuntimeError("the one-commit answer refused")
        return await real_retry(operation, what, *args, **kwargs)

    async def terminal_refused(self: RunEventWriter, key: str, value: Any) -> None:
        if key.endswith(".completed"):
            raise RuntimeError("terminal event refused")
        await store_event(self, key, value)

    monkeypatch.setattr(run_event_writer, "retry_unavailable", one_commit_fails)
    monkeypatch.setattr(RunEventWriter, "store_event", terminal_refused)
    before = completed("succeeded")
    run_id = (await apis[0].submit("echo", 7, timeout_s=60)).run_id
    assert await ended(apis[0], run_id) == "succeeded"
    async with asyncio.timeout(10):
        while completed("succeeded") - before < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    assert completed("succeeded") - before == 1.0


async def test_a_run_that_fails_before_its_request_is_read_is_counted(
    apis: list[RunService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: a request whose serving raised before the agent read it (and so knew it for
    an API run) was ended as failed without being counted."""
    from colony.blackboard.blackboard import Blackboard as Board

    real_read = Board.read_many_and_tagged
    raised: list[int] = []

    async def fails_once(self: Board, *args: Any, **kwargs: Any) -> Any:
        if not raised and len(args) > 1 and args[1]:  # the agent's read of a request (with its tag)
            raised.append(1)
            raise RuntimeError("read refused")
        return await real_read(self, *args, **kwargs)

    monkeypatch.setattr(Board, "read_many_and_tagged", fails_once)
    # a member's pick-up reads the request with its claim: here it reads it again, and that fails
    monkeypatch.setattr(run_capability, "PICKED_UP_FRESH_SECONDS", 0.0)
    before = completed("failed")
    run_id = (await apis[0].submit("echo", 8, timeout_s=60)).run_id
    assert await ended(apis[0], run_id) == "failed" and raised
    assert completed("failed") - before == 1.0
