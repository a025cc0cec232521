"""The clients retry writes safely (issue 34, deliverable 3): every write carries an
`Idempotency-Key`, the same on each attempt, and is tried again after a lost connection or a 5xx
(never after another 4xx), so a write whose answer was lost lands once.

The real API app over a real redis-server, served by uvicorn behind `Faults`: an ASGI layer that
does to chosen writes what a dying replica or its proxy does (the write runs, then its answer is
lost as a plain 500 or a cut connection; or a 503 before it runs). The effect is counted in the
colony block it appends to. Runs streamed with `stream: true` go through the in-process app of
tests/test_api.py (`api`), behind a transport that loses the first answer."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from api_kit import BareApi
from test_api import AUTH as RUN_AUTH
from test_api import api  # noqa: F401 - `api` is a fixture

from colony.api import idempotency
from colony.api.limits import Receive, Scope, Send
from colony.client import ColonyClient
from colony.client_http import AsyncApiConnection
from colony.config import ColonySettings
from colony.errors import ApiError
from colony.memory.blocks import BlockStore

TOKEN = "retry-token"


class Faults:
    """Between the client and the app. `plan`: what happens to the next writes, in order: "500"
    (the write runs, its answer is replaced by a plain 500, as Serve's proxy gives for a replica
    that died under it), "drop" (the write runs, the connection is cut mid-answer), "503" (refused
    before the app sees it); no plan left: passed through. `seen`: (method, path, key) of each
    request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.plan: list[str] = []
        self.seen: list[tuple[str, str, str | None]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = next((v.decode() for k, v in scope["headers"] if k == b"idempotency-key"), None)
        self.seen.append((scope["method"], scope["path"], key))
        fault = self.plan.pop(0) if self.plan and scope["method"] != "GET" else None
        if fault is None:
            await self.app(scope, receive, send)
            return
        if fault != "503":

            async def lost(message: Any) -> None:
                return None

            await self.app(scope, receive, lost)
        if fault == "drop":
            head = [(b"content-length", b"100")]
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": b'{"cut', "more_body": True})
            raise ConnectionResetError("the replica went away mid-answer")
        status = 500 if fault == "500" else 503
        head = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})


class FaultyApi(BareApi):
    def __init__(self, redis_url: str, data_dir: Path) -> None:
        settings = ColonySettings(
            redis_url=redis_url, data_dir=data_dir, colony_id=f"retry{uuid.uuid4().hex[:8]}"
        )
        super().__init__(settings, TOKEN)
        self.faults = Faults(self.app)
        self.server = uvicorn.Server(uvicorn.Config(self.faults, log_level="critical", lifespan="off"))


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyApi]:
    with FaultyApi(redis_server.url, tmp_path_factory.mktemp("retry-api")) as app:
        yield app


@pytest.fixture
def faults(served: FaultyApi) -> Iterator[Faults]:
    served.faults.plan.clear()
    served.faults.seen.clear()
    yield served.faults
    served.faults.plan.clear()


@pytest.fixture
def client(served: FaultyApi) -> Iterator[ColonyClient]:
    with ColonyClient(served.url, TOKEN, timeout=30) as colony:
        yield colony


def fresh_block(client: ColonyClient) -> str:
    label = f"retry_{uuid.uuid4().hex[:8]}"
    client.blocks.create(None, label, content="start")
    return label


def lines(client: ColonyClient, label: str, text: str) -> int:
    return str(client.blocks.read(None, label)["content"]).count(text)


def writes(faults: Faults) -> list[tuple[str, str, str | None]]:
    return [seen for seen in faults.seen if seen[0] != "GET"]


@pytest.mark.parametrize("fault", ["500", "drop"])
def test_a_write_whose_answer_was_lost_is_retried_with_its_key_and_lands_once(
    client: ColonyClient, faults: Faults, fault: str
) -> None:
    label = fresh_block(client)
    faults.seen.clear()
    faults.plan.append(fault)
    outcome = client.blocks.append(None, label, "exactly once")
    assert outcome["version"] >= 1
    attempts = writes(faults)
    assert len(attempts) == 2, attempts
    keys = {key for _, _, key in attempts}
    assert len(keys) == 1 and None not in keys  # one key, sent on both attempts
    assert lines(client, label, "exactly once") == 1
    # the next call is another request: another key
    client.blocks.append(None, label, "second call")
    assert writes(faults)[-1][2] not in keys
    assert lines(client, label, "second call") == 1


def test_a_503_before_the_write_ran_is_retried_and_the_write_runs(
    client: ColonyClient, faults: Faults
) -> None:
    label = fresh_block(client)
    faults.seen.clear()
    faults.plan.extend(["503", "503"])
    client.blocks.append(None, label, "third time")
    assert len(writes(faults)) == 3 and lines(client, label, "third time") == 1


def test_attempts_bound_the_retries(served: FaultyApi, faults: Faults) -> None:
    with ColonyClient(served.url, TOKEN, attempts=2) as colony:
        label = fresh_block(colony)
        faults.seen.clear()
        faults.plan.extend(["503", "503", "503"])
        with pytest.raises(ApiError) as caught:
            colony.blocks.append(None, label, "never")
        assert caught.value.status == 503 and len(writes(faults)) == 2
        assert lines(colony, label, "never") == 0
    with pytest.raises(ValueError, match="attempts"):
        ColonyClient(served.url, TOKEN, attempts=0)


def test_a_4xx_is_not_retried(client: ColonyClient, faults: Faults) -> None:
    with pytest.raises(ApiError) as caught:
        client.blocks.append(None, "no_such_block", "x")
    assert caught.value.status == 404
    assert len(writes(faults)) == 1
    with pytest.raises(ApiError) as bad:
        client.blocks.create(None, "Not A Label")
    assert bad.value.status == 422 and len(writes(faults)) == 2


def test_reads_carry_no_key_and_a_read_is_retried_after_a_lost_connection(
    client: ColonyClient, faults: Faults, monkeypatch: pytest.MonkeyPatch
) -> None:
    label = fresh_block(client)
    real = client._api.http.send
    failures = {"left": 1}

    def flaky(request: httpx.Request, **kwargs: Any) -> httpx.Response:
        if request.method == "GET" and failures["left"]:
            failures["left"] -= 1
            raise httpx.ReadError("connection reset", request=request)
        return real(request, **kwargs)

    monkeypatch.setattr(client._api.http, "send", flaky)
    assert client.blocks.read(None, label)["content"].startswith("start")
    assert failures["left"] == 0
    assert all(key is None for method, _, key in faults.seen if method == "GET")


class ReplicaKilled(BaseException):
    """A killed process, from inside its request: nothing after it runs."""


def test_a_write_whose_replica_died_mid_way_is_not_repeated(
    served: FaultyApi, client: ColonyClient, faults: Faults, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append lands and the process dies before it answers: the client's retries wait while
    its claim's lease runs, then one takes the dead claim over (an append is effect-keyed) and
    finds its edit made: the call succeeds and the line is there once."""
    monkeypatch.setattr(idempotency, "LEASE_SECONDS", 1.0)
    monkeypatch.setattr(idempotency, "WAIT_SECONDS", 0.2)
    label = fresh_block(client)
    real = BlockStore.append
    died = {"once": False}

    async def dies_once(self: BlockStore, *args: Any, **kwargs: Any) -> Any:
        outcome = await real(self, *args, **kwargs)
        if not died["once"]:
            died["once"] = True
            raise ReplicaKilled
        return outcome

    monkeypatch.setattr(BlockStore, "append", dies_once)
    with ColonyClient(served.url, TOKEN, attempts=8) as patient:
        outcome = patient.blocks.append(None, label, "landed once")
    assert died["once"] and outcome["version"] >= 1
    assert lines(client, label, "landed once") == 1


async def test_the_async_client_retries_the_same_way(served: FaultyApi, faults: Faults) -> None:
    with ColonyClient(served.url, TOKEN) as colony:
        label = fresh_block(colony)
    faults.seen.clear()
    faults.plan.append("500")
    connection = AsyncApiConnection(served.url, TOKEN, timeout=30, transport=None)
    try:
        path = f"/v1/colony/blocks/{label}/append"
        outcome = await connection.call("POST", path, json={"text": "async once"})
    finally:
        await connection.close()
    assert outcome["version"] >= 1
    assert len({key for _, _, key in writes(faults)}) == 1 and len(writes(faults)) == 2
    with ColonyClient(served.url, TOKEN) as colony:
        assert lines(colony, label, "async once") == 1


class LosesFirstAnswer(httpx.AsyncBaseTransport):
    """Passes requests to the app; the first POST runs whole, then its answer is lost."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.posts: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST":
            self.posts.append(request.headers.get("idempotency-key"))
            if len(self.posts) == 1:
                await response.aread()
                raise httpx.ReadError("connection reset", request=request)
        return response


async def test_a_streamed_submit_retried_goes_on_with_the_runs_events(api) -> None:  # noqa: F811
    """`stream: true` and the answer lost: the retry, same key, is sent to the run's own event
    stream; the client reads the run's events from there, and there is one run."""
    http, _ = api
    transport = LosesFirstAnswer(http._transport)
    token = RUN_AUTH["Authorization"].removeprefix("Bearer ")
    connection = AsyncApiConnection("http://colony", token, timeout=30, transport=transport)
    body = {"agent": "echo", "input": {"once": 1}, "stream": True}
    try:
        async with connection.events("POST", "/v1/runs", json=body) as events:
            got = [event async for event in events]
    finally:
        await connection.close()
    assert [e["event_type"] for e in got] == ["started", "step", "completed"]
    assert got[-1]["data"]["output"] == {"once": 1}
    assert len(transport.posts) == 2 and transport.posts[0] == transport.posts[1] is not None
    runs = {e["request_id"] for e in got}
    assert len(runs) == 1
