"""Quotas of the tenants other than the colony's own (issue 39, deliverable 3): runs per second,
runs submitted and not yet ended, and agents; each answered 429 with Retry-After before anything
is written, counted per tenant (one tenant at its quota leaves the other's calls alone) and never
applied to the colony's own tenant. A colony served on a loopback port over a real redis-server
(tests/tenant_kit.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tenant_kit import HOME, TenantApp, bearer, made

from colony.blackboard.redis_server import RedisServerInfo


@pytest.fixture
def served(redis_server: RedisServerInfo, tmp_path: Any) -> Iterator[tuple[TenantApp, httpx.Client]]:
    with (
        TenantApp(
            redis_server.url,
            [tmp_path],
            tenant_runs_per_second=4,
            tenant_max_open_runs=3,
            tenant_max_agents=3,
        ) as app,
        httpx.Client(base_url=app.url, timeout=60) as http,
    ):
        yield app, http


def submit(http: httpx.Client, headers: dict[str, str], agent: str = "echo", **body: Any) -> httpx.Response:
    return http.post("/v1/runs", json={"agent": agent, "input": "x", **body}, headers=headers)


def test_runs_per_second_are_counted_per_tenant_and_not_for_the_colonys_own(served: Any) -> None:
    _, http = served
    a, b = (bearer(made(http, t, ["read", "run"])["token"]) for t in ("qa", "qb"))
    assert submit(http, a, wait_s=20).status_code == 200  # places qa's echo (its first run)
    assert submit(http, b, wait_s=20).status_code == 200
    for _ in range(3):  # a new second: qa's counter starts again
        answers = [submit(http, a) for _ in range(8)]
        if sum(r.status_code == 202 for r in answers) <= 4:
            break
    refused = [r for r in answers if r.status_code == 429]
    assert refused and all(r.headers["Retry-After"] == "1" for r in refused)
    assert "api.tenant_runs_per_second" in refused[0].json()["error"]["message"]
    assert refused[0].json()["error"]["code"] == "quota_exceeded"
    assert submit(http, b, wait_s=20).status_code == 200  # the other tenant's counter is its own
    assert all(submit(http, HOME).status_code == 202 for _ in range(8))  # the operator's: none


def test_open_runs_are_capped_and_a_run_that_ended_makes_room(served: Any) -> None:
    _, http = served
    a = bearer(made(http, "qc", ["read", "run"])["token"])
    b = bearer(made(http, "qd", ["read", "run"])["token"])
    assert submit(http, a, wait_s=20).status_code == 200
    suspended = http.post("/v1/agents/t.qc.echo/suspend", headers=a)
    assert suspended.status_code == 200, suspended.text  # its runs now wait: they stay open
    held = []
    for _ in range(3):
        answer = submit(http, a)
        assert answer.status_code == 202, answer.text
        held.append(answer.json()["run_id"])
    time.sleep(1.1)  # (another second: the per-second quota is not what refuses it)
    refused = submit(http, a)
    assert refused.status_code == 429 and "api.tenant_max_open_runs" in refused.text
    assert refused.headers["Retry-After"] == "2"
    assert submit(http, b, wait_s=20).status_code == 200  # the other tenant is not held up
    assert http.post(f"/v1/runs/{held[0]}/cancel", headers=a).status_code == 200
    again = submit(http, a)
    assert again.status_code == 202, again.text  # the cancelled run no longer counts


def test_agents_are_capped_per_tenant(served: Any) -> None:
    _, http = served
    a = bearer(made(http, "qe", ["read", "run"])["token"])
    b = bearer(made(http, "qf", ["read", "run"])["token"])
    first = http.post("/v1/sessions", json={}, headers=a)  # its starter and its session: 2 agents
    assert first.status_code == 201, first.text
    assert submit(http, a, wait_s=20).status_code == 200  # its echo: 3
    over = http.post("/v1/sessions", json={}, headers=a)
    assert over.status_code == 429 and "api.tenant_max_agents" in over.text
    # nor through its starter directly: the replica refuses the new agent, and the run says why
    direct = submit(http, a, agent="session", input={}, wait_s=20)
    assert direct.status_code == 200 and direct.json()["status"] == "failed", direct.text
    assert "api.tenant_max_agents" in direct.json()["error"]
    agents = [x["agent_id"] for x in http.get("/v1/agents", headers=a).json()]
    assert len(agents) == 3 and all(x.startswith("t.qe.") for x in agents)
    assert http.delete(f"/v1/sessions/{first.json()['session_id']}", headers=a).status_code == 204
    assert http.post("/v1/sessions", json={}, headers=a).status_code == 201  # room again
    assert http.post("/v1/sessions", json={}, headers=b).status_code == 201  # another tenant's own count
    assert http.post("/v1/sessions", json={}, headers=HOME).status_code == 201
