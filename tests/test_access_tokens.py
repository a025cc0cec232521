"""Scoped API tokens and the audit trail (issue 39, deliverables 2 and 4): tokens with verbs and
agents, created, listed and revoked by an admin, refused within a second of their revocation
(also by another API process on the same Redis) or after their expiry; every route needs a verb
(a new state-changing route is admin-only until listed); a token given some agents sees only
those; every state-changing call is in the audit trail, refused ones included. In-process API
(ASGI) on a real redis-server, agents hosted by a ReplicaHost with the scripted engine."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.routing import Mount

from colony.api.access import ROUTE_VERBS, verb_of
from colony.api.app import ApiServices, create_app
from colony.blackboard import Blackboard
from colony.blackboard.access_keys import AccessProtocol
from colony.config import ApiSettings, ColonySettings
from colony.inference.scripted import ScriptedEngine
from colony.system import access_tokens
from colony.system.builtin import ask_blueprint, echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.runs import RunService

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def api(bb: Blackboard, redis_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"acc{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "replica-a", engine=ScriptedEngine(["The answer is forty two."]))
    await host.start(bb)
    await host.ensure_agent(echo_blueprint())
    await host.ensure_agent(ask_blueprint())
    assert host.registry is not None
    runs = RunService(bb, host.registry, settings=settings)

    def app() -> Any:  # one more API process on the same Redis (its own token cache)
        return create_app(ApiServices(runs=runs, registry=host.registry, token=TOKEN), api=ApiSettings())

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app()), base_url="http://colony"
    ) as client:
        client.another_app = app  # type: ignore[attr-defined]
        yield client, settings
    await host.close()


async def make(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    answer = await client.post("/v1/tokens", json=body, headers=AUTH)
    assert answer.status_code == 201, answer.text
    return answer.json()


async def audit(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    for _ in range(50):  # appended in the background once the answer started: give it a moment
        await asyncio.sleep(0.02)
        entries = (await client.get("/v1/audit", params=params, headers=AUTH)).json()["entries"]
        if entries:
            return entries
    return []


def test_every_state_changing_route_names_its_verb_and_the_table_names_only_routes() -> None:
    app = create_app(ApiServices(runs=None, registry=None, token=TOKEN))  # type: ignore[arg-type]
    routes = {
        (method, route.path)
        for route in app.router.routes
        for method in getattr(route, "methods", ()) or ()
        if route.path.startswith(("/v1/", "/openai/"))
    }
    # a mounted app (the MCP server at /mcp) answers every method under its path
    routes |= {(m, r.path) for r in app.router.routes if isinstance(r, Mount) for m in ("POST", "DELETE")}
    unlisted = sorted(r for r in routes if r[0] not in ("GET", "HEAD") and r not in ROUTE_VERBS)
    assert not unlisted, f"routes with no verb in colony.api.access.ROUTE_VERBS: {unlisted}"
    assert set(ROUTE_VERBS) <= routes, sorted(set(ROUTE_VERBS) - routes)
    assert verb_of("POST", "/v1/something/new") == "admin"  # a route missing from the table
    assert (
        verb_of("HEAD", "/v1/agents") == "read" and verb_of("GET", "/v1/agents/{agent_id}/export") == "admin"
    )


async def test_a_read_token_reads_and_is_refused_the_rest_until_revoked(api) -> None:
    client, _ = api
    made = await make(client, verbs=["read"], note="dashboards")
    assert made["token"].startswith("ct-") and made["verbs"] == ["read"] and made["agents"] is None
    token = bearer(made["token"])
    assert (await client.get("/v1/agents", headers=token)).status_code == 200
    me = (await client.get("/v1/token", headers=token)).json()
    assert me == {
        "token_id": made["id"],
        "tenant": "default",
        "verbs": ["read"],
        "agents": None,
        "expires_at": None,
        "prefix": "",
    }
    refused = await client.post("/v1/runs", json={"agent": "echo", "input": "x"}, headers=token)
    assert refused.status_code == 403 and "may not run" in refused.json()["error"]["message"]
    for method, path in (("GET", "/v1/tokens"), ("GET", "/v1/audit"), ("GET", "/v1/agents/echo/export")):
        assert (await client.request(method, path, headers=token)).status_code == 403, path
    listed = (await client.get("/v1/tokens", headers=AUTH)).json()
    assert [t["id"] for t in listed] == [made["id"]] and listed[0]["note"] == "dashboards"
    assert "digest" not in listed[0] and "token" not in listed[0]  # the secret is shown once
    assert (await client.delete(f"/v1/tokens/{made['id']}", headers=AUTH)).status_code == 204
    assert (await client.get("/v1/agents", headers=token)).status_code == 401  # this process: at once
    assert (await client.delete(f"/v1/tokens/{made['id']}", headers=AUTH)).status_code == 404


async def test_revocation_reaches_another_api_process_within_a_second(api) -> None:
    client, _ = api
    made = await make(client, verbs=["read", "run"])
    token = bearer(made["token"])
    other = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=client.another_app()), base_url="http://other"
    )
    async with other:
        assert (await other.get("/v1/agents", headers=token)).status_code == 200  # cached there now
        assert (await client.delete(f"/v1/tokens/{made['id']}", headers=AUTH)).status_code == 204
        revoked_at = time.monotonic()
        for _ in range(100):
            if (await other.get("/v1/agents", headers=token)).status_code != 200:
                break
            await asyncio.sleep(0.05)
        assert (await other.get("/v1/agents", headers=token)).status_code == 401
        assert time.monotonic() - revoked_at <= access_tokens.CACHE_SECONDS + 0.3


async def test_an_expired_a_forged_and_a_spoilt_token_are_refused(api, bb: Blackboard) -> None:
    client, settings = api
    made = await make(client, verbs=["read"], ttl_seconds=1)
    assert made["expires_at"] == pytest.approx(made["created_at"] + 1)
    assert (await client.get("/v1/agents", headers=bearer(made["token"]))).status_code == 200
    await asyncio.sleep(1.2)
    assert (await client.get("/v1/agents", headers=bearer(made["token"]))).status_code == 401
    good = await make(client, verbs=["read", "run", "write", "admin"])
    forged = good["token"][:-4] + ("AAAA" if not good["token"].endswith("AAAA") else "BBBB")
    for presented in (forged, "ct-", "ct-" + "0" * 16 + "-" + "x" * 43, good["token"] + "x", "ct-../../x"):
        assert (await client.get("/v1/agents", headers=bearer(presented))).status_code == 401, presented
    # a record in Redis that does not validate (a tenant no id could carry, a verb) is no token
    board = bb.scoped(AccessProtocol.scope("default", settings.colony_id))
    key = AccessProtocol.token_key(good["id"])
    held = (await board.read(key)).value
    await board.write(key, {**held, "tenant": "../someone-else"})
    await asyncio.sleep(access_tokens.CACHE_SECONDS + 0.1)
    assert (await client.get("/v1/agents", headers=bearer(good["token"]))).status_code == 401
    await board.write(key, {**held, "verbs": ["everything"]})
    await asyncio.sleep(access_tokens.CACHE_SECONDS + 0.1)
    assert (await client.get("/v1/agents", headers=bearer(good["token"]))).status_code == 401
    for body in (
        {"verbs": []},
        {"verbs": ["root"]},
        {"verbs": ["read"], "ttl_seconds": 0},
        {"verbs": ["read"], "x": 1},
        {"verbs": ["read"], "agents": ["../evil"]},
    ):
        assert (await client.post("/v1/tokens", json=body, headers=AUTH)).status_code == 422, body


async def test_a_token_given_some_agents_sees_and_acts_on_those_only(api) -> None:
    client, _ = api
    made = await make(client, verbs=["read", "run", "write"], agents=["echo"])
    token = bearer(made["token"])
    assert [a["agent_id"] for a in (await client.get("/v1/agents", headers=token)).json()] == ["echo"]
    assert (await client.get("/v1/agents/ask", headers=token)).status_code == 404  # as no such agent
    assert (await client.get("/v1/agents/echo", headers=token)).status_code == 200
    assert (
        await client.post("/v1/runs", json={"agent": "ask", "input": "x"}, headers=token)
    ).status_code == 404
    mine = await client.post("/v1/runs", json={"agent": "echo", "input": "x", "wait_s": 10}, headers=token)
    assert mine.status_code in (200, 202), mine.text
    theirs = (await client.post("/v1/runs", json={"agent": "ask", "input": "y"}, headers=AUTH)).json()[
        "run_id"
    ]
    for path in (f"/v1/runs/{theirs}", f"/v1/runs/{theirs}/tree", f"/v1/runs/{theirs}/events"):
        assert (await client.get(path, headers=token)).status_code == 404, path
    assert (await client.post(f"/v1/runs/{theirs}/cancel", headers=token)).status_code == 404
    assert (await client.get("/v1/runs", params={"agent": "ask"}, headers=token)).status_code == 404
    assert (await client.get(f"/v1/runs/{mine.json()['run_id']}", headers=token)).status_code == 200
    colony_wide = await client.post("/v1/colony/blocks", json={"label": "x", "content": "y"}, headers=token)
    assert colony_wide.status_code == 403 and "only on its agents" in colony_wide.json()["error"]["message"]
    assert (await client.post("/v1/sessions", json={}, headers=token)).status_code == 403


async def test_every_state_changing_call_is_in_the_audit_trail(api) -> None:
    client, _ = api
    runner = await make(client, verbs=["read", "run"])
    await client.get("/v1/agents", headers=AUTH)  # a read: not audited
    await client.post("/v1/runs", json={"agent": "echo", "input": "a"}, headers=bearer(runner["token"]))
    await client.post(
        "/v1/agents/echo/blocks", json={"label": "n", "content": "x"}, headers=bearer(runner["token"])
    )
    await client.post("/v1/colony/blocks", json={"label": "team", "content": "x"}, headers=AUTH)
    entries = []
    for _ in range(50):
        entries = await audit(client)
        if len(entries) >= 4:
            break
    calls = [(e["token"], e["method"], e["route"], e["status"]) for e in entries]
    assert calls[:3] == [
        ("api", "POST", "/v1/colony/blocks", 201),
        (runner["id"], "POST", "/v1/runs", 202),
        ("api", "POST", "/v1/tokens", 201),
    ]
    refused = await audit(client, refused="true")  # refused calls: audited too, in a stream apart
    assert [(e["token"], e["route"], e["status"], e["ids"]) for e in refused] == [
        (runner["id"], "/v1/agents/{agent_id}/blocks", 403, {"agent_id": "echo"})
    ]
    assert entries[0]["at"] <= time.time()
    older = (await client.get("/v1/audit", params={"limit": 2}, headers=AUTH)).json()
    assert len(older["entries"]) == 2 and older["next_before"] == older["entries"][-1]["id"]
    rest = (await client.get("/v1/audit", params={"before": older["next_before"]}, headers=AUTH)).json()
    assert [e["id"] for e in rest["entries"]] == [e["id"] for e in entries[2:]]
    assert (await client.get("/v1/audit", params={"before": "0-0"}, headers=AUTH)).json()["entries"] == []
    assert (await client.get("/v1/audit", params={"before": "x"}, headers=AUTH)).status_code == 422


async def test_an_idempotency_key_belongs_to_the_token_that_sent_it(api) -> None:
    client, _ = api
    one = await make(client, verbs=["read", "run"])
    other = await make(client, verbs=["read", "run"])
    body = {"agent": "echo", "input": "same"}
    key = {"Idempotency-Key": "shared-key-0001"}
    first = await client.post("/v1/runs", json=body, headers={**bearer(one["token"]), **key})
    again = await client.post("/v1/runs", json=body, headers={**bearer(one["token"]), **key})
    theirs = await client.post("/v1/runs", json=body, headers={**bearer(other["token"]), **key})
    assert first.status_code == again.status_code == theirs.status_code == 202
    assert again.headers.get("idempotent-replayed") == "true" and again.json() == first.json()
    assert "idempotent-replayed" not in theirs.headers and theirs.json()["run_id"] != first.json()["run_id"]
    admins = await client.post("/v1/runs", json=body, headers={**AUTH, **key})  # the API token's own key
    assert "idempotent-replayed" not in admins.headers and admins.json()["run_id"] not in {
        first.json()["run_id"],
        theirs.json()["run_id"],
    }


async def test_a_crashed_call_is_audited_and_refusals_are_kept_apart(
    api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from colony.memory.blocks import BlockStore

    client, _ = api
    reader = await make(client, verbs=["read"])

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(BlockStore, "create_colony_block", broken)
    transport = httpx.ASGITransport(app=client.another_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://other") as other:
        crash = await other.post("/v1/colony/blocks", json={"label": "c", "content": "x"}, headers=AUTH)
    assert crash.status_code == 500
    for _ in range(3):  # refused: kept apart, cannot push the accepted calls out
        await client.post(
            "/v1/colony/blocks", json={"label": "r", "content": "x"}, headers=bearer(reader["token"])
        )
    entries = await audit(client)
    assert [(e["route"], e["status"]) for e in entries[:2]] == [
        ("/v1/colony/blocks", 500),
        ("/v1/tokens", 201),
    ]
    refused = await audit(client, refused="true")
    assert [(e["token"], e["status"]) for e in refused] == [(reader["id"], 403)] * 3
    huge = await client.get("/v1/audit", params={"before": "99999999999999999999-0"}, headers=AUTH)
    assert huge.status_code == 422


async def test_a_token_given_some_agents_sees_no_one_elses_tokens_catalog_or_runs(api) -> None:
    client, _ = api
    admin_of_echo = await make(client, verbs=["admin"], agents=["echo"])
    token = bearer(admin_of_echo["token"])
    for path in ("/v1/tokens", "/v1/audit"):
        assert (await client.get(path, headers=token)).status_code == 403, path
    assert (await client.post("/v1/tokens", json={"verbs": ["admin"]}, headers=token)).status_code == 403
    assert [c["name"] for c in (await client.get("/v1/agents/catalog", headers=token)).json()] == ["echo"]
    assert (await client.get("/v1/agents/echo", headers=token)).status_code == 200  # admin holds read
    assert (
        await client.post("/v1/tokens", json={"verbs": ["read"], "agents": []}, headers=AUTH)
    ).status_code == 422


async def test_a_run_tree_shows_other_agents_runs_blanked() -> None:
    from colony.system.run_tree import HIDDEN, RunNode, hide_others

    child = RunNode(
        agent="ask", request_id="run-b", status="failed", error="secret", replica="r1", pages=["p"]
    )
    root = RunNode(agent="echo", request_id="run-a", status="succeeded", children=[child])
    hide_others(root, {"echo"}.__contains__)
    assert (root.agent, root.request_id) == ("echo", "run-a")
    assert (child.agent, child.request_id, child.error, child.replica, child.pages, child.status) == (
        HIDDEN,
        HIDDEN,
        None,
        None,
        [],
        "failed",
    )
