"""Idempotent HTTP writes: a POST, PUT, PATCH or DELETE sent with an `Idempotency-Key` header runs
once; a retry with the same key gets the first answer (with `Idempotent-Replayed: true`) and changes
nothing. Without the header a request is served as before. docs/api.md, Idempotent writes, says what
a client can count on; the records live in Redis (colony.blackboard.idempotency), so any API
replica answers a retry the first one was sent to.

A pure ASGI middleware, inside GuardMiddleware (the token is checked and the body read and bounded
before a key is looked at), rather than a dependency: it has to hold back a duplicate before the
route parses anything, and to see the answer the route gives (status, headers, body, streamed or
not) to keep it.

- The key is checked (colony.wire.idempotency: 422 naming the header) and never stored: its
  record is named by a digest of colony, method, app path and key (and the sending token's id
  for a scoped token), so one key means one request per route and token, and a key sent to another
  route, or by another scoped token, is another request.
- The request is fingerprinted (method, path, query and body): the same key with another
  fingerprint is a 422 `idempotency_key_reused`.
- The first request claims the key in one script (the record and a lease of LEASE_SECONDS,
  renewed while it runs). A duplicate sent meanwhile waits up to WAIT_SECONDS for the answer, then
  gets 409 `idempotency_in_flight` with `Retry-After`: never does a key run twice at once.
- An answer below 500 (but 408/425/429, which ask for a retry) is kept for
  `api.idempotency_ttl_seconds`: status, a few headers, and the body up to MAX_KEPT_BODY (a larger
  one is kept as a note). A 5xx, or a route that raised, forgets the claim: the next retry runs.
  A 5xx may come after the effect landed (a Redis reply lost), so the routes that create something
  derive its id from the request (`effect_key`): their retry finds it made instead of making it
  again (docs/api.md lists them, and what a retry after a 5xx does on the others).
- A process that stops while its request runs (the replica was killed) leaves the claim without a
  lease. On an effect-keyed route (colony.wire.idempotency.EFFECT_KEYED: what it creates derives
  from the key) the retry of the same request takes the claim over and runs it again, finding its
  effect made. On any other route whether its effect landed cannot be told from here, so a retry
  gets 409 `idempotency_outcome_unknown` (until the TTL), never a second execution.
- A streamed answer (`text/event-stream`: a run submitted with `stream: true`, a session message)
  is kept as its run id once its first chunk is out; a retry is answered 303 See Other to the run's
  event stream, where the client goes on (`Last-Event-ID`).

The route can read the key's digest as `request.state.idempotency_digest` (and `effect_key(request)`,
that digest with the request's fingerprint), to derive the ids of what it creates from it (the same
on every retry). A key sent to a read-only POST (wire READ_ONLY_POSTS: memory recall) is ignored:
nothing is kept for a request that changes nothing.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError
from starlette.requests import Request

from colony import metrics
from colony.api.deps import ServicesProvider
from colony.api.limits import ASGIApp, Message, Receive, Scope, Send, app_path, replay_body, send_error
from colony.blackboard.idempotency import IdempotencyKeys, IdempotencyStore, Kept
from colony.errors import ColonyError
from colony.system.access_tokens import MAIN_TOKEN_ID
from colony.wire.idempotency import (
    HEADER,
    IN_FLIGHT,
    KEY_REUSED,
    OUTCOME_UNKNOWN,
    REPLAYED_HEADER,
    effect_keyed,
    key_problem,
    takes_key,
)

log = logging.getLogger(__name__)

LEASE_SECONDS = 10.0  # a claim whose process stopped is known as such this long after its last renewal
WAIT_SECONDS = 5.0  # how long a duplicate waits for the first request's answer before a 409
POLL_SECONDS = 0.05
MAX_KEPT_BODY = 64 * 1024  # a larger answer is kept as status, headers and a note
KEPT_HEADERS = frozenset({b"content-type", b"location", b"content-location", b"colony-run-id", b"allow"})
NOT_KEPT = frozenset({408, 425, 429})  # answers that ask the client to retry: a retry runs again
_HEADER = HEADER.lower().encode()
_RUN_ID = re.compile(rb'"request_id": "([A-Za-z0-9][A-Za-z0-9_.-]{0,127})"')

Settle = Callable[[dict[str, Any] | None], Awaitable[None]]


class IdempotencyMiddleware:
    """Runs a keyed write once and answers its retries from what was kept (see the module doc)."""

    def __init__(self, app: ASGIApp, *, services: ServicesProvider, ttl_seconds: float) -> None:
        self.app = app
        self.services = services
        self.ttl_ms = int(ttl_seconds * 1000)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys = [v for k, v in scope.get("headers", []) if k == _HEADER] if scope["type"] == "http" else []
        if not keys or not takes_key(str(scope.get("method", "")), app_path(scope)):
            await self.app(scope, receive, send)
            return
        key = keys[0].decode("latin-1")
        problem = key_problem(key) if len(keys) == 1 else f"{HEADER}: send one header, not {len(keys)}"
        if problem is not None:
            await send_error(send, 422, "invalid_request", problem, [])
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away mid-body
        method, path = str(scope["method"]), app_path(scope)
        fingerprint = hashlib.sha256(b"\x00".join((bytes(scope.get("query_string", b"")), body))).hexdigest()
        try:
            runs = (await self.services()).runs
            digest = IdempotencyKeys.digest(runs.tenant_id, runs.colony_id, method, path, _owned(scope, key))
            store = IdempotencyStore(runs.api_board.redis, digest, uuid.uuid4().hex)
            kept = await self._claim(store, fingerprint, effect_keyed(method, path))
        except (ColonyError, RedisError) as exc:
            message = f"the {HEADER} could not be checked ({type(exc).__name__}: {exc}); retry with it"
            await send_error(send, 503, "unavailable", message, [(b"retry-after", b"1")])
            return
        if kept is not None:
            await _answer_kept(kept, fingerprint, send)
            return
        metrics.HTTP_IDEMPOTENT.labels("executed").inc()
        state = scope.setdefault("state", {})
        state["idempotency_digest"], state["idempotency_fingerprint"] = digest, fingerprint
        await self._run(scope, replay_body(body, receive), send, store)

    async def _claim(self, store: IdempotencyStore, fingerprint: str, take_orphan: bool) -> Kept | None:
        """None: this request runs. A duplicate of one still running waits for its answer (or, when
        that one freed the key with a 5xx, claims it) up to WAIT_SECONDS. `take_orphan`: an
        effect-keyed route's request whose process stopped is run again by its retry."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            kept = await store.claim(
                fingerprint, self.ttl_ms, int(LEASE_SECONDS * 1000), take_orphan=take_orphan
            )
            if (
                kept is None
                or kept.done
                or kept.lease_ms <= 0
                or kept.record.get("fingerprint") != fingerprint
                or time.monotonic() >= deadline
            ):
                return kept
            await asyncio.sleep(POLL_SECONDS)

    async def _run(self, scope: Scope, receive: Receive, send: Send, store: IdempotencyStore) -> None:
        async def settle(answer: dict[str, Any] | None) -> None:
            if answer is None:
                metrics.HTTP_IDEMPOTENT.labels("released").inc()
            try:
                await store.settle(answer, self.ttl_ms)
            except RedisError as exc:  # the claim then lapses into "outcome unknown": never run twice
                log.warning("an idempotent request's answer could not be kept: %s", exc)

        answer = AnswerWatch(send, settle)
        renewing = asyncio.create_task(self._renew(store))
        try:
            await self.app(scope, receive, answer.send)
        except Exception:
            if not answer.settled:
                answer.settled = True
                await settle(None)
            raise
        finally:
            renewing.cancel()
        await answer.close()

    async def _renew(self, store: IdempotencyStore) -> None:
        while True:
            await asyncio.sleep(LEASE_SECONDS / 4)
            try:
                await store.renew(int(LEASE_SECONDS * 1000))
            except RedisError as exc:
                log.warning("an idempotent request's lease could not be renewed: %s", exc)


def effect_key(request: Request) -> str | None:
    """What a keyed route derives the ids of its effects from (block edit ids, memory entry ids,
    run ids): the key's digest and the request's fingerprint, so every retry of the request makes
    the same ids (its redo finds the effect made) and the same key released by a 5xx and sent
    with another body makes other ones. None: the request carries no key."""
    digest = getattr(request.state, "idempotency_digest", None)
    if not isinstance(digest, str):
        return None
    fingerprint = str(getattr(request.state, "idempotency_fingerprint", ""))
    return hashlib.sha256(f"{digest}\n{fingerprint}".encode()).hexdigest()[:32]


def keyed_run_id(request: Request) -> str | None:
    """The id of the run a keyed request submits (POST /v1/runs, a session's start or message):
    every retry of the request names the same run, which `RunService.submit(run_id=)` makes once."""
    keyed = effect_key(request)
    return None if keyed is None else f"run-{keyed[:24]}"


_KEEPING: set[asyncio.Task[None]] = set()  # streamed answers' records being stored


def _event_stream(start: Message) -> bool:
    for key, value in start.get("headers", []):
        if bytes(key).lower() == b"content-type":
            return bytes(value).decode("latin-1").startswith("text/event-stream")
    return False


class AnswerWatch:
    """The route's answer on its way out: held back until it is kept (or its claim forgotten), then
    passed on, so a client that got an answer finds it kept when it retries. A streamed answer is
    not held for its record, which names only the run: from the head's Colony-Run-Id (the head then
    goes on at once, so a client learns its run id while the run is still queued), else from the
    first chunk. It is kept meanwhile, and a retry that comes before it is stored waits for it as a
    duplicate of a request in flight does (the claim holds until then), then is sent on to the
    run's events. The stream's first token so reaches the client a Redis round trip sooner."""

    def __init__(self, send: Send, settle: Settle) -> None:
        self._send = send
        self._settle = settle
        self.settled = False
        self.start: Message | None = None
        self.held: list[Message] = []
        self.body = bytearray()
        self.too_large = False
        self._keeping: asyncio.Task[None] | None = None  # a streamed answer's record, being stored

    @property
    def status(self) -> int:
        return int(self.start["status"]) if self.start else 500

    def header(self, name: bytes) -> str | None:
        for key, value in self.start.get("headers", []) if self.start else []:
            if key.lower() == name:
                return bytes(value).decode("latin-1")
        return None

    async def send(self, message: Message) -> None:
        if self.settled:
            await self._send(message)
            return
        streamed = message["type"] == "http.response.start" and _event_stream(message)
        if message["type"] == "http.response.start":
            self.start = message
        if streamed and self.header(b"colony-run-id"):  # the run is named: its head goes on at once
            self._keep(self._streamed(b""))
            await self._send(message)
            return
        if message["type"] != "http.response.body" or self.start is None:
            self.held.append(message)
            return
        chunk, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
        self.held.append(message)
        if _event_stream(self.start):  # a stream naming its run in its first event
            self._keep(self._streamed(chunk))
            await self._flush()
            return
        if not self.too_large:
            self.body += chunk
            if len(self.body) > MAX_KEPT_BODY:  # passed on as it comes from now on; a note is kept
                self.too_large, self.body = True, bytearray()
        if not more:
            await self._finish(self._answer())
        elif self.too_large:
            await self._flush()

    def _keep(self, answer: dict[str, Any] | None) -> None:
        """Store a streamed answer's record while the stream goes on (held by `_KEEPING` till
        stored, even when the request is cancelled)."""
        self.settled = True
        self._keeping = asyncio.create_task(self._settle(answer))
        _KEEPING.add(self._keeping)
        self._keeping.add_done_callback(_KEEPING.discard)

    async def close(self) -> None:
        """After the route returned: an answer it never finished is not kept; a streamed one's
        record is stored before this returns. (A route that raised, or a request cancelled, does
        not come here: its record is stored by the task alone, and a retry waits for it.)"""
        if self._keeping is not None:
            await asyncio.shield(self._keeping)
        if not self.settled:
            await self._finish(None)

    async def _finish(self, answer: dict[str, Any] | None) -> None:
        self.settled = True
        await self._settle(answer)
        await self._flush()

    async def _flush(self) -> None:
        held, self.held = self.held, []
        for message in held:
            await self._send(message)

    def _kept(self) -> dict[str, Any] | None:
        if self.start is None or self.status >= 500 or self.status in NOT_KEPT:
            return None
        headers = [
            [bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1")]
            for k, v in self.start.get("headers", [])
            if bytes(k).lower() in KEPT_HEADERS
        ]
        return {"status": self.status, "headers": headers}

    def _answer(self) -> dict[str, Any] | None:
        kept = self._kept()
        if kept is None:
            return None
        if self.too_large:
            return {**kept, "note": f"the first answer's body was over {MAX_KEPT_BODY} bytes and is not kept"}
        return {**kept, "body": base64.b64encode(bytes(self.body)).decode()}

    def _streamed(self, first_chunk: bytes) -> dict[str, Any] | None:
        kept = self._kept()
        if kept is None:
            return None
        run_id = self.header(b"colony-run-id")
        if run_id is None and (found := _RUN_ID.search(first_chunk)):
            run_id = found.group(1).decode()
        return {**kept, "stream": True, "run_id": run_id}


async def _answer_kept(kept: Kept, fingerprint: str, send: Send) -> None:
    record = kept.record
    if record.get("fingerprint") != fingerprint:
        metrics.HTTP_IDEMPOTENT.labels("reused").inc()
        message = (
            f"{HEADER}: this key was sent with another request to this route (another body or query); "
            "send a new key for each request"
        )
        await send_error(send, 422, KEY_REUSED, message, [])
    elif kept.done:
        metrics.HTTP_IDEMPOTENT.labels("replayed").inc()
        await _replay_answer(record, send)
    elif kept.lease_ms > 0:
        metrics.HTTP_IDEMPOTENT.labels("in_flight").inc()
        wait = str(max(1, math.ceil(kept.lease_ms / 1000)))
        message = f"the request first sent with this {HEADER} is still running; retry with the same key"
        await send_error(send, 409, IN_FLIGHT, message, [(b"retry-after", wait.encode())])
    else:
        metrics.HTTP_IDEMPOTENT.labels("unknown").inc()
        message = (
            f"the request first sent with this {HEADER} stopped before it answered (the API process "
            "serving it went away); whether it took effect is unknown: read the resource to see, and "
            "send a new key to make the change again"
        )
        await send_error(send, 409, OUTCOME_UNKNOWN, message, [])


async def _replay_answer(record: dict[str, Any], send: Send) -> None:
    status = int(record["status"])
    headers = [(str(k).encode("latin-1"), str(v).encode("latin-1")) for k, v in record.get("headers", [])]
    if record.get("stream"):
        run_id = record.get("run_id")
        if not isinstance(run_id, str):
            message = "the first answer to this key was an event stream, and streams are not replayed"
            await send_error(send, 409, OUTCOME_UNKNOWN, message, [])
            return
        events = f"/v1/runs/{run_id}/events"
        body = json.dumps({"run_id": run_id, "events_url": events, "replayed": True}).encode()
        status = 303
        headers = [(b"location", events.encode()), (b"colony-run-id", run_id.encode())]
        headers.append((b"content-type", b"application/json"))
    elif "body" in record:
        body = base64.b64decode(record["body"])
    else:
        body = json.dumps({"replayed": True, "note": record.get("note", "")}).encode()
        headers = [(k, v) for k, v in headers if k != b"content-type"]
        headers.append((b"content-type", b"application/json"))
    headers.append((REPLAYED_HEADER.lower().encode(), b"true"))
    if status not in (204, 304):
        headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body if status not in (204, 304) else b""})


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (GuardMiddleware has read and bounded it already), or None: the client left."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)


__all__ = ["IdempotencyMiddleware", "effect_key"]


def _owned(scope: Scope, key: str) -> str:
    """The key as the token that sent it owns it: a scoped token's keys are its own (another token
    sending the same key makes another request, never gets this one's answer); the deployment's
    API token keeps the key as sent."""
    principal = (scope.get("state") or {}).get("principal")
    token_id = getattr(principal, "token_id", MAIN_TOKEN_ID)
    return key if token_id == MAIN_TOKEN_ID else f"{token_id}\n{key}"
