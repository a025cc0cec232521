"""ColonyClient methods for checkpoints, undo, restore (mixed into colony.client.ColonyClient;
docs/checkpoints.md)."""

from __future__ import annotations

from typing import Any

import httpx


class ContextClientMixin:
    _http: httpx.Client

    def agent_checkpoints(self, agent: str) -> list[dict[str, Any]]:
        """The agent's kept checkpoints, oldest first: {"step", "run_id", "at", "lifecycle",
        "run_status", "size", "calls", "effects"} each."""
        from colony.client import _agent_path, _raise_for

        response = self._http.get(f"{_agent_path(agent)}/checkpoints")
        _raise_for(response)
        return list(response.json()["checkpoints"])

    def agent_undo(self, agent: str) -> dict[str, Any]:
        """Back to the checkpoint before the newest: the report ({"step", "discarded",
        "not_undone", "notes", "kept", "state", "record", ...})."""
        from colony.client import _agent_path, _raise_for

        response = self._http.post(f"{_agent_path(agent)}/undo")
        _raise_for(response)
        return dict(response.json())

    def agent_restore(
        self, agent: str, step: int, *, mode: str = "reexecute", run_id: str | None = None
    ) -> dict[str, Any]:
        """Back to checkpoint `step` (`mode` "reexecute" or "replay"; `run_id`: that run's
        checkpoint of the step); the report, as `agent_undo`'s."""
        from colony.client import _agent_path, _raise_for

        body: dict[str, Any] = {"mode": mode}
        if run_id is not None:
            body["run_id"] = run_id
        response = self._http.post(f"{_agent_path(agent)}/checkpoints/{int(step)}/restore", json=body)
        _raise_for(response)
        return dict(response.json())
