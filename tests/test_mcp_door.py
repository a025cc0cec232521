"""The MCP server (issue 40, deliverable 2) with the official `mcp` package's client: over
streamable HTTP at `<colony>/mcp/` with a Colony token, and over stdio (`colony mcp --stdio`, as a
local client launches it). Tools list, remember then recall, a block appended and read, an agent
run with its progress as notifications; the same access rules as HTTP (a verb a token lacks, another
tenant's agent), and hostile arguments refused. The API is served on a loopback port over a real
redis-server with a ReplicaHost (scripted engine) and an in-process control plane (tests/tenant_kit.py)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from tenant_kit import HOME, TOKEN, TenantApp, bearer, made

from colony.blackboard.redis_server import RedisServerInfo
from colony.wire.idempotency import effect_keyed

TOOLS = {
    "list_agents",
    "recall",
    "remember",
    "block_read",
    "block_append",
    "run_agent",
    "start_session",
    "chat",
}


@pytest.fixture(scope="module")
def served(
    redis_server: RedisServerInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TenantApp, str]]:
    with TenantApp(redis_server.url, [tmp_path_factory.mktemp("mcp")]) as app:
        session = httpx.post(f"{app.url}/v1/sessions", json={}, headers=HOME, timeout=60).json()["session_id"]
        made_block = httpx.post(
            f"{app.url}/v1/agents/echo/blocks",
            json={"label": "notes", "content": "first."},
            headers=HOME,
            timeout=60,
        )
        assert made_block.status_code == 201, made_block.text
        yield app, session


def over_http(url: str, token: str = TOKEN) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(f"{url}/mcp/", http_client=http))


def text_of(result: Any) -> str:
    return "".join(getattr(part, "text", "") for part in result.content)


def test_tools_remember_recall_blocks_and_a_run_with_its_progress(served: tuple[TenantApp, str]) -> None:
    app, session = served

    async def scenario() -> None:
        async with over_http(app.url) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert {"colony://agents/{agent}/memory", "colony://agents/{agent}/blocks"} <= templates
            agents = text_of(await client.call_tool("list_agents", {}))
            assert '"echo"' in agents and session in agents
            stored = await client.call_tool(
                "remember", {"agent": session, "content": "The release is on the third of March."}
            )
            assert not stored.is_error, text_of(stored)
            found = await client.call_tool("recall", {"agent": session, "query": "When is the release?"})
            assert "third of March" in text_of(found)
            appended = await client.call_tool(
                "block_append", {"agent": "echo", "label": "notes", "text": " second."}
            )
            assert not appended.is_error, text_of(appended)
            shown = text_of(await client.call_tool("block_read", {"agent": "echo", "label": "notes"}))
            assert "first." in shown and "second." in shown
            memory = await client.read_resource(f"colony://agents/{session}/memory")
            assert "working" in memory.contents[0].text
            progress: list[str] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append(message or "")

            ran = await client.call_tool(
                "run_agent", {"agent": "echo", "input": {"hello": "mcp"}}, progress_callback=on_progress
            )
            assert not ran.is_error and '"hello": "mcp"' in text_of(ran)
            assert progress[0] == "started" and progress[-1] == "completed"

    asyncio.run(scenario())


def test_a_conversation_through_a_session_with_the_reply_as_progress(served: tuple[TenantApp, str]) -> None:
    app, home_session = served
    with httpx.Client(base_url=app.url, timeout=60) as http:
        guest = made(http, "mz", ["read", "run", "write"])["token"]

    async def scenario() -> None:
        async with over_http(app.url) as client:
            started = await client.call_tool("start_session", {})
            assert not started.is_error, text_of(started)
            session = json.loads(text_of(started))["session_id"]
            pieces: list[str] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                pieces.append(message or "")

            for said in ("My name is Dana.", "What is my name?"):
                reply = await client.call_tool(
                    "chat", {"session": session, "message": said}, progress_callback=on_progress
                )
                assert not reply.is_error and text_of(reply) == "a scripted reply", text_of(reply)
            assert "scripted" in "".join(pieces) and pieces[-1] == "completed"
            async with httpx.AsyncClient(base_url=app.url, headers=HOME, timeout=60) as rest:
                tree = (await rest.get(f"/v1/sessions/{session}/messages")).json()
            said = [m["content"] for m in tree["messages"] if m["role"] == "user"]
            assert said == ["My name is Dana.", "What is my name?"]  # the session kept both turns
            not_a_session = await client.call_tool("chat", {"session": "echo", "message": "hi"})
            assert not_a_session.is_error and "404" in text_of(not_a_session)
            long = await client.call_tool("chat", {"session": session, "message": "x" * 200_000})
            assert long.is_error and "422" in text_of(long)  # (as the REST route: before a run)
            async with httpx.AsyncClient(base_url=app.url, headers=HOME, timeout=60) as rest:
                paused = await rest.post(f"/v1/agents/{session}/suspend")
            assert paused.status_code == 200, paused.text
            refused = await asyncio.wait_for(
                client.call_tool("chat", {"session": session, "message": "hi"}), 30
            )
            assert refused.is_error and "409" in text_of(refused)  # suspended by request: resume it first
            too_many = await client.call_tool("start_session", {"pages": ["p"] * 65})
            assert too_many.is_error and "at most 64" in text_of(too_many)
        async with over_http(app.url, guest) as client:  # the colony's session, from another tenant
            hidden = await client.call_tool("chat", {"session": home_session, "message": "hi"})
            assert hidden.is_error and "404" in text_of(hidden)
            odd = await client.call_tool("chat", {"session": "../x", "message": "hi"})
            assert odd.is_error and "no agent id or label" in text_of(odd)

    asyncio.run(scenario())


def test_a_turn_started_without_a_stream(served: tuple[TenantApp, str]) -> None:
    """`POST /v1/sessions/{id}/turns`: the turn's run id at once (202), its reply the run's output;
    an Idempotency-Key makes a retry the same turn; a read token may not."""
    app, session = served
    with httpx.Client(base_url=app.url, timeout=60) as http:
        keyed = {**HOME, "Idempotency-Key": "turn-key-1"}
        first = http.post(f"/v1/sessions/{session}/turns", json={"message": "Hello"}, headers=keyed)
        assert first.status_code == 202, first.text
        again = http.post(f"/v1/sessions/{session}/turns", json={"message": "Hello"}, headers=keyed)
        assert again.json()["run_id"] == first.json()["run_id"]
        # its effects derive from the key: a retry after the answer was lost (the replica died) is
        # run again to the same turn, not refused as an unknown outcome
        assert effect_keyed("POST", f"/v1/sessions/{session}/turns")
        run_id = first.json()["run_id"]
        for _ in range(300):
            ended = http.get(f"/v1/runs/{run_id}", headers=HOME).json()
            if ended["status"] not in ("pending", "running"):
                break
            time.sleep(0.1)
        assert ended["status"] == "succeeded" and ended["output"]["message"]["content"] == "a scripted reply"
        said = [
            m["content"]
            for m in http.get(f"/v1/sessions/{session}/messages", headers=HOME).json()["messages"]
        ]
        assert said.count("Hello") == 1
        runner = bearer(made(http, "mr", ["read", "run"])["token"])
        reader = bearer(made(http, "mr", ["read"])["token"])
        own = http.post("/v1/sessions", json={}, headers=runner).json()["session_id"]
        refused = http.post(f"/v1/sessions/{own}/turns", json={"message": "x"}, headers=reader)
        assert refused.status_code == 403, refused.text  # its own tenant's session: the verb is missing
        hidden = http.post(f"/v1/sessions/{session}/turns", json={"message": "x"}, headers=runner)
        assert hidden.status_code == 404 and "Hello" not in hidden.text  # another tenant's session
        assert http.post("/v1/sessions/echo/turns", json={"message": "x"}, headers=HOME).status_code == 404


def test_the_same_access_rules_as_http(served: tuple[TenantApp, str]) -> None:
    app, session = served
    with httpx.Client(base_url=app.url, timeout=60) as http:
        reader = made(http, "mx", ["read"])["token"]
        other = made(http, "my", ["read", "run", "write"])["token"]

    async def scenario() -> None:
        async with over_http(app.url, reader) as client:
            refused = await client.call_tool("remember", {"agent": "echo", "content": "x"})
            assert refused.is_error and "403" in text_of(refused)
            assert "agent_id" not in text_of(
                await client.call_tool("list_agents", {})
            )  # none of the colony's
        async with over_http(app.url, other) as client:
            for tool, arguments in (
                ("block_read", {"agent": "echo", "label": "notes"}),
                ("recall", {"agent": session, "query": "release"}),
                ("run_agent", {"agent": "t.mx.echo", "input": 1}),
            ):
                hidden = await client.call_tool(tool, arguments)
                assert hidden.is_error and "404" in text_of(hidden) and "first." not in text_of(hidden), tool
            for label in ("../x", "a/b", "..", "notes?", "notes#", "notes%2F..%2Fx"):
                odd = await client.call_tool("block_read", {"agent": "echo", "label": label})
                assert odd.is_error and "no agent id or label" in text_of(odd), label
            routed = await client.call_tool("block_read", {"agent": "echo%2Fblocks%2Fnotes#", "label": "x"})
            assert routed.is_error and "first." not in text_of(routed)

    asyncio.run(scenario())
    wrong = httpx.post(f"{app.url}/mcp/", json={}, headers={"Authorization": "Bearer wrong"}, timeout=30)
    assert wrong.status_code == 401


def test_colony_mcp_stdio_serves_a_local_client(served: tuple[TenantApp, str]) -> None:
    app, _ = served
    colony = shutil.which("colony") or str(Path(sys.executable).with_name("colony"))
    params = StdioServerParameters(
        command=colony, args=["mcp", "--stdio", "--url", app.url, "--token", TOKEN]
    )

    async def scenario() -> None:
        async with Client(params) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            ran = await client.call_tool("run_agent", {"agent": "echo", "input": "over stdio"})
            assert text_of(ran) == "over stdio"

    asyncio.run(scenario())


def test_any_host_reaches_it_and_a_get_stream_is_refused(served: tuple[TenantApp, str]) -> None:
    """A colony is reached by its name or through a proxy (the token guards it, not the Host), and
    the stateless server holds no GET stream open."""
    app, _ = served

    async def scenario() -> None:
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {TOKEN}", "Host": "colony.example.com"}, timeout=60
        )
        async with Client(streamable_http_client(f"{app.url}/mcp/", http_client=http)) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS

    asyncio.run(scenario())
    held = httpx.get(f"{app.url}/mcp/", headers=HOME, timeout=10)
    assert held.status_code == 405
