"""The audit trail: every state-changing call made to the API (who: the token's id; what: method,
route template, the ids in its path; when; outcome: the status code), appended by the API's
guard after the answer to a capped Redis stream per tenant, and read newest first (`GET
/v1/audit`, `colony audit`).

Capped twice: at most `api.audit_max_entries` entries (XADD MAXLEN, approximate) and none older
than `api.audit_retention_seconds` (trimmed by MINID at most once a minute per process). An
entry's fields are bounded strings written by the API itself (a route template, ids that matched
the route's patterns, a status code); what is read back is validated and bounded again."""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from redis.asyncio import Redis

from colony.blackboard.access_keys import AccessProtocol

log = logging.getLogger(__name__)

TRIM_EVERY_SECONDS = 60.0
MAX_READ = 1000  # entries one read returns at most
FIELD_CHARS = 300
MAX_REFUSED = 10_000  # refused calls kept at most (a token can make many: each is one entry)


class AuditEntry(BaseModel):
    id: str = Field(description="the stream id: `<ms>-<seq>`, newest first in a listing")
    at: float
    token: str = Field(max_length=FIELD_CHARS, description="the token's id (`api`: the deployment's token)")
    method: str = Field(max_length=16)
    route: str = Field(
        max_length=FIELD_CHARS, description="the route template, e.g. /v1/agents/{agent_id}/undo"
    )
    ids: dict[str, str] = Field(default_factory=dict, description="the ids in the request's path")
    status: int


class AuditTrail:
    """One tenant's audit stream."""

    def __init__(
        self, redis: Redis, *, tenant: str, colony: str, max_entries: int, retention_seconds: float
    ) -> None:
        self.redis, self.key = redis, AccessProtocol.audit_stream_key(tenant, colony)
        self.refused_key = AccessProtocol.audit_stream_key(tenant, colony, refused=True)
        self.max_entries, self.retention_seconds = max_entries, retention_seconds
        self._trimmed_at = 0.0

    async def append(
        self, *, token: str, method: str, route: str, ids: dict[str, str], status: int, refused: bool = False
    ) -> None:
        """One call; `refused` (the guard refused it: the token may not) goes to the stream of
        refusals, capped at MAX_REFUSED, so refusals cannot push the accepted calls out."""
        fields: dict[Any, Any] = {
            "token": token[:FIELD_CHARS],
            "method": method[:16],
            "route": route[:FIELD_CHARS],
            "status": str(status),
            **{f"id.{name}"[:64]: str(value)[:FIELD_CHARS] for name, value in list(ids.items())[:8]},
        }
        key, cap = (
            (self.refused_key, min(MAX_REFUSED, self.max_entries))
            if refused
            else (self.key, self.max_entries)
        )
        await self.redis.xadd(key, fields, maxlen=cap, approximate=True)
        now = time.time()
        if now - self._trimmed_at >= TRIM_EVERY_SECONDS:
            self._trimmed_at = now
            oldest = f"{max(0, int((now - self.retention_seconds) * 1000))}-0"
            for stream in (self.key, self.refused_key):
                await self.redis.xtrim(stream, minid=oldest, approximate=False)

    async def read(
        self, limit: int = 100, before: str | None = None, *, refused: bool = False
    ) -> list[AuditEntry]:
        """Up to `limit` entries, newest first (before the stream id `before`, exclusive);
        `refused`: of the calls the guard refused."""
        top = f"({before}" if before else "+"
        key = self.refused_key if refused else self.key
        rows = await self.redis.xrevrange(key, max=top, min="-", count=min(max(1, limit), MAX_READ))
        entries = []
        for raw_id, raw in rows:
            entry = _entry(_text(raw_id), {_text(k): _text(v) for k, v in raw.items()})
            if entry is not None:
                entries.append(entry)
        return entries


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _entry(stream_id: str, fields: dict[str, str]) -> AuditEntry | None:
    try:
        at = int(stream_id.split("-", 1)[0]) / 1000
        ids = {k[3:][:64]: v[:FIELD_CHARS] for k, v in fields.items() if k.startswith("id.")}
        return AuditEntry(
            id=stream_id[:64],
            at=at,
            token=fields.get("token", "")[:FIELD_CHARS],
            method=fields.get("method", "")[:16],
            route=fields.get("route", "")[:FIELD_CHARS],
            ids=dict(list(ids.items())[:8]),
            status=int(fields.get("status", "0")[:3] or 0),
        )
    except (ValueError, ValidationError):
        log.warning("an audit entry that does not read as one was skipped: %s", stream_id[:64])
        return None
