"""How a run's answer goes out over HTTP: a submit that waits for the end (`wait_s`), and event
streams sent in as few ASGI messages as the events arrive in (behind Serve each message is an
item the proxy relays, at about the cost of a small request)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from colony.api import event_stream as sse_module
from colony.api.app import ApiServices, create_app
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import echo_blueprint
from colony.system.host import ReplicaHost
from colony.system.registry import AgentRecord
from colony.system.runs import RunService

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def served(bb: Blackboard, redis_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, Any, ReplicaHost]]:
    settings = ColonySettings(redis_url=redis_url, colony_id=f"ans{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "replica-a", engine=ScriptedEngine(["unused"]))
    await host.start(bb)
    await host.ensure_agent(echo_blueprint())
    assert host.registry is not None
    await host.registry.put(AgentRecord(agent_id="sleepy", state="idle"))  # registered, nobody serves it
    runs = RunService(bb, host.registry, settings=settings)
    app = create_app(ApiServices(runs=runs, registry=host.registry, token=TOKEN))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://colony") as client:
        yield client, app, host
    await host.close()


def events_of(text: str) -> list[str]:
    return [line[7:] for line in text.splitlines() if line.startswith("event: ")]


async def test_a_submit_with_wait_s_answers_with_the_ended_run(served) -> None:
    client, _, _ = served
    answer = await client.post(
        "/v1/runs", json={"agent": "echo", "input": {"x": [1, "two"]}, "wait_s": 10}, headers=AUTH
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    run_id = answer.headers["colony-run-id"]
    assert answer.headers["content-location"] == f"/v1/runs/{run_id}"
    assert body["run_id"] == run_id and body["agent"] == "echo"
    assert body["status"] == "succeeded" and body["output"] == {"x": [1, "two"]} and body["error"] is None
    assert body["updated_at"] >= body["created_at"]
    # what it answered is what GET shows for the run
    view = (await client.get(f"/v1/runs/{run_id}", headers=AUTH)).json()
    assert {k: view[k] for k in ("status", "output", "error", "agent")} == {
        k: body[k] for k in ("status", "output", "error", "agent")
    }


async def test_a_run_still_going_after_wait_s_is_answered_as_submitted(served) -> None:
    client, _, _ = served
    started = asyncio.get_running_loop().time()
    answer = await client.post("/v1/runs", json={"agent": "sleepy", "wait_s": 0.3}, headers=AUTH)
    waited = asyncio.get_running_loop().time() - started
    assert answer.status_code == 202 and answer.json()["status"] == "queued"
    assert 0.3 <= waited < 5
    run_id = answer.json()["run_id"]
    assert (await client.get(f"/v1/runs/{run_id}", headers=AUTH)).json()["status"] == "queued"  # goes on
    # a run ended by its deadline within the wait is answered as ended (failed), not as queued
    timed = await client.post(
        "/v1/runs", json={"agent": "sleepy", "wait_s": 5, "timeout_s": 0.2}, headers=AUTH
    )
    assert timed.status_code == 200 and timed.json()["status"] == "failed"
    assert "timed out" in timed.json()["error"]


@pytest.mark.parametrize(
    "body",
    [
        {"agent": "echo", "wait_s": 0},
        {"agent": "echo", "wait_s": -1},
        {"agent": "echo", "wait_s": 601},
        {"agent": "echo", "wait_s": "soon"},
        {"agent": "echo", "wait_s": 5, "stream": True},
    ],
)
async def test_wait_s_out_of_bounds_or_with_stream_is_refused_with_its_field(served, body) -> None:
    client, _, _ = served
    answer = await client.post("/v1/runs", json=body, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert "wait_s" in answer.text
    nan = await client.post(
        "/v1/runs",
        content=b'{"agent": "echo", "wait_s": NaN}',
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert nan.status_code == 422


async def asgi_call(
    app: Any,
    path: str,
    body: dict[str, Any] | None,
    sent: list[dict[str, Any]],
    first: asyncio.Event | None = None,
) -> None:
    """One request straight to the ASGI app, each message it sends appended to `sent` (the
    messages Serve relays one by one)."""
    raw = json.dumps(body).encode() if body is not None else b""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST" if body is not None else "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"colony"),
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("colony", 80),
    }
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if first is not None:
            first.set()

    await app(scope, receive, send)


async def asgi_messages(app: Any, path: str, body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    await asyncio.wait_for(asgi_call(app, path, body, sent), 20)
    return sent


async def test_events_that_arrived_together_go_in_one_message_that_also_ends_the_response(served) -> None:
    client, app, _ = served
    done = await client.post("/v1/runs", json={"agent": "echo", "input": 1, "wait_s": 10}, headers=AUTH)
    run_id = done.json()["run_id"]
    # an ended run: every event is at hand, so the head and one body (the last) are all it takes
    messages = await asgi_messages(app, f"/v1/runs/{run_id}/events")
    assert [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    assert messages[1]["more_body"] is False
    assert events_of(messages[1]["body"].decode()) == ["started", "step", "completed"]
    # a live stream: the head goes with the first events, the terminal event closes the response
    live = await asgi_messages(app, "/v1/runs", {"agent": "echo", "input": 2, "stream": True})
    assert live[0]["type"] == "http.response.start" and live[0]["status"] == 200
    bodies = live[1:]
    assert all(m["type"] == "http.response.body" for m in bodies)
    assert [m["more_body"] for m in bodies] == [True] * (len(bodies) - 1) + [False]
    assert bodies[-1]["body"], "no empty closing message after the terminal event"
    text = b"".join(m["body"] for m in bodies).decode()
    assert events_of(text) == ["started", "step", "completed"]
    assert len(bodies) <= 3


async def test_started_waits_briefly_for_what_follows_and_goes_in_its_message(served, monkeypatch) -> None:
    """A run's `started` event is held (here up to 5 s) for the events that follow it: a run that
    ends meanwhile streams in one message, as a waited-for run answers."""
    _, app, _ = served
    monkeypatch.setattr(sse_module, "STARTED_HOLD_SECONDS", 5.0)
    live = await asgi_messages(app, "/v1/runs", {"agent": "echo", "input": 3, "stream": True})
    bodies = [m for m in live if m["type"] == "http.response.body"]
    assert len(bodies) == 1 and bodies[0]["more_body"] is False
    assert events_of(bodies[0]["body"].decode()) == ["started", "step", "completed"]


def sleepy_board(host: ReplicaHost) -> Blackboard:
    """The run scope of `sleepy` (registered, served by nobody), to write its runs' events as an
    agent would."""
    from colony.blackboard import AgentRunProtocol, BlackboardScope, scope_id

    agent = scope_id(
        BlackboardScope.AGENT, tenant_id="default", colony_id=host.settings.colony_id, agent_id="sleepy"
    )
    return host.blackboard.scoped(AgentRunProtocol.namespaced_scope(agent, "runs"))


async def messages_sent(sent: list[dict[str, Any]], count: int, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while len(sent) < count:  # noqa: ASYNC110 - the list an ASGI send appends to
            await asyncio.sleep(0.01)


async def write_event(board: Blackboard, run_id: str, seq: int, kind: str) -> None:
    from colony.blackboard import AgentRunProtocol

    await board.write(
        AgentRunProtocol.event_key(run_id, f"{seq:05d}.{kind}"),
        {"request_id": run_id, "seq": seq, "event_type": kind, "data": {}},
        created_by="sleepy",
        value_in_event=True,
    )


async def test_a_held_started_event_goes_once_the_next_comes_or_the_hold_is_over(served, monkeypatch) -> None:
    """The hold never delays what follows `started` (a first token goes when it comes, with
    `started`), and `started` goes alone once the hold is over if nothing follows."""
    _, app, host = served
    for hold, then in ((5.0, "token"), (0.2, None)):
        monkeypatch.setattr(sse_module, "STARTED_HOLD_SECONDS", hold)
        sent: list[dict[str, Any]] = []
        task = asyncio.create_task(asgi_call(app, "/v1/runs", {"agent": "sleepy", "stream": True}, sent))
        try:
            await messages_sent(sent, 1, 5)  # the head, alone once HEAD_WAIT_SECONDS is over
            board, run_id = sleepy_board(host), dict(sent[0]["headers"])[b"colony-run-id"].decode()
            await write_event(board, run_id, 1, "started")
            await asyncio.sleep(0.3)
            if then is not None:
                assert len(sent) == 1  # held: nothing came after `started` yet
                await write_event(board, run_id, 2, then)
            await messages_sent(sent, 2, 2)  # well within a hold of 5 s
            assert events_of(sent[1]["body"].decode()) == ["started", *([then] if then else [])]
            assert sent[1]["more_body"] is True and not task.done()
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def test_the_stream_head_goes_alone_once_the_wait_for_events_is_over(served, monkeypatch) -> None:
    """The client learns the run id (its header) while the run waits to be served."""
    _, app, _ = served
    monkeypatch.setattr(sse_module, "HEAD_WAIT_SECONDS", 0.05)
    sent: list[dict[str, Any]] = []
    first = asyncio.Event()
    task = asyncio.create_task(asgi_call(app, "/v1/runs", {"agent": "sleepy", "stream": True}, sent, first))
    try:
        await asyncio.wait_for(first.wait(), 30)  # (the order is the point, not the speed: a busy CI)
        assert sent[0]["type"] == "http.response.start"
        assert dict(sent[0]["headers"])[b"colony-run-id"].startswith(b"run-")
        await asyncio.sleep(0.2)
        assert len(sent) == 1 and not task.done()  # no events yet; the stream goes on
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_runs_submitted_while_the_agents_stream_is_read_start_there_and_miss_nothing(
    served, monkeypatch
) -> None:
    """A submit takes where its run's events start from the shared reader when that reads the
    agent's stream already (no round trip); every concurrent stream still gets all its events."""
    client, _, _ = served
    from colony.blackboard.blackboard import Blackboard as Board

    asked: list[str] = []
    latest = Board.latest_event_id

    async def counted(self: Board) -> str:
        asked.append(self.scope_id)
        return await latest(self)

    monkeypatch.setattr(Board, "latest_event_id", counted)
    quiet = await client.post("/v1/runs", json={"agent": "sleepy", "wait_s": 0.1}, headers=AUTH)
    assert quiet.status_code == 202 and len(asked) == 1  # nobody reads sleepy's stream: Redis is asked
    asked.clear()

    async def one(n: int) -> list[str]:
        answer = await client.post(
            "/v1/runs", json={"agent": "echo", "input": n, "stream": True}, headers=AUTH
        )
        assert answer.status_code == 200
        return events_of(answer.text)

    async with asyncio.timeout(60):
        streams = await asyncio.gather(*(one(n) for n in range(1, 25)))
    assert all(kinds == ["started", "step", "completed"] for kinds in streams)
    assert asked == []  # echo's stream is read (by echo itself here, by other runs' streams in an API)


async def test_a_client_gone_during_the_head_wait_cancels_cleanly(served, monkeypatch) -> None:
    """Cancelled while the head waits for the first events: the cancellation itself comes out
    (no error of the stream's own), and the run's subscription is let go."""
    _, app, host = served
    monkeypatch.setattr(sse_module, "HEAD_WAIT_SECONDS", 5.0)
    sent: list[dict[str, Any]] = []
    task = asyncio.create_task(asgi_call(app, "/v1/runs", {"agent": "sleepy", "stream": True}, sent))
    await asyncio.sleep(0.3)
    assert sent == []  # still waiting for events to go with the head
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    from colony.blackboard.event_reader import running_reader

    reader = running_reader(host.blackboard.redis)
    assert reader is not None
    assert not [key for key in reader._where if ":agent:sleepy:" in key]  # nobody reads sleepy's runs


async def hostile_end(
    client: httpx.AsyncClient, host: ReplicaHost, terminal: dict[str, Any]
) -> httpx.Response:
    """A wait_s submit to `sleepy` whose terminal event (as a misbehaving agent could write it)
    is `terminal`: written while the submit waits."""
    from colony.blackboard import AgentRunProtocol

    waiting = asyncio.create_task(
        client.post("/v1/runs", json={"agent": "sleepy", "wait_s": 10}, headers=AUTH)
    )
    await asyncio.sleep(0.3)
    board = sleepy_board(host)
    requests = [e.key async for e in board.iter_query(AgentRunProtocol.pattern("request"))]
    run_id = AgentRunProtocol.parse_request_key(sorted(requests)[-1])  # the only one
    await board.write(
        AgentRunProtocol.event_key(run_id, "00001.completed"),
        {"request_id": run_id, "seq": 1, **terminal},
        created_by="sleepy",
        value_in_event=True,
    )
    return await waiting


@pytest.mark.parametrize(
    "terminal",
    [
        {"event_type": "completed", "ts": float("inf"), "data": {"output": float("nan"), "error": None}},
        {"event_type": "completed", "ts": 10**400, "data": {"output": [1], "error": {"not": "text"}}},
        {"event_type": "completed", "ts": "yesterday", "data": "not an object"},
    ],
)
async def test_a_hostile_terminal_event_still_answers_a_wait(served, terminal) -> None:
    client, _, host = served
    answer = await hostile_end(client, host, terminal)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "succeeded" and body["updated_at"] >= body["created_at"]
    assert body["error"] is None or isinstance(body["error"], str)


async def test_an_event_type_that_is_no_text_is_not_an_end(served) -> None:
    client, _, host = served
    waiting = asyncio.create_task(hostile_end(client, host, {"event_type": ["completed"], "data": {}}))
    done, _ = await asyncio.wait({waiting}, timeout=1.5)
    assert not done  # not taken for the end (nor a crash): the wait goes on
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_wait_whose_redis_fails_answers_as_submitted(served, monkeypatch) -> None:
    """The run exists once submitted: a Redis failure while waiting answers 202 with its id (a
    retrying client would submit it twice on a 503)."""
    client, _, _ = served
    from colony.errors import BlackboardUnavailable

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise BlackboardUnavailable("xread", "redis://blip")

    monkeypatch.setattr(sse_module, "wait_for_end", failing)
    import colony.api.routes.runs as runs_module

    monkeypatch.setattr(runs_module, "wait_for_end", failing)
    answer = await client.post("/v1/runs", json={"agent": "echo", "input": 1, "wait_s": 5}, headers=AUTH)
    assert answer.status_code == 202 and answer.json()["run_id"].startswith("run-")


async def test_runs_followed_by_stream_or_wait_are_counted_once(served) -> None:
    client, _, _ = served
    from colony import metrics

    def succeeded() -> float:
        return metrics.RUNS_COMPLETED.labels("succeeded")._value.get()

    before = succeeded()
    waited = await client.post("/v1/runs", json={"agent": "echo", "input": 1, "wait_s": 10}, headers=AUTH)
    streamed = await client.post("/v1/runs", json={"agent": "echo", "input": 2, "stream": True}, headers=AUTH)
    assert waited.status_code == 200 and streamed.status_code == 200
    assert succeeded() == before + 2
    await client.get(f"/v1/runs/{waited.json()['run_id']}", headers=AUTH)  # read again: not again
    await client.get(f"/v1/runs/{streamed.headers['colony-run-id']}/events", headers=AUTH)
    assert succeeded() == before + 2
