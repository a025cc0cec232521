"""Every agent-side loop heals after a Redis outage: runs accepted before a Redis SIGKILL (or a
SIGSTOP pause) all end, and new runs succeed soon after Redis is back on the same address."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from agent_kit import counter_blueprint

from colony.agents import Agent, AgentHandle, AgentMetadata, LocalAgentRuntime
from colony.blackboard import Blackboard, create_redis
from colony.blackboard.redis_server import EmbeddedRedis
from colony.config import BlackboardSettings, load_settings

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]
RUNS = 30


async def _until(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await predicate()
        except Exception:
            value = None
        if value is not None or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)


async def _outage(tmp_path: Path, fault: str) -> None:
    server = EmbeddedRedis(tmp_path / "data")
    info = server.start()  # append-only: a restart replays what was accepted
    settings = BlackboardSettings(op_timeout_seconds=1.0, connect_timeout_seconds=0.5)
    client = create_redis(info.url, settings)
    board = Blackboard(client, "test:chaos", settings=settings)
    runtime = LocalAgentRuntime(board, colony_id="chaos", settings=load_settings())
    handle = AgentHandle("worker", owner=Agent(AgentMetadata(agent_id="p", colony_id="chaos"), board))
    try:
        await runtime.spawn(counter_blueprint("worker", STEPS, serve_namespace="ns", delay=0.05))
        accepted = [await handle.submit(i, namespace="ns") for i in range(RUNS)]
        await asyncio.sleep(0.3 if fault == "kill" else 0.02)  # some served, some claimed or queued
        if fault == "kill":
            os.kill(info.pid, signal.SIGKILL)
            await asyncio.sleep(1.5)  # calls fail while it is away
            server.stop()  # forget the dead server's state
            restarted = EmbeddedRedis(
                tmp_path / "data", server.settings.model_copy(update={"port": info.port})
            )
            restarted.start()  # same port, same data dir (AOF replayed when on)
        else:
            os.kill(info.pid, signal.SIGSTOP)
            await asyncio.sleep(5.0)
            os.kill(info.pid, signal.SIGCONT)
        back = time.monotonic()

        async def succeeded():
            run = await handle.run(1000, namespace="ns", timeout=3)
            return run if run.output is not None else None

        fresh = await _until(succeeded, timeout=15)
        assert fresh is not None, "no new run succeeded within 15 s"
        assert time.monotonic() - back < 15

        async def ended(request_id: str):
            run = await handle.result(request_id, namespace="ns")
            return run if run is not None and run.status.value != "running" else None

        outcomes = [await _until(lambda r=r: ended(r), timeout=20) for r in accepted]
        stuck = [r for r, o in zip(accepted, outcomes, strict=True) if o is None]
        assert not stuck, f"{len(stuck)} of {RUNS} accepted runs never ended: {stuck[:3]}"
    finally:
        await runtime.shutdown()
        await client.aclose()
        EmbeddedRedis(tmp_path / "data").stop()


async def test_runs_end_and_new_runs_succeed_after_redis_sigkill_and_restart(tmp_path: Path) -> None:
    await asyncio.wait_for(_outage(tmp_path, "kill"), 55)


async def test_runs_end_and_new_runs_succeed_after_a_5s_redis_pause(tmp_path: Path) -> None:
    await asyncio.wait_for(_outage(tmp_path, "pause"), 55)


async def test_consumer_group_is_recreated_after_redis_lost_its_data(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "data")
    server.settings = server.settings.model_copy(update={"appendonly": False})
    info = server.start()
    settings = BlackboardSettings(op_timeout_seconds=1.0, connect_timeout_seconds=0.5)
    client = create_redis(info.url, settings)
    board = Blackboard(client, "test:groups", settings=settings)
    try:
        consumer = await board.consume("workers", "w1", "job:*").start()
        await board.write("job:1", 1)
        first = await asyncio.wait_for(anext(consumer), 5)
        await first.ack()
        os.kill(info.pid, signal.SIGKILL)
        server.stop()
        EmbeddedRedis(tmp_path / "data", server.settings.model_copy(update={"port": info.port})).start()

        async def after_restart():
            await board.write("job:2", 2)
            return await asyncio.wait_for(anext(consumer), 3)

        second = await _until(after_restart, timeout=15)
        assert second is not None, "the consumer never delivered again (its group was lost with the data)"
        assert second.event.key == "job:2"
        await second.ack()
    finally:
        await client.aclose()
        EmbeddedRedis(tmp_path / "data").stop()


async def test_healthz_is_degraded_with_the_reason_while_redis_is_away(tmp_path: Path) -> None:
    import httpx

    from colony.api.app import ApiServices, create_app
    from colony.system.registry import AgentRegistry
    from colony.system.runs import RunService

    server = EmbeddedRedis(tmp_path / "data")
    info = server.start()
    settings = BlackboardSettings(op_timeout_seconds=1.0, connect_timeout_seconds=0.5)
    client = create_redis(info.url, settings)
    board = Blackboard(client, "test:health", settings=settings)
    registry = AgentRegistry(board, settings=load_settings())
    app = create_app(
        ApiServices(runs=RunService(board, registry, settings=load_settings()), registry=registry, token="t")
    )
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as http:
            ok = await http.get("/healthz")
            assert ok.status_code == 200 and ok.json()["status"] == "ok" and "reason" not in ok.json()
            os.kill(info.pid, signal.SIGSTOP)  # paused: the ping gets no answer
            started = time.monotonic()
            paused = await http.get("/healthz")
            assert time.monotonic() - started < 3
            assert paused.status_code == 503 and paused.json()["status"] == "degraded"
            assert "did not answer" in paused.json()["reason"]
            os.kill(info.pid, signal.SIGCONT)
            os.kill(info.pid, signal.SIGKILL)  # gone: refused
            server.stop()
            down = await http.get("/healthz")
            assert down.status_code == 503 and "Redis unavailable" in down.json()["reason"]
            assert info.password not in down.text and str(info.port) not in down.text
            EmbeddedRedis(tmp_path / "data", server.settings.model_copy(update={"port": info.port})).start()
            back = await _until(lambda: _ok_or_none(http.get("/healthz")), timeout=10)
            assert back is not None, "/healthz never said ok again after Redis came back"
    finally:
        await client.aclose()
        EmbeddedRedis(tmp_path / "data").stop()


async def _ok_or_none(request):
    response = await request
    return response if response.status_code == 200 and response.json()["status"] == "ok" else None


async def test_a_capability_event_feed_goes_on_after_redis_restarts(tmp_path: Path) -> None:
    from colony.agents import AgentCapability

    server = EmbeddedRedis(tmp_path / "data")
    info = server.start()
    settings = BlackboardSettings(op_timeout_seconds=1.0, connect_timeout_seconds=0.5)
    client = create_redis(info.url, settings)
    board = Blackboard(client, "test:feed", settings=settings)
    watcher = AgentCapability(None, "test:feed", blackboard=board)
    queue: asyncio.Queue = asyncio.Queue()
    try:
        task = watcher.stream_events_to_queue(queue, "k*", from_id="0")
        await board.write("k1", 1)
        assert (await asyncio.wait_for(queue.get(), 5)).key == "k1"
        os.kill(info.pid, signal.SIGKILL)
        await asyncio.sleep(1.5)  # the feed fails a few reads meanwhile
        server.stop()
        EmbeddedRedis(tmp_path / "data", server.settings.model_copy(update={"port": info.port})).start()
        assert await _until(lambda: board.write("k2", 2), timeout=10) is not None
        event = await asyncio.wait_for(queue.get(), 10)
        assert event.key == "k2" and not task.done()
    finally:
        await watcher.close()
        await client.aclose()
        EmbeddedRedis(tmp_path / "data").stop()


async def test_a_run_broken_by_a_redis_kill_is_redone_and_its_waiter_gets_it(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "data")
    info = server.start()
    settings = BlackboardSettings(op_timeout_seconds=1.0, connect_timeout_seconds=0.5)
    client = create_redis(info.url, settings)
    board = Blackboard(client, "test:driver", settings=settings)
    runtime = LocalAgentRuntime(board, colony_id="driver", settings=load_settings())
    try:
        await runtime.spawn(counter_blueprint("slow", STEPS * 40, delay=0.1))
        run = await runtime.start_run("slow", 1)
        waiter = asyncio.create_task(runtime.wait_for_run("slow", run.run_id, timeout=30))
        await asyncio.sleep(0.5)  # a few steps in
        os.kill(info.pid, signal.SIGKILL)
        await asyncio.sleep(1.5)
        server.stop()
        EmbeddedRedis(tmp_path / "data", server.settings.model_copy(update={"port": info.port})).start()
        ended = await asyncio.wait_for(waiter, 30)  # neither raised by the outage nor `running` for ever
        # the step the kill cut short is redone from the last checkpoint (its agent restored from
        # Redis), so the run finishes, every step counted once
        assert ended.done and ended.status.value == "succeeded", ended.error
        assert ended.output == 40
        again = await runtime.start_run("slow", 2)  # the agent serves on
        assert (await runtime.wait_for_run("slow", again.run_id, timeout=20)).status.value != "running"
    finally:
        await runtime.shutdown()
        await client.aclose()
        EmbeddedRedis(tmp_path / "data").stop()
