"""`client.blocks`: a ColonyClient's calls on memory blocks (docs/blocks.md). `agent` names who
acts, with exactly that agent's access; None acts on the colony-wide blocks, as the operator."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from colony.client_http import ApiConnection, agent_path, present

Rows = list[dict[str, Any]]


def _path(agent: str | None, label: str | None = None) -> str:
    """`/v1/agents/{agent}/blocks[/{label}]`, or `/v1/colony/blocks[/{label}]` when `agent` is None
    (colony-wide blocks, as the operator); parts escaped (the API checks them against its patterns)."""
    base = f"{agent_path(agent)}/blocks" if agent is not None else "/v1/colony/blocks"
    return base if label is None else f"{base}/{quote(label, safe='')}"


def _provision(provision: bool) -> dict[str, str]:
    """The query of a pre-provisioning request (none otherwise)."""
    return {"provision": "true"} if provision else {}


class BlocksClient:
    """Memory blocks: list, create, read, write, append, settings, history, rollback, undo, delete,
    share and unshare."""

    def __init__(self, api: ApiConnection) -> None:
        self._api = api

    def list(self, agent: str | None) -> Rows:
        """Every block `agent` sees (own, shared, colony) with its access and size; None: colony blocks."""
        return list(self._api.call("GET", _path(agent)))

    def create(
        self, agent: str | None, label: str, *, provision: bool = False, **fields: Any
    ) -> dict[str, Any]:
        """Create a block owned by `agent` (None: a colony block; `access` in `fields`); `fields`:
        description, block_type, char_limit, read_only, content, template, ... Its BlockInfo.
        An agent the colony does not know is refused (404) unless `provision` (pre-provisioning:
        an agent started later under that id has the block)."""
        body = present(label=label, **fields)
        return dict(self._api.call("POST", _path(agent), json=body, params=_provision(provision)))

    def read(
        self, agent: str | None, label: str, *, owner: str | None = None, version: int | None = None
    ) -> dict[str, Any]:
        """The BlockView `agent` gets (content, version, access, info); `version`: a past one."""
        return dict(self._api.call("GET", _path(agent, label), params=present(owner=owner, version=version)))

    def write(
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
        body = present(content=content, base_version=base_version, message=message)
        return dict(self._api.call("PUT", _path(agent, label), json=body, params=present(owner=owner)))

    def append(
        self,
        agent: str | None,
        label: str,
        text: str,
        *,
        base_version: int | None = None,
        message: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        body = present(text=text, base_version=base_version, message=message)
        path = f"{_path(agent, label)}/append"
        return dict(self._api.call("POST", path, json=body, params=present(owner=owner)))

    def settings(self, agent: str | None, label: str, **fields: Any) -> dict[str, Any]:
        """Change description, char_limit or swapped_out (the owner only); the new BlockInfo."""
        return dict(self._api.call("PATCH", _path(agent, label), json=present(**fields)))

    def history(
        self, agent: str | None, label: str, *, owner: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        params = present(owner=owner, limit=limit)
        return dict(self._api.call("GET", f"{_path(agent, label)}/history", params=params))

    def rollback(
        self,
        agent: str | None,
        label: str,
        version: int,
        *,
        message: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        body = present(version=version, message=message)
        path = f"{_path(agent, label)}/rollback"
        return dict(self._api.call("POST", path, json=body, params=present(owner=owner)))

    def undo(self, agent: str, label: str, *, owner: str | None = None) -> dict[str, Any]:
        """Undo `agent`'s own latest edit of the block, keeping everyone else's."""
        path = f"{_path(agent, label)}/undo"
        return dict(self._api.call("POST", path, json={}, params=present(owner=owner)))

    def delete(self, agent: str | None, label: str) -> None:
        self._api.call("DELETE", _path(agent, label))

    def share(
        self, owner: str, label: str, agent: str, access: str, *, provision: bool = False
    ) -> dict[str, Any]:
        """Give `agent` `access` (read_only, append_only, read_write) to `owner`'s block (an agent
        the colony does not know: 404 unless `provision`)."""
        body = {"owner": owner, "label": label, "agent_id": agent, "access": access}
        return dict(self._api.call("POST", "/v1/blocks/share", json=body, params=_provision(provision)))

    def unshare(self, owner: str, label: str, agent: str) -> bool:
        body = {"owner": owner, "label": label, "agent_id": agent}
        return bool(self._api.call("DELETE", "/v1/blocks/share", json=body)["removed"])
