"""`client.transfer`: a ColonyClient's calls for agent export and import.

`export_agent(id)` returns the document `GET /v1/agents/{id}/export` answers; `import_agent(doc)`
posts it to `POST /v1/agents/{id}/import` and returns what was imported (docs/transfer.md). Errors are
`colony.errors.ApiError` with the API's status and message (409: running or live; 413: over
`api.max_import_bytes`; 422: refused, naming the field).
"""

from __future__ import annotations

from typing import Any

from colony.client_http import ApiConnection, agent_path
from colony.errors import InvalidArgument


class TransferClient:
    """Moving an agent between colonies: its export document out of one, into another."""

    def __init__(self, api: ApiConnection) -> None:
        self._api = api

    def export_agent(self, agent_id: str) -> dict[str, Any]:
        """The agent's export document (a JSON object; write it to a file with json.dump)."""
        return dict(self._api.call("GET", f"{agent_path(agent_id)}/export"))

    def import_agent(
        self, document: dict[str, Any], *, catalog: str | None = None, replace: bool = False
    ) -> dict[str, Any]:
        """Import an export document into the colony this client talks to. `catalog`: the catalog
        agent that builds its blueprint here (else the document's own catalog name, else its
        signature must verify under this colony's secret); `replace`: overwrite a suspended agent
        of that id. Returns the agent id, its state (`suspended`, resumed by the monitor), the
        run and step it resumes at, and what else came with it."""
        agent_id = document.get("agent_id") if isinstance(document, dict) else None
        if not isinstance(agent_id, str) or not agent_id:
            raise InvalidArgument("the document names no agent_id: it is not an agent export document")
        params: dict[str, str] = {}
        if catalog is not None:
            params["catalog"] = catalog
        if replace:
            params["replace"] = "true"
        return dict(self._api.call("POST", f"{agent_path(agent_id)}/import", json=document, params=params))
