"""Server-side retention of API runs (issue 11 review): every process uses the settings it was
built with (never a stray COLONY_* variable), a submit that fails half-way leaves nothing permanent,
a run nobody answers still goes, and a cancel trims the old events like an agent's end does."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from colony.api.app import ApiServices, create_app
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentRunProtocol, ApiRunProtocol
from colony.config import ColonySettings, RunsSettings, VcmSettings
from colony.errors import BlackboardUnavailable, InvalidArgument
from colony.inference.scripted import ScriptedEngine
from colony.serve.app import api_services
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.registry import AgentRecord, AgentRegistry
from colony.system.runs import RunService

TOKEN = "retention-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def colony_settings(redis_url: str, **runs: Any) -> ColonySettings:
    return ColonySettings(
        redis_url=redis_url,
        colony_id=f"ret{uuid.uuid4().hex[:8]}",
        runs=RunsSettings(**runs),
        vcm=VcmSettings(page_retention_seconds=9.0),
    )


@pytest.fixture
async def silent(bb: Blackboard, redis_url: str) -> AsyncIterator[tuple[RunService, ColonySettings]]:
    """A RunService whose agent `mute` is registered but hosted nowhere: nobody ever answers."""
    settings = colony_settings(
        redis_url, retention_seconds=1.0, default_timeout_seconds=1.0, known_ids_seconds=1.5
    )
    board = bb.scoped(scope_id(BlackboardScope.COLONY, tenant_id="default", colony_id=settings.colony_id))
    registry = AgentRegistry(board, settings=settings)
    await registry.put(AgentRecord(agent_id="mute", state="idle"))
    yield RunService(bb, registry, colony_id=settings.colony_id, settings=settings), settings


async def run_keys(bb: Blackboard, colony_id: str, run_id: str) -> dict[str, int]:
    """Every Redis key of the run (its request, record, tag set...) with its PTTL, but the marker
    that it was submitted (ApiRunProtocol.known_key), which outlives them on purpose."""
    known = ApiRunProtocol.known_key(run_id)
    keys = [k async for k in bb.redis.scan_iter(match=f"*{colony_id}*{run_id}*") if not k.endswith(known)]
    return {k: await bb.redis.pttl(k) for k in keys}


async def test_processes_use_the_settings_they_are_given_not_the_environment(
    bb: Blackboard, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = colony_settings(redis_url, retention_seconds=5.0, default_timeout_seconds=7.0)
    # a stray variable in a replica's environment: load_settings() would refuse it or read 99
    monkeypatch.setenv("COLONY_RUNS__RETENTION_SECONDS", "not-a-number")
    monkeypatch.setenv("COLONY_VCM__PAGE_RETENTION_SECONDS", "99")
    host = ReplicaHost(settings, "replica-r", engine=ScriptedEngine(["ok"]))
    await host.start(bb)
    try:
        assert host.registry is not None and host.pages is not None
        assert host.registry.retention_seconds == 5.0
        assert host.pages.retention_seconds == 9.0
        control = ControlPlane(bb, {"replica-r": host}, settings)
        assert control.registry.retention_seconds == 5.0
        assert control.pages.retention_seconds == 9.0
        services = api_services(settings, token=TOKEN)  # what the ColonyAPI replica builds
        try:
            assert services.registry.retention_seconds == 5.0
            assert services.runs.retention_seconds == 5.0
            assert services.runs.runs_settings.default_timeout_seconds == 7.0
            assert services.pages is not None and services.pages.retention_seconds == 9.0
            # and it acts on them: a run's request and record live its timeout plus the retention
            await services.registry.put(AgentRecord(agent_id="mute", state="idle"))
            record = await services.runs.submit("mute", {"x": 1})
            ttls = await run_keys(bb, settings.colony_id, record.run_id)
            assert len(ttls) >= 2 and all(0 < ttl <= 12_000 for ttl in ttls.values()), ttls
        finally:
            await services.runs._root.close()
    finally:
        await host.close()


async def test_a_submit_that_fails_leaves_nothing_permanent(silent, bb: Blackboard) -> None:
    runs, settings = silent
    with pytest.raises(InvalidArgument, match="JSON"):  # the request cannot be stored
        await runs.submit("mute", [[[[[[[[[[[[[[[[object()]]]]]]]]]]]]]]]])
    assert [k async for k in bb.redis.scan_iter(match=f"*{settings.colony_id}*run:run-*")] == []


async def test_a_redis_failure_at_submit_is_a_503_and_leaves_no_request(silent, bb: Blackboard) -> None:
    runs, settings = silent
    # the API scope's event stream is not a stream: Redis refuses every write of a run record
    await bb.redis.set(runs.api_board.keyspace.events_key, "not a stream")
    try:
        with pytest.raises(BlackboardUnavailable, match="submit run"):
            await runs.submit("mute", {"x": 1})
        app = create_app(ApiServices(runs=runs, registry=runs.registry, token=TOKEN))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://colony") as client:
            response = await client.post("/v1/runs", json={"agent": "mute", "input": {}}, headers=AUTH)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "unavailable"
        # no request left to serve; what Redis kept of the failed writes expires on its own
        left = [k async for k in bb.redis.scan_iter(match=f"*{settings.colony_id}*run:run-*")]
        assert not [k for k in left if ":request:run:" in k], left
        ttls = {k: await bb.redis.pttl(k) for k in left}
        assert all(0 < ttl <= 2_000 for ttl in ttls.values()), ttls
    finally:
        await bb.redis.delete(runs.api_board.keyspace.events_key)


async def test_a_run_nobody_answers_expires_after_its_timeout_and_retention(silent, bb: Blackboard) -> None:
    runs, settings = silent
    unbounded = await runs.submit("mute", {"x": 1})  # no timeout: runs.default_timeout_seconds
    bounded = await runs.submit("mute", {"x": 2}, timeout_s=0.5)
    assert unbounded.deadline is not None and unbounded.deadline - unbounded.created_at == pytest.approx(
        1, 0.1
    )
    for record, life in ((unbounded, 2_000), (bounded, 1_500)):
        ttls = await run_keys(bb, settings.colony_id, record.run_id)
        request = next(k for k in ttls if k.endswith(AgentRunProtocol.request_key(record.run_id)))
        stored = next(k for k in ttls if k.endswith(ApiRunProtocol.run_key(record.run_id)))
        assert 0 < ttls[request] <= life and 0 < ttls[stored] <= life, ttls
    await asyncio.sleep(2.3)  # nobody asked for these runs meanwhile: Redis drops them by itself
    for record in (unbounded, bounded):
        assert await run_keys(bb, settings.colony_id, record.run_id) == {}


async def test_a_retired_run_is_410_retired_then_404_once_forgotten(silent, bb: Blackboard) -> None:
    runs, settings = silent
    record = await runs.submit("mute", {"x": 1}, timeout_s=0.3)  # keys live 0.3 + 1 s
    known = [
        k
        async for k in bb.redis.scan_iter(match=f"*{settings.colony_id}*")
        if k.endswith(ApiRunProtocol.known_key(record.run_id))
    ]
    assert len(known) == 1 and 1_000 < await bb.redis.pttl(known[0]) <= 2_800  # life + 1.5 s
    await asyncio.sleep(1.5)  # the record is gone, the marker is not
    assert await run_keys(bb, settings.colony_id, record.run_id) == {}
    app = create_app(ApiServices(runs=runs, registry=runs.registry, token=TOKEN))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://colony") as client:
        for path in (f"/v1/runs/{record.run_id}", f"/v1/runs/{record.run_id}/events"):
            response = await client.get(path, headers=AUTH)
            assert response.status_code == 410, response.text
            error = response.json()["error"]
            assert (
                error["code"] == "retired" and "retired" in error["message"] and "'mute'" in error["message"]
            )
        never = await client.get("/v1/runs/run-neversubmitted", headers=AUTH)
        assert never.status_code == 404 and "request_id" in never.json()["error"]["message"]
        await asyncio.sleep(1.5)  # the marker expires too: an id nobody knows any more
        assert (await client.get(f"/v1/runs/{record.run_id}", headers=AUTH)).status_code == 404


async def test_a_run_past_the_default_deadline_reports_failed(silent) -> None:
    runs, _ = silent
    record = await runs.submit("mute", {"x": 1})
    assert (await runs.get(record.run_id)).status == "queued"
    await asyncio.sleep(1.1)
    view = await runs.get(record.run_id)
    assert view.status == "failed" and "deadline" in (view.error or "")


async def test_cancel_trims_the_scopes_events_older_than_the_retention(silent, bb: Blackboard) -> None:
    runs, _ = silent
    record = await runs.submit("mute", {"x": 1})
    stream = runs.run_board(record).keyspace.events_key
    request_key = AgentRunProtocol.request_key(record.run_id)

    async def logged_keys() -> list[str]:
        return [fields["key"] for _, fields in await bb.redis.xrange(stream)]

    assert request_key in await logged_keys()
    await asyncio.sleep(1.2)  # the request's event is now older than runs.retention_seconds
    assert (await runs.cancel(record.run_id)).status == "cancelled"
    keys = await logged_keys()
    assert request_key not in keys  # trimmed, as docs/blackboard.md says
    assert AgentRunProtocol.result_key(record.run_id) in keys  # the cancel's own event stays
