"""`client.stream(agent, input)`: a run submitted and streamed in one request (`stream: true`), as
`client.run` and `colony run` now do (issue 35, the token path: one request through Serve's proxy
less before the first token). Against the real API app (tests/test_api.py's `api`): the events
and the run id, one POST and no second request for the events, a retried submit's replay. Against
scripted answers: a stream cut after its head goes on at the run's own events after the last one
received; one refused before its head is raised, never resumed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from test_api import (
    TOKEN,
    api,  # noqa: F401 - `api` is a fixture
)
from test_client_retry import LosesFirstAnswer

from colony.client import ApiError, AsyncColonyClient, ColonyClient

STARTED = ("1-0", {"event_type": "started", "data": {}})
TOKEN_A = ("2-0", {"event_type": "token", "data": {"text": "a"}})
DONE = ("3-0", {"event_type": "completed", "data": {"output": "a"}})
HEAD = {"Content-Type": "text/event-stream", "Colony-Run-Id": "run-1"}


def _sse(*events: tuple[str, dict]) -> bytes:  # type: ignore[type-arg]
    return b"".join(f"id: {i}\ndata: {json.dumps(e)}\n\n".encode() for i, e in events)


class Counted(httpx.AsyncBaseTransport):
    """Passes requests through, keeping (method, path, stream flag) of each."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.seen: list[tuple[str, str, bool]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        streamed = request.method == "POST" and json.loads(request.content or b"{}").get("stream") is True
        self.seen.append((request.method, request.url.path, streamed))
        return await self.inner.handle_async_request(request)


async def test_a_streamed_run_names_itself_and_yields_its_events_from_one_request(api) -> None:  # noqa: F811
    http, _ = api
    transport = Counted(http._transport)
    async with AsyncColonyClient("http://colony", TOKEN, transport=transport) as colony:
        stream = colony.stream("ask", {"question": "What is six times seven?"})
        assert stream.run_id is None  # nothing sent yet
        events = [event async for event in stream]
        assert transport.seen == [("POST", "/v1/runs", True)]  # the events came with the submit
        kinds = [e["event_type"] for e in events]
        assert kinds[0] == "started" and kinds[-1] == "completed" and "token" in kinds
        text = "".join(e["data"]["text"] for e in events if e["event_type"] == "token")
        assert text.strip() == "The answer is forty two."
        assert stream.run_id is not None and {e["request_id"] for e in events} == {stream.run_id}
        assert (await colony.get(stream.run_id))["output"] == "The answer is forty two."

        transport.seen.clear()
        view = await colony.run("echo", {"n": 1})  # run(): one streamed submit, then the view
        assert view["status"] == "succeeded" and view["output"] == {"n": 1}
        assert transport.seen == [("POST", "/v1/runs", True), ("GET", f"/v1/runs/{view['run_id']}", False)]


async def test_a_refused_streamed_submit_is_raised_and_nothing_is_resumed(api) -> None:  # noqa: F811
    http, _ = api
    transport = Counted(http._transport)
    async with AsyncColonyClient("http://colony", TOKEN, transport=transport) as colony:
        stream = colony.stream("nobody", None)
        with pytest.raises(ApiError) as caught:
            [event async for event in stream]
        assert caught.value.status == 404 and stream.run_id is None
        assert transport.seen == [("POST", "/v1/runs", True)]


async def test_a_streamed_submit_whose_answer_was_lost_is_replayed_with_its_run(api) -> None:  # noqa: F811
    """The first answer lost: the retry (same key) is sent on to the run's events by a 303, whose
    Colony-Run-Id names the run; its events come once, and there is one run."""
    http, _ = api
    transport = LosesFirstAnswer(http._transport)
    async with AsyncColonyClient("http://colony", TOKEN, transport=transport) as colony:
        stream = colony.stream("echo", {"once": 2})
        events = [event async for event in stream]
    assert [e["event_type"] for e in events] == ["started", "step", "completed"]
    assert len(transport.posts) == 2 and transport.posts[0] == transport.posts[1] is not None
    assert {e["request_id"] for e in events} == {stream.run_id}


class Script:
    """Answers each request from a script: (status, headers, body or a body that breaks)."""

    def __init__(self, *answers: tuple[int, dict[str, str], bytes | Iterator[bytes]]) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[str, str, str | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path, request.headers.get("Last-Event-ID")))
        status, headers, body = self.answers.pop(0)
        return httpx.Response(status, headers=headers, content=body)


def _breaks_after(body: bytes) -> Iterator[bytes]:
    yield body
    raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def test_a_stream_cut_after_its_head_goes_on_at_the_runs_events() -> None:
    script = Script((200, HEAD, _breaks_after(_sse(STARTED, TOKEN_A))), (200, {}, _sse(DONE)))
    with ColonyClient("http://api", "t", transport=httpx.MockTransport(script)) as client:
        stream = client.stream("ask", {"question": "q"})
        assert [e["id"] for e in stream] == ["1-0", "2-0", "3-0"]  # each once, in order
    assert stream.run_id == "run-1"
    assert script.seen == [("POST", "/v1/runs", None), ("GET", "/v1/runs/run-1/events", "2-0")]


def test_a_stream_that_ends_without_its_terminal_event_goes_on_too() -> None:
    script = Script((200, HEAD, _sse(STARTED)), (503, {}, b"{}"), (200, {}, _sse(TOKEN_A, DONE)))
    with ColonyClient("http://api", "t", transport=httpx.MockTransport(script)) as client:
        assert [e["id"] for e in client.stream("ask")] == ["1-0", "2-0", "3-0"]
    assert [s[2] for s in script.seen] == [None, "1-0", "1-0"]


def test_an_answer_without_a_run_id_or_refused_is_raised_not_resumed() -> None:
    script = Script((200, {"Content-Type": "text/event-stream"}, _sse(STARTED)))
    client = ColonyClient("http://api", "t", transport=httpx.MockTransport(script))
    with client, pytest.raises(ApiError) as caught:
        list(client.stream("ask"))
    assert caught.value.code == "stream_without_run" and len(script.seen) == 1

    error = json.dumps({"error": {"code": "invalid_argument", "message": "input: too deep"}}).encode()
    script = Script((422, {"Content-Type": "application/json"}, error))
    client = ColonyClient("http://api", "t", transport=httpx.MockTransport(script))
    with client, pytest.raises(ApiError) as caught:
        list(client.stream("ask"))
    assert caught.value.status == 422 and len(script.seen) == 1  # a 4xx is neither retried nor resumed


async def _abreaks_after(body: bytes) -> AsyncIterator[bytes]:
    yield body
    raise httpx.ReadError("connection reset")


async def test_the_async_stream_goes_on_the_same_way() -> None:
    script = Script((200, HEAD, _abreaks_after(_sse(STARTED))), (200, {}, _sse(TOKEN_A, DONE)))  # type: ignore[arg-type]
    async with AsyncColonyClient("http://api", "t", transport=httpx.MockTransport(script)) as client:
        stream = client.stream("ask")
        assert [e["id"] async for e in stream] == ["1-0", "2-0", "3-0"]
    assert stream.run_id == "run-1" and [s[2] for s in script.seen] == [None, "1-0"]


# -- found by the attacking review -----------------------------------------------------------------


def test_iterating_again_goes_on_after_the_last_event_and_never_submits_again() -> None:
    script = Script((200, HEAD, _sse(STARTED, TOKEN_A)), (200, {}, _sse(DONE)))
    with ColonyClient("http://api", "t", transport=httpx.MockTransport(script)) as client:
        stream = client.stream("ask")
        for _event in stream:
            break  # the consumer stops after the first event
        assert [e["id"] for e in stream] == ["3-0"]  # (the server sends from after 1-0 on)
        assert list(stream) == []  # ended: nothing more, nothing sent
    assert [(m, p) for m, p, _ in script.seen] == [("POST", "/v1/runs"), ("GET", "/v1/runs/run-1/events")]
    assert script.seen[1][2] == "1-0"


def test_the_submit_has_a_timeout_for_its_head_and_none_between_events() -> None:
    seen: list[dict[str, float | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200, headers=HEAD, content=_sse(DONE))

    with ColonyClient("http://api", "t", timeout=7, transport=httpx.MockTransport(handler)) as client:
        list(client.stream("ask"))
    assert seen[0]["connect"] == 7 and seen[0]["read"] is None


def test_a_replay_whose_events_fail_once_goes_on_with_the_run_it_named() -> None:
    replay = {"Location": "/v1/runs/run-1/events", "Idempotent-Replayed": "true", "Colony-Run-Id": "run-1"}
    script = Script((303, replay, b"{}"), (503, {}, b"{}"), (200, {}, _sse(STARTED, DONE)))
    with ColonyClient("http://api", "t", transport=httpx.MockTransport(script)) as client:
        stream = client.stream("ask")
        assert [e["id"] for e in stream] == ["1-0", "3-0"] and stream.run_id == "run-1"
    assert [m for m, _, _ in script.seen] == ["POST", "GET", "GET"]


def test_a_replay_to_another_host_is_not_followed_with_the_token() -> None:
    replay = {"Location": "http://evil.example/v1/runs/run-1/events", "Idempotent-Replayed": "true"}
    script = Script((303, replay, b"{}"))
    client = ColonyClient("http://api", "secret", transport=httpx.MockTransport(script))
    with client, pytest.raises(ApiError) as caught:
        list(client.stream("ask"))
    assert caught.value.code == "bad_replay" and len(script.seen) == 1


def test_a_server_that_ignores_last_event_id_is_not_streamed_for_ever() -> None:
    script = Script(*[(200, {}, _sse(STARTED, TOKEN_A)) for _ in range(40)])
    client = ColonyClient("http://api", "t", transport=httpx.MockTransport(script), reconnect_seconds=0.5)
    with client, pytest.raises(ApiError):
        events = []
        for event in client.events("run-1"):
            events.append(event["id"])
    assert events == ["1-0", "2-0"]  # each once; then given up after the window without progress
    once = ColonyClient(
        "http://api",
        "t",
        transport=httpx.MockTransport(Script((200, {}, _sse(STARTED)))),
        reconnect_seconds=0,
    )
    with once, pytest.raises(ApiError):
        list(once.events("run-1"))  # 0: never reconnects (one request, then the error)
