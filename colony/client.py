"""Python clients of the Colony HTTP API (sync and async).

`ColonyClient` runs agents and reads their runs; the API's other resources are clients it holds,
sharing its one connection: `client.sessions` (colony.client_sessions), `client.blocks`
(colony.client_blocks), `client.memory` (colony.client_memory), `client.context` (checkpoints, undo,
restore: colony.client_context), `client.transfer` (export, import: colony.client_transfer) and
`client.access` (scoped tokens, the audit trail: colony.client_access).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from colony.client_access import AccessClient
from colony.client_blocks import BlocksClient
from colony.client_context import ContextClient
from colony.client_http import DEFAULT_ATTEMPTS, ApiConnection, AsyncApiConnection, StreamResumer
from colony.client_memory import AsyncMemoryClient, MemoryClient
from colony.client_runs import RUNS_PATH, AsyncRunStream, RunStream
from colony.client_sessions import SessionsClient
from colony.client_transfer import TransferClient
from colony.errors import ApiError
from colony.wire.run_events import TERMINAL_EVENTS

__all__ = ["ApiError", "AsyncColonyClient", "AsyncRunStream", "ColonyClient", "RunStream"]


def _body(agent: str, input_data: Any, namespace: str | None, timeout_s: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "input": input_data}
    if namespace:
        body["namespace"] = namespace
    if timeout_s:
        body["timeout_s"] = timeout_s
    return body


class ColonyClient:
    """`with ColonyClient(url, token) as client: run = client.run("echo", {"x": 1})`; sessions,
    blocks, memory, checkpoints and transfer through `client.sessions`, `client.blocks`,
    `client.memory`, `client.context` and `client.transfer`."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        reconnect_seconds: float = 30.0,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> None:
        """`reconnect_seconds`: how long `events()` keeps reconnecting a broken event stream
        without receiving an event (0: never reconnects). `attempts`: tries per call in all (1:
        never retried); every write carries an Idempotency-Key and is retried after a lost
        connection or a 5xx, a read (a read-only POST too: memory recall) after a lost connection
        or a 502/503/504 (colony.client_http.Retry). `transport`: httpx's (tests mock it)."""
        self.reconnect_seconds = reconnect_seconds
        self._api = ApiConnection(url, token, timeout=timeout, transport=transport, attempts=attempts)
        self.sessions = SessionsClient(self._api)
        self.blocks = BlocksClient(self._api)
        self.memory = MemoryClient(self._api)
        self.context = ContextClient(self._api)
        self.transfer = TransferClient(self._api)
        self.access = AccessClient(self._api)

    def __enter__(self) -> ColonyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._api.close()

    def health(self) -> dict[str, Any]:
        return dict(self._api.request("GET", "/healthz").json())

    def submit(
        self,
        agent: str,
        input_data: Any = None,
        *,
        namespace: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        return dict(self._api.call("POST", RUNS_PATH, json=_body(agent, input_data, namespace, timeout_s)))

    def stream(
        self,
        agent: str,
        input_data: Any = None,
        *,
        namespace: str | None = None,
        timeout_s: float | None = None,
    ) -> RunStream:
        """Submit a run and iterate its events, in one request (`stream: true`): the first events
        sooner than `submit` then `events` (one request less through the proxy). The stream's
        `run_id` is set before its first event; a stream that breaks is resumed as `events`
        resumes one (colony.client_runs)."""
        return RunStream(self._api, _body(agent, input_data, namespace, timeout_s), self.events)

    def get(self, run_id: str) -> dict[str, Any]:
        return dict(self._api.call("GET", f"/v1/runs/{run_id}"))

    def cancel(self, run_id: str) -> dict[str, Any]:
        return dict(self._api.call("POST", f"/v1/runs/{run_id}/cancel"))

    def tree(self, run_id: str) -> dict[str, Any]:
        """The run and the requests made while it was served, nested (GET /v1/runs/{id}/tree)."""
        return dict(self._api.call("GET", f"/v1/runs/{run_id}/tree"))

    def events(self, run_id: str, last_event_id: str | None = None) -> Iterator[dict[str, Any]]:
        """The run's events, ending with its terminal one, as the server sends them: a run that
        redid a step after its replica died has a `restarted` event, and the abandoned attempt's
        events stay in the stream (docs/api.md, Run events; `colony.run_display.RunDisplay` shows how to
        render them without repeating text). A stream that breaks before the terminal event is
        resumed after the last event received (`reconnect_seconds`)."""
        resumer = StreamResumer(last_event_id, self.reconnect_seconds)
        while True:
            error: Exception | None = None
            try:
                path = f"/v1/runs/{run_id}/events"
                with self._api.events("GET", path, headers=resumer.headers, timeout=None) as events:
                    for event in events:
                        if not resumer.fresh(event):  # sent again by a server that ignored Last-Event-ID
                            continue
                        resumer.seen(event)
                        yield event
                        if event.get("event_type") in TERMINAL_EVENTS:
                            return
            except (httpx.TransportError, ApiError) as exc:
                if not resumer.retryable(exc):
                    raise
                error = exc
            time.sleep(resumer.delay(error))

    def run(self, agent: str, input_data: Any = None, **kwargs: Any) -> dict[str, Any]:
        """Submit and wait (through the event stream); the final run view."""
        events = self.stream(agent, input_data, **kwargs)
        for _event in events:
            pass
        assert events.run_id is not None  # (the stream ended with the run's terminal event)
        return self.get(events.run_id)

    def agents(self) -> list[dict[str, Any]]:
        return list(self._api.call("GET", "/v1/agents"))

    def replicas(self) -> list[dict[str, Any]]:
        return list(self._api.call("GET", "/v1/replicas"))

    def suspend(self, agent_id: str) -> dict[str, Any]:
        """Suspend an agent until `resume()`; its registry record."""
        return dict(self._api.call("POST", f"/v1/agents/{agent_id}/suspend"))

    def resume(self, agent_id: str) -> dict[str, Any]:
        return dict(self._api.call("POST", f"/v1/agents/{agent_id}/resume"))

    def catalog(self) -> list[dict[str, Any]]:
        """Every agent the colony starts with: built-ins and user agents (`GET /v1/agents/catalog`)."""
        return list(self._api.call("GET", "/v1/agents/catalog"))

    def map_source(self, path: str, page_tokens: int | None = None) -> dict[str, Any]:
        """Cut a folder (readable by the cluster) into pages; {"source_id", "path", "pages": [...]}."""
        body: dict[str, Any] = {"path": path}
        if page_tokens is not None:
            body["page_tokens"] = page_tokens
        return dict(self._api.call("POST", "/v1/vcm/sources", json=body))


class AsyncColonyClient:
    """The async twin of ColonyClient (runs, the catalog, and `client.memory`)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        reconnect_seconds: float = 30.0,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> None:
        self.reconnect_seconds = reconnect_seconds
        self._api = AsyncApiConnection(url, token, timeout=timeout, transport=transport, attempts=attempts)
        self.memory = AsyncMemoryClient(self._api)

    async def __aenter__(self) -> AsyncColonyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._api.close()

    async def submit(
        self,
        agent: str,
        input_data: Any = None,
        *,
        namespace: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        body = _body(agent, input_data, namespace, timeout_s)
        return dict(await self._api.call("POST", RUNS_PATH, json=body))

    def stream(
        self,
        agent: str,
        input_data: Any = None,
        *,
        namespace: str | None = None,
        timeout_s: float | None = None,
    ) -> AsyncRunStream:
        """As `ColonyClient.stream`: `async for event in client.stream(...)`."""
        return AsyncRunStream(self._api, _body(agent, input_data, namespace, timeout_s), self.events)

    async def get(self, run_id: str) -> dict[str, Any]:
        return dict(await self._api.call("GET", f"/v1/runs/{run_id}"))

    async def cancel(self, run_id: str) -> dict[str, Any]:
        return dict(await self._api.call("POST", f"/v1/runs/{run_id}/cancel"))

    async def tree(self, run_id: str) -> dict[str, Any]:
        return dict(await self._api.call("GET", f"/v1/runs/{run_id}/tree"))

    async def events(self, run_id: str, last_event_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """As `ColonyClient.events`: raw, `restarted` events included, a broken stream resumed."""
        resumer = StreamResumer(last_event_id, self.reconnect_seconds)
        while True:
            error: Exception | None = None
            try:
                path = f"/v1/runs/{run_id}/events"
                async with self._api.events("GET", path, headers=resumer.headers, timeout=None) as events:
                    async for event in events:
                        if not resumer.fresh(event):
                            continue
                        resumer.seen(event)
                        yield event
                        if event.get("event_type") in TERMINAL_EVENTS:
                            return
            except (httpx.TransportError, ApiError) as exc:
                if not resumer.retryable(exc):
                    raise
                error = exc
            await asyncio.sleep(resumer.delay(error))

    async def run(self, agent: str, input_data: Any = None, **kwargs: Any) -> dict[str, Any]:
        events = self.stream(agent, input_data, **kwargs)
        async for _event in events:
            pass
        assert events.run_id is not None
        return await self.get(events.run_id)

    async def catalog(self) -> list[dict[str, Any]]:
        return list(await self._api.call("GET", "/v1/agents/catalog"))
