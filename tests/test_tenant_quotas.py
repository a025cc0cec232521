"""Quotas of the tenants other than the colony's own (issue 39, deliverable 3): runs per second,
runs submitted and not yet ended, and agents; each answered 429 with Retry-After before anything
is written, counted per tenant (one tenant at its quota leaves the other's calls alone) and never
applied to the colony's own tenant. A colony served on a loopback port over a real redis-server
(tests/tenant_kit.py)."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tenant_kit import HOME, TenantApp, bearer, made

from colony import metrics
from colony.blackboard.redis_server import RedisServerInfo
from colony.system import tenant_quota


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
    # within that second the rest of its submits are refused at the door; its other calls are not
    admitted = next(r.json()["run_id"] for r in answers if r.status_code == 202)
    assert http.post(f"/v1/runs/{admitted}/cancel", headers=a).status_code == 200
    assert http.get(f"/v1/runs/{admitted}", headers=a).status_code == 200
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


def test_agents_made_together_never_pass_the_cap(served: Any) -> None:
    """Found by review: each making counted the registry before any was made, so first runs of six
    catalog agents sent together gave a tenant capped at three six agents, and sessions started
    together past the cap were answered 503 instead of 429."""
    _, http = served
    a = bearer(made(http, "qr", ["read", "run"])["token"])
    names = ["echo", "ask", "analyze", "assistant", "research", "session"]
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        answers = list(pool.map(lambda n: submit(http, a, agent=n, input={}), names))
    assert sorted(r.status_code for r in answers) == [202] * 3 + [429] * 3, [r.text for r in answers]
    assert len(http.get("/v1/agents", headers=a).json()) == 3
    b = bearer(made(http, "qs", ["read", "run"])["token"])
    assert http.post("/v1/sessions", json={}, headers=b).status_code == 201  # its starter and session: 2
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        starts = list(pool.map(lambda _: http.post("/v1/sessions", json={}, headers=b), range(6)))
    codes = sorted(r.status_code for r in starts)
    assert codes == [201] + [429] * 5, [r.text[:200] for r in starts]
    # (refused for its agents, or for its runs a second: the fixture allows 4)
    assert all(r.json()["error"]["code"] == "quota_exceeded" for r in starts if r.status_code == 429)
    assert len(http.get("/v1/agents", headers=b).json()) == 3


def test_redis_bytes_are_weighed_per_tenant_and_deleting_makes_room(
    redis_server: RedisServerInfo, tmp_path: Any
) -> None:
    """A tenant over `api.tenant_max_redis_bytes` (weighed with MEMORY USAGE over its keys, at most
    every `tenant_usage_refresh_seconds`) is refused new runs and writes (429); reads and deletes
    pass; the other tenant's writes are not refused, and neither are the colony's own."""
    limits = {"tenant_max_redis_bytes": 1 << 20, "tenant_usage_refresh_seconds": 1.0}
    with (
        TenantApp(redis_server.url, [tmp_path], **limits) as app,
        httpx.Client(base_url=app.url, timeout=60) as http,
    ):
        a = bearer(made(http, "qg", ["read", "run", "write"])["token"])
        b = bearer(made(http, "qh", ["read", "run", "write"])["token"])
        session = http.post("/v1/sessions", json={}, headers=a).json()["session_id"]
        text = "x" * 60_000
        written = 0
        for n in range(100):
            answer = http.post(
                f"/v1/agents/{session}/memory",
                json={"scope": "working", "content": f"entry {n}", "data": text},
                headers=a,
            )
            if answer.status_code == 429:
                break
            assert answer.status_code == 201, answer.text
            written += 1
            time.sleep(0.1)
        # refused within a refresh of passing 1 MiB (an entry weighs its data and more: indexes, embedding)
        assert 3 <= written < 100, written
        assert answer.json()["error"]["code"] == "quota_exceeded"
        assert "api.tenant_max_redis_bytes" in answer.text and answer.headers["Retry-After"] == "1"
        assert submit(http, a, input="z" * 20_000).status_code == 429  # a run is a write too
        assert http.get(f"/v1/agents/{session}/memory", headers=a).status_code == 200  # reads pass
        assert http.post("/v1/sessions", json={}, headers=b).status_code == 201  # the other's are its own
        assert submit(http, HOME).status_code == 202  # the colony's own: no such quota
        assert http.delete(f"/v1/sessions/{session}", headers=a).status_code == 204  # deleting passes
        time.sleep(1.1)
        for _ in range(20):  # room again, once weighed again (in the background: a moment)
            again = submit(http, a, wait_s=20)
            if again.status_code != 429:
                break
            time.sleep(0.2)
        assert again.status_code == 200, again.text


def test_a_tenant_that_spent_its_second_is_refused_at_the_door(served: Any) -> None:
    """Once a tenant spent a second's runs, this API process refuses its next submits of that
    second in the guard (no Redis call, no body read, not audited), each held until its second
    ends (a client retrying at once waits, at most 1 s; at most 16 of a tenant's held at once,
    the rest answered at once); its other calls go on."""
    _, http = served
    a = bearer(made(http, "qy", ["read", "run"])["token"])
    assert submit(http, a, wait_s=20).status_code == 200
    tenant_quota._spent["qy"] = time.monotonic() + 30  # (as if it spent them, for the next 30 s)
    counted = metrics.TENANT_REFUSALS.labels("qy", "runs_per_second")
    before = counted._value.get()
    try:
        for attempt in (lambda: submit(http, a), lambda: http.post("/v1/sessions", json={}, headers=a)):
            began = time.monotonic()
            answer = attempt()
            assert answer.status_code == 429 and answer.headers["Retry-After"] == "1"
            assert "spent this second's runs" in answer.json()["error"]["message"]
            assert 0.9 <= time.monotonic() - began < 5  # held for its second (at most HOLD_SECONDS)
        assert http.get("/v1/agents", headers=a).status_code == 200  # not held: not a submit
        assert http.post("/v1/agents/t.qy.echo/suspend", headers=a).status_code == 200

        def timed(_: int) -> tuple[int, float]:
            began = time.monotonic()
            with httpx.Client(base_url=str(http.base_url), timeout=60) as own:
                return submit(own, a).status_code, time.monotonic() - began

        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(timed, range(24)))
        assert {status for status, _ in answers} == {429}
        assert counted._value.get() - before == 2 + 24  # each refusal counted once, held or not
        took = sorted(took for _, took in answers)
        held = [t for t in took if t >= 0.9]
        assert len(held) >= tenant_quota.MAX_HELD_PER_TENANT and took[0] < 0.9, took  # 16 held, not 24
    finally:
        tenant_quota._spent.pop("qy", None)
    assert submit(http, a).status_code == 202


def test_a_held_submit_is_taken_when_its_tenants_second_ends(served: Any) -> None:
    """A submit held because its tenant spent its second goes on once the second ends: admitted
    (the new second's runs), not refused with a Retry-After that has passed."""
    _, http = served
    a = bearer(made(http, "qh", ["read", "run"])["token"])
    assert submit(http, a, wait_s=20).status_code == 200
    tenant_quota._spent["qh"] = time.monotonic() + 0.5
    counted = metrics.TENANT_REFUSALS.labels("qh", "runs_per_second")
    before = counted._value.get()
    began = time.monotonic()
    held = submit(http, a)
    assert held.status_code == 202, held.text
    assert counted._value.get() == before  # admitted: no refusal counted
    assert 0.4 <= time.monotonic() - began < 5 and "qh" not in tenant_quota._held


def test_concurrent_submits_never_pass_the_open_runs_cap_and_failed_ones_give_their_place_back(
    redis_server: RedisServerInfo, tmp_path: Any
) -> None:
    """Submits racing each other (one slot left, thirty callers) are admitted up to the cap and no
    further: a run admitted but not yet written holds its place; a submit that fails after its
    admission (404: no such agent) gives it back."""
    with (
        TenantApp(redis_server.url, [tmp_path], tenant_runs_per_second=None, tenant_max_open_runs=3) as app,
        httpx.Client(base_url=app.url, timeout=60) as http,
    ):
        a = bearer(made(http, "qk", ["read", "run"])["token"])
        assert submit(http, a, wait_s=20).status_code == 200
        assert http.post("/v1/agents/t.qk.echo/suspend", headers=a).status_code == 200
        for _ in range(5):  # failures after admission: no place kept
            assert submit(http, a, agent="no-such-agent").status_code == 404
        with concurrent.futures.ThreadPoolExecutor(30) as pool:
            answers = list(pool.map(lambda _: submit(http, a).status_code, range(30)))
        assert answers.count(202) == 3 and answers.count(429) == 27, answers


def test_a_body_that_would_pass_the_bytes_quota_and_an_import_over_it_are_refused(
    redis_server: RedisServerInfo, tmp_path: Any
) -> None:
    """Between two weighings what each call adds is counted (its body, times the copies Colony
    keeps of it): a body that would pass the quota is refused at once, and so is an import."""
    limits = {"tenant_max_redis_bytes": 1 << 20, "tenant_usage_refresh_seconds": 60.0}
    with (
        TenantApp(redis_server.url, [tmp_path], **limits) as app,
        httpx.Client(base_url=app.url, timeout=60) as http,
    ):
        a = bearer(made(http, "ql", ["read", "run", "write", "admin"])["token"])
        assert submit(http, a, wait_s=20).status_code == 200
        big = submit(http, a, input="x" * 100_000)  # weighed as the copies a run makes of it: > 1 MiB
        assert big.status_code == 429 and "would add about" in big.text, big.text
        session = http.post("/v1/sessions", json={}, headers=a).json()["session_id"]
        for n in range(3):  # 3 x 60 KB of data (weighed 4 times each): under the quota
            entry = {"scope": "working", "content": f"entry {n}", "data": "y" * 60_000}
            assert http.post(f"/v1/agents/{session}/memory", json=entry, headers=a).status_code == 201
        exported = http.get(f"/v1/agents/{session}/export", headers=a)
        assert exported.status_code == 200 and len(exported.content) > 180_000
        again = http.post(f"/v1/agents/{session}/import?replace=true", content=exported.content, headers=a)
        assert again.status_code == 429 and "api.tenant_max_redis_bytes" in again.text, again.text
