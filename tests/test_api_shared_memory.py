"""Shared memory across replicas and over HTTP (issue 36, deliverable 4): the operator defines a
team's scope with `PUT /v1/memory/shared/{name}`; two agents hosted by two ReplicaHosts (each with
its own Redis client, memory service and keyword index, as two replicas have) share facts in runs
and recall each other's; an agent left out of the rules is refused; the routes list, describe,
write and query, and refuse bad names, bodies and undefined scopes. Real redis-server, the real
embedder and an in-process Chroma."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_kit import ServedApi

from colony import cli
from colony.agents import Agent, AgentBlueprint, AgentMetadata, ScriptedActionPolicy
from colony.api.app import ApiServices
from colony.blackboard import Blackboard, create_redis
from colony.config import ColonySettings
from colony.inference.scripted import ScriptedEngine
from colony.memory.capability import MemoryCapability
from colony.memory.scopes import PURPOSES
from colony.memory.shared import SharedMemoryCapability
from colony.memory.shared_tools import SharedMemoryToolsCapability
from colony.system.host import ReplicaHost
from colony.system.runs import RunService

TOKEN = "shared-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TEAM = "collective:team-a"
HOSTED = {"scout": "ra", "reader": "rb", "outsider": "rb"}


def member(agent_id: str) -> AgentBlueprint:
    """Shares `$input.fact` with the team, then recalls `$input.query` from it."""
    steps = [
        {"action": "share_memory", "parameters": {"fact": "$input.fact"}},
        {"action": "recall_shared", "parameters": {"query": "$input.query"}},
    ]
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, role="member"),
        capabilities=[
            MemoryCapability.bind(level="working"),
            SharedMemoryCapability.bind(name=TEAM),
            SharedMemoryToolsCapability.bind(),
        ],
        action_policy=ScriptedActionPolicy.bind(steps=steps),
    )


class TwoReplicas(ServedApi):
    def __init__(self, redis_url: str, data_dir: Path) -> None:
        settings = ColonySettings(
            redis_url=redis_url, data_dir=data_dir, colony_id=f"sh{uuid.uuid4().hex[:8]}"
        )
        super().__init__(settings, TOKEN)
        self.hosts: dict[str, ReplicaHost] = {}
        self.clients: list[Any] = []

    async def start_services(self) -> ApiServices:
        settings = self.settings
        for name in ("ra", "rb"):
            client = create_redis(settings.redis_url, settings.blackboard)
            self.clients.append(client)
            host = ReplicaHost(settings, name, engine=ScriptedEngine(["ok"]))
            await host.start(Blackboard(client, f"colony:shared-{name}", settings=settings.blackboard))
            self.hosts[name] = host
        for agent_id, replica in HOSTED.items():
            await self.hosts[replica].ensure_agent(member(agent_id))
        registry = self.hosts["ra"].registry
        assert registry is not None
        api_board = Blackboard(self.clients[0], "colony:shared-api", settings=settings.blackboard)
        ids = {"tenant_id": settings.tenant_id, "colony_id": settings.colony_id}
        return ApiServices(
            runs=RunService(api_board, registry, settings=settings, **ids),
            registry=registry,
            token=TOKEN,
            settings=settings,
        )

    async def stop_services(self) -> None:
        for host in self.hosts.values():
            await host.close()
        for client in self.clients:
            await client.aclose()

    def run(self, agent_id: str, fact: str, query: str) -> Any:
        runtime = self.hosts[HOSTED[agent_id]].runtime
        assert runtime is not None and agent_id in runtime.agent_ids
        run = self.call(lambda: runtime.start_run(agent_id, {"fact": fact, "query": query}))
        return self.call(lambda: runtime.wait_for_run(agent_id, run.run_id, timeout=60))


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoReplicas]:
    with TwoReplicas(redis_server.url, tmp_path_factory.mktemp("shared")) as made:
        yield made


@pytest.fixture
def http(served: TwoReplicas) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=60) as client:
        yield client


def test_two_agents_on_two_replicas_recall_each_others_shared_facts(
    served: TwoReplicas, http: httpx.Client
) -> None:
    defined = http.put(
        f"/v1/memory/shared/{TEAM}", json={"readers": ["scout", "reader"], "writers": ["scout", "reader"]}
    )
    assert defined.status_code == 201, defined.text
    assert defined.json()["writers"] == ["scout", "reader"] and defined.json()["entry_count"] == 0
    first = "The staging database was migrated to Postgres 16 on Tuesday."
    second = "The flaky login test fails only when the clock crosses midnight."
    done = served.run("scout", first, "database migration")
    assert done.status.value == "succeeded", done
    done = served.run("reader", second, "which Postgres version does staging run?")
    assert done.status.value == "succeeded", done
    assert done.output[0]["content"] == first and done.output[0]["shared_by"] == "scout"
    done = served.run("scout", first, "why does the login test fail?")
    assert done.status.value == "succeeded", done
    assert done.output[0]["content"] == second and done.output[0]["shared_by"] == "reader"
    # the outsider (on rb too) is in neither list: its share and its recall are refused
    refused = served.run("outsider", "I was here too, on the team.", "database")
    assert refused.status.value == "failed" and "does not let agent 'outsider' write" in (
        refused.error or ""
    ), refused

    listed = http.get("/v1/memory/shared").json()["scopes"]
    assert [s["name"] for s in listed] == [TEAM] and listed[0]["entry_count"] == 2
    found = http.post(f"/v1/memory/shared/{TEAM}/query", json={"query": "postgres version"}).json()["entries"]
    assert found[0]["entry"]["content"] == first and found[0]["entry"]["created_by"] == "scout"


def test_an_agents_own_memory_routes_do_not_reach_its_shared_scopes(
    served: TwoReplicas, http: httpx.Client
) -> None:
    """Found by review: `/v1/agents/{id}/memory...` read and wrote a shared scope the agent is a
    member of, past its rules and past a token restricted to that agent (403 on the shared routes)."""
    rules = {"readers": ["scout", "reader"], "writers": ["scout", "reader"]}
    assert http.put(f"/v1/memory/shared/{TEAM}", json=rules).status_code in (200, 201)
    team = http.get(f"/v1/memory/shared/{TEAM}").json()["scope_id"]
    fact = "The vault code for the staging bastion is 4242."
    assert http.post(f"/v1/memory/shared/{TEAM}/entries", json={"content": fact}).status_code in (200, 201)

    # the map shows the team's scope to a reader only
    assert team in http.get("/v1/agents/scout/memory").json()["scopes"]
    assert team not in http.get("/v1/agents/outsider/memory").json()["scopes"]
    for agent in ("scout", "outsider"):
        for named in ("collective", team):
            asked = http.post(f"/v1/agents/{agent}/memory/query", json={"query": "vault", "scopes": [named]})
            assert asked.status_code == 404 and f"/v1/memory/shared/{TEAM}" in asked.text, asked.text
            body = {"scope": named, "content": "planted here"}
            planted = http.post(f"/v1/agents/{agent}/memory", json=body)
            assert planted.status_code == 404, planted.text
        found = http.post(f"/v1/agents/{agent}/memory/query", json={"query": "vault code"}).json()["entries"]
        assert all(e["entry"]["scope_id"] != team for e in found) and fact not in str(found)
    assert team not in http.post("/v1/agents/scout/memory/reindex").json()["scopes"]
    held = http.post(f"/v1/memory/shared/{TEAM}/query", json={"query": "planted here"}).json()["entries"]
    assert "planted here" not in [e["entry"]["content"] for e in held]

    # a token restricted to the outsider reaches neither way
    made = http.post("/v1/tokens", json={"verbs": ["read", "write"], "agents": ["outsider"]})
    assert made.status_code == 201, made.text
    scoped = {"Authorization": f"Bearer {made.json()['token']}"}
    with httpx.Client(base_url=served.url, headers=scoped, timeout=60) as outsider:
        assert outsider.post(f"/v1/memory/shared/{TEAM}/query", json={"query": "vault"}).status_code == 403
        asked = outsider.post("/v1/agents/outsider/memory/query", json={"query": "vault", "scopes": [team]})
        assert asked.status_code == 404, asked.text


def test_the_operator_writes_and_redefines_and_bad_requests_are_refused(
    served: TwoReplicas, http: httpx.Client
) -> None:
    name = "task:release-7"
    assert (
        http.put(f"/v1/memory/shared/{name}", json={"writers": ["scout"], "max_entries": 50}).status_code
        == 201
    )
    written = http.post(
        f"/v1/memory/shared/{name}/entries", json={"content": "Release 7 ships on Friday.", "tags": ["plan"]}
    )
    assert written.status_code == 201 and written.json()["created"] is True, written.text
    again = http.post(f"/v1/memory/shared/{name}/entries", json={"content": "release 7 ships on friday."})
    assert again.status_code == 200 and again.json()["created"] is False
    shown = http.get(f"/v1/memory/shared/{name}").json()
    assert shown["readers"] == ["*"] and shown["writers"] == ["scout"] and shown["max_entries"] == 50
    assert shown["entry_count"] == 1 and shown["updated_by"] == "api"
    changed = http.put(f"/v1/memory/shared/{name}", json={"writers": ["reader"]})  # only what it names
    assert changed.status_code == 200 and changed.json()["readers"] == ["*"], changed.text
    assert changed.json()["writers"] == ["reader"] and changed.json()["max_entries"] == 50
    redefined = http.put(f"/v1/memory/shared/{name}", json={"readers": [], "writers": []})
    assert redefined.status_code == 200 and redefined.json()["entry_count"] == 1  # entries stay
    longest = "collective:" + "n" * 64
    assert http.put(f"/v1/memory/shared/{longest}", json={}).status_code == 201
    assert http.get(f"/v1/memory/shared/{longest}").json()["name"] == longest
    assert http.get(f"/v1/memory/shared/{longest}n").status_code == 422

    for path in ("/v1/memory/shared/team", "/v1/memory/shared/global:x", "/v1/memory/shared/collective:a*"):
        assert http.get(path).status_code == 422, path
    assert http.get("/v1/memory/shared/task:nope").status_code == 404
    missing = http.post("/v1/memory/shared/task:nope/entries", json={"content": "x"})
    assert missing.status_code == 404 and "define it first" in missing.text
    assert http.post("/v1/memory/shared/task:nope/query", json={"query": "x"}).status_code == 404
    for body in (
        {"readers": ["bad:id"]},
        {"writers": ["*", "a b"]},
        {"writers": [f"a{i}" for i in range(257)]},
        {"max_entries": 0},
        {"purpose": "line\nbreak"},
        {"purpose": "line\u2028separator"},
        {"purpose": "c1\x85control"},
        {"owner": "me"},
        {"ttl_seconds": "60"},
        {"max_entries": True},
    ):
        refused = http.put(f"/v1/memory/shared/{name}", json=body)
        assert refused.status_code == 422, (body, refused.text)
    assert (
        http.post(f"/v1/memory/shared/{name}/query", json={"query": "x", "scopes": ["stm"]}).status_code
        == 422
    )
    for body in ({"content": "x", "importance": False}, {"content": "x", "ttl_seconds": "5"}):
        assert http.post(f"/v1/memory/shared/{name}/entries", json=body).status_code == 422, body
    for query in ({"min_relevance": False}, {"max_results": 2.5}, {"time_range": [0, "1"]}):
        assert http.post(f"/v1/memory/shared/{name}/query", json=query).status_code == 422, query
    assert httpx.get(f"{served.url}/v1/memory/shared").status_code == 401


def test_the_cli_defines_lists_writes_and_queries(
    served: TwoReplicas, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("COLONY_URL", "COLONY_API_TOKEN", "COLONY_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLONY_DATA_DIR", str(tmp_path))

    def colony(*argv: str) -> tuple[int, str]:
        code = cli.main(["memory", "shared", *argv, "--url", served.url, "--token", TOKEN])
        out, err = capsys.readouterr()
        assert code == 0, err
        return code, out

    _, out = colony("define", "collective:cli-team", "--writers", "scout,reader", "--purpose", "CLI team")
    assert out.startswith("defined collective:cli-team: 0/") and "writers: scout, reader" in out
    assert "readers: every agent" in out and "purpose: CLI team" in out
    # a define changes only what it names (found by review: the purpose was sent as "" and wiped)
    _, out = colony("define", "collective:cli-team", "--writers", "scout", "--json")
    assert json.loads(out)["purpose"] == "CLI team" and json.loads(out)["writers"] == ["scout"]
    _, out = colony("define", "task:cli-new", "--json")
    assert json.loads(out)["purpose"] == PURPOSES["task"], out
    _, out = colony("write", "collective:cli-team", "The demo is on Monday.\x1b[2J", "--tag", "plan")
    assert out.startswith("stored ") and "\x1b" not in out
    _, out = colony("query", "collective:cli-team", "when is the demo?")
    assert out.startswith("1. [") and "The demo is on Monday." in out and "\x1b" not in out
    _, out = colony("ls", "--json")
    assert "collective:cli-team" in [s["name"] for s in json.loads(out)]
    _, out = colony("show", "collective:cli-team")
    assert "1/" in out.splitlines()[0]
    with pytest.raises(SystemExit):  # argparse refuses a bad name before any call
        cli.main(["memory", "shared", "show", "team", "--url", served.url, "--token", TOKEN])
    assert "not a shared scope name" in capsys.readouterr().err
    assert cli.main(["memory", "shared", "show", "task:absent", "--url", served.url, "--token", TOKEN]) != 0
    assert "define it first" in capsys.readouterr().err
