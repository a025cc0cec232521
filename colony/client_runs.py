"""A run submitted and streamed in one request (`POST /v1/runs` with `"stream": true`): what
`ColonyClient.stream` and `run` use. Against submitting and then opening the run's event stream,
it saves a request through Serve's proxy before the first event (about 5 to 7 ms of a 2-core
box's time to first token, benchmarks/token_path.py).

A stream that breaks after the answer's head arrived is resumed at the run's own event stream
(`GET /v1/runs/{run_id}/events`) after the last event received, so nothing is repeated and
nothing skipped. One that breaks before it is the submit's to retry: it carries an
Idempotency-Key, and the API answers a retry whose first try did submit with that run's events
(colony.client_http)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx

from colony.client_http import ApiConnection, AsyncApiConnection, StreamResumer
from colony.errors import ApiError
from colony.wire.run_events import TERMINAL_EVENTS

RUN_ID_HEADER = "Colony-Run-Id"
RUNS_PATH = "/v1/runs"


def _run_id_of(headers: httpx.Headers) -> str:
    run_id = headers.get(RUN_ID_HEADER)
    if not run_id:
        message = f"the streamed submit's answer has no {RUN_ID_HEADER} header"
        raise ApiError(502, "stream_without_run", message)
    return run_id


def _resumable(run_id: str | None, exc: Exception) -> bool:
    """Whether a broken stream goes on at the run's events: only once the run is known (before,
    the submit itself failed, and its retries are the connection's), and only for an error a
    reconnect can outlast."""
    return run_id is not None and StreamResumer(None, 0.0).retryable(exc)


class RunStream:
    """`for event in client.stream("ask", {...})`: the run's events as `client.events` yields them,
    ending with its terminal one. `run_id` is set once the answer's head arrived (before the first
    event is yielded)."""

    def __init__(
        self,
        api: ApiConnection,
        body: dict[str, Any],
        resume: Callable[[str, str | None], Iterator[dict[str, Any]]],
    ) -> None:
        self._api = api
        self._body = {**body, "stream": True}
        self._resume = resume
        self.run_id: str | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        last: str | None = None
        try:
            with self._api.events("POST", RUNS_PATH, json=self._body, timeout=None) as events:
                self.run_id = _run_id_of(events.headers)
                for event in events:
                    last = event.get("id") or last
                    yield event
                    if event.get("event_type") in TERMINAL_EVENTS:
                        return
        except (httpx.TransportError, ApiError) as exc:
            if not _resumable(self.run_id, exc):
                raise
        assert self.run_id is not None  # (set before any event, else raised above)
        yield from self._resume(self.run_id, last)  # broken, or ended without its terminal event


class AsyncRunStream:
    """The async twin of RunStream: `async for event in client.stream(...)`."""

    def __init__(
        self,
        api: AsyncApiConnection,
        body: dict[str, Any],
        resume: Callable[[str, str | None], AsyncIterator[dict[str, Any]]],
    ) -> None:
        self._api = api
        self._body = {**body, "stream": True}
        self._resume = resume
        self.run_id: str | None = None

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        last: str | None = None
        try:
            async with self._api.events("POST", RUNS_PATH, json=self._body, timeout=None) as events:
                self.run_id = _run_id_of(events.headers)
                async for event in events:
                    last = event.get("id") or last
                    yield event
                    if event.get("event_type") in TERMINAL_EVENTS:
                        return
        except (httpx.TransportError, ApiError) as exc:
            if not _resumable(self.run_id, exc):
                raise
        assert self.run_id is not None
        async for event in self._resume(self.run_id, last):
            yield event
