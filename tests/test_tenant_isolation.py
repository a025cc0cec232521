"""Tenants on one colony (issue 39, deliverable 1, and its isolation acceptance): two tenants, each
with a read token, a run token and an admin token made by the colony's operator, each running its
own instance of the catalog's agents, a session, memory, blocks, a shared scope, a colony block and
a mapped folder. Then every route of the app is tried with one tenant's tokens and the other
tenant's ids: 403 or 404 (or a listing of its own), and nothing of the other tenant in any body;
a token lacking the verb gets 403 on every route that needs it; each tenant's audit trail holds its
own writes only; the colony's own (home) token sees no tenant's agents.

The API is served on a loopback port over a real redis-server, with a ReplicaHost (scripted
engine) and an in-process control plane that places each tenant's instances."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tenant_kit import HOME, TenantApp, bearer, made

from colony.api.access import verb_of
from colony.blackboard.redis_server import RedisServerInfo
from colony.wire.tenants import owned_id, tenant_of

TENANTS = ("ta", "tb")


def populate(http: httpx.Client, tenant: str, folder: Path) -> dict[str, Any]:
    """Everything a tenant owns, made with its own tokens; its ids and a secret in every text."""
    secret = f"secret-of-{tenant}-{uuid.uuid4().hex[:6]}"
    tokens = {
        "read": made(http, tenant, ["read"]),
        "run": made(http, tenant, ["read", "run", "write"]),
        "admin": made(http, tenant, ["admin"]),
    }
    run_h, admin_h = bearer(tokens["run"]["token"]), bearer(tokens["admin"]["token"])
    ran = http.post("/v1/runs", json={"agent": "echo", "input": secret, "wait_s": 30}, headers=run_h)
    assert ran.status_code == 200, ran.text
    assert ran.json()["agent"] == f"t.{tenant}.echo" and ran.json()["output"] == secret
    (folder / "notes.txt").write_text(f"{secret}\n" * 20)
    mapped = http.post("/v1/vcm/sources", json={"path": str(folder), "page_tokens": 64}, headers=run_h)
    assert mapped.status_code == 200, mapped.text
    pages = [p["page_id"] for p in mapped.json()["pages"]]
    started = http.post("/v1/sessions", json={}, headers=run_h)
    assert started.status_code == 201, started.text
    session = started.json()["session_id"]
    assert session.startswith(f"t.{tenant}.session-")
    turn = http.post(f"/v1/sessions/{session}/messages", json={"message": f"hello {secret}"}, headers=run_h)
    assert turn.status_code == 200 and "a scripted reply" in turn.text
    echo = f"t.{tenant}.echo"
    block = http.post(f"/v1/agents/{echo}/blocks", json={"label": "notes", "content": secret}, headers=run_h)
    assert block.status_code == 201, block.text
    wrote = http.post(
        f"/v1/agents/{session}/memory",
        json={"scope": "working", "content": f"remember {secret}"},
        headers=run_h,
    )
    assert wrote.status_code == 201, wrote.text
    scope = http.put(f"/v1/memory/shared/collective:{tenant}-team", json={"readers": ["*"]}, headers=run_h)
    assert scope.status_code == 201, scope.text
    entry = http.post(
        f"/v1/memory/shared/collective:{tenant}-team/entries",
        json={"content": f"shared {secret}"},
        headers=run_h,
    )
    assert entry.status_code == 201, entry.text
    colony_block = http.post(
        "/v1/colony/blocks", json={"label": f"rules_{tenant}", "content": secret}, headers=run_h
    )
    assert colony_block.status_code == 201, colony_block.text
    shared = http.post(
        "/v1/blocks/share",
        json={"owner": echo, "label": "notes", "agent_id": session, "access": "read_only"},
        headers=admin_h,
    )
    assert shared.status_code == 200, shared.text
    return {
        "tenant": tenant,
        "secret": secret,
        "tokens": tokens,
        "echo": echo,
        "session": session,
        "run": ran.json()["run_id"],
        "pages": pages,
        "message": None,
    }


@pytest.fixture(scope="module")
def colony(
    redis_server: RedisServerInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TenantApp, dict[str, Any]]]:
    folders = {t: tmp_path_factory.mktemp(f"folder-{t}") for t in TENANTS}
    with (
        TenantApp(redis_server.url, list(folders.values())) as served,
        httpx.Client(base_url=served.url, timeout=60) as http,
    ):
        yield served, {t: populate(http, t, folders[t]) for t in TENANTS}


def fill(template: str, other: dict[str, Any]) -> str:
    """The route's path with the other tenant's ids in every parameter."""
    values = {
        "agent_id": other["echo"],
        "session_id": other["session"],
        "run_id": other["run"],
        "label": "notes",
        "name": f"collective:{other['tenant']}-team",
        "token_id": other["tokens"]["read"]["id"],
        "step": "1",
        "version": "1",
        "message_id": "msg-000000000000",
    }
    return re.sub(r"{(\w+)}", lambda m: values.get(m.group(1), "x"), template)


def bodies(other: dict[str, Any], mine: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """Bodies that name the other tenant's ids where a route reads ids from its body."""
    return {
        ("POST", "/v1/runs"): {"agent": other["echo"], "input": "x", "pages": other["pages"][:1]},
        ("POST", "/v1/blocks/share"): {
            "owner": other["echo"],
            "label": "notes",
            "agent_id": mine["echo"],
            "access": "read_only",
        },
        ("DELETE", "/v1/blocks/share"): {
            "owner": other["echo"],
            "label": "notes",
            "agent_id": other["session"],
        },
        ("POST", "/v1/sessions"): {"pages": other["pages"][:1]},
        ("POST", "/openai/v1/chat/completions"): {
            "model": other["echo"],
            "messages": [{"role": "user", "content": "x"}],
        },
    }


def routes(served: TenantApp) -> list[tuple[str, str]]:
    return sorted(
        (method, route.path)
        for route in served.app.routes
        for method in (getattr(route, "methods", None) or ())
        if route.path.startswith(("/v1/", "/openai/")) and method != "HEAD"
    )


def leaks(text: str, other: dict[str, Any], sent: str = "") -> list[str]:
    """What of the other tenant a body shows that the request did not send itself (its secret,
    its agents, runs, pages and token ids; an error may repeat an id it was given)."""
    marks = [other["secret"], other["echo"], other["session"], other["run"], *other["pages"]]
    marks += [t["id"] for t in other["tokens"].values()]
    return [m for m in marks if m in text and m not in sent]


def test_every_route_with_the_other_tenants_ids_is_refused_and_shows_nothing(colony: Any) -> None:
    served, tenants = colony
    with httpx.Client(base_url=served.url, timeout=60) as http:
        for me, other in (("ta", "tb"), ("tb", "ta")):
            mine, theirs = tenants[me], tenants[other]
            body_of = bodies(theirs, mine)
            for kind in ("read", "run", "admin"):
                headers = bearer(mine["tokens"][kind]["token"])
                for method, template in routes(served):
                    if template.endswith("/events") or template == "/v1/runs/{run_id}/events":
                        continue  # (an event stream: tried below with a bounded read)
                    path = fill(template, theirs)
                    params = {"agent": theirs["echo"]} if template == "/v1/runs" and method == "GET" else None
                    answer = http.request(
                        method, path, json=body_of.get((method, template)), params=params, headers=headers
                    )
                    where = (
                        f"{kind} token of {me}: {method} {path} -> {answer.status_code} {answer.text[:200]}"
                    )
                    sent = f"{path} {json.dumps(body_of.get((method, template)))} {params}"
                    if template == "/v1/audit":  # its own calls, with the ids it sent: checked below
                        sent += json.dumps(answer.json())
                    assert not leaks(answer.text, theirs, sent), where
                    if "{" in template or (method, template) in body_of or template == "/v1/runs":
                        assert answer.status_code in (403, 404, 422), where


def test_an_event_stream_of_the_other_tenants_run_is_a_404(colony: Any) -> None:
    served, tenants = colony
    with httpx.Client(base_url=served.url, timeout=10) as http:
        answer = http.get(
            f"/v1/runs/{tenants['tb']['run']}/events",
            headers=bearer(tenants["ta"]["tokens"]["read"]["token"]),
        )
        assert answer.status_code == 404 and tenants["tb"]["secret"] not in answer.text


def test_a_token_lacking_the_verb_is_refused_on_every_route_that_needs_it(colony: Any) -> None:
    served, tenants = colony
    mine = tenants["ta"]
    with httpx.Client(base_url=served.url, timeout=60) as http:
        for kind, holds in (("read", {"read"}), ("run", {"read", "run", "write"})):
            headers = bearer(mine["tokens"][kind]["token"])
            for method, template in routes(served):
                verb = verb_of(method, template)
                if verb == "any" or verb in holds:
                    continue
                answer = http.request(method, fill(template, mine), json={}, headers=headers)
                assert answer.status_code == 403, f"{kind}: {method} {template} -> {answer.status_code}"
                assert mine["secret"] not in answer.text


def test_each_tenant_sees_its_own_and_the_home_token_sees_neither(colony: Any) -> None:
    served, tenants = colony
    with httpx.Client(base_url=served.url, timeout=60) as http:
        for tenant, other in (("ta", "tb"), ("tb", "ta")):
            mine, theirs = tenants[tenant], tenants[other]
            headers = bearer(mine["tokens"]["read"]["token"])
            agents = {a["agent_id"] for a in http.get("/v1/agents", headers=headers).json()}
            assert {mine["echo"], mine["session"]} <= agents
            assert all(tenant_of(a, "default") == tenant for a in agents)
            pages = {p["page_id"] for p in http.get("/v1/vcm/pages", headers=headers).json()}
            assert pages == set(mine["pages"])
            scopes = http.get("/v1/memory/shared", headers=headers).json()["scopes"]
            assert [s["name"] for s in scopes] == [f"collective:{tenant}-team"]
            blocks = http.get("/v1/colony/blocks", headers=headers).json()
            assert [b["label"] for b in blocks] == [f"rules_{tenant}"]
            recalled = http.post(
                f"/v1/memory/shared/collective:{tenant}-team/query", json={"query": "shared"}, headers=headers
            )
            assert mine["secret"] in recalled.text and theirs["secret"] not in recalled.text
            me = http.get("/v1/token", headers=headers).json()
            assert me["tenant"] == tenant and me["prefix"] == f"t.{tenant}."
            listed = http.get("/v1/tokens", headers=bearer(mine["tokens"]["admin"]["token"])).json()
            assert {t["id"] for t in listed} == {t["id"] for t in mine["tokens"].values()}
            replicas = http.get("/v1/replicas", headers=headers).json()
            assert [set(r) for r in replicas] == [
                {"replica_id", "engine", "agent_ids", "max_agents", "updated_at", "agents"}
            ]
            assert set(replicas[0]["agent_ids"]) == agents and replicas[0]["agents"] == len(agents)
        home = {a["agent_id"] for a in http.get("/v1/agents", headers=HOME).json()}
        assert "echo" in home and not any(a.startswith("t.") for a in home)
        for tenant in TENANTS:
            assert http.get(f"/v1/agents/{tenants[tenant]['echo']}", headers=HOME).status_code == 404
            assert http.get(f"/v1/runs/{tenants[tenant]['run']}", headers=HOME).status_code == 404
        # a tenant's token cannot make a token of another tenant; the operator can
        other = http.post(
            "/v1/tokens",
            json={"tenant": "tb", "verbs": ["read"]},
            headers=bearer(tenants["ta"]["tokens"]["admin"]["token"]),
        )
        assert other.status_code == 422 and "own tenant" in other.text
        # ids of another tenant are never made: not by a body, not by a name with its prefix
        named = http.post(
            "/v1/runs",
            json={"agent": "t.tb.echo", "input": 1},
            headers=bearer(tenants["ta"]["tokens"]["run"]["token"]),
        )
        assert named.status_code == 404


def test_each_tenants_audit_trail_holds_its_own_writes(colony: Any) -> None:
    served, tenants = colony
    with httpx.Client(base_url=served.url, timeout=60) as http:
        for tenant, other in (("ta", "tb"), ("tb", "ta")):
            mine, theirs = tenants[tenant], tenants[other]
            deadline = time.monotonic() + 5
            while True:
                trail = http.get(
                    "/v1/audit", params={"limit": 1000}, headers=bearer(mine["tokens"]["admin"]["token"])
                )
                entries = trail.json()["entries"]
                routes_seen = {(e["method"], e["route"]) for e in entries}
                if ("POST", "/v1/blocks/share") in routes_seen or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert trail.json()["tenant"] == tenant
            wanted = {
                ("POST", "/v1/runs"),
                ("POST", "/v1/vcm/sources"),
                ("POST", "/v1/sessions"),
                ("POST", "/v1/sessions/{session_id}/messages"),
                ("POST", "/v1/agents/{agent_id}/blocks"),
                ("POST", "/v1/agents/{agent_id}/memory"),
                ("PUT", "/v1/memory/shared/{name}"),
                ("POST", "/v1/memory/shared/{name}/entries"),
                ("POST", "/v1/colony/blocks"),
                ("POST", "/v1/blocks/share"),
            }
            assert wanted <= routes_seen, wanted - routes_seen
            tokens = {e["token"] for e in entries}
            assert tokens <= {t["id"] for t in mine["tokens"].values()}
            assert not tokens & {t["id"] for t in theirs["tokens"].values()}


def test_tenant_ids_are_scoped_and_the_home_tenant_cannot_make_one() -> None:
    assert tenant_of("t.acme.echo", "default") == "acme" and tenant_of("echo", "default") == "default"
    assert tenant_of("t.Acme.echo", "default") != "acme" and tenant_of("t.acme", "default") != "acme"
    assert owned_id("acme", "default", "echo") == "t.acme.echo"
    assert owned_id("acme", "default", "t.acme.echo") == "t.acme.echo"
    assert owned_id("acme", "default", "t.other.echo") == "t.other.echo"  # another's: 404 where named
    with pytest.raises(ValueError):
        owned_id("acme", "default", "x" * 125)


async def test_a_tenants_claims_on_folders_hold_their_bound_when_sent_together(bb: Any) -> None:
    """Found by review: the count was checked, then the source added, in two steps."""
    import asyncio
    import uuid

    from colony.api.tenant_pages import claimed

    key = f"test:sources:{uuid.uuid4().hex}"
    outcomes = await asyncio.gather(*(claimed(bb.redis, key, f"src-{n}", 5) for n in range(20)))
    assert sum(outcomes) == 5 and await bb.redis.scard(key) == 5
    held = sorted(m.decode() if isinstance(m, bytes) else m for m in await bb.redis.smembers(key))
    assert await claimed(bb.redis, key, held[0], 5)  # a claim it holds is kept, at the bound too
    await bb.redis.delete(key)
