"""The OpenAI-compatible door on a real `colony up` (issue 40, deliverable 3): the `openai` package,
unchanged, against the documented base URL, with the embedded model answering: a completion, a
streamed completion whose text is the run's output, JSON-schema output the engine's constrained
decoding holds to, and a two-turn conversation through a session."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from colony.blackboard.redis_server import free_port
from colony.config import ColonySettings, ServeSettings
from colony.serve import cluster

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 40}},
    "required": ["answer"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.ClusterInfo]:
    settings = ColonySettings(
        data_dir=tmp_path_factory.mktemp("colony-openai"),
        serve=ServeSettings(port=free_port(), num_cpus=2, replicas=1, replica_cpus=0.5),
    )
    info = cluster.up(settings)
    try:
        yield info
    finally:
        cluster.down(settings)


def test_the_openai_package_talks_to_a_colony_up(up: cluster.ClusterInfo) -> None:
    colony = openai.OpenAI(base_url=f"{up.url}/openai/v1", api_key=up.token, max_retries=0, timeout=600)
    assert "ask" in {m.id for m in colony.models.list()}
    answer = colony.chat.completions.create(
        model="ask", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12
    )
    assert answer.choices[0].message.content and answer.usage is not None
    assert 0 < answer.usage.completion_tokens <= 12 and answer.usage.prompt_tokens > 5  # the tokenizer's
    chunks = list(
        colony.chat.completions.create(
            model="ask", messages=[{"role": "user", "content": "Count to five."}], max_tokens=16, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    run = httpx.get(
        f"{up.url}/v1/runs/{chunks[0].id.removeprefix('chatcmpl-')}",
        headers={"Authorization": f"Bearer {up.token}"},
        timeout=60,
    ).json()
    assert text and text == run["output"]["content"]
    shaped = colony.chat.completions.create(
        model="ask",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}},
    )
    parsed = json.loads(shaped.choices[0].message.content or "")
    assert set(parsed) == {"answer"} and isinstance(parsed["answer"], str)
    called = colony.chat.completions.create(
        model="ask",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=60,
    )
    call = called.choices[0].message.tool_calls[0]  # the model's call, held to the function's schema
    assert call.function.name == "get_weather" and isinstance(
        json.loads(call.function.arguments)["city"], str
    )
    assert called.choices[0].finish_reason == "tool_calls"
    planned = colony.chat.completions.create(  # the assistant plans the call beside its own actions
        model="assistant",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
    )
    call = planned.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(
        json.loads(call.function.arguments)["city"], str
    )
    assert planned.choices[0].finish_reason == "tool_calls"
    assert planned.usage is not None and planned.usage.completion_tokens > 0  # the planner's model call
    answered = colony.chat.completions.create(
        model="assistant",
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            planned.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
        ],
        tools=[WEATHER],
    )
    assert answered.choices[0].message.content or answered.choices[0].message.tool_calls
    session = httpx.post(
        f"{up.url}/v1/sessions", json={}, headers={"Authorization": f"Bearer {up.token}"}, timeout=120
    ).json()["session_id"]
    for turn in ("My name is Dana.", "What is my name?"):
        reply = colony.chat.completions.create(
            model="session", messages=[{"role": "user", "content": turn}], extra_body={"session": session}
        )
        assert reply.choices[0].message.content
    tree = httpx.get(
        f"{up.url}/v1/sessions/{session}/messages",
        headers={"Authorization": f"Bearer {up.token}"},
        timeout=60,
    ).json()
    assert [m["content"] for m in tree["messages"] if m["role"] == "user"] == [
        "My name is Dana.",
        "What is my name?",
    ]


def test_the_mcp_package_talks_to_a_colony_up(up: cluster.ClusterInfo) -> None:
    """The MCP server through Serve's proxy: tools listed, an agent run with its progress, remember
    then recall in the assistant's memory, and a session's turn with the reply's pieces."""
    import asyncio

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def scenario() -> None:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {up.token}"}, timeout=600)
        async with Client(streamable_http_client(f"{up.url}/mcp/", http_client=http)) as client:
            assert "run_agent" in {t.name for t in (await client.list_tools()).tools}
            progress: list[str] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append(message or "")

            ran = await client.call_tool(
                "run_agent", {"agent": "echo", "input": "through Serve"}, progress_callback=on_progress
            )
            assert not ran.is_error and "through Serve" in "".join(
                getattr(p, "text", "") for p in ran.content
            )
            assert progress and progress[-1] == "completed"
            stored = await client.call_tool(
                "remember", {"agent": "assistant", "content": "The release is on the third of March."}
            )
            assert not stored.is_error, text(stored)
            found = await client.call_tool("recall", {"agent": "assistant", "query": "When is the release?"})
            assert "third of March" in text(found)
            session = json.loads(text(await client.call_tool("start_session", {})))["session_id"]
            pieces: list[str] = []

            async def on_piece(done: float, total: float | None, message: str | None) -> None:
                pieces.append(message or "")

            reply = await client.call_tool(
                "chat", {"session": session, "message": "My name is Dana."}, progress_callback=on_piece
            )
            assert not reply.is_error and text(reply).strip()  # the embedded model's reply
            assert text(reply).strip() in "".join(pieces[:-1]).strip()  # streamed as it was written
            assert pieces[-1] == "completed"

    asyncio.run(scenario())


def text(result: object) -> str:
    return "".join(getattr(p, "text", "") for p in getattr(result, "content", []))
