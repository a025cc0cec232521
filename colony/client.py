"""Python clients of the Colony HTTP API (sync and async)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import httpx

from colony.client_context import ContextClientMixin
from colony.client_sessions import SessionClientMixin
from colony.client_transfer import TransferClientMixin
from colony.errors import ApiError
from colony.wire.run_events import TERMINAL_EVENTS
from colony.wire.token import TOKEN_ENV, TokenSource, is_loopback

__all__ = ["ApiError", "AsyncColonyClient", "ColonyClient"]


def _auth_headers(token: str | None, url: str) -> dict[str, str]:
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


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error", {})
    except ValueError:
        error = {}
    raise ApiError(
        response.status_code, error.get("code", "http_error"), error.get("message", response.text[:300])
    )


class _SseParser:
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


RETRYABLE_STATUSES = frozenset({502, 503, 504})  # the API (or the proxy before it) is restarting


class _StreamResumer:
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


def _body(agent: str, input_data: Any, namespace: str | None, timeout_s: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "input": input_data}
    if namespace:
        body["namespace"] = namespace
    if timeout_s:
        body["timeout_s"] = timeout_s
    return body


def _agent_path(agent: str) -> str:
    """`/v1/agents/{agent}`, the id escaped (the API refuses ids outside its pattern anyway)."""
    return f"/v1/agents/{quote(agent, safe='')}"


def _blocks_path(agent: str | None, label: str | None = None) -> str:
    """`/v1/agents/{agent}/blocks[/{label}]`, or `/v1/colony/blocks[/{label}]` when `agent` is None
    (colony-wide blocks, as the operator); parts escaped (the API checks them against its patterns)."""
    base = f"{_agent_path(agent)}/blocks" if agent is not None else "/v1/colony/blocks"
    return base if label is None else f"{base}/{quote(label, safe='')}"


def _present(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _memory_query(query: str | None, **fields: Any) -> dict[str, Any]:
    """A MemoryQuery body: `query` text plus any of its fields (None ones left out)."""
    body = {"query": query, **fields}
    return {k: v for k, v in body.items() if v is not None}


def _memory_write(scope: str, content: str, **fields: Any) -> dict[str, Any]:
    body = {"scope": scope, "content": content, **fields}
    return {k: v for k, v in body.items() if v is not None}


class ColonyClient(ContextClientMixin, TransferClientMixin, SessionClientMixin):
    """`with ColonyClient(url, token) as client: run = client.run("echo", {"x": 1})`."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        reconnect_seconds: float = 30.0,
    ) -> None:
        """`reconnect_seconds`: how long `events()` keeps reconnecting a broken event stream
        without receiving an event (0: never reconnects)."""
        headers = _auth_headers(token, url)
        self.reconnect_seconds = reconnect_seconds
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> ColonyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def health(self) -> dict[str, Any]:
        response = self._http.get("/healthz")
        _raise_for(response)
        return dict(response.json())

    def submit(
        self,
        agent: str,
        input_data: Any = None,
        *,
        namespace: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        response = self._http.post("/v1/runs", json=_body(agent, input_data, namespace, timeout_s))
        _raise_for(response)
        return dict(response.json())

    def get(self, run_id: str) -> dict[str, Any]:
        response = self._http.get(f"/v1/runs/{run_id}")
        _raise_for(response)
        return dict(response.json())

    def cancel(self, run_id: str) -> dict[str, Any]:
        response = self._http.post(f"/v1/runs/{run_id}/cancel")
        _raise_for(response)
        return dict(response.json())

    def events(self, run_id: str, last_event_id: str | None = None) -> Iterator[dict[str, Any]]:
        """The run's events, ending with its terminal one, as the server sends them: a run that
        redid a step after its replica died has a `restarted` event, and the abandoned attempt's
        events stay in the stream (docs/api.md, Run events; `colony.run_display.RunDisplay` shows how to
        render them without repeating text). A stream that breaks before the terminal event is
        resumed after the last event received (`reconnect_seconds`)."""
        resumer = _StreamResumer(last_event_id, self.reconnect_seconds)
        while True:
            error: Exception | None = None
            try:
                with self._http.stream(
                    "GET", f"/v1/runs/{run_id}/events", headers=resumer.headers, timeout=None
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        _raise_for(response)
                    parser = _SseParser()
                    for line in response.iter_lines():
                        event = parser.feed(line)
                        if event is not None:
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
        run_id = self.submit(agent, input_data, **kwargs)["run_id"]
        for _event in self.events(run_id):
            pass
        return self.get(run_id)

    def agents(self) -> list[dict[str, Any]]:
        response = self._http.get("/v1/agents")
        _raise_for(response)
        return list(response.json())

    def replicas(self) -> list[dict[str, Any]]:
        response = self._http.get("/v1/replicas")
        _raise_for(response)
        return list(response.json())

    def suspend(self, agent_id: str) -> dict[str, Any]:
        """Suspend an agent until `resume()`; its registry record."""
        response = self._http.post(f"/v1/agents/{agent_id}/suspend")
        _raise_for(response)
        return dict(response.json())

    def resume(self, agent_id: str) -> dict[str, Any]:
        response = self._http.post(f"/v1/agents/{agent_id}/resume")
        _raise_for(response)
        return dict(response.json())

    def catalog(self) -> list[dict[str, Any]]:
        """Every agent the colony starts with: built-ins and user agents (`GET /v1/agents/catalog`)."""
        response = self._http.get("/v1/agents/catalog")
        _raise_for(response)
        return list(response.json())

    def memory_map(self, agent: str) -> dict[str, Any]:
        """The agent's MemoryMap: scopes (type, entries, cap, TTL, pending, tags) and dataflow edges."""
        response = self._http.get(f"{_agent_path(agent)}/memory")
        _raise_for(response)
        return dict(response.json())

    def memory_query(self, agent: str, query: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        """Recall from the agent's memory; `fields`: MemoryQuery's (tag_filter, scopes, max_results,
        min_relevance, mode, ...). The RecalledEntry list, most relevant first."""
        response = self._http.post(f"{_agent_path(agent)}/memory/query", json=_memory_query(query, **fields))
        _raise_for(response)
        return list(response.json()["entries"])

    def memory_write(self, agent: str, scope: str, content: str, **fields: Any) -> dict[str, Any]:
        """Store an entry in one of the agent's scopes (`scope`: "working", "stm", ... or a full id);
        `fields`: NewMemory's (tags, data, kind, ttl_seconds, entry_id, importance, ...).
        {"entry", "created", "duplicate_of"}."""
        response = self._http.post(
            f"{_agent_path(agent)}/memory", json=_memory_write(scope, content, **fields)
        )
        _raise_for(response)
        return dict(response.json())

    def memory_reindex(self, agent: str) -> dict[str, Any]:
        """Rebuild the agent's memory indexes from Redis: {"scopes": {scope_id: entries}, "vector"}."""
        response = self._http.post(f"{_agent_path(agent)}/memory/reindex")
        _raise_for(response)
        return dict(response.json())

    # -- memory blocks: `agent` None means the colony-wide blocks (acting as the operator) ---------

    def _blocks(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        _raise_for(response)
        return None if response.status_code == 204 else response.json()

    def blocks(self, agent: str | None) -> list[dict[str, Any]]:
        """Every block `agent` sees (own, shared, colony) with its access and size; None: colony blocks."""
        return list(self._blocks("GET", _blocks_path(agent)))

    def block_create(self, agent: str | None, label: str, **fields: Any) -> dict[str, Any]:
        """Create a block owned by `agent` (None: a colony block; `access` in `fields`); `fields`:
        description, block_type, char_limit, read_only, content, template, ... Its BlockInfo."""
        return dict(self._blocks("POST", _blocks_path(agent), json=_present(label=label, **fields)))

    def block(
        self, agent: str | None, label: str, *, owner: str | None = None, version: int | None = None
    ) -> dict[str, Any]:
        """The BlockView `agent` gets (content, version, access, info); `version`: a past one."""
        params = _present(owner=owner, version=version)
        return dict(self._blocks("GET", _blocks_path(agent, label), params=params))

    def block_put(
        self,
        agent: str | None,
        label: str,
        content: str,
        *,
        base_version: int | None = None,
        message: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Rewrite the content as `agent` (409 only when `base_version` is given and stale)."""
        body = _present(content=content, base_version=base_version, message=message)
        return dict(self._blocks("PUT", _blocks_path(agent, label), json=body, params=_present(owner=owner)))

    def block_append(
        self,
        agent: str | None,
        label: str,
        text: str,
        *,
        base_version: int | None = None,
        message: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        body = _present(text=text, base_version=base_version, message=message)
        path = f"{_blocks_path(agent, label)}/append"
        return dict(self._blocks("POST", path, json=body, params=_present(owner=owner)))

    def block_settings(self, agent: str | None, label: str, **fields: Any) -> dict[str, Any]:
        """Change description, char_limit or swapped_out (the owner only); the new BlockInfo."""
        return dict(self._blocks("PATCH", _blocks_path(agent, label), json=_present(**fields)))

    def block_history(
        self, agent: str | None, label: str, *, owner: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        params = _present(owner=owner, limit=limit)
        return dict(self._blocks("GET", f"{_blocks_path(agent, label)}/history", params=params))

    def block_rollback(
        self,
        agent: str | None,
        label: str,
        version: int,
        *,
        message: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        body = _present(version=version, message=message)
        path = f"{_blocks_path(agent, label)}/rollback"
        return dict(self._blocks("POST", path, json=body, params=_present(owner=owner)))

    def block_undo(self, agent: str, label: str, *, owner: str | None = None) -> dict[str, Any]:
        """Undo `agent`'s own latest edit of the block, keeping everyone else's."""
        path = f"{_blocks_path(agent, label)}/undo"
        return dict(self._blocks("POST", path, json={}, params=_present(owner=owner)))

    def block_delete(self, agent: str | None, label: str) -> None:
        self._blocks("DELETE", _blocks_path(agent, label))

    def block_share(self, owner: str, label: str, agent: str, access: str) -> dict[str, Any]:
        """Give `agent` `access` (read_only, append_only, read_write) to `owner`'s block."""
        body = {"owner": owner, "label": label, "agent_id": agent, "access": access}
        return dict(self._blocks("POST", "/v1/blocks/share", json=body))

    def block_unshare(self, owner: str, label: str, agent: str) -> bool:
        body = {"owner": owner, "label": label, "agent_id": agent}
        return bool(self._blocks("DELETE", "/v1/blocks/share", json=body)["removed"])

    def map_source(self, path: str, page_tokens: int | None = None) -> dict[str, Any]:
        """Cut a folder (readable by the cluster) into pages; {"source_id", "path", "pages": [...]}."""
        body: dict[str, Any] = {"path": path}
        if page_tokens is not None:
            body["page_tokens"] = page_tokens
        response = self._http.post("/v1/vcm/sources", json=body)
        _raise_for(response)
        return dict(response.json())


class AsyncColonyClient:
    """The async twin of ColonyClient."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        reconnect_seconds: float = 30.0,
    ) -> None:
        headers = _auth_headers(token, url)
        self.reconnect_seconds = reconnect_seconds
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncColonyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def submit(
        self,
        agent: str,
        input_data: Any = None,
        *,
        namespace: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        response = await self._http.post("/v1/runs", json=_body(agent, input_data, namespace, timeout_s))
        _raise_for(response)
        return dict(response.json())

    async def get(self, run_id: str) -> dict[str, Any]:
        response = await self._http.get(f"/v1/runs/{run_id}")
        _raise_for(response)
        return dict(response.json())

    async def cancel(self, run_id: str) -> dict[str, Any]:
        response = await self._http.post(f"/v1/runs/{run_id}/cancel")
        _raise_for(response)
        return dict(response.json())

    async def events(self, run_id: str, last_event_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """As `ColonyClient.events`: raw, `restarted` events included, a broken stream resumed."""
        resumer = _StreamResumer(last_event_id, self.reconnect_seconds)
        while True:
            error: Exception | None = None
            try:
                async with self._http.stream(
                    "GET", f"/v1/runs/{run_id}/events", headers=resumer.headers, timeout=None
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        _raise_for(response)
                    parser = _SseParser()
                    async for line in response.aiter_lines():
                        event = parser.feed(line)
                        if event is not None:
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
        run_id = (await self.submit(agent, input_data, **kwargs))["run_id"]
        async for _event in self.events(run_id):
            pass
        return await self.get(run_id)

    async def catalog(self) -> list[dict[str, Any]]:
        response = await self._http.get("/v1/agents/catalog")
        _raise_for(response)
        return list(response.json())

    async def memory_map(self, agent: str) -> dict[str, Any]:
        response = await self._http.get(f"{_agent_path(agent)}/memory")
        _raise_for(response)
        return dict(response.json())

    async def memory_query(self, agent: str, query: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        body = _memory_query(query, **fields)
        response = await self._http.post(f"{_agent_path(agent)}/memory/query", json=body)
        _raise_for(response)
        return list(response.json()["entries"])

    async def memory_write(self, agent: str, scope: str, content: str, **fields: Any) -> dict[str, Any]:
        body = _memory_write(scope, content, **fields)
        response = await self._http.post(f"{_agent_path(agent)}/memory", json=body)
        _raise_for(response)
        return dict(response.json())

    async def memory_reindex(self, agent: str) -> dict[str, Any]:
        response = await self._http.post(f"{_agent_path(agent)}/memory/reindex")
        _raise_for(response)
        return dict(response.json())
