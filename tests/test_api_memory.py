"""Agent memory over HTTP (`/v1/agents/{id}/memory*`) and the agent catalog, on the real API app
served by uvicorn over a real Redis, with an agent whose working and short-term memory are
MemoryCapabilities hosted by a ReplicaHost, and recall through the real embedder and an in-process
Chroma. One app for the module (the agents and the Redis client live in its thread's event loop)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_kit import ServedApi
from memory_kit import two_level_memory

from colony.agents import Agent, AgentBlueprint, AgentMetadata
from colony.api.app import ApiServices
from colony.blackboard import Blackboard, create_redis
from colony.config import ColonySettings
from colony.inference.scripted import ScriptedEngine
from colony.memory.scopes import MemoryScope
from colony.system.builtin import echo_blueprint
from colony.system.catalog import BUILTIN_AGENTS
from colony.system.host import ReplicaHost
from colony.system.registry import AgentRecord
from colony.system.runs import RunService

TOKEN = "memory-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AGENT = "rememberer"
OTHER = "bystander"
MAX_RECALL = 5


def memory_agent(agent_id: str) -> AgentBlueprint:
    """Working memory, and STM ingesting from it (no action policy: memory only)."""
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, role="rememberer"),
        capabilities=two_level_memory(),
    )


class MemoryApp(ServedApi):
    """The API, a ReplicaHost with the memory agents and echo, served over HTTP (the CLI tests use
    it too)."""

    def __init__(self, redis_url: str, data_dir: Path) -> None:
        settings = ColonySettings(
            redis_url=redis_url,
            data_dir=data_dir,
            colony_id=f"mem{uuid.uuid4().hex[:8]}",
            agents={"greeter": "colony_memtest_pkg.a:greeter"},
            memory={"max_recall_results": MAX_RECALL, "max_content_chars": 500},
        )
        super().__init__(settings, TOKEN)
        self.host: ReplicaHost | None = None
        self.board: Blackboard | None = None

    async def start_services(self) -> ApiServices:
        settings = self.settings
        client = create_redis(settings.redis_url, settings.blackboard)
        self.board = Blackboard(client, "colony:memory-api", settings=settings.blackboard)
        self.host = ReplicaHost(settings, "replica-m", engine=ScriptedEngine(["ok"]))
        await self.host.start(self.board)
        for blueprint in (memory_agent(AGENT), memory_agent(OTHER), echo_blueprint()):
            await self.host.ensure_agent(blueprint)
        assert self.host.registry is not None
        # an agent literally named "catalog" (not from `agents:`, where the name is reserved, but
        # spawned by library code), placed
        await self.host.registry.put(AgentRecord(agent_id="catalog", role="cataloguer", state="idle"))
        ids = {"tenant_id": settings.tenant_id, "colony_id": settings.colony_id}
        return ApiServices(
            runs=RunService(self.board, self.host.registry, settings=settings, **ids),
            registry=self.host.registry,
            token=TOKEN,
            settings=settings,
        )

    async def stop_services(self) -> None:
        assert self.host is not None and self.board is not None
        await self.host.close()
        await self.board.redis.aclose()

    def scope(self, agent: str, level: str) -> str:
        ids = {"tenant_id": self.settings.tenant_id, "colony_id": self.settings.colony_id}
        return MemoryScope.agent(agent, level, **ids)

    def wait_for(self, check: Callable[[], bool], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, "condition not reached in time"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryApp]:
    with MemoryApp(redis_server.url, tmp_path_factory.mktemp("memory-api")) as app:
        client = httpx.Client(base_url=app.url, headers=AUTH, timeout=120)
        # the agents registered their scopes when they started
        app.wait_for(lambda: len(client.get(f"/v1/agents/{AGENT}/memory").json()["scopes"]) == 2)
        client.close()
        yield app


@pytest.fixture
def http(served: MemoryApp) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=120) as client:
        yield client


def scope_counts(http: httpx.Client, agent: str = AGENT) -> dict[str, int]:
    memory_map = http.get(f"/v1/agents/{agent}/memory").json()
    return {info["scope_type"]: info["entry_count"] for info in memory_map["scopes"].values()}


def test_memory_map_shows_scopes_edges_and_needs_the_token(served: MemoryApp, http: httpx.Client) -> None:
    working, stm = served.scope(AGENT, "working"), served.scope(AGENT, "stm")
    memory_map = http.get(f"/v1/agents/{AGENT}/memory")
    assert memory_map.status_code == 200, memory_map.text
    body = memory_map.json()
    assert body["agent_id"] == AGENT and set(body["scopes"]) == {working, stm}
    assert body["scopes"][working]["scope_type"] == "working"
    assert body["scopes"][stm]["subscribed_to"] == [working]
    assert body["scopes"][stm]["max_entries"] == served.settings.memory.default_max_entries
    assert body["dataflow_edges"] == [[working, stm]]
    # an agent without memory: an empty map; no such agent: 404; no token: 401
    echo = http.get("/v1/agents/echo/memory")
    assert echo.status_code == 200 and echo.json()["scopes"] == {} and echo.json()["total_entries"] == 0
    missing = http.get("/v1/agents/nobody/memory")
    assert missing.status_code == 404 and "nobody" in missing.json()["error"]["message"]
    for path in (f"/v1/agents/{AGENT}/memory", "/v1/agents/catalog"):
        refused = httpx.get(served.url + path)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    refused_write = httpx.post(
        f"{served.url}/v1/agents/{AGENT}/memory", json={"scope": "working", "content": "x"}
    )
    assert refused_write.status_code == 401
    assert scope_counts(http)["working"] == 0  # nothing was written by the refused call


def test_write_dedups_is_ingested_and_refuses_bad_input(served: MemoryApp, http: httpx.Client) -> None:
    before = scope_counts(http)
    body = {"scope": "working", "content": "The deploy key lives in vault path ops/deploy.", "tags": ["fact"]}
    created = http.post(f"/v1/agents/{AGENT}/memory", json=body)
    assert created.status_code == 201, created.text
    entry = created.json()["entry"]
    assert created.json()["created"] is True and entry["scope_id"] == served.scope(AGENT, "working")
    assert entry["tags"] == ["fact"] and entry["created_by"] == "api"
    again = http.post(
        f"/v1/agents/{AGENT}/memory",
        json={**body, "content": "the deploy key LIVES in vault path  ops/deploy."},
    )
    assert again.status_code == 200 and again.json()["created"] is False
    assert again.json()["duplicate_of"] == entry["entry_id"]
    # the agent's STM takes the entry in from working memory (its own ingestion)
    served.wait_for(lambda: scope_counts(http)["stm"] == before["stm"] + 1)
    assert scope_counts(http)["working"] == before["working"] + 1
    stm_map = http.get(f"/v1/agents/{AGENT}/memory").json()["scopes"][served.scope(AGENT, "stm")]
    assert stm_map["pending_ingestion"] == 0 and "fact" in stm_map["available_tags"]

    def refused(payload: dict[str, Any], status: int, *words: str) -> None:
        answer = http.post(f"/v1/agents/{AGENT}/memory", json=payload)
        assert answer.status_code == status, (payload, answer.text)
        message = answer.json()["error"]["message"]
        assert all(w in message for w in words), message

    refused({"scope": "working", "content": "x", "tags": ["two words"]}, 422, "tags")
    refused({"scope": "working", "content": "x" * 501}, 422, "content", "memory.max_content_chars")
    refused({"scope": "working", "content": "x", "entry_id": "a*{b}"}, 422, "entry_id")
    refused({"scope": "working", "content": "x", "colour": "red"}, 422, "colour")
    refused({"scope": "working", "content": "x", "sources": ["a*#b"]}, 422, "sources")
    refused({"scope": "working", "content": "x", "tags": ["index:memory"]}, 422, "reserved")
    refused({"scope": "ltm:semantic", "content": "x"}, 404, "no memory scope", "working", "stm")
    nan = http.post(
        f"/v1/agents/{AGENT}/memory",
        content=b'{"scope": "working", "content": "x", "data": {"a": NaN}}',
        headers={"content-type": "application/json"},
    )
    assert nan.status_code == 422 and "body.data.a: NaN" in nan.json()["error"]["message"]
    # another agent's scope by full id: refused, and nothing reaches it
    other_working = served.scope(OTHER, "working")
    refused({"scope": other_working, "content": "planted"}, 404, "no memory scope")
    assert scope_counts(http, OTHER)["working"] == 0
    assert http.post("/v1/agents/nobody/memory", json={"scope": "working", "content": "x"}).status_code == 404
    huge = http.post(
        f"/v1/agents/{AGENT}/memory",
        content=b'{"scope": "working", "content": "' + b"x" * (2 * 1024 * 1024) + b'"}',
        headers={"content-type": "application/json"},
    )
    assert huge.status_code == 413


FACTS = {
    "pets": "Our cat Miso sleeps on the radiator every afternoon.",
    "db": "The staging database password is rotated every Tuesday at noon.",
    "trip": "Alice flies to Osaka for the robotics conference in March.",
}


def test_query_ranks_by_meaning_filters_and_stays_in_the_agents_scopes(
    served: MemoryApp, http: httpx.Client
) -> None:
    for tag, text in FACTS.items():
        written = http.post(
            f"/v1/agents/{AGENT}/memory", json={"scope": "working", "content": text, "tags": [tag]}
        )
        assert written.status_code == 201, written.text
    planted = http.post(
        f"/v1/agents/{OTHER}/memory",
        json={"scope": "working", "content": "The vault PIN is 4821.", "tags": ["db"]},
    )
    assert planted.status_code == 201

    def query(**body: Any) -> httpx.Response:
        return http.post(f"/v1/agents/{AGENT}/memory/query", json=body)

    found = query(query="When do the credentials of the test DB change?", scopes=["working"])
    assert found.status_code == 200, found.text
    entries = found.json()["entries"]
    assert entries[0]["entry"]["content"] == FACTS["db"]
    assert 0 <= entries[-1]["relevance"] <= entries[0]["relevance"] <= 1
    assert set(entries[0]["scores"]) >= {"vector", "keyword", "recency"}
    # min_relevance drops the unrelated facts; the other agent's entry is never seen
    strict = query(query="When do the credentials of the test DB change?", min_relevance=0.3).json()[
        "entries"
    ]
    contents = [e["entry"]["content"] for e in strict]
    assert FACTS["db"] in contents and FACTS["pets"] not in contents
    assert all("4821" not in c for c in contents)
    # tag filter: only matching entries, from working and STM (once ingested)
    served.wait_for(lambda: scope_counts(http)["stm"] >= 4)
    tagged = query(query="travel plans", tag_filter={"all_of": ["trip"]}).json()["entries"]
    # (a fact copied down the hierarchy, working -> stm, shows once: the same text is one result)
    assert [e["entry"]["content"] for e in tagged] == [FACTS["trip"]]
    only_stm = query(query="travel plans", scopes=["stm"], tag_filter={"all_of": ["trip"]}).json()["entries"]
    assert only_stm and all(e["entry"]["scope_id"] == served.scope(AGENT, "stm") for e in only_stm)
    # results are bounded by memory.max_recall_results whatever max_results asks
    for n in range(MAX_RECALL):
        http.post(f"/v1/agents/{AGENT}/memory", json={"scope": "working", "content": f"Filler note {n}."})
    assert len(query(max_results=1000, scopes=["working"]).json()["entries"]) == MAX_RECALL
    assert len(query(max_results=1000).json()["entries"]) <= MAX_RECALL
    # an empty time range matches nothing
    assert query(time_range=[time.time(), 0]).json()["entries"] == []
    # scopes the agent does not have: 404, even as full ids of another agent's scope
    for scopes in (["ltm:episodic"], [served.scope(OTHER, "working")], ["working", "nope"]):
        answer = query(query="vault PIN", scopes=scopes)
        assert answer.status_code == 404 and "no memory scope" in answer.json()["error"]["message"]
    bad = query(query="x", max_results=0)
    assert bad.status_code == 422 and "max_results" in bad.json()["error"]["message"]
    bad_tag = query(tag_filter={"any_of": ["a*"]})
    assert bad_tag.status_code == 422 and "tag_filter" in bad_tag.json()["error"]["message"]
    bad_pattern = query(key_pattern="a b")
    assert bad_pattern.status_code == 422 and "key_pattern" in bad_pattern.json()["error"]["message"]
    # no include_expired: an expired entry is not kept, so no query could return it (docs/memory.md)
    expired = query(query="x", include_expired=True)
    assert expired.status_code == 422 and "include_expired" in expired.json()["error"]["message"]
    assert http.post("/v1/agents/nobody/memory/query", json={}).status_code == 404
    assert http.post("/v1/agents/echo/memory/query", json={"query": "x"}).json() == {"entries": []}


def test_reindex_rebuilds_every_scope_from_redis(served: MemoryApp, http: httpx.Client) -> None:
    for text in (FACTS["pets"], "Reindex me, please."):  # created, or already held (200)
        assert http.post(f"/v1/agents/{AGENT}/memory", json={"scope": "working", "content": text}).is_success
    served.wait_for(lambda: http.get(f"/v1/agents/{AGENT}/memory").json()["total_pending_ingestion"] == 0)
    counts = scope_counts(http)
    done = http.post(f"/v1/agents/{AGENT}/memory/reindex")
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["vector"] is True, body
    assert body["scopes"] == {served.scope(AGENT, t): counts[t] for t in ("working", "stm")}
    # recall still finds entries by meaning after the rebuild
    hit = http.post(
        f"/v1/agents/{AGENT}/memory/query", json={"query": "a cat napping near the heater", "mode": "vector"}
    )
    assert hit.json()["entries"][0]["entry"]["content"] == FACTS["pets"]
    assert http.post("/v1/agents/echo/memory/reindex").json() == {"scopes": {}, "vector": False}
    assert http.post("/v1/agents/nobody/memory/reindex").status_code == 404


def test_catalog_lists_builtins_and_user_agents_beside_an_agent_named_catalog(
    served: MemoryApp, http: httpx.Client
) -> None:
    catalog = http.get("/v1/agents/catalog")
    assert catalog.status_code == 200, catalog.text
    by_name = {a["name"]: a for a in catalog.json()}
    assert [a["name"] for a in catalog.json()] == [*BUILTIN_AGENTS, "greeter"]
    assert {"echo", "ask", "analyze"} <= set(BUILTIN_AGENTS)
    assert by_name["echo"] == {
        "name": "echo",
        "kind": "builtin",
        "role": "echo",
        "agent_type": "service",
        "state": by_name["echo"]["state"],
        "replica": "replica-m",
    }
    assert by_name["analyze"] == {"name": "analyze", "kind": "builtin"}  # not placed here
    assert by_name["greeter"] == {
        "name": "greeter",
        "kind": "user",
        "factory": "colony_memtest_pkg.a:greeter",
    }
    # the agent named "catalog" keeps its record (in the listing) and its memory routes
    assert "catalog" in {a["agent_id"] for a in http.get("/v1/agents").json()}
    assert http.get("/v1/agents/catalog/memory").json() == {
        "agent_id": "catalog",
        "scopes": {},
        "dataflow_edges": [],
        "total_entries": 0,
        "total_pending_ingestion": 0,
    }


def test_openapi_documents_every_memory_route_with_auth(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    expected = {
        ("/v1/agents/catalog", "get"),
        ("/v1/agents/{agent_id}/memory", "get"),
        ("/v1/agents/{agent_id}/memory", "post"),
        ("/v1/agents/{agent_id}/memory/query", "post"),
        ("/v1/agents/{agent_id}/memory/reindex", "post"),
    }
    for path, method in expected:
        operation = paths[path][method]
        assert operation["security"] == [{"HTTPBearer": []}], (path, method)
        assert {"401", "503"} <= set(operation["responses"]), (path, method)
        assert ("404" in operation["responses"]) == ("{agent_id}" in path), (path, method)
    assert "201" in paths["/v1/agents/{agent_id}/memory"]["post"]["responses"]
    # one path, two routes: a wrong method names both in `Allow`
    wrong = http.delete(f"/v1/agents/{AGENT}/memory")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, POST"
    # the catalog is declared before /v1/agents/{agent_id}: its path is the catalog's
    ordered = list(paths)
    assert ordered.index("/v1/agents/catalog") < ordered.index("/v1/agents/{agent_id}")


async def test_async_client_memory_methods(served: MemoryApp) -> None:
    from colony.client import ApiError, AsyncColonyClient

    async with AsyncColonyClient(served.url, TOKEN) as colony:
        written = await colony.memory.write(
            AGENT, "working", "The printer on floor 2 needs toner.", tags=["office"]
        )
        assert written["created"] is True and written["entry"]["tags"] == ["office"]
        found = await colony.memory.query(
            AGENT, "who should refill the printer?", tag_filter={"all_of": ["office"]}
        )
        assert [e["entry"]["content"] for e in found] == ["The printer on floor 2 needs toner."]
        assert (await colony.memory.map(AGENT))["agent_id"] == AGENT
        assert set((await colony.memory.reindex(AGENT))["scopes"]) == {
            served.scope(AGENT, "working"),
            served.scope(AGENT, "stm"),
        }
        assert {a["name"] for a in await colony.catalog()} >= {"echo", "greeter"}
        with pytest.raises(ApiError) as missing:
            await colony.memory.map("nobody")
        assert missing.value.status == 404
