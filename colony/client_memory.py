"""`client.memory`: a ColonyClient's (and an AsyncColonyClient's) calls on an agent's memory
(docs/memory.md)."""

from __future__ import annotations

from typing import Any

from colony.client_http import ApiConnection, AsyncApiConnection, agent_path, present


def _query(query: str | None, **fields: Any) -> dict[str, Any]:
    """A MemoryQuery body: `query` text plus any of its fields (None ones left out)."""
    return present(query=query, **fields)


def _write(scope: str, content: str, **fields: Any) -> dict[str, Any]:
    return present(scope=scope, content=content, **fields)


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
