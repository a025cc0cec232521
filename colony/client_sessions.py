"""ColonyClient methods for sessions (mixed into colony.client.ColonyClient; docs/sessions.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx


def _path(session_id: str, tail: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{tail}"


class SessionClientMixin:
    _http: httpx.Client

    def _session_call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        from colony.client import _raise_for

        response = self._http.request(method, path, **kwargs)
        _raise_for(response)
        return dict(response.json())

    def session_start(self) -> dict[str, Any]:
        """Start a session; its view ({"session_id", "active", "branches", "messages"})."""
        return self._session_call("POST", "/v1/sessions", json={})

    def session(self, session_id: str) -> dict[str, Any]:
        """The session's branches, the active one and its message count."""
        return self._session_call("GET", _path(session_id))

    def session_send(self, session_id: str, message: str) -> Iterator[dict[str, Any]]:
        """Send a message; yields the turn's events as they come ({"event_type", "data", ...}):
        `turn`, `user_chat_message`, `token`..., then `message` (the reply) or `error`."""
        from colony.client import _raise_for, _SseParser

        with self._http.stream(
            "POST", _path(session_id, "/messages"), json={"message": message}, timeout=None
        ) as response:
            if response.status_code >= 400:
                response.read()
                _raise_for(response)
            parser = _SseParser()
            for line in response.iter_lines():
                event = parser.feed(line)
                if event is not None:
                    yield event
                    if event.get("event_type") in ("message", "error"):
                        return

    def session_reply(self, session_id: str, message: str) -> dict[str, Any]:
        """Send a message and wait for the reply: the `message` event's data
        ({"message", "context", "cut"})."""
        from colony.errors import ApiError

        for event in self.session_send(session_id, message):
            if event.get("event_type") == "message":
                return dict(event.get("data") or {})
            if event.get("event_type") == "error":
                data = event.get("data") or {}
                raise ApiError(500, "turn_failed", str(data.get("error") or data))
        raise ApiError(502, "stream_ended", "the turn's event stream ended without a reply")

    def session_messages(
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
        return self._session_call("GET", _path(session_id, "/messages"), params=params)

    def session_all_messages(self, session_id: str, *, all: bool = False) -> list[dict[str, Any]]:
        """Every message of the listing, page after page (`session_messages` for one page)."""
        found: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = self.session_messages(session_id, all=all, offset=offset)
            found.extend(page["messages"])
            following = page.get("next_offset")
            # a page that does not move forward ends the listing rather than looping on it
            offset = following if isinstance(following, int) and following > offset else None
        return found

    def session_revert(self, session_id: str, message_id: str) -> dict[str, Any]:
        return self._session_call("POST", _path(session_id, "/revert"), json={"message_id": message_id})

    def session_fork(self, session_id: str, message_id: str, branch: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"message_id": message_id}
        if branch is not None:
            body["branch"] = branch
        return self._session_call("POST", _path(session_id, "/fork"), json=body)

    def session_switch(self, session_id: str, branch: str) -> dict[str, Any]:
        return self._session_call("POST", _path(session_id, "/switch"), json={"branch": branch})
