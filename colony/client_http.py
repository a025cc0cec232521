"""The HTTP layer of colony.client: one connection to the Colony API (`ApiConnection`, and its async
twin), shared by a client and its resource clients (`client.sessions`, `client.blocks`, ...), the
API's error answers raised as `ApiError`, and the server-sent events a run or a turn streams."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any
from urllib.parse import quote

import httpx

from colony.errors import ApiError
from colony.wire.token import TOKEN_ENV, TokenSource, is_loopback

RETRYABLE_STATUSES = frozenset({502, 503, 504})  # the API (or the proxy before it) is restarting


def auth_headers(token: str | None, url: str) -> dict[str, str]:
    """`Authorization` for `token`; None: for an API on this machine, the token it reads itself
    (COLONY_API_TOKEN, the config file's `api_token`, else the token file `api.token_file` /
    `<data_dir>/api-token`); for any other address only $COLONY_API_TOKEN, so the local cluster's
    token never goes to a server elsewhere. "" sends no token."""
    if token is None and not is_loopback(httpx.URL(url).host):
        token = os.environ.get(TOKEN_ENV) or ""
    if token is None:
        from colony.config import load_settings

        token = TokenSource.from_settings(load_settings()).current()
    return {"Authorization": f"Bearer {token}"} if token else {}


def raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error", {})
    except ValueError:
        error = {}
    raise ApiError(
        response.status_code, error.get("code", "http_error"), error.get("message", response.text[:300])
    )


def agent_path(agent: str) -> str:
    """`/v1/agents/{agent}`, the id escaped (the API refuses ids outside its pattern anyway)."""
    return f"/v1/agents/{quote(agent, safe='')}"


def present(**fields: Any) -> dict[str, Any]:
    """`fields` without the None ones."""
    return {k: v for k, v in fields.items() if v is not None}


class SseParser:
    """Server-sent events, a line at a time: `feed` returns an event when a blank line ends one."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}

    def feed(self, line: str) -> dict[str, Any] | None:
        if line:
            key, _, value = line.partition(": ")
            self._fields[key] = value
            return None
        fields, self._fields = self._fields, {}
        return {"id": fields.get("id"), **json.loads(fields["data"])} if "data" in fields else None


def sse_events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The events of a server-sent event stream's lines."""
    parser = SseParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event


async def async_sse_events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    parser = SseParser()
    async for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event


class StreamResumer:
    """When a run's event stream breaks before its terminal event (the API replica serving it died,
    the proxy dropped it, the API answers 503 while it restarts), the clients reconnect with the
    last event id they handed out (`Last-Event-ID`), so nothing is repeated and nothing skipped.
    They give up when no event arrived for `window` seconds, raising the last error."""

    def __init__(self, last_event_id: str | None, window: float) -> None:
        self.last_event_id = last_event_id
        self.window = window
        self._since: float | None = None  # when the current run of failures began
        self._failures = 0

    @property
    def headers(self) -> dict[str, str]:
        return {"Last-Event-ID": self.last_event_id} if self.last_event_id else {}

    def seen(self, event: dict[str, Any]) -> None:
        self.last_event_id = event.get("id") or self.last_event_id
        self._since, self._failures = None, 0

    def retryable(self, exc: Exception) -> bool:
        """A transport error, a 502/503/504, or a 404 or 500 without a Colony error body: Serve's
        proxy answering before the app is deployed again (404, e.g. after `colony up`), or for a
        replica that died under the request it had routed to it (500). Reconnecting resumes the
        stream after the last event (nothing repeats); an error that persists is raised once the
        window passes without an event."""
        return isinstance(exc, httpx.TransportError) or (
            isinstance(exc, ApiError)
            and (exc.status in RETRYABLE_STATUSES or (exc.status in (404, 500) and exc.code == "http_error"))
        )

    def delay(self, exc: Exception | None) -> float:
        """Seconds to wait before reconnecting; raises `exc` (or a `StreamInterrupted`) once the
        window has passed without an event."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since >= self.window:
            if exc is not None:
                raise exc
            raise ApiError(
                503,
                "stream_interrupted",
                f"the event stream kept ending before the run's terminal event for {self.window:g}s",
            )
        self._failures += 1
        return min(0.2 * 2 ** (self._failures - 1), 2.0)


class ApiConnection:
    """One connection to the API (an httpx client carrying the token), shared by a ColonyClient and
    its resource clients; every answer of 400 or above raises `ApiError`."""

    def __init__(
        self, url: str, token: str | None, *, timeout: float, transport: httpx.BaseTransport | None
    ) -> None:
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers=auth_headers(token, url), timeout=timeout, transport=transport
        )

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self.http.request(method, path, **kwargs)
        raise_for(response)
        return response

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The answer's JSON (None for a 204 No Content)."""
        response = self.request(method, path, **kwargs)
        return None if response.status_code == 204 else response.json()

    @contextlib.contextmanager
    def events(self, method: str, path: str, **kwargs: Any) -> Iterator[Iterator[dict[str, Any]]]:
        """The events a streamed answer sends, while the block lasts (the stream closes after)."""
        with self.http.stream(method, path, **kwargs) as response:
            if response.status_code >= 400:
                response.read()
                raise_for(response)
            yield sse_events(response.iter_lines())

    def close(self) -> None:
        self.http.close()


class AsyncApiConnection:
    """The async twin of ApiConnection."""

    def __init__(
        self, url: str, token: str | None, *, timeout: float, transport: httpx.AsyncBaseTransport | None
    ) -> None:
        self.http = httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=auth_headers(token, url), timeout=timeout, transport=transport
        )

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The answer's JSON (None for a 204 No Content)."""
        response = await self.http.request(method, path, **kwargs)
        raise_for(response)
        return None if response.status_code == 204 else response.json()

    @contextlib.asynccontextmanager
    async def events(
        self, method: str, path: str, **kwargs: Any
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        async with self.http.stream(method, path, **kwargs) as response:
            if response.status_code >= 400:
                await response.aread()
                raise_for(response)
            yield async_sse_events(response.aiter_lines())

    async def close(self) -> None:
        await self.http.aclose()
