"""Memory blocks over HTTP (`/v1/agents/{id}/blocks*`, `/v1/blocks/share`, `/v1/colony/blocks*`) on
the real API app served by uvicorn over a real redis-server: every route, access levels (403 and no
new version), 404/403 for an agent the block is not shared with, 409 only for a stale base_version,
concurrent appends that all land, 422s naming the field or the reason, history, views, rollback
and undo. One app for the module (its Redis client lives in the app thread's event loop); each test
uses its own agent ids, so tests never see each other's blocks (colony blocks: their own labels)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_kit import BareApi

from colony.api.schemas import MAX_BLOCK_TEXT
from colony.config import ColonySettings

TOKEN = "blocks-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROVISION = {"provision": "true"}  # these tests' agents never run (BlocksApp)
MAX_EDIT = 300  # blocks.max_edit_chars of the app: one edit carries at most this many characters


class BlocksApp(BareApi):
    """The API over a real Redis, served over HTTP (the CLI tests use it too). The agents of these
    tests never run: their blocks and shares are pre-provisioned (`?provision=true`, which an
    unknown agent needs; tests/test_block_known_agents.py)."""

    def __init__(self, redis_url: str, data_dir: Path) -> None:
        settings = ColonySettings(
            redis_url=redis_url,
            data_dir=data_dir,
            colony_id=f"blk{uuid.uuid4().hex[:8]}",
            blocks={"max_edit_chars": MAX_EDIT},
        )
        super().__init__(settings, TOKEN)


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlocksApp]:
    with BlocksApp(redis_server.url, tmp_path_factory.mktemp("blocks-api")) as app:
        yield app


@pytest.fixture
def http(served: BlocksApp) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=60) as client:
        yield client


def names(*roles: str) -> list[str]:
    """Fresh agent ids for one test."""
    tag = uuid.uuid4().hex[:6]
    return [f"{role}-{tag}" for role in roles]


def error_of(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    assert error["message"]
    return error


def create(http: httpx.Client, agent: str, label: str, **fields: Any) -> dict[str, Any]:
    response = http.post(f"/v1/agents/{agent}/blocks", json={"label": label, **fields}, params=PROVISION)
    assert response.status_code == 201, response.text
    return dict(response.json())


def versions_of(http: httpx.Client, agent: str, label: str, **params: Any) -> list[dict[str, Any]]:
    response = http.get(f"/v1/agents/{agent}/blocks/{label}/history", params=params)
    assert response.status_code == 200, response.text
    return list(response.json()["versions"])


def share(http: httpx.Client, owner: str, label: str, agent: str, access: str) -> dict[str, Any]:
    body = {"owner": owner, "label": label, "agent_id": agent, "access": access}
    response = http.post("/v1/blocks/share", json=body, params=PROVISION)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_create_list_read_settings_and_delete(http: httpx.Client) -> None:
    owner, reader = names("owner", "reader")
    info = create(
        http, owner, "persona", block_type="core", description="who I am", content="I help.", char_limit=500
    )
    assert (info["owner"], info["label"], info["block_type"], info["char_limit"]) == (
        owner,
        "persona",
        "core",
        500,
    )
    assert info["created_by"] == owner
    create(http, owner, "notes", content="n1")
    # the label exists in the agent's view: 409, nothing changed
    error_of(http.post(f"/v1/agents/{owner}/blocks", json={"label": "persona"}), 409, "conflict")
    assert http.get(f"/v1/agents/{owner}/blocks/persona").json()["content"] == "I help.\n"

    listed = http.get(f"/v1/agents/{owner}/blocks").json()
    mine = {b["label"]: b for b in listed if not b["colony"]}
    assert set(mine) == {"notes", "persona"}
    assert mine["persona"] == {
        "label": "persona",
        "owner": owner,
        "block_type": "core",
        "description": "who I am",
        "chars": len("I help."),  # the final line break is not counted
        "char_limit": 500,
        "access": "read_write",
        "read_only": False,
        "swapped_out": False,
        "colony": False,
        "updated_at": mine["persona"]["updated_at"],
    }
    view = http.get(f"/v1/agents/{owner}/blocks/persona").json()
    assert (view["content"], view["chars"], view["version"], view["access"], view["head"]) == (
        "I help.\n",
        7,
        1,
        "read_write",
        True,
    )
    assert view["info"]["description"] == "who I am"

    # settings: the owner only; swapping out is for working blocks
    patched = http.patch(f"/v1/agents/{owner}/blocks/notes", json={"swapped_out": True, "description": "d2"})
    assert patched.status_code == 200, patched.text
    assert patched.json()["swapped_out"] is True and patched.json()["description"] == "d2"
    row = next(b for b in http.get(f"/v1/agents/{owner}/blocks").json() if b["label"] == "notes")
    assert row["swapped_out"] is True
    error = error_of(
        http.patch(f"/v1/agents/{owner}/blocks/persona", json={"swapped_out": True}), 422, "invalid_request"
    )
    assert "WORKING" in error["message"]
    share(http, owner, "notes", reader, "read_write")
    error_of(http.patch(f"/v1/agents/{reader}/blocks/notes", json={"description": "mine"}), 403, "forbidden")
    error_of(http.delete(f"/v1/agents/{reader}/blocks/notes"), 403, "forbidden")
    assert http.get(f"/v1/agents/{owner}/blocks/notes").json()["info"]["description"] == "d2"

    assert http.delete(f"/v1/agents/{owner}/blocks/notes").status_code == 204
    error_of(http.get(f"/v1/agents/{owner}/blocks/notes"), 404, "not_found")
    error_of(http.get(f"/v1/agents/{reader}/blocks/notes"), 404, "not_found")  # its grant went too
    error_of(http.delete(f"/v1/agents/{owner}/blocks/notes"), 404, "not_found")
    assert [b["label"] for b in http.get(f"/v1/agents/{owner}/blocks").json() if not b["colony"]] == [
        "persona"
    ]


def test_create_from_a_template(http: httpx.Client) -> None:
    (agent,) = names("templated")
    body = {"label": "human", "template": "human", "fields": {"name": "Ada", "preferences": ["tea"]}}
    info = create(http, agent, body.pop("label"), **body)
    assert (info["block_type"], info["char_limit"], info["template"]) == ("core", 2000, "human")
    assert info["description"].startswith("Stores key details about the person")
    assert http.get(f"/v1/agents/{agent}/blocks/human").json()["content"] == "Name: Ada\nPreferences: tea\n"
    # what the body sets wins over the template's defaults
    info = create(http, agent, "user2", template="human", char_limit=300, description="the other user")
    assert (info["char_limit"], info["description"], info["block_type"]) == (300, "the other user", "core")


def test_three_edits_history_views_and_rollback(http: httpx.Client) -> None:
    (agent,) = names("editor")
    create(http, agent, "human", content="v1 text")
    assert http.post(f"/v1/agents/{agent}/blocks/human/append", json={"text": "line two"}).status_code == 200
    put = http.put(
        f"/v1/agents/{agent}/blocks/human", json={"content": "rewritten", "message": "fresh start"}
    )
    assert put.status_code == 200, put.text
    assert put.json() == {
        "block_id": put.json()["block_id"],
        "label": "human",
        "owner": agent,
        "version": 3,
        "chars": len("rewritten"),  # content is lines; the final break is not counted
        "char_limit": 5000,
        "op": "put",
    }
    assert http.post(f"/v1/agents/{agent}/blocks/human/append", json={"text": "more"}).status_code == 200

    versions = versions_of(http, agent, "human")
    assert [v["version"] for v in versions] == [1, 2, 3, 4]
    assert [v["op"] for v in versions] == ["create", "append", "put", "append"]
    assert all(v["author"] == agent for v in versions)
    assert [v["via"] for v in versions[1:]] == ["http", "http", "http"]
    assert versions[2]["message"] == "fresh start"
    assert [v["version"] for v in versions_of(http, agent, "human", limit=2)] == [3, 4]

    old = http.get(f"/v1/agents/{agent}/blocks/human", params={"version": 1}).json()
    assert (old["content"], old["version"], old["head"]) == ("v1 text\n", 1, False)
    at = http.get(f"/v1/agents/{agent}/blocks/human/versions/1").json()
    assert (at["content"], at["head"]) == ("v1 text\n", False)
    head = http.get(f"/v1/agents/{agent}/blocks/human").json()
    assert (head["content"], head["version"], head["head"]) == ("rewritten\nmore\n", 4, True)
    assert len(versions_of(http, agent, "human")) == 4  # viewing changed nothing
    error = error_of(http.get(f"/v1/agents/{agent}/blocks/human/versions/9"), 404, "not_found")
    assert "version 9" in error["message"]

    rolled = http.post(f"/v1/agents/{agent}/blocks/human/rollback", json={"version": 1})
    assert rolled.status_code == 200 and rolled.json()["version"] == 5 and rolled.json()["op"] == "rollback"
    assert http.get(f"/v1/agents/{agent}/blocks/human").json()["content"] == "v1 text\n"
    versions = versions_of(http, agent, "human")
    assert len(versions) == 5 and versions[-1]["op"] == "rollback" and versions[-1]["author"] == agent


def test_access_levels_are_enforced_and_refusals_add_no_version(http: httpx.Client) -> None:
    owner, reader, adder, stranger = names("owner", "reader", "adder", "stranger")
    create(http, owner, "plan", content="step one\nstep two")
    granted = share(http, owner, "plan", reader, "read_only")
    assert granted["access"] == "read_only" and granted["agent_id"] == reader
    share(http, owner, "plan", adder, "append_only")
    grants = http.get(f"/v1/agents/{owner}/blocks/plan/shares").json()
    assert {(g["agent_id"], g["access"]) for g in grants} == {(reader, "read_only"), (adder, "append_only")}
    error_of(http.get(f"/v1/agents/{reader}/blocks/plan/shares"), 404, "not_found")  # not its own

    # the read-only agent reads, and every change is refused with nothing recorded
    view = http.get(f"/v1/agents/{reader}/blocks/plan").json()
    assert view["access"] == "read_only" and view["info"]["owner"] == owner
    row = next(b for b in http.get(f"/v1/agents/{reader}/blocks").json() if b["label"] == "plan")
    assert (row["owner"], row["access"], row["colony"]) == (owner, "read_only", False)
    before = versions_of(http, owner, "plan")
    error_of(http.put(f"/v1/agents/{reader}/blocks/plan", json={"content": "mine now"}), 403, "forbidden")
    error_of(http.post(f"/v1/agents/{reader}/blocks/plan/append", json={"text": "x"}), 403, "forbidden")
    error_of(http.post(f"/v1/agents/{reader}/blocks/plan/rollback", json={"version": 1}), 403, "forbidden")
    assert versions_of(http, owner, "plan") == before
    assert http.get(f"/v1/agents/{owner}/blocks/plan").json()["content"] == "step one\nstep two\n"

    # append-only: adding is fine (append, or a PUT that only inserts); deleting text is refused
    error = error_of(
        http.put(f"/v1/agents/{adder}/blocks/plan", json={"content": "step one"}), 403, "forbidden"
    )
    assert "append" in error["message"]
    assert len(versions_of(http, owner, "plan")) == len(before)
    added = http.put(f"/v1/agents/{adder}/blocks/plan", json={"content": "step one\nstep two\nstep three"})
    assert added.status_code == 200, added.text
    assert http.post(f"/v1/agents/{adder}/blocks/plan/append", json={"text": "step four"}).status_code == 200
    content = http.get(f"/v1/agents/{owner}/blocks/plan").json()["content"]
    assert content.splitlines() == ["step one", "step two", "step three", "step four"]
    assert [v["author"] for v in versions_of(http, owner, "plan")][-2:] == [adder, adder]

    # an agent the block is not shared with: 404 by label, 403 when naming the owner
    error_of(http.get(f"/v1/agents/{stranger}/blocks/plan"), 404, "not_found")
    error = error_of(
        http.get(f"/v1/agents/{stranger}/blocks/plan", params={"owner": owner}), 403, "forbidden"
    )
    assert stranger in error["message"]
    error_of(
        http.get(f"/v1/agents/{stranger}/blocks/plan/history", params={"owner": owner}), 403, "forbidden"
    )
    assert all(b["label"] != "plan" for b in http.get(f"/v1/agents/{stranger}/blocks").json())

    # unsharing takes the access away
    gone = http.request(
        "DELETE", "/v1/blocks/share", json={"owner": owner, "label": "plan", "agent_id": reader}
    )
    assert gone.status_code == 200 and gone.json() == {"removed": True}
    error_of(http.get(f"/v1/agents/{reader}/blocks/plan"), 404, "not_found")
    again = http.request(
        "DELETE", "/v1/blocks/share", json={"owner": owner, "label": "plan", "agent_id": reader}
    )
    assert again.json() == {"removed": False}
    # sharing a block that does not exist, or with an agent that has its own block of that label
    body = {"owner": owner, "label": "nothing", "agent_id": reader, "access": "read_only"}
    error_of(http.post("/v1/blocks/share", json=body), 404, "not_found")
    create(http, stranger, "plan")
    body = {"owner": owner, "label": "plan", "agent_id": stranger, "access": "read_only"}
    error_of(http.post("/v1/blocks/share", json=body), 409, "conflict")


def test_409_only_for_a_stale_base_version_and_concurrent_appends_all_land(
    served: BlocksApp, http: httpx.Client
) -> None:
    owner, peer = names("owner", "peer")
    create(http, owner, "board", content="start")
    share(http, owner, "board", peer, "read_write")
    ok = http.post(f"/v1/agents/{owner}/blocks/board/append", json={"text": "a", "base_version": 1})
    assert ok.status_code == 200 and ok.json()["version"] == 2
    stale = http.put(f"/v1/agents/{peer}/blocks/board", json={"content": "lost?", "base_version": 1})
    error = error_of(stale, 409, "version_conflict")
    assert error["current_version"] == 2 and "version 2" in error["message"]
    error = error_of(
        http.post(f"/v1/agents/{peer}/blocks/board/append", json={"text": "x", "base_version": 1}),
        409,
        "version_conflict",
    )
    assert error["current_version"] == 2
    assert len(versions_of(http, owner, "board")) == 2  # the refused edits changed nothing
    assert "current_version" not in error_of(http.get(f"/v1/agents/{peer}/blocks/nope"), 404, "not_found")

    async def appends() -> list[int]:
        async with httpx.AsyncClient(base_url=served.url, headers=AUTH, timeout=60) as client:

            async def one(agent: str, n: int) -> int:
                path = f"/v1/agents/{agent}/blocks/board/append"
                return (await client.post(path, json={"text": f"{agent} line {n}"})).status_code

            return await asyncio.gather(*(one(a, n) for n in range(10) for a in (owner, peer)))

    statuses = asyncio.run(appends())
    assert statuses == [200] * 20
    lines = http.get(f"/v1/agents/{owner}/blocks/board").json()["content"].splitlines()
    for agent in (owner, peer):
        assert sorted(x for x in lines if x.startswith(agent)) == sorted(
            f"{agent} line {n}" for n in range(10)
        )
    assert len(versions_of(http, owner, "board")) == 22


def test_refusals_are_422_naming_the_field_or_reason(http: httpx.Client) -> None:
    (agent,) = names("strict")
    create(http, agent, "small", content="0123456789", char_limit=20)
    before = versions_of(http, agent, "small")

    error = error_of(http.get(f"/v1/agents/{agent}/blocks/Bad-Label"), 422, "invalid_request")
    assert "label" in error["message"]
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks", json={"label": "9lives"}), 422, "invalid_request"
    )
    assert "label" in error["message"]
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks", json={"label": "ok", "colour": "red"}), 422, "invalid_request"
    )
    assert "colour" in error["message"]
    error = error_of(http.get("/v1/agents/_operator/blocks"), 422, "invalid_request")
    assert "agent_id" in error["message"]
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks", json={"label": "huge", "char_limit": 999_999}),
        422,
        "invalid_request",
    )
    assert "char_limit" in error["message"]

    # one edit carries at most blocks.max_edit_chars
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks/small/append", json={"text": "x" * (MAX_EDIT + 1)}),
        422,
        "invalid_request",
    )
    assert f"at most {MAX_EDIT}" in error["message"]
    # over the block's char limit: refused with the sizes, nothing changed
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks/small/append", json={"text": "abcdefghijklmnop"}),
        422,
        "invalid_request",
    )
    assert "/20 characters" in error["message"] and "char_limit" in error["message"]
    error = error_of(http.put(f"/v1/agents/{agent}/blocks/small", json={}), 422, "invalid_request")
    assert "content" in error["message"]
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks/small/append", json={"text": "a", "message": "m" * 501}),
        422,
        "invalid_request",
    )
    assert "message" in error["message"]
    error_of(
        http.post(f"/v1/agents/{agent}/blocks/small/rollback", json={"version": 0}), 422, "invalid_request"
    )
    error_of(http.get(f"/v1/agents/{agent}/blocks/small", params={"owner": "a b"}), 422, "invalid_request")
    # text that is not valid Unicode (a lone surrogate) never reaches the store
    lone = json.dumps({"text": "a\ud800b"})
    response = http.post(
        f"/v1/agents/{agent}/blocks/small/append", content=lone, headers={"Content-Type": "application/json"}
    )
    assert "text" in error_of(response, 422, "invalid_request")["message"]
    # the longest text one request carries is below the body limit: a longer one is a 422 naming it
    too_long = http.put(f"/v1/agents/{agent}/blocks/small", json={"content": "x" * (MAX_BLOCK_TEXT + 1)})
    assert "content" in error_of(too_long, 422, "invalid_request")["message"]
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks", json={"label": "who", "template": "nonesuch"}),
        422,
        "invalid_request",
    )
    assert "nonesuch" in error["message"] and "persona" in error["message"]
    body = {"label": "who", "template": "human", "fields": {"name": 7}}
    error = error_of(http.post(f"/v1/agents/{agent}/blocks", json=body), 422, "invalid_request")
    assert "name" in error["message"]
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks", json={"label": "who", "fields": {"name": "x"}}),
        422,
        "invalid_request",
    )
    assert "template" in error["message"]
    error_of(http.get(f"/v1/agents/{agent}/blocks/who"), 404, "not_found")
    assert versions_of(http, agent, "small") == before
    assert http.get(f"/v1/agents/{agent}/blocks/small").json()["content"] == "0123456789\n"

    # every block route needs the token
    with httpx.Client(base_url=http.base_url, timeout=30) as anonymous:
        error_of(anonymous.get(f"/v1/agents/{agent}/blocks"), 401, "unauthorized")
        error_of(anonymous.get("/v1/colony/blocks"), 401, "unauthorized")


def test_undo_removes_the_agents_own_latest_edit_and_keeps_others(http: httpx.Client) -> None:
    alice, bob = names("alice", "bob")
    create(http, alice, "shared", content="base")
    share(http, alice, "shared", bob, "read_write")
    http.post(f"/v1/agents/{alice}/blocks/shared/append", json={"text": "from alice"})
    http.post(f"/v1/agents/{bob}/blocks/shared/append", json={"text": "from bob"})
    undone = http.post(f"/v1/agents/{alice}/blocks/shared/undo", json={})
    assert undone.status_code == 200, undone.text
    assert undone.json()["op"] == "undo" and undone.json()["version"] == 4
    content = http.get(f"/v1/agents/{bob}/blocks/shared").json()["content"]
    assert "from bob" in content and "from alice" not in content and content.startswith("base")
    versions = versions_of(http, alice, "shared")
    assert [(v["author"], v["op"]) for v in versions] == [
        (alice, "create"),
        (alice, "append"),
        (bob, "append"),
        (alice, "undo"),
    ]
    error = error_of(http.post(f"/v1/agents/{alice}/blocks/shared/undo", json={}), 422, "invalid_request")
    assert "undo" in error["message"]
    # bob's undo (no body at all) takes his line out
    assert http.post(f"/v1/agents/{bob}/blocks/shared/undo", params={"owner": alice}).status_code == 200
    assert http.get(f"/v1/agents/{alice}/blocks/shared").json()["content"] == "base\n"


def test_colony_blocks(http: httpx.Client) -> None:
    agent, later = names("member", "newcomer")
    label = f"policy_{uuid.uuid4().hex[:6]}"
    made = http.post(
        "/v1/colony/blocks",
        json={"label": label, "description": "house rules", "content": "be kind", "access": "append_only"},
    )
    assert made.status_code == 201, made.text
    assert made.json()["owner"] == "_colony" and made.json()["colony_access"] == "append_only"
    error_of(http.post("/v1/colony/blocks", json={"label": label}), 409, "conflict")
    rows = [b for b in http.get("/v1/colony/blocks").json() if b["label"] == label]
    assert rows and rows[0]["colony"] is True and rows[0]["access"] == "append_only" and rows[0]["chars"] == 7

    # every agent sees it (one that never had a block too), with the colony's access
    for who in (agent, later):
        row = next(b for b in http.get(f"/v1/agents/{who}/blocks").json() if b["label"] == label)
        assert (row["colony"], row["access"], row["owner"]) == (True, "append_only", "_colony")
    appended = http.post(f"/v1/agents/{agent}/blocks/{label}/append", json={"text": "share tools"})
    assert appended.status_code == 200, appended.text
    error_of(
        http.put(f"/v1/agents/{agent}/blocks/{label}", json={"content": "anything goes"}), 403, "forbidden"
    )
    made = http.post(f"/v1/agents/{agent}/blocks", json={"label": label}, params=PROVISION)
    error_of(made, 409, "conflict")
    error_of(http.delete(f"/v1/agents/{agent}/blocks/{label}"), 403, "forbidden")

    # the operator: full access
    put = http.put(f"/v1/colony/blocks/{label}", json={"content": "be kind\nshare tools\nrest"})
    assert put.status_code == 200 and put.json()["version"] == 3
    assert http.post(f"/v1/colony/blocks/{label}/append", json={"text": "eat"}).status_code == 200
    view = http.get(f"/v1/colony/blocks/{label}").json()
    assert view["content"] == "be kind\nshare tools\nrest\neat\n" and view["access"] == "read_write"
    assert http.get(f"/v1/colony/blocks/{label}", params={"version": 1}).json()["content"] == "be kind\n"
    history = http.get(f"/v1/colony/blocks/{label}/history").json()
    assert [(v["author"], v["op"]) for v in history["versions"]] == [
        ("_operator", "create"),
        (agent, "append"),
        ("_operator", "put"),
        ("_operator", "append"),
    ]
    rolled = http.post(f"/v1/colony/blocks/{label}/rollback", json={"version": 2})
    assert rolled.status_code == 200 and rolled.json()["version"] == 5
    assert http.get(f"/v1/agents/{later}/blocks/{label}").json()["content"] == "be kind\nshare tools\n"
    patched = http.patch(f"/v1/colony/blocks/{label}", json={"description": "rules"})
    assert patched.status_code == 200 and patched.json()["description"] == "rules"

    assert http.delete(f"/v1/colony/blocks/{label}").status_code == 204
    error_of(http.get(f"/v1/colony/blocks/{label}"), 404, "not_found")
    error_of(http.get(f"/v1/agents/{agent}/blocks/{label}"), 404, "not_found")
    error_of(http.delete(f"/v1/colony/blocks/{label}"), 404, "not_found")
