"""ColonyClient methods for agent export and import (mixed into colony.client.ColonyClient).

`agent_export(id)` returns the document `GET /v1/agents/{id}/export` answers; `agent_import(doc)`
posts it to `POST /v1/agents/{id}/import` and returns what was imported (docs/transfer.md). Errors are
`colony.errors.ApiError` with the API's status and message (409: running or live; 422: refused).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from colony.errors import InvalidArgument


class TransferClientMixin:
    _http: httpx.Client

    def agent_export(self, agent_id: str) -> dict[str, Any]:
        """The agent's export document (a JSON object; write it to a file with json.dump)."""
        from colony.client import _raise_for  # here: colony.client imports this module

        response = self._http.get(f"/v1/agents/{quote(agent_id, safe='')}/export")
        _raise_for(response)
        return dict(response.json())

    def agent_import(
        self, document: dict[str, Any], *, catalog: str | None = None, replace: bool = False
    ) -> dict[str, Any]:
        """Import an export document into the colony this client talks to. `catalog`: the catalog
        agent that builds its blueprint here (else the document's own catalog name, else its
        signature must verify under this colony's secret); `replace`: overwrite a suspended agent
        of that id. Returns the agent id, its state (`suspended`, resumed by the monitor), the
        run and step it resumes at, and what else came with it."""
        from colony.client import _raise_for

        agent_id = document.get("agent_id") if isinstance(document, dict) else None
        if not isinstance(agent_id, str) or not agent_id:
            raise InvalidArgument("the document names no agent_id: it is not an agent export document")
        params: dict[str, str] = {}
        if catalog is not None:
            params["catalog"] = catalog
        if replace:
            params["replace"] = "true"
        path = f"/v1/agents/{quote(agent_id, safe='')}/import"
        response = self._http.post(path, json=document, params=params)
        _raise_for(response)
        return dict(response.json())
