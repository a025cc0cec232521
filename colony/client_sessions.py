"""`client.sessions`: a ColonyClient's calls on sessions (docs/sessions.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from colony.client_http import ApiConnection
from colony.errors import ApiError

START_SECONDS = 75.0  # the server waits up to 60 s for the session agent's placement


def _path(session_id: str, tail: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{tail}"


def as_turn_event(event: dict[str, Any]) -> dict[str, Any]:
    """A turn's event as the messages route words it. A retried message whose first try was
    answered is followed on its run's event stream (a 303 to /v1/runs/{id}/events), whose end is
    `completed` (the reply is its output) or `failed`/`cancelled`: the same turn, told as `message`
    or `error`."""
    kind, data = event.get("event_type"), event.get("data")
    if kind == "completed":
        return {
            **event,
            "event_type": "message",
            "data": data.get("output") if isinstance(data, dict) else None,
        }
    if kind in ("failed", "cancelled"):
        error = data.get("error") if isinstance(data, dict) else None
        return {**event, "event_type": "error", "data": {"status": kind, "error": error}}
    return event


class SessionsClient:
    """Sessions: start one, send it messages (the reply streams back), page through its messages,
    revert, fork and switch its branches, delete it."""

    def __init__(self, api: ApiConnection) -> None:
        self._api = api

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return dict(self._api.call(method, path, **kwargs))

    def start(self, pages: list[str] | None = None) -> dict[str, Any]:
        """Start a session; its view ({"session_id", "active", "branches", "messages"}). Waits as
        long as the server does for a replica to place it (START_SECONDS). `pages`: page ids the
        session talks about (a page-bound session, docs/sessions.md)."""
        body = {"pages": list(pages)} if pages else {}
        return self._call("POST", "/v1/sessions", json=body, timeout=START_SECONDS)

    def delete(self, session_id: str) -> None:
        """Delete the session for good (its agent, tree and state); ApiError 404 when it is unknown
        (or deleted already)."""
        self._api.call("DELETE", _path(session_id))

    def get(self, session_id: str) -> dict[str, Any]:
        """The session's branches, the active one and its message count."""
        return self._call("GET", _path(session_id))

    def send(self, session_id: str, message: str) -> Iterator[dict[str, Any]]:
        """Send a message; yields the turn's events as they come ({"event_type", "data", ...}):
        `turn`, `user_chat_message`, `token`..., then `message` (the reply) or `error`."""
        path = _path(session_id, "/messages")
        with self._api.events("POST", path, json={"message": message}, timeout=None) as events:
            for event in events:
                event = as_turn_event(event)
                yield event
                if event.get("event_type") in ("message", "error"):
                    return

    def reply(self, session_id: str, message: str) -> dict[str, Any]:
        """Send a message and wait for the reply: the `message` event's data
        ({"message", "context", "cut"})."""
        for event in self.send(session_id, message):
            if event.get("event_type") == "message":
                return dict(event.get("data") or {})
            if event.get("event_type") == "error":
                data = event.get("data") or {}
                raise ApiError(500, "turn_failed", str(data.get("error") or data))
        raise ApiError(502, "stream_ended", "the turn's event stream ended without a reply")

    def messages(
        self, session_id: str, *, all: bool = False, limit: int | None = None, offset: int = 0
    ) -> dict[str, Any]:
        """One page of the active branch's messages (`all=True`: of every message of the tree):
        {"messages", "total", "offset", "next_offset", ...}; `limit` per page (the server's
        default 1000, at most 10000), from `offset`. Pass `next_offset` back as `offset` for the
        next page; it is None on the last."""
        params: dict[str, Any] = {"offset": offset}
        if all:
            params["all"] = "true"
        if limit is not None:
            params["limit"] = limit
        return self._call("GET", _path(session_id, "/messages"), params=params)

    def all_messages(self, session_id: str, *, all: bool = False) -> list[dict[str, Any]]:
        """Every message of the listing, page after page (`messages` for one page)."""
        found: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = self.messages(session_id, all=all, offset=offset)
            found.extend(page["messages"])
            following = page.get("next_offset")
            # a page that does not move forward ends the listing rather than looping on it
            offset = following if isinstance(following, int) and following > offset else None
        return found

    def revert(self, session_id: str, message_id: str) -> dict[str, Any]:
        return self._call("POST", _path(session_id, "/revert"), json={"message_id": message_id})

    def fork(self, session_id: str, message_id: str, branch: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"message_id": message_id}
        if branch is not None:
            body["branch"] = branch
        return self._call("POST", _path(session_id, "/fork"), json=body)

    def switch(self, session_id: str, branch: str) -> dict[str, Any]:
        return self._call("POST", _path(session_id, "/switch"), json={"branch": branch})
