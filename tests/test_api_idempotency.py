"""Idempotent HTTP writes (issue 34, deliverable 3): a write sent with an `Idempotency-Key` runs
once, on the real API app served by uvicorn over a real redis-server (memory blocks: their effect,
a new version, is counted from the block's history), and, for runs, the real app in-process with
agents hosted by a ReplicaHost (the `api` fixture of tests/test_api.py).

Same key twice: one effect, the same answer; the same key with another body: 422, nothing done;
the same key sent at once from many clients: one effect; no key: as before; a 5xx is not kept
(the retry runs again); a key too long or with bad characters: 422 naming the header; a request
whose process stopped mid-way: its retry is refused as of unknown outcome, never run again."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_kit import BareApi
from test_api import AUTH as RUN_AUTH
from test_api import api, parse_sse  # noqa: F401 - `api` is a fixture

from colony import metrics
from colony.api import idempotency
from colony.config import ColonySettings
from colony.errors import BlackboardUnavailable
from colony.memory.blocks import BlockStore

TOKEN = "idem-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class IdemApp(BareApi):
    def __init__(self, redis_url: str, data_dir: Path) -> None:
        settings = ColonySettings(
            redis_url=redis_url, data_dir=data_dir, colony_id=f"idem{uuid.uuid4().hex[:8]}"
        )
        super().__init__(settings, TOKEN)


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdemApp]:
    with IdemApp(redis_server.url, tmp_path_factory.mktemp("idem-api")) as app:
        yield app


@pytest.fixture
def http(served: IdemApp) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=60) as client:
        yield client


def block(http: httpx.Client) -> str:
    """A fresh colony block (no agent needed); its path."""
    label = f"idem_{uuid.uuid4().hex[:8]}"
    created = http.post("/v1/colony/blocks", json={"label": label, "content": "start"})
    assert created.status_code == 201, created.text
    return f"/v1/colony/blocks/{label}"


def versions(http: httpx.Client, path: str) -> int:
    response = http.get(f"{path}/history")
    assert response.status_code == 200, response.text
    return len(response.json()["versions"])


def content(http: httpx.Client, path: str) -> str:
    return str(http.get(path).json()["content"])


def counted(outcome: str) -> float:
    return float(metrics.HTTP_IDEMPOTENT.labels(outcome)._value.get())


def test_a_retry_with_the_same_key_gets_the_first_answer_and_changes_nothing(http: httpx.Client) -> None:
    path = block(http)
    before = versions(http, path)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    replays = counted("replayed")
    first = http.post(f"{path}/append", json={"text": "line one"}, headers=key)
    assert first.status_code == 200, first.text
    assert "idempotent-replayed" not in first.headers
    again = http.post(f"{path}/append", json={"text": "line one"}, headers=key)
    assert again.status_code == first.status_code
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["content-type"] == first.headers["content-type"]
    assert versions(http, path) == before + 1
    assert content(http, path).count("line one") == 1
    assert counted("replayed") == replays + 1
    # the key belongs to that route: on another route it is another request
    other = http.put(path, json={"content": "rewritten"}, headers=key)
    assert other.status_code == 200 and "idempotent-replayed" not in other.headers
    # a DELETE (204, no body) replays as such
    gone_key = {"Idempotency-Key": "delete-" + uuid.uuid4().hex}
    assert http.delete(path, headers=gone_key).status_code == 204
    replay = http.delete(path, headers=gone_key)
    assert replay.status_code == 204 and replay.headers["idempotent-replayed"] == "true"
    assert http.get(path).status_code == 404


def test_the_same_key_with_another_body_is_refused_and_changes_nothing(http: httpx.Client) -> None:
    path = block(http)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    assert http.post(f"{path}/append", json={"text": "first"}, headers=key).status_code == 200
    after_first = versions(http, path)
    reused = counted("reused")
    refused = http.post(f"{path}/append", json={"text": "second"}, headers=key)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "idempotency_key_reused" and "Idempotency-Key" in error["message"]
    query = http.post(f"{path}/append", json={"text": "first"}, headers=key, params={"owner": "x"})
    assert query.status_code == 422 and query.json()["error"]["code"] == "idempotency_key_reused"
    assert versions(http, path) == after_first and "second" not in content(http, path)
    assert counted("reused") == reused + 2


async def test_concurrent_duplicates_run_once(served: IdemApp) -> None:
    """Twelve clients send one append with one key at the same moment: one version, and every
    answer is the first one (those that came while it ran waited for it)."""
    async with httpx.AsyncClient(base_url=served.url, headers=AUTH, timeout=60) as client:
        label = f"idem_{uuid.uuid4().hex[:8]}"
        path = f"/v1/colony/blocks/{label}"
        assert (await client.post("/v1/colony/blocks", json={"label": label})).status_code == 201
        before = len((await client.get(f"{path}/history")).json()["versions"])
        key = {"Idempotency-Key": str(uuid.uuid4())}
        answers = await asyncio.gather(
            *(client.post(f"{path}/append", json={"text": "once"}, headers=key) for _ in range(12))
        )
        assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
        assert len({a.text for a in answers}) == 1
        assert sum(a.headers.get("idempotent-replayed") == "true" for a in answers) == 11
        assert len((await client.get(f"{path}/history")).json()["versions"]) == before + 1
        assert (await client.get(path)).json()["content"].count("once") == 1


def test_without_a_key_writes_behave_as_before(http: httpx.Client) -> None:
    path = block(http)
    before = versions(http, path)
    for _ in range(2):
        answer = http.post(f"{path}/append", json={"text": "twice"})
        assert answer.status_code == 200 and "idempotent-replayed" not in answer.headers
    assert versions(http, path) == before + 2
    assert content(http, path).count("twice") == 2
    # a key on a read is ignored: GET is idempotent already
    read = http.get(path, headers={"Idempotency-Key": "not a key at all"})
    assert read.status_code == 200


def test_a_5xx_is_not_kept_and_the_retry_runs_again(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = block(http)
    before = versions(http, path)
    real = BlockStore.append
    failures = {"left": 1}

    async def flaky(self: BlockStore, *args: Any, **kwargs: Any) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            raise BlackboardUnavailable("append", "redis://test", ConnectionError("gone"))
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(BlockStore, "append", flaky)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    released = counted("released")
    failed = http.post(f"{path}/append", json={"text": "after a 503"}, headers=key)
    assert failed.status_code == 503, failed.text
    assert versions(http, path) == before
    retried = http.post(f"{path}/append", json={"text": "after a 503"}, headers=key)
    assert retried.status_code == 200 and "idempotent-replayed" not in retried.headers
    assert versions(http, path) == before + 1
    assert counted("released") == released + 1
    replay = http.post(f"{path}/append", json={"text": "after a 503"}, headers=key)
    assert replay.headers["idempotent-replayed"] == "true" and replay.json() == retried.json()


@pytest.mark.parametrize("key", ["k" * 129, "with space", "semi;colon", "-leading-dash", "", "ключ"])
def test_a_malformed_key_is_a_422_naming_the_header(http: httpx.Client, key: str) -> None:
    path = block(http)
    before = versions(http, path)
    refused = http.post(f"{path}/append", json={"text": "never"}, headers={"Idempotency-Key": key.encode()})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_request" and error["message"].startswith("Idempotency-Key")
    assert f"({len(key.encode())} characters)" in error["message"] and "1-128 characters" in error["message"]
    assert versions(http, path) == before
    longest = http.post(f"{path}/append", json={"text": "ok"}, headers={"Idempotency-Key": "k" * 128})
    assert longest.status_code == 200
    two = [("Idempotency-Key", "a1"), ("Idempotency-Key", "a2")]
    assert http.post(f"{path}/append", json={"text": "x"}, headers=two).status_code == 422
    assert versions(http, path) == before + 1


class ReplicaKilled(BaseException):
    """What a killed process looks like from inside a request: it ends, nothing after it runs."""


def test_a_request_whose_process_stopped_is_never_run_again(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case on a route that is not effect-keyed (creating a block): the block is made,
    then the replica serving it dies before it answers. A retry meanwhile is told the first still
    runs (409, Retry-After); once its lease lapsed, that its outcome is unknown (409): never run
    twice."""
    monkeypatch.setattr(idempotency, "LEASE_SECONDS", 2.0)
    monkeypatch.setattr(idempotency, "WAIT_SECONDS", 0.2)
    real = BlockStore.create_colony_block

    async def dies_after(self: BlockStore, *args: Any, **kwargs: Any) -> Any:
        await real(self, *args, **kwargs)
        raise ReplicaKilled

    monkeypatch.setattr(BlockStore, "create_colony_block", dies_after)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    body = {"label": f"idem_{uuid.uuid4().hex[:8]}", "content": "made"}
    lost = http.post("/v1/colony/blocks", json=body, headers=key)
    assert lost.status_code == 500  # uvicorn's answer for an app that ended without one
    monkeypatch.setattr(BlockStore, "create_colony_block", real)
    running = http.post("/v1/colony/blocks", json=body, headers=key)
    assert running.status_code == 409, running.text
    assert running.json()["error"]["code"] == "idempotency_in_flight"
    assert int(running.headers["retry-after"]) >= 1
    time.sleep(2.2)
    unknown = http.post("/v1/colony/blocks", json=body, headers=key)
    assert unknown.status_code == 409, unknown.text
    assert unknown.json()["error"]["code"] == "idempotency_outcome_unknown"
    assert http.get(f"/v1/colony/blocks/{body['label']}").status_code == 200  # made, once


def test_an_effect_keyed_request_whose_process_stopped_is_finished_by_its_retry(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on an effect-keyed route (an append): once the dead claimant's lease lapsed, the
    retry takes its claim over and runs the request again, whose redo finds the edit made: 200,
    the line stored once."""
    monkeypatch.setattr(idempotency, "LEASE_SECONDS", 2.0)
    monkeypatch.setattr(idempotency, "WAIT_SECONDS", 0.2)
    path = block(http)
    real = BlockStore.append

    async def dies_after(self: BlockStore, *args: Any, **kwargs: Any) -> Any:
        await real(self, *args, **kwargs)
        raise ReplicaKilled

    monkeypatch.setattr(BlockStore, "append", dies_after)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    assert http.post(f"{path}/append", json={"text": "landed"}, headers=key).status_code == 500
    monkeypatch.setattr(BlockStore, "append", real)
    running = http.post(f"{path}/append", json={"text": "landed"}, headers=key)
    assert running.status_code == 409 and running.json()["error"]["code"] == "idempotency_in_flight"
    other = http.post(f"{path}/append", json={"text": "another"}, headers=key)
    assert other.status_code == 422  # the key of another request is never taken over
    time.sleep(2.2)
    before = versions(http, path)
    finished = http.post(f"{path}/append", json={"text": "landed"}, headers=key)
    assert finished.status_code == 200, finished.text
    assert content(http, path).count("landed") == 1 and versions(http, path) == before
    again = http.post(f"{path}/append", json={"text": "landed"}, headers=key)
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"


def test_a_large_answer_is_kept_as_its_status_and_a_note(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idempotency, "MAX_KEPT_BODY", 16)
    path = block(http)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    first = http.post(f"{path}/append", json={"text": "big"}, headers=key)
    assert first.status_code == 200 and len(first.content) > 16
    again = http.post(f"{path}/append", json={"text": "big"}, headers=key)
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["replayed"] is True and "16 bytes" in again.json()["note"]
    assert content(http, path).count("big") == 1


async def test_a_run_submitted_twice_with_one_key_is_one_run(api) -> None:  # noqa: F811
    client, _ = api
    key = {**RUN_AUTH, "Idempotency-Key": str(uuid.uuid4())}
    body = {"agent": "echo", "input": {"n": 1}}
    first = await client.post("/v1/runs", json=body, headers=key)
    assert first.status_code == 202, first.text
    again = await client.post("/v1/runs", json=body, headers=key)
    assert again.status_code == 202 and again.json() == first.json()
    other = await client.post("/v1/runs", json=body, headers={**RUN_AUTH, "Idempotency-Key": "another"})
    assert other.json()["run_id"] != first.json()["run_id"]


async def test_a_streamed_answer_is_replayed_as_a_redirect_to_the_runs_events(api) -> None:  # noqa: F811
    """A submit with `stream: true`: its events are not kept; a retry is sent to the run's own
    event stream (303), where the same events are, and no second run is made."""
    client, _ = api
    key = {**RUN_AUTH, "Idempotency-Key": str(uuid.uuid4())}
    body = {"agent": "echo", "input": {"streamed": True}, "stream": True}
    first = await client.post("/v1/runs", json=body, headers=key)
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
    run_id = first.headers["colony-run-id"]
    again = await client.post("/v1/runs", json=body, headers=key)
    assert again.status_code == 303, again.text
    assert again.headers["location"] == f"/v1/runs/{run_id}/events"
    assert again.headers["idempotent-replayed"] == "true"
    events_url = f"/v1/runs/{run_id}/events"
    assert json.loads(again.text) == {"run_id": run_id, "events_url": events_url, "replayed": True}
    events = await client.get(again.headers["location"], headers=RUN_AUTH)
    assert [e["id"] for e in parse_sse(events.text)] == [e["id"] for e in parse_sse(first.text)]


async def test_a_session_turns_stream_is_replayed_by_the_run_id_of_its_first_event(redis_url: str) -> None:
    """A turn's event stream names its run in its first event, not in a header: the replay is sent
    to that run's events. A stream that names no run is not replayed (409), never run again."""
    from types import SimpleNamespace

    from colony.blackboard import create_redis
    from colony.config import BlackboardSettings

    served: list[str] = []

    async def turn(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        served.append(scope["path"])
        turn_event = {"event_type": "turn", "data": {}, "request_id": "run-0123456789ab"}
        first = (
            f"event: turn\ndata: {json.dumps(turn_event)}\n\n"
            if scope["path"] == "/named"
            else "data: {}\n\n"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": first.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"event: message\ndata: {}\n\n"})

    redis = create_redis(redis_url, BlackboardSettings())
    runs = SimpleNamespace(
        tenant_id="t", colony_id=f"turns{uuid.uuid4().hex[:6]}", api_board=SimpleNamespace(redis=redis)
    )

    async def services() -> Any:
        return SimpleNamespace(runs=runs)

    app = idempotency.IdempotencyMiddleware(turn, services=services, ttl_seconds=60)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            key = {"Idempotency-Key": str(uuid.uuid4())}
            first = await client.post("/named", json={"message": "hi"}, headers=key)
            assert first.status_code == 200 and "run-0123456789ab" in first.text
            again = await client.post("/named", json={"message": "hi"}, headers=key)
            assert (
                again.status_code == 303 and again.headers["location"] == "/v1/runs/run-0123456789ab/events"
            )
            assert again.headers["colony-run-id"] == "run-0123456789ab"
            await client.post("/unnamed", json={"message": "hi"}, headers=key)
            refused = await client.post("/unnamed", json={"message": "hi"}, headers=key)
            assert refused.status_code == 409 and "not replayed" in refused.json()["error"]["message"]
            assert served == ["/named", "/unnamed"]
    finally:
        await redis.aclose()


def _middleware(route: Any, redis: Any) -> Any:
    """The idempotency middleware over a bare ASGI `route`, its records in `redis`."""
    from types import SimpleNamespace

    runs = SimpleNamespace(
        tenant_id="t", colony_id=f"streams{uuid.uuid4().hex[:6]}", api_board=SimpleNamespace(redis=redis)
    )

    async def services() -> Any:
        return SimpleNamespace(runs=runs)

    return idempotency.IdempotencyMiddleware(route, services=services, ttl_seconds=60)


def _streamed_submit(app: Any, key: bytes, sent: list[dict[str, Any]], on_send: asyncio.Event) -> Any:
    """One keyed `POST /v1/runs` with `stream: true` through `app`, its messages into `sent`
    (`on_send` set at each)."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/runs",
        "query_string": b"",
        "headers": [(b"idempotency-key", key)],
    }
    body = iter([{"type": "http.request", "body": b'{"stream": true}', "more_body": False}])

    async def receive() -> Any:
        return next(body, {"type": "http.disconnect"})

    async def send(message: Any) -> None:
        sent.append(message)
        on_send.set()

    return app(scope, receive, send)


async def _messages(sent: list[dict[str, Any]], at_least: int, on_send: asyncio.Event) -> None:
    async with asyncio.timeout(5):
        while len(sent) < at_least:
            await on_send.wait()
            on_send.clear()


async def test_a_streamed_answers_first_chunk_is_not_held_for_its_record(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35 (the token path): a streamed answer's first chunk goes out while its record is
    still being stored, and a retry sent in that window waits for the record, then is sent on to
    the run's events (303): the route never runs twice."""
    from colony.blackboard import create_redis
    from colony.config import BlackboardSettings

    route_gate, store_gate = asyncio.Event(), asyncio.Event()
    served: list[str] = []

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        served.append(scope["path"])
        headers = [(b"content-type", b"text/event-stream"), (b"colony-run-id", b"run-0123456789ab")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"event: token\ndata: {}\n\n", "more_body": True})
        await route_gate.wait()
        await send({"type": "http.response.body", "body": b"event: completed\ndata: {}\n\n"})

    settle = idempotency.IdempotencyStore.settle

    async def slow_settle(self: Any, answer: Any, ttl_ms: int) -> None:
        await store_gate.wait()
        await settle(self, answer, ttl_ms)

    monkeypatch.setattr(idempotency.IdempotencyStore, "settle", slow_settle)
    redis = create_redis(redis_url, BlackboardSettings())
    app, key = _middleware(stream, redis), str(uuid.uuid4()).encode()
    first_sent: list[dict[str, Any]] = []
    again_sent: list[dict[str, Any]] = []
    first_out, again_out = asyncio.Event(), asyncio.Event()
    try:
        first = asyncio.create_task(_streamed_submit(app, key, first_sent, first_out))
        await _messages(first_sent, 2, first_out)  # the head and the first chunk, the record not stored
        assert first_sent[1]["body"].startswith(b"event: token") and not store_gate.is_set()
        again = asyncio.create_task(_streamed_submit(app, key, again_sent, again_out))
        await asyncio.sleep(3 * idempotency.POLL_SECONDS)
        assert again_sent == [] and served == ["/v1/runs"]  # the retry waits for the record
        store_gate.set()
        await asyncio.wait_for(again, 5)
        assert again_sent[0]["status"] == 303 and served == ["/v1/runs"]
        assert (b"location", b"/v1/runs/run-0123456789ab/events") in again_sent[0]["headers"]
        route_gate.set()
        await asyncio.wait_for(first, 5)
        assert first_sent[-1]["body"].startswith(b"event: completed")
    finally:
        route_gate.set()
        store_gate.set()
        await redis.aclose()


async def test_a_streamed_answer_naming_its_run_sends_its_head_at_once(redis_url: str) -> None:
    """A keyed stream whose head names its run (Colony-Run-Id) passes the head on before any event:
    a client learns its run id while the run is still queued (found by the attacking review)."""
    from colony.blackboard import create_redis
    from colony.config import BlackboardSettings

    queued = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-type", b"text/event-stream"), (b"colony-run-id", b"run-0123456789ab")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await queued.wait()  # the run has not started: no event yet
        await send({"type": "http.response.body", "body": b"event: completed\ndata: {}\n\n"})

    redis = create_redis(redis_url, BlackboardSettings())
    sent: list[dict[str, Any]] = []
    out = asyncio.Event()
    try:
        served = asyncio.create_task(
            _streamed_submit(_middleware(stream, redis), str(uuid.uuid4()).encode(), sent, out)
        )
        await _messages(sent, 1, out)
        assert sent[0]["type"] == "http.response.start" and not queued.is_set()
        queued.set()
        await asyncio.wait_for(served, 5)
        assert sent[-1]["body"].startswith(b"event: completed")
    finally:
        queued.set()
        await redis.aclose()
