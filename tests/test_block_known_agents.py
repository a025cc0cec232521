"""Blocks and shares only for agents the colony knows or has reserved, over the real API app (uvicorn
over a real redis-server) and the CLI: a block or a share for an agent id nobody spawned (a future
`session-...` or `analyze-...-w0`) is a 404 naming the agent, and nothing is written; with the
documented pre-provisioning flag (`?provision=true`, `--provision`) it is made, for an id that can
name an agent, and that id is then reserved. An agent that exists (its registry record, or its
state in its own scope) needs no flag. Also: the size caps of a block's free-form fields."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_api_blocks import AUTH, TOKEN, BlocksApp, error_of

from colony import cli
from colony.agents import Agent, AgentBlueprint, AgentMetadata, LocalAgentRuntime
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentRegistryProtocol
from colony.config import ColonySettings
from colony.errors import AgentNotFound, InvalidArgument
from colony.memory.blocks import templates
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.types import NewBlock


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlocksApp]:
    with BlocksApp(redis_server.url, tmp_path_factory.mktemp("blocks-known")) as app:
        yield app


@pytest.fixture
def http(served: BlocksApp) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=60) as client:
        yield client


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_a_block_or_share_for_an_unknown_agent_is_a_404_naming_it(http: httpx.Client) -> None:
    owner, future = fresh("owner"), f"session-{uuid.uuid4().hex[:16]}"
    worker = f"analyze-{uuid.uuid4().hex[:8]}-w0"
    for agent in (future, worker):
        error = error_of(http.post(f"/v1/agents/{agent}/blocks", json={"label": "human"}), 404, "not_found")
        assert agent in error["message"] and "provision=true" in error["message"]
        assert http.get(f"/v1/agents/{agent}/blocks").json() == []  # nothing was written
    made = http.post(f"/v1/agents/{owner}/blocks", json={"label": "plan"}, params={"provision": "true"})
    assert made.status_code == 201, made.text
    body = {"owner": owner, "label": "plan", "agent_id": future, "access": "read_write"}
    error = error_of(http.post("/v1/blocks/share", json=body), 404, "not_found")
    assert future in error["message"]
    assert http.get(f"/v1/agents/{future}/blocks").json() == []  # not shared


def test_provisioning_makes_the_block_and_reserves_the_id(http: httpx.Client) -> None:
    future, owner = f"session-{uuid.uuid4().hex[:16]}", fresh("owner")
    provision = {"provision": "true"}
    made = http.post(
        f"/v1/agents/{future}/blocks", json={"label": "human", "content": "Ada"}, params=provision
    )
    assert made.status_code == 201, made.text
    # reserved now: its next block, or a share with it, needs no flag
    assert http.post(f"/v1/agents/{future}/blocks", json={"label": "notes"}).status_code == 201
    assert (
        http.post(f"/v1/agents/{owner}/blocks", json={"label": "plan"}, params=provision).status_code == 201
    )
    body = {"owner": owner, "label": "plan", "agent_id": future, "access": "read_only"}
    assert http.post("/v1/blocks/share", json=body).status_code == 200
    labels = {b["label"] for b in http.get(f"/v1/agents/{future}/blocks").json()}
    assert labels == {"human", "notes", "plan"}
    # a share provisions its agent as well
    other = fresh("helper")
    body = {"owner": owner, "label": "plan", "agent_id": other, "access": "read_only"}
    assert http.post("/v1/blocks/share", json=body, params=provision).status_code == 200
    assert http.post(f"/v1/agents/{other}/blocks", json={"label": "own"}).status_code == 201


async def test_an_agent_the_colony_knows_needs_no_flag(bb: Blackboard, tmp_path: Path) -> None:
    """Known: spawned (its state in its own scope, its registry record), or only a registry record
    (its state retired), in the store's own tenant and colony."""
    colony = f"c{uuid.uuid4().hex[:10]}"
    runtime = LocalAgentRuntime(bb, colony_id=colony, settings=ColonySettings(data_dir=tmp_path))
    store = BlockStore(bb.redis, ColonySettings(colony_id=colony))
    try:
        await runtime.spawn(AgentBlueprint(agent_class=Agent, metadata=AgentMetadata(agent_id="spawned")))
        assert await store.check_known("spawned") == "spawned"
        registry = bb.scoped(scope_id(BlackboardScope.COLONY, tenant_id="default", colony_id=colony))
        await registry.write(AgentRegistryProtocol.agent_key("listed"), {"agent_id": "listed"})
        assert await store.check_known("listed") == "listed"
        elsewhere = BlockStore(bb.redis, ColonySettings(colony_id=f"{colony}x"))  # another colony
        with pytest.raises(AgentNotFound, match="'spawned'"):
            await elsewhere.check_known("spawned")
        with pytest.raises(AgentNotFound, match="'nobody'"):
            await store.check_known("nobody", what="blocks are shared")
        assert await store.check_known("nobody", provision=True) == "nobody"
        for bad in ("_colony", "a b", "-lead", "x" * 129):
            with pytest.raises(InvalidArgument):
                await store.check_known(bad, provision=True)
    finally:
        await runtime.shutdown()


def test_the_cli_refuses_an_unknown_agent_unless_provisioned(
    served: BlocksApp, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("COLONY_URL", "COLONY_API_TOKEN", "COLONY_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLONY_DATA_DIR", str(tmp_path))
    agent, owner = fresh("later"), fresh("owner")

    def colony(*argv: str) -> tuple[int, str]:
        code = cli.main(["blocks", *argv, "--url", served.url, "--token", TOKEN])
        return code, capsys.readouterr().err

    code, err = colony("create", agent, "human")
    assert code == 1 and agent in err and "--provision" in err
    assert colony("create", agent, "human", "--provision")[0] == 0
    assert colony("create", owner, "plan", "--provision")[0] == 0
    stranger = fresh("stranger")
    code, err = colony("share", owner, "plan", stranger, "--access", "read_only")
    assert code == 1 and stranger in err
    assert colony("share", owner, "plan", stranger, "--access", "read_only", "--provision")[0] == 0
    code, err = colony("create", "--colony", fresh("c").replace("-", "_"), "--provision")
    assert code != 0 and "--provision is for an agent's block" in err


def test_free_form_fields_are_capped_naming_the_field(http: httpx.Client) -> None:
    agent = fresh("capped")
    provision = {"provision": "true"}
    long = {"label": "x", "description": "d" * 1001}
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks", json=long, params=provision), 422, "invalid_request"
    )
    assert "description" in error["message"]
    wide = {"label": "who", "template": "human", "fields": {"name": "n" * (templates.MAX_FIELDS_CHARS + 1)}}
    error = error_of(
        http.post(f"/v1/agents/{agent}/blocks", json=wide, params=provision), 422, "invalid_request"
    )
    assert "fields" in error["message"] and str(templates.MAX_FIELDS_CHARS) in error["message"]
    assert http.post(f"/v1/agents/{agent}/blocks", json={"label": "ok"}, params=provision).status_code == 201
    patch = http.patch(f"/v1/agents/{agent}/blocks/ok", json={"description": "d" * 1001})
    assert "description" in error_of(patch, 422, "invalid_request")["message"]
    with pytest.raises(ValueError, match="template"):
        NewBlock(label="t", template="t" * 65)
    with pytest.raises(ValueError, match="description"):
        NewBlock(label="t", description="d" * 1001)
