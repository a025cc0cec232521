"""`client.context`: a ColonyClient's calls on an agent's checkpoints, undo and restore
(docs/checkpoints.md)."""

from __future__ import annotations

from typing import Any

from colony.client_http import ApiConnection, agent_path


class ContextClient:
    """An agent's kept checkpoints, and going back to one of them."""

    def __init__(self, api: ApiConnection) -> None:
        self._api = api

    def checkpoints(self, agent: str) -> list[dict[str, Any]]:
        """The agent's kept checkpoints, oldest first: {"step", "run_id", "at", "lifecycle",
        "run_status", "size", "calls", "effects"} each."""
        return list(self._api.call("GET", f"{agent_path(agent)}/checkpoints")["checkpoints"])

    def undo(self, agent: str) -> dict[str, Any]:
        """Back to the checkpoint before the newest: the report ({"step", "discarded",
        "not_undone", "notes", "kept", "state", "record", ...})."""
        return dict(self._api.call("POST", f"{agent_path(agent)}/undo"))

    def restore(
        self, agent: str, step: int, *, mode: str = "reexecute", run_id: str | None = None
    ) -> dict[str, Any]:
        """Back to checkpoint `step` (`mode` "reexecute" or "replay"; `run_id`: that run's
        checkpoint of the step); the report, as `undo`'s."""
        body: dict[str, Any] = {"mode": mode}
        if run_id is not None:
            body["run_id"] = run_id
        return dict(self._api.call("POST", f"{agent_path(agent)}/checkpoints/{int(step)}/restore", json=body))
