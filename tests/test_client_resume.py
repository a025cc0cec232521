"""Issue 12: a run's event stream that breaks before its terminal event (the API replica serving it
was killed, the API answers 503 while it restarts) is resumed by the clients after the last event
they handed out, so `colony run` neither fails nor repeats events."""

from __future__ import annotations

import json

import httpx
import pytest

from colony.client import ApiError, AsyncColonyClient, ColonyClient


def _sse(*events: tuple[str, dict]) -> bytes:  # type: ignore[type-arg]
    return b"".join(f"id: {i}\ndata: {json.dumps(e)}\n\n".encode() for i, e in events)


TOKEN_1 = ("1-0", {"event_type": "token", "data": {"text": "a"}})
TOKEN_2 = ("2-0", {"event_type": "token", "data": {"text": "b"}})
DONE = ("3-0", {"event_type": "completed", "data": {"output": "ab"}})


class Server:
    """Answers each connection from a script: a body (a stream cut after it), or a status."""

    def __init__(self, *answers: bytes | int) -> None:
        self.answers = list(answers)
        self.seen_ids: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen_ids.append(request.headers.get("Last-Event-ID"))
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            return httpx.Response(answer, json={"error": {"code": "unavailable", "message": "down"}})
        return httpx.Response(200, content=answer, headers={"Content-Type": "text/event-stream"})


def test_a_stream_cut_before_the_terminal_event_is_resumed_after_the_last_event() -> None:
    server = Server(_sse(TOKEN_1), 503, _sse(TOKEN_2), _sse(DONE))
    with ColonyClient("http://api", "t", transport=httpx.MockTransport(server)) as client:
        events = list(client.events("run-1"))
    assert [e["id"] for e in events] == ["1-0", "2-0", "3-0"]  # each once, in order, to the end
    assert server.seen_ids == [None, "1-0", "1-0", "2-0"]


def test_a_transport_error_is_resumed_too() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        assert request.headers.get("Last-Event-ID") == "x-1"
        return httpx.Response(200, content=_sse(DONE))

    with ColonyClient("http://api", "t", transport=httpx.MockTransport(handler)) as client:
        assert [e["id"] for e in client.events("run-1", last_event_id="x-1")] == ["3-0"]


def test_errors_that_a_retry_cannot_fix_are_raised_at_once() -> None:
    server = Server(404)
    client = ColonyClient("http://api", "t", transport=httpx.MockTransport(server))
    with client, pytest.raises(ApiError) as caught:
        list(client.events("run-1"))
    assert caught.value.status == 404 and len(server.seen_ids) == 1


def test_it_gives_up_after_the_window_without_events() -> None:
    server = Server(*([503] * 50))
    client = ColonyClient("http://api", "t", transport=httpx.MockTransport(server), reconnect_seconds=0.5)
    with client, pytest.raises(ApiError) as caught:
        list(client.events("run-1"))
    assert caught.value.status == 503 and 2 <= len(server.seen_ids) < 10


async def test_the_async_client_resumes_the_same_way() -> None:
    server = Server(_sse(TOKEN_1, TOKEN_2), 502, _sse(DONE))
    async with AsyncColonyClient("http://api", "t", transport=httpx.MockTransport(server)) as client:
        events = [e async for e in client.events("run-1")]
    assert [e["id"] for e in events] == ["1-0", "2-0", "3-0"]
    assert server.seen_ids == [None, "2-0", "2-0"]


def test_a_404_from_the_proxy_before_the_app_is_back_is_resumed() -> None:
    """After `colony up` restarts the cluster, Serve's proxy answers 404 (a plain text body, not the
    API's error) until the app is deployed: the stream is resumed, not given up."""
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            return httpx.Response(404, text="Path '/v1/runs/run-1/events' not found. Ping /-/routes")
        return httpx.Response(200, content=_sse(DONE))

    with ColonyClient("http://api", "t", transport=httpx.MockTransport(handler)) as client:
        assert [e["id"] for e in client.events("run-1")] == ["3-0"]


def test_a_plain_500_from_the_proxy_for_a_dying_replica_is_resumed() -> None:
    """Serve's proxy answers a plain-text 500 (no Colony error body) for a request it had routed
    to an API replica that died under it: the stream is resumed after the last event; the API's
    own errors carry a Colony body and are raised at once."""
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            return httpx.Response(200, content=_sse(TOKEN_1))
        if calls["n"] == 2:
            return httpx.Response(500, text="Internal Server Error")
        assert request.headers.get("Last-Event-ID") == "1-0"
        return httpx.Response(200, content=_sse(DONE))

    with ColonyClient("http://api", "t", transport=httpx.MockTransport(handler)) as client:
        assert [e["id"] for e in client.events("run-1")] == ["1-0", "3-0"]

    server = Server(500)  # a Colony error body: the API's own 500
    client = ColonyClient("http://api", "t", transport=httpx.MockTransport(server))
    with client, pytest.raises(ApiError) as caught:
        list(client.events("run-1"))
    assert caught.value.status == 500 and len(server.seen_ids) == 1
