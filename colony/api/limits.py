"""The API's outer wall: authentication and the body-size limit, before any route sees a request.

Both live in one pure ASGI middleware rather than in FastAPI dependencies, because FastAPI reads
and parses a body before it runs dependencies: a caller without a token could make the server
parse a megabyte, and a chunked body (no `Content-Length`) would be read whole before a limit on
the header could apply. Here the token is checked first, and the body is counted as it streams
in: past `api.max_body_bytes` the request ends with 413 and what was read is dropped.

What a parsed input may hold is checked by `colony.wire.input_check.check_input`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from colony.errors import ColonyError
from colony.wire.token import TokenSource

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/healthz"})
METRICS_PATH = "/metrics"  # the one route the metrics-only token (api.metrics_token) opens
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


async def send_error(
    send: Send, status: int, code: str, message: str, headers: list[tuple[bytes, bytes]]
) -> None:
    body = error_body(code, message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def app_path(scope: Scope) -> str:
    """The request's path inside the app: Serve mounts an app under its route prefix by setting
    `root_path` and keeping the full path, so `/colony/healthz` under prefix `/colony` is `/healthz`
    (the open and metrics-only routes are matched on this, as the router matches its routes)."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", "")).rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :] or "/"
    return path


IMPORT_PATH = re.compile(r"/v1/agents/[^/]+/import")


class GuardMiddleware:
    """Token first (401 with `WWW-Authenticate: Bearer`), then a streamed body limit (413)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Callable[[], Awaitable[TokenSource]],
        max_body_bytes: int,
        public_docs: bool,
        import_body_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.max_body_bytes = max_body_bytes
        # an agent export document (`POST /v1/agents/{id}/import`) may be larger than any other
        # body; only a caller whose token was accepted gets that far
        self.import_body_bytes = max(max_body_bytes, import_body_bytes or 0)
        self.open_paths = OPEN_PATHS | (DOCS_PATHS if public_docs else frozenset())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = app_path(scope)
        if path not in self.open_paths:
            authorization = None
            for name, value in scope.get("headers", []):
                if name == b"authorization":
                    authorization = value.decode("latin-1")
                    break
            try:
                tokens = await self.tokens()
                if path == METRICS_PATH:
                    accepted = tokens.accepts_for_metrics(authorization)
                else:
                    accepted = tokens.accepts(authorization)
            except ColonyError as exc:  # e.g. the token file exists but cannot be read: the operator's
                await send_error(send, 503, "unavailable", str(exc), [])
                return
            if not accepted:
                await send_error(
                    send,
                    401,
                    "unauthorized",
                    "missing or wrong bearer token (send Authorization: Bearer <token>; "
                    "`colony status` prints it)",
                    [(b"www-authenticate", b"Bearer")],
                )
                return
        limit = self.import_body_bytes if IMPORT_PATH.fullmatch(path) else self.max_body_bytes
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await send_error(send, 413, "body_too_large", f"request body over {limit} bytes", [])
                return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away mid-body: nothing to answer, nothing half-read to act on
            body += message.get("body", b"")
            if len(body) > limit:
                await send_error(send, 413, "body_too_large", f"request body over {limit} bytes", [])
                return
            more = message.get("more_body", False)
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the buffered body once, then whatever the server sends next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
