"""`client.memory`: a ColonyClient's (and an AsyncColonyClient's) calls on an agent's memory and
on the colony's shared memory (docs/memory.md)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from colony.client_http import ApiConnection, AsyncApiConnection, agent_path, present

SHARED = "/v1/memory/shared"


def _query(query: str | None, **fields: Any) -> dict[str, Any]:
    """A MemoryQuery body: `query` text plus any of its fields (None ones left out)."""
    return present(query=query, **fields)


def _write(scope: str, content: str, **fields: Any) -> dict[str, Any]:
    return present(scope=scope, content=content, **fields)


def shared_path(name: str) -> str:
    """`/v1/memory/shared/{name}` (`global`, `collective:NAME`, `task:NAME`), the name escaped."""
    return f"{SHARED}/{quote(name, safe=':')}"


def _define(readers: list[str] | None, writers: list[str] | None, **fields: Any) -> dict[str, Any]:
    return present(readers=readers, writers=writers, **fields)


class MemoryClient:
    """An agent's memory: its map, recall, a write, and a rebuild of its indexes."""

    def __init__(self, api: ApiConnection) -> None:
        self._api = api

    def map(self, agent: str) -> dict[str, Any]:
        """The agent's MemoryMap: scopes (type, entries, cap, TTL, pending, tags) and dataflow edges."""
        return dict(self._api.call("GET", f"{agent_path(agent)}/memory"))

    def query(self, agent: str, query: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        """Recall from the agent's memory; `fields`: MemoryQuery's (tag_filter, scopes, max_results,
        min_relevance, mode, ...). The RecalledEntry list, most relevant first."""
        body = _query(query, **fields)
        return list(self._api.call("POST", f"{agent_path(agent)}/memory/query", json=body)["entries"])

    def write(self, agent: str, scope: str, content: str, **fields: Any) -> dict[str, Any]:
        """Store an entry in one of the agent's scopes (`scope`: "working", "stm", ... or a full id);
        `fields`: NewMemory's (tags, data, kind, ttl_seconds, entry_id, importance, ...).
        {"entry", "created", "duplicate_of"}."""
        body = _write(scope, content, **fields)
        return dict(self._api.call("POST", f"{agent_path(agent)}/memory", json=body))

    def reindex(self, agent: str) -> dict[str, Any]:
        """Rebuild the agent's memory indexes from Redis: {"scopes": {scope_id: entries}, "vector"}."""
        return dict(self._api.call("POST", f"{agent_path(agent)}/memory/reindex"))

    def shared(self) -> list[dict[str, Any]]:
        """The colony's shared memory scopes (name, rules, entry count, the scopes feeding each)."""
        return list(self._api.call("GET", SHARED)["scopes"])

    def shared_scope(self, name: str) -> dict[str, Any]:
        """One shared scope (404 when not defined)."""
        return dict(self._api.call("GET", shared_path(name)))

    def define_shared(
        self, name: str, *, readers: list[str] | None = None, writers: list[str] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Define a shared scope or replace its rules (`readers`/`writers`: agent ids or "*"; absent:
        every agent reads, none writes); `fields`: purpose, ttl_seconds, max_entries."""
        body = _define(readers, writers, **fields)
        return dict(self._api.call("PUT", shared_path(name), json=body))

    def share(self, name: str, content: str, **fields: Any) -> dict[str, Any]:
        """Store an entry in a shared scope (as the operator); {"entry", "created", "duplicate_of"}."""
        body = present(content=content, **fields)
        return dict(self._api.call("POST", f"{shared_path(name)}/entries", json=body))

    def recall_shared(self, name: str, query: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        """Recall from a shared scope, most relevant first (fields as `query`'s, less `scopes`)."""
        body = _query(query, **fields)
        return list(self._api.call("POST", f"{shared_path(name)}/query", json=body)["entries"])


class AsyncMemoryClient:
    """The async twin of MemoryClient."""

    def __init__(self, api: AsyncApiConnection) -> None:
        self._api = api

    async def map(self, agent: str) -> dict[str, Any]:
        return dict(await self._api.call("GET", f"{agent_path(agent)}/memory"))

    async def query(self, agent: str, query: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        body = _query(query, **fields)
        return list((await self._api.call("POST", f"{agent_path(agent)}/memory/query", json=body))["entries"])

    async def write(self, agent: str, scope: str, content: str, **fields: Any) -> dict[str, Any]:
        body = _write(scope, content, **fields)
        return dict(await self._api.call("POST", f"{agent_path(agent)}/memory", json=body))

    async def reindex(self, agent: str) -> dict[str, Any]:
        return dict(await self._api.call("POST", f"{agent_path(agent)}/memory/reindex"))

    async def shared(self) -> list[dict[str, Any]]:
        return list((await self._api.call("GET", SHARED))["scopes"])

    async def shared_scope(self, name: str) -> dict[str, Any]:
        return dict(await self._api.call("GET", shared_path(name)))

    async def define_shared(
        self, name: str, *, readers: list[str] | None = None, writers: list[str] | None = None, **fields: Any
    ) -> dict[str, Any]:
        body = _define(readers, writers, **fields)
        return dict(await self._api.call("PUT", shared_path(name), json=body))

    async def share(self, name: str, content: str, **fields: Any) -> dict[str, Any]:
        body = present(content=content, **fields)
        return dict(await self._api.call("POST", f"{shared_path(name)}/entries", json=body))

    async def recall_shared(self, name: str, query: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        body = _query(query, **fields)
        return list((await self._api.call("POST", f"{shared_path(name)}/query", json=body))["entries"])
