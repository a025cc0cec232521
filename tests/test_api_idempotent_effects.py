"""Keyed writes whose first try answered 5xx after its effect landed (issue 34, deliverable 3, and
the review of it): the 5xx releases the key, the client retries with it, and the retry must find
the effect made instead of making it again. The effect-keyed routes derive what they create from
the key (`colony.api.idempotency.effect_key`): block edits their edit id, memory writes their
entry id, run submits their run id.

The real API app served by uvicorn over a real redis-server (blocks: the line is counted in the
block; the Redis reply of the append script is lost after the script ran), the in-process app of
tests/test_api.py for runs (the `api` fixture: agents hosted by a ReplicaHost), and the memory app
of tests/test_api_memory.py (an agent with working and short-term memory). Also: a read-only POST
(memory recall) keeps no answer and the client sends it no key, and the key's scripts (a claim
re-sent after its reply was lost; a request longer than the TTL) in Redis itself."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_kit import BareApi
from redis.exceptions import TimeoutError as RedisTimeout
from test_api import AUTH as RUN_AUTH
from test_api import api  # noqa: F401 - `api` is a fixture
from test_api_memory import AGENT, MemoryApp
from test_api_memory import AUTH as MEMORY_AUTH

from colony.blackboard import create_redis
from colony.blackboard.idempotency import IdempotencyKeys, IdempotencyStore
from colony.client import ColonyClient
from colony.client_http import Retry
from colony.config import ColonySettings
from colony.errors import BlackboardUnavailable
from colony.memory.blocks.cache import DocumentCache
from colony.memory.store import MemoryStore
from colony.system.runs import RunService

TOKEN = "effects-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class EffectsApp(BareApi):
    def __init__(self, redis_url: str, data_dir: Path) -> None:
        settings = ColonySettings(
            redis_url=redis_url, data_dir=data_dir, colony_id=f"eff{uuid.uuid4().hex[:8]}"
        )
        super().__init__(settings, TOKEN)


@pytest.fixture(scope="module")
def served(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EffectsApp]:
    with EffectsApp(redis_server.url, tmp_path_factory.mktemp("effects-api")) as app:
        yield app


@pytest.fixture
def http(served: EffectsApp) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=60) as client:
        yield client


def new_block(http: httpx.Client) -> str:
    label = f"eff_{uuid.uuid4().hex[:8]}"
    created = http.post("/v1/colony/blocks", json={"label": label, "content": "start"})
    assert created.status_code == 201, created.text
    return label


def versions(http: httpx.Client, label: str) -> int:
    return len(http.get(f"/v1/colony/blocks/{label}/history").json()["versions"])


def lose_append_replies(monkeypatch: pytest.MonkeyPatch, times: int) -> dict[str, int]:
    """The block append script runs, then its reply is lost (a socket timeout), `times` times."""
    real = DocumentCache._append_update
    state = {"left": times, "ran": 0}

    async def lost(self: DocumentCache, *args: Any, **kwargs: Any) -> Any:
        out = await real(self, *args, **kwargs)
        state["ran"] += 1
        if state["left"]:
            state["left"] -= 1
            raise RedisTimeout("Timeout reading from socket")
        return out

    monkeypatch.setattr(DocumentCache, "_append_update", lost)
    return state


def fails(send: Any) -> None:
    """The first try: the route raised after its effect, so a 500 (uvicorn may cut the
    connection instead: the answer is lost either way)."""
    with contextlib.suppress(httpx.TransportError):
        assert send().status_code == 500


def test_the_clients_retry_of_an_append_whose_reply_was_lost_appends_once(
    served: EffectsApp, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    label = new_block(http)
    before = versions(http, label)
    lost = lose_append_replies(monkeypatch, 1)
    with ColonyClient(served.url, TOKEN) as client:
        outcome = client.blocks.append(None, label, "exactly once")
    assert lost["ran"] == 1  # the retry found the edit made: it did not append again
    assert http.get(f"/v1/colony/blocks/{label}").json()["content"].count("exactly once") == 1
    assert versions(http, label) == before + 1
    assert outcome["version"] == before + 1


def test_an_edit_failing_after_its_effect_on_every_try_is_made_once(
    served: EffectsApp, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every try's reply is lost: the first makes the edit, each retry finds it (no append runs)."""
    label = new_block(http)
    before = versions(http, label)
    lost = lose_append_replies(monkeypatch, 100)
    with ColonyClient(served.url, TOKEN) as client:
        client.blocks.append(None, label, "four tries")
    monkeypatch.undo()
    assert lost["ran"] == 1
    assert http.get(f"/v1/colony/blocks/{label}").json()["content"].count("four tries") == 1
    assert versions(http, label) == before + 1


@pytest.mark.parametrize(
    ("route", "body"),
    [("append", {"text": "added"}), ("put", {"content": "start\nrewritten"}), ("rollback", {"version": 1})],
)
def test_every_block_edit_route_retried_after_a_5xx_finds_its_edit(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch, route: str, body: dict[str, Any]
) -> None:
    label = new_block(http)
    path = f"/v1/colony/blocks/{label}"
    http.post(f"{path}/append", json={"text": "second"})  # something to roll back from
    before = versions(http, label)
    lose_append_replies(monkeypatch, 1)
    # a connection each (uvicorn closes the one whose request raised)
    key = {"Idempotency-Key": str(uuid.uuid4()), "Connection": "close"}
    send = (lambda: http.put(path, json=body, headers=key)) if route == "put" else None
    send = send or (lambda: http.post(f"{path}/{route}", json=body, headers=key))
    fails(send)
    retried = send()
    assert retried.status_code == 200, retried.text
    assert "idempotent-replayed" not in retried.headers  # run again, and found the edit made
    assert retried.json()["version"] == before + 1 and versions(http, label) == before + 1


def test_a_key_released_by_a_5xx_and_sent_with_another_body_makes_another_edit(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The effect's id derives from the key and the request (its body): another body under the
    same key is another edit, not the first one's outcome."""
    label = new_block(http)
    path = f"/v1/colony/blocks/{label}"
    before = versions(http, label)
    lose_append_replies(monkeypatch, 1)
    # a connection each (uvicorn closes the one whose request raised)
    key = {"Idempotency-Key": str(uuid.uuid4()), "Connection": "close"}
    fails(lambda: http.post(f"{path}/append", json={"text": "first"}, headers=key))
    other = http.post(f"{path}/append", json={"text": "second"}, headers=key)
    assert other.status_code == 200 and other.json()["version"] == before + 2
    assert "second" in http.get(path).json()["content"]


async def test_a_submit_answered_5xx_after_the_run_was_made_gets_that_run_on_retry(
    api: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, _ = api
    real_submit, real_write = RunService.submit, RunService._write_run
    written: list[str] = []
    failures = {"left": 1}

    async def write(self: RunService, board: Any, record: Any, *args: Any, **kwargs: Any) -> None:
        await real_write(self, board, record, *args, **kwargs)
        written.append(record.run_id)

    async def submit(self: RunService, *args: Any, **kwargs: Any) -> Any:
        record = await real_submit(self, *args, **kwargs)
        if failures["left"]:  # the run is made; the answer is not
            failures["left"] -= 1
            raise BlackboardUnavailable("after submit", "redis://test", ConnectionError("gone"))
        return record

    monkeypatch.setattr(RunService, "_write_run", write)
    monkeypatch.setattr(RunService, "submit", submit)
    key = {**RUN_AUTH, "Idempotency-Key": str(uuid.uuid4())}
    body = {"agent": "echo", "input": {"once": True}}
    failed = await client.post("/v1/runs", json=body, headers=key)
    assert failed.status_code == 503, failed.text
    retried = await client.post("/v1/runs", json=body, headers=key)
    assert retried.status_code == 202, retried.text
    assert written == [retried.json()["run_id"]]  # one run written: the retry answered it
    assert (await client.get(f"/v1/runs/{written[0]}", headers=RUN_AUTH)).status_code == 200
    other = await client.post("/v1/runs", json=body, headers={**RUN_AUTH, "Idempotency-Key": "other-key"})
    assert other.json()["run_id"] != written[0] and len(written) == 2


@pytest.fixture(scope="module")
def memory_app(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryApp]:
    with MemoryApp(redis_server.url, tmp_path_factory.mktemp("effects-memory")) as app:
        with httpx.Client(base_url=app.url, headers=MEMORY_AUTH, timeout=120) as client:
            app.wait_for(lambda: len(client.get(f"/v1/agents/{AGENT}/memory").json()["scopes"]) == 2)
        yield app


def test_a_memory_write_retried_after_a_5xx_finds_its_entry(
    memory_app: MemoryApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = MemoryStore.write
    failures = {"left": 1}

    async def write(self: MemoryStore, *args: Any, **kwargs: Any) -> Any:
        outcome = await real(self, *args, **kwargs)
        if failures["left"]:  # stored; the answer is lost
            failures["left"] -= 1
            raise BlackboardUnavailable("memory write", "redis://test", ConnectionError("gone"))
        return outcome

    monkeypatch.setattr(MemoryStore, "write", write)
    text = f"the retry finds me {uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=memory_app.url, headers=MEMORY_AUTH, timeout=120) as http:
        key = {"Idempotency-Key": str(uuid.uuid4())}
        body = {"scope": "working", "content": text}
        assert http.post(f"/v1/agents/{AGENT}/memory", json=body, headers=key).status_code == 503
        retried = http.post(f"/v1/agents/{AGENT}/memory", json=body, headers=key)
        assert retried.status_code == 201, retried.text  # answered as the first try would have been
        answer = retried.json()
        assert answer["created"] is True and answer["duplicate_of"] is None
        assert answer["entry"]["entry_id"].startswith("http-")
        # an id the body gives is kept; without a key the store picks one
        own_id = f"mine-{uuid.uuid4().hex[:8]}"
        own_body = {**body, "content": f"Lyon hosts a festival {own_id}", "entry_id": own_id}
        own = http.post(f"/v1/agents/{AGENT}/memory", json=own_body, headers={"Idempotency-Key": own_id})
        assert own.json()["entry"]["entry_id"] == own_id
        plain = http.post(f"/v1/agents/{AGENT}/memory", json={**body, "content": f"Oslo has fjords {own_id}"})
        assert not plain.json()["entry"]["entry_id"].startswith("http-")


def test_a_key_sent_to_a_read_only_post_is_ignored_and_keeps_nothing(
    served: EffectsApp, http: httpx.Client
) -> None:
    key = str(uuid.uuid4())
    path = "/v1/agents/nobody-1/memory/query"
    answers = [http.post(path, json={"query": "what"}, headers={"Idempotency-Key": key}) for _ in range(2)]
    assert [a.status_code for a in answers] == [404, 404]
    assert all("idempotent-replayed" not in a.headers for a in answers)
    # a malformed key there is not even looked at
    assert (
        http.post(path, json={"query": "what"}, headers={"Idempotency-Key": "not a key"}).status_code == 404
    )
    settings = served.settings
    digest = IdempotencyKeys.digest(settings.tenant_id, settings.colony_id, "POST", path, key)

    async def kept() -> int:
        redis = create_redis(settings.redis_url)
        try:
            return int(await redis.exists(IdempotencyKeys.key(digest, "answer")))
        finally:
            await redis.aclose()

    assert asyncio.run(kept()) == 0
    # a write's key on the same colony is kept (the check above could not pass by accident)
    label = new_block(http)
    write_key = str(uuid.uuid4())
    append = f"/v1/colony/blocks/{label}/append"
    assert http.post(append, json={"text": "x"}, headers={"Idempotency-Key": write_key}).status_code == 200
    digest = IdempotencyKeys.digest(settings.tenant_id, settings.colony_id, "POST", append, write_key)
    assert asyncio.run(kept()) == 1


def test_the_client_sends_no_key_to_a_read_only_post_and_retries_it_as_a_read() -> None:
    seen: list[tuple[str, str | None]] = []
    status = {"value": 200}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("idempotency-key")))
        if request.url.path.endswith("/query"):
            return httpx.Response(status["value"], json={"entries": []})
        return httpx.Response(201, json={"entry": {}, "created": True, "duplicate_of": None})

    with ColonyClient("http://colony", "t", transport=httpx.MockTransport(handler), attempts=3) as client:
        client.memory.query("agent-1", "what")
        client.memory.write("agent-1", "working", "a fact")
        assert seen == [("/v1/agents/agent-1/memory/query", None), ("/v1/agents/agent-1/memory", seen[1][1])]
        assert seen[1][1] is not None
        status["value"] = 500  # a read's 500 is not retried (a write's is)
        seen.clear()
        with pytest.raises(Exception, match=r"500|http_error"):
            client.memory.query("agent-1", "what")
        assert len(seen) == 1
    retry = Retry(3, backoff=0)
    assert retry.delay("POST", 1, httpx.Response(500), path="/v1/agents/a/memory/query") is None
    assert retry.delay("POST", 1, httpx.Response(503), path="/v1/agents/a/memory/query") == 0
    assert retry.delay("POST", 1, httpx.Response(500), path="/v1/agents/a/memory") == 0


async def test_a_claim_re_sent_after_its_reply_was_lost_is_still_its_own(redis_url: str) -> None:
    redis = create_redis(redis_url)
    try:
        digest = IdempotencyKeys.digest("t", "c", "POST", "/x", uuid.uuid4().hex)
        mine = IdempotencyStore(redis, digest, "owner-1")
        assert await mine.claim("fp", 60_000, 10_000) is None
        await redis.pexpire(IdempotencyKeys.key(digest, "lease"), 50)
        assert await mine.claim("fp", 60_000, 10_000) is None  # the re-sent script: still claimed
        assert await redis.pttl(IdempotencyKeys.key(digest, "lease")) > 5_000  # its lease renewed
        other = await IdempotencyStore(redis, digest, "owner-2").claim("fp", 60_000, 10_000)
        assert other is not None and other.lease_ms > 0 and not other.done  # another's: in flight
        await mine.settle({"status": 200, "headers": []}, 60_000)
        done = await mine.claim("fp", 60_000, 10_000)  # the owner's own answer is an answer
        assert done is not None and done.done
    finally:
        await redis.aclose()


async def test_a_request_longer_than_the_ttl_keeps_its_claim(redis_url: str) -> None:
    redis = create_redis(redis_url)
    try:
        digest = IdempotencyKeys.digest("t", "c", "POST", "/x", uuid.uuid4().hex)
        first = IdempotencyStore(redis, digest, "first")
        assert await first.claim("fp", 300, 10_000) is None  # a TTL of 0.3 s stands for 1 day
        for _ in range(5):
            await asyncio.sleep(0.1)
            assert await first.renew(10_000)
        second = await IdempotencyStore(redis, digest, "second").claim("fp", 300, 10_000)
        assert second is not None and second.record["owner"] == "first"
        # a renewal by another than the claimant changes nothing
        assert not await IdempotencyStore(redis, digest, "second").renew(10_000)
        assert await redis.get(IdempotencyKeys.key(digest, "lease")) == "first"
    finally:
        await redis.aclose()
