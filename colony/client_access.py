"""`client.access`: a ColonyClient's calls for scoped tokens and the audit trail (docs/api.md,
Scoped tokens, Audit trail). Every call but `whoami` needs an admin token; errors are
`colony.errors.ApiError` (403: the token lacks a verb; 404: no such token; 422: a bad field)."""

from __future__ import annotations

from typing import Any

from colony.client_http import ApiConnection


class AccessClient:
    """Who this client's token is, tokens made, listed and revoked, and the audit trail."""

    def __init__(self, api: ApiConnection) -> None:
        self._api = api

    def whoami(self) -> dict[str, Any]:
        """What this client's token may do: `{"token_id", "tenant", "verbs", "agents", "expires_at"}`."""
        return dict(self._api.call("GET", "/v1/token"))

    def create_token(
        self,
        verbs: list[str],
        *,
        agents: list[str] | None = None,
        ttl_seconds: float | None = None,
        note: str = "",
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """A new token: its record and `token`, the secret itself (shown this once). `tenant`:
        the colony's own (the default); another is refused until tenants are isolated."""
        body: dict[str, Any] = {"verbs": verbs, "note": note}
        if tenant is not None:
            body["tenant"] = tenant
        if agents is not None:
            body["agents"] = agents
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        return dict(self._api.call("POST", "/v1/tokens", json=body))

    def tokens(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """The tokens kept of the caller's tenant (or of `tenant`: the colony's own admins only),
        newest first (no secrets)."""
        params = {"tenant": tenant} if tenant is not None else None
        return list(self._api.call("GET", "/v1/tokens", params=params))

    def revoke_token(self, token_id: str) -> None:
        """Revoke a token (refused by every API process within a second)."""
        self._api.call("DELETE", f"/v1/tokens/{token_id}")

    def audit(self, *, limit: int = 100, before: str | None = None, refused: bool = False) -> dict[str, Any]:
        """The audit trail, newest first: `{"tenant", "entries", "next_before"}`; `refused`: the
        calls refused because their token may not make them (kept apart)."""
        params: dict[str, Any] = {"limit": limit}
        if refused:
            params["refused"] = "true"
        if before is not None:
            params["before"] = before
        return dict(self._api.call("GET", "/v1/audit", params=params))
