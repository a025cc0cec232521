"""The HTTP layer of colony.client: one connection to the Colony API (`ApiConnection`, and its async
twin), shared by a client and its resource clients (`client.sessions`, `client.blocks`, ...), the
API's error answers raised as `ApiError`, and the server-sent events a run or a turn streams.

Every write (POST, PUT, PATCH, DELETE; not a read-only POST such as memory recall) carries an
`Idempotency-Key` (one per call, the same on each of its attempts), so the connection can try it
again when the answer is lost or a 5xx (`Retry`): the API runs it once and answers a retry with the
first answer (docs/api.md, Idempotent writes). A read-only POST carries no key and is retried as a
read."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any
from urllib.parse import quote

import httpx

from colony.errors import ApiError
from colony.wire import idempotency
from colony.wire.token import TOKEN_ENV, TokenSource, is_loopback

HeadHook = Callable[[httpx.Headers], None]
RETRYABLE_STATUSES = frozenset({502, 503, 504})  # the API (or the proxy before it) is restarting
DEFAULT_ATTEMPTS = 4


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


class EventStream:
    """A streamed answer: its events (iterate it, once) and its headers (a run's `Colony-Run-Id`:
    a replayed answer's, from the 303 that sent it on, where the events' own answer names none)."""

    def __init__(self, headers: httpx.Headers, events: Iterator[dict[str, Any]]) -> None:
        self.headers = headers
        self._events = events

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._events


class AsyncEventStream:
    """The async twin of EventStream."""

    def __init__(self, headers: httpx.Headers, events: AsyncIterator[dict[str, Any]]) -> None:
        self.headers = headers
        self._events = events

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._events


def _headers_of(first: httpx.Response, final: httpx.Response) -> httpx.Headers:
    """The final answer's headers, with those of the first (a 303 replay) it lacks."""
    headers = httpx.Headers(first.headers)
    headers.update(final.headers)
    return headers


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

    def fresh(self, event: dict[str, Any]) -> bool:
        """False for an event at or before the last one handed out (a server or proxy that
        ignored `Last-Event-ID` sends the stream again): it is skipped, and is no progress, so such
        a server is given up on after the window instead of streaming the same events for ever."""
        last, now = _event_order(self.last_event_id), _event_order(event.get("id"))
        return last is None or now is None or now > last

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
        if self.window <= 0 or now - self._since >= self.window:  # 0: never reconnects
            if exc is not None:
                raise exc
            raise ApiError(
                503,
                "stream_interrupted",
                f"the event stream kept ending before the run's terminal event for {self.window:g}s",
            )
        self._failures += 1
        return min(0.2 * 2 ** (self._failures - 1), 2.0)


def _event_order(event_id: Any) -> tuple[int, int] | None:
    """(ms, seq) of an event id (`<ms>-<seq>`), or None for anything else."""
    if not isinstance(event_id, str):
        return None
    ms, sep, seq = event_id.partition("-")
    return (int(ms), int(seq)) if sep and ms.isdigit() and seq.isdigit() else None


class Retry:
    """When a call is tried again, and after how long. A write (it carries an Idempotency-Key) after
    a lost connection or answer (any httpx transport error, timeouts included), a 5xx, or a 409
    saying the first attempt still runs; a read after a transport error or a 502/503/504. Never
    after another 4xx. At most `attempts` tries in all, `backoff` seconds doubling up to 5 s
    between them (longer when the answer's `Retry-After` says so, up to 5 s)."""

    MAX_DELAY = 5.0

    def __init__(self, attempts: int = DEFAULT_ATTEMPTS, backoff: float = 0.25) -> None:
        if attempts < 1:
            raise ValueError(f"attempts: {attempts}; at least 1 (1: never retried)")
        self.attempts = attempts
        self.backoff = backoff

    def delay(
        self,
        method: str,
        attempt: int,
        response: httpx.Response | None,
        exc: Exception | None = None,
        *,
        path: str = "",
    ) -> float | None:
        """Seconds to wait before attempt `attempt + 1` of `method` on `path`; None: `response` (or
        `exc`) stands."""
        if attempt >= self.attempts:
            return None
        write = idempotency.takes_key(method, path)
        if response is None:
            retried = isinstance(exc, httpx.TransportError)
        elif write:
            retried = response.status_code >= 500 or (
                response.status_code == 409 and _error_code(response) == idempotency.IN_FLIGHT
            )
        else:
            retried = response.status_code in RETRYABLE_STATUSES
        if not retried:
            return None
        wait = min(self.backoff * 2 ** (attempt - 1), self.MAX_DELAY)
        after = response.headers.get("retry-after", "") if response is not None else ""
        return min(max(wait, float(after)), self.MAX_DELAY) if after.isdigit() else wait


def _error_code(response: httpx.Response) -> str | None:
    try:
        response.read()  # (an async stream's answer was read before)
        error = response.json().get("error", {})
    except (ValueError, AttributeError, RuntimeError, httpx.HTTPError):
        return None
    return error.get("code") if isinstance(error, dict) else None


def _timeout_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"timeout": kwargs["timeout"]} if "timeout" in kwargs else {}


def keyed(method: str, path: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with an Idempotency-Key for a write (a fresh one, unless the caller gave one); a
    read, or a read-only POST (`idempotency.READ_ONLY_POSTS`), as it is: the API would keep an
    answer for each keyed call, for nothing."""
    if not idempotency.takes_key(method, path):
        return kwargs
    headers = dict(kwargs.get("headers") or {})
    if not any(name.lower() == idempotency.HEADER.lower() for name in headers):
        headers[idempotency.HEADER] = idempotency.new_key()
    return {**kwargs, "headers": headers}


_RUN_EVENTS = re.compile(r"/v1/runs/[A-Za-z0-9][A-Za-z0-9_.-]{0,127}/events")


def replayed_stream(response: httpx.Response) -> str | None:
    """Where a streamed answer replayed to a retry goes on (a 303 to the run's events), or None.
    Only a path of this API's run events is followed: a Location naming another host (a hostile
    proxy's) would be sent the token."""
    if response.status_code == 303 and response.headers.get(idempotency.REPLAYED_HEADER) == "true":
        location = response.headers.get("location", "")
        if not _RUN_EVENTS.fullmatch(location):
            raise ApiError(
                502,
                "bad_replay",
                f"a replayed answer sent the client to {location[:120]!r}, not to a run's events on this "
                "API; not followed",
            )
        return location
    return None


class ApiConnection:
    """One connection to the API (an httpx client carrying the token), shared by a ColonyClient and
    its resource clients; every answer of 400 or above raises `ApiError`. Writes carry an
    Idempotency-Key and are retried as `Retry` says (`attempts`: tries in all per call)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float,
        transport: httpx.BaseTransport | None,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> None:
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers=auth_headers(token, url), timeout=timeout, transport=transport
        )
        self.retry = Retry(attempts)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._send(method, path, keyed(method, path, kwargs), stream=False)
        raise_for(response)
        return response

    def _send(
        self, method: str, path: str, kwargs: dict[str, Any], *, stream: bool, retry: Retry | None = None
    ) -> httpx.Response:
        retry = retry or self.retry
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self.http.send(self.http.build_request(method, path, **kwargs), stream=stream)
            except httpx.TransportError as exc:
                if (wait := retry.delay(method, attempt, None, exc, path=path)) is None:
                    raise
            else:
                if (wait := retry.delay(method, attempt, response, path=path)) is None:
                    return response
                response.close()
            time.sleep(wait)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The answer's JSON (None for a 204 No Content)."""
        response = self.request(method, path, **kwargs)
        return None if response.status_code == 204 else response.json()

    @contextlib.contextmanager
    def events(
        self, method: str, path: str, *, on_head: HeadHook | None = None, **kwargs: Any
    ) -> Iterator[EventStream]:
        """The events a streamed answer sends, while the block lasts (the stream closes after). A
        write is retried until its stream starts; a retry answered with a replay goes on with the
        run's own event stream (`GET /v1/runs/{id}/events`, the events the run wrote). `on_head`
        gets the first answer's headers (a replay's 303 too) before its events are followed."""
        with contextlib.ExitStack() as stack:
            kwargs = keyed(method, path, kwargs)
            retry = self.retry if idempotency.takes_key(method, path) else Retry(1)
            first = response = self._send(method, path, kwargs, stream=True, retry=retry)
            stack.callback(response.close)
            if on_head is not None and response.status_code < 400:
                on_head(response.headers)
            location = replayed_stream(response)
            if location is not None:
                response = self._send("GET", location, _timeout_of(kwargs), stream=True, retry=Retry(1))
                stack.callback(response.close)
            if response.status_code >= 400:
                response.read()
                raise_for(response)
            yield EventStream(_headers_of(first, response), sse_events(response.iter_lines()))

    def close(self) -> None:
        self.http.close()


class AsyncApiConnection:
    """The async twin of ApiConnection."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float,
        transport: httpx.AsyncBaseTransport | None,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> None:
        self.http = httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=auth_headers(token, url), timeout=timeout, transport=transport
        )
        self.retry = Retry(attempts)

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The answer's JSON (None for a 204 No Content)."""
        response = await self._send(method, path, keyed(method, path, kwargs), stream=False)
        raise_for(response)
        return None if response.status_code == 204 else response.json()

    async def _send(
        self, method: str, path: str, kwargs: dict[str, Any], *, stream: bool, retry: Retry | None = None
    ) -> httpx.Response:
        retry = retry or self.retry
        attempt = 0
        while True:
            attempt += 1
            try:
                request = self.http.build_request(method, path, **kwargs)
                response = await self.http.send(request, stream=stream)
            except httpx.TransportError as exc:
                if (wait := retry.delay(method, attempt, None, exc, path=path)) is None:
                    raise
            else:
                if stream and response.status_code >= 300:
                    await response.aread()  # (Retry reads an error's code)
                if (wait := retry.delay(method, attempt, response, path=path)) is None:
                    return response
                await response.aclose()
            await asyncio.sleep(wait)

    @contextlib.asynccontextmanager
    async def events(
        self, method: str, path: str, *, on_head: HeadHook | None = None, **kwargs: Any
    ) -> AsyncIterator[AsyncEventStream]:
        async with contextlib.AsyncExitStack() as stack:
            kwargs = keyed(method, path, kwargs)
            retry = self.retry if idempotency.takes_key(method, path) else Retry(1)
            first = response = await self._send(method, path, kwargs, stream=True, retry=retry)
            stack.push_async_callback(response.aclose)
            if on_head is not None and response.status_code < 400:
                on_head(response.headers)
            location = replayed_stream(response)
            if location is not None:
                response = await self._send("GET", location, _timeout_of(kwargs), stream=True, retry=Retry(1))
                stack.push_async_callback(response.aclose)
            if response.status_code >= 400:
                await response.aread()
                raise_for(response)
            yield AsyncEventStream(_headers_of(first, response), async_sse_events(response.aiter_lines()))

    async def close(self) -> None:
        await self.http.aclose()
