"""A run submitted and streamed in one request (`POST /v1/runs` with `"stream": true`): what
`ColonyClient.stream` and `run` use. Against submitting and then opening the run's event stream,
it saves a request through Serve's proxy before the first event (about 5 to 7 ms of a 2-core
box's time to first token, benchmarks/token_path.py).

A stream that breaks after the answer's head arrived (the run id known, from its Colony-Run-Id or
a replay's 303) is resumed at the run's own event stream (`GET /v1/runs/{run_id}/events`) after the
last event received, so nothing is repeated and nothing skipped. One that breaks before it is the
submit's to retry: the stream carries one Idempotency-Key for its whole life, and the API answers
a retry whose first try did submit with that run's events (colony.client_http). Iterating a stream
again goes on after the last event it yielded: it never submits a second run. The submit waits
for its answer's head as long as any call does (the client's timeout); the events, however long
the run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx

from colony.client_http import ApiConnection, AsyncApiConnection, StreamResumer
from colony.errors import ApiError
from colony.wire import idempotency
from colony.wire.run_events import TERMINAL_EVENTS

RUN_ID_HEADER = "Colony-Run-Id"
RUNS_PATH = "/v1/runs"


def _run_id_of(headers: httpx.Headers) -> str:
    run_id = headers.get(RUN_ID_HEADER)
    if not run_id:
        message = f"the streamed submit's answer has no {RUN_ID_HEADER} header"
        raise ApiError(502, "stream_without_run", message)
    return run_id


def _timeout(api: ApiConnection | AsyncApiConnection) -> httpx.Timeout:
    """The client's timeout to connect, send and get the answer's head; none between events."""
    limit = api.http.timeout.connect
    return httpx.Timeout(limit if limit is not None else 30.0, read=None)


def _resumable(run_id: str | None, exc: Exception) -> bool:
    """Whether a broken stream goes on at the run's events: only once the run is known (before,
    the submit itself failed, and its retries are the connection's), and only for an error a
    reconnect can outlast."""
    return run_id is not None and StreamResumer(None, 0.0).retryable(exc)


class _StreamedRun:
    """What a streamed run knows of itself, the same for both twins: its submit (one body, one
    Idempotency-Key for every try), its run id once a head named it, the last event yielded."""

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = {**body, "stream": True}
        self._key = {idempotency.HEADER: idempotency.new_key()}  # every try of this one submit
        self.run_id: str | None = None
        self.last_event_id: str | None = None
        self.ended = False  # its terminal event was yielded: iterating again yields nothing

    def _submit(self, api: ApiConnection | AsyncApiConnection) -> dict[str, Any]:
        """The arguments of the streamed submit (`api.events`)."""
        return {"json": self._body, "headers": self._key, "timeout": _timeout(api), "on_head": self._head}

    def _head(self, headers: httpx.Headers) -> None:
        self.run_id = headers.get(RUN_ID_HEADER) or self.run_id

    def _seen(self, event: dict[str, Any]) -> bool:
        """Note `event`; True when it ends the run."""
        self.last_event_id = event.get("id") or self.last_event_id
        self.ended = self.ended or event.get("event_type") in TERMINAL_EVENTS
        return self.ended

    def _broken(self, exc: Exception) -> None:
        """Raise `exc` unless the stream can go on at the run's events."""
        if not _resumable(self.run_id, exc):
            raise exc


class RunStream(_StreamedRun):
    """`for event in client.stream("ask", {...})`: the run's events as `client.events` yields them,
    ending with its terminal one. `run_id` is set once the answer's head arrived (before the first
    event is yielded)."""

    def __init__(
        self,
        api: ApiConnection,
        body: dict[str, Any],
        resume: Callable[[str, str | None], Iterator[dict[str, Any]]],
    ) -> None:
        super().__init__(body)
        self._api = api
        self._resume = resume

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.ended:
            return
        if self.run_id is None:
            try:
                with self._api.events("POST", RUNS_PATH, **self._submit(self._api)) as events:
                    _run_id_of(events.headers)
                    for event in events:
                        ended = self._seen(event)
                        yield event
                        if ended:
                            return
            except (httpx.TransportError, ApiError) as exc:
                self._broken(exc)
        assert self.run_id is not None  # (known before any event, else raised above)
        for event in self._resume(self.run_id, self.last_event_id):  # broken, ended early, or again
            self._seen(event)
            yield event


class AsyncRunStream(_StreamedRun):
    """The async twin of RunStream: `async for event in client.stream(...)`."""

    def __init__(
        self,
        api: AsyncApiConnection,
        body: dict[str, Any],
        resume: Callable[[str, str | None], AsyncIterator[dict[str, Any]]],
    ) -> None:
        super().__init__(body)
        self._api = api
        self._resume = resume

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        if self.ended:
            return
        if self.run_id is None:
            try:
                async with self._api.events("POST", RUNS_PATH, **self._submit(self._api)) as events:
                    _run_id_of(events.headers)
                    async for event in events:
                        ended = self._seen(event)
                        yield event
                        if ended:
                            return
            except (httpx.TransportError, ApiError) as exc:
                self._broken(exc)
        assert self.run_id is not None
        async for event in self._resume(self.run_id, self.last_event_id):
            self._seen(event)
            yield event
