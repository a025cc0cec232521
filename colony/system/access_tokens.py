"""Scoped API tokens: a token with a tenant, verbs and optionally a list of agents, stored in Redis
by id with a SHA-256 digest of its secret (never the secret itself), created, listed and revoked
by an admin (`POST/GET/DELETE /v1/tokens`, `colony token ...`).

A token reads `ct-<id>-<secret>`: the API finds its record by id (one read, no scan) and compares
the digest of the secret presented in constant time. The secret is 256 random bits, so a plain
digest is enough (nothing to brute-force). Records are cached in the API process for at most
`CACHE_SECONDS`: a revoked or expired token stops working within that second. A token with a TTL
also expires in Redis. What is read back from Redis is validated; a record that does not is no
token (401), never an error.

The verbs (docs/api.md, Scoped tokens): `read` (every GET), `run` (runs, sessions, suspend and
resume), `write` (memory and blocks), `admin` (sharing blocks, export and import, undo and
restore, deleting agents, tokens, the audit trail). The API token of the deployment (`colony
status` prints it) is an admin token of the colony's own tenant.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from colony.blackboard import Blackboard
from colony.blackboard.access_keys import AccessProtocol
from colony.errors import InvalidArgument
from colony.wire.ids import ID_PATTERN
from colony.wire.tenants import TENANT_RULE, is_tenant_name, owned_id, prefix, tenant_of

Verb = Literal["read", "run", "write", "admin"]
VERBS: tuple[Verb, ...] = ("read", "run", "write", "admin")
PREFIX = "ct-"
TOKEN = re.compile(r"ct-([0-9a-f]{16})-([A-Za-z0-9_-]{43})")
CACHE_SECONDS = 1.0  # how long a looked-up record is trusted: revocation takes effect within this
CACHE_ENTRIES = 4096  # records cached at most (the oldest go first)
MAX_TOKENS = 10_000  # tokens a colony keeps at most (creating one more is refused)
MAX_AGENTS = 256  # agents one token may name
MAX_TTL_SECONDS = 10 * 365 * 86_400.0
MAIN_TOKEN_ID = "api"  # the id audit entries give the deployment's own API token


class AccessToken(BaseModel):
    """A token's record in Redis (what `GET /v1/tokens` lists: no secret, no digest)."""

    id: str = Field(pattern=r"^[0-9a-f]{16}$")
    tenant: str = Field(min_length=1, max_length=128, pattern=ID_PATTERN)
    verbs: list[Verb] = Field(min_length=1, max_length=len(VERBS))
    agents: list[str] | None = Field(
        None, max_length=MAX_AGENTS, description="the agents it may act on; null: every agent"
    )
    note: str = Field("", max_length=200)
    created_at: float
    expires_at: float | None = None


class StoredToken(AccessToken):
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: a token's id, tenant, verbs and agents (None: every agent)."""

    token_id: str
    tenant: str
    verbs: frozenset[str]
    agents: frozenset[str] | None = None
    expires_at: float | None = None
    home: str = ""  # the colony's own tenant ("" with `tenant` "": the deployment's token)

    def may(self, verb: str) -> bool:
        """Whether it holds `verb` (`admin` holds them all)."""
        return verb in self.verbs or "admin" in self.verbs

    def sees(self, agent_id: str) -> bool:
        """Whether the agent is its tenant's (by its id: colony.wire.tenants) and one it is given."""
        if tenant_of(agent_id, self.home) != self.tenant:
            return False
        return self.agents is None or agent_id in self.agents

    @property
    def is_home(self) -> bool:
        """Whether it acts for the colony's own tenant (whose agent ids carry no prefix)."""
        return self.tenant == self.home

    @property
    def prefix(self) -> str:
        """What the ids of its tenant's agents start with ("" for the colony's own)."""
        return prefix(self.tenant, self.home)


def main_principal() -> Principal:
    """The deployment's API token: an admin of the colony's own tenant (`tenant` empty: the
    colony's, read where it is needed), every agent of it."""
    return Principal(MAIN_TOKEN_ID, "", frozenset(VERBS))


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def looks_scoped(presented: str) -> bool:
    return presented.startswith(PREFIX)


class TokenStore:
    """The scoped tokens of one colony, of every tenant it serves (`board`: the `access` scope of
    the colony's own tenant, `tenant`; each record names its token's tenant)."""

    def __init__(self, board: Blackboard, *, tenant: str) -> None:
        self.board, self.tenant = board, tenant
        self._cache: dict[str, tuple[float, StoredToken | None]] = {}

    async def create(
        self,
        verbs: list[str],
        *,
        agents: list[str] | None = None,
        ttl_seconds: float | None = None,
        note: str = "",
        tenant: str | None = None,
    ) -> tuple[AccessToken, str]:
        """A new token of `tenant` (default: the colony's own): its record and the token itself
        (shown once). `agents` of another tenant than the colony's may be named without their
        prefix (`echo` for `t.acme.echo`)."""
        wanted = sorted(set(verbs), key=VERBS.index) if set(verbs) <= set(VERBS) else None
        if not wanted:
            raise InvalidArgument(f"verbs must be some of {', '.join(VERBS)}; got {verbs!r}")
        tenant = tenant or self.tenant
        if tenant != self.tenant and not is_tenant_name(tenant):
            raise InvalidArgument(f"tenant: {tenant[:40]!r} is no tenant name ({TENANT_RULE})")
        if agents is not None:
            agents = self._agents_of(tenant, agents)
        if ttl_seconds is not None and not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
            raise InvalidArgument(f"ttl must be 1 to {MAX_TTL_SECONDS:.0f} seconds; got {ttl_seconds!r}")
        index = self.board.keyspace.tag_key(AccessProtocol.token_index_tag())
        if await self.board.redis.scard(index) >= MAX_TOKENS and len(await self.list()) >= MAX_TOKENS:
            # (the index still names tokens that expired until a listing prunes them: listed first)
            raise InvalidArgument(f"this colony keeps {MAX_TOKENS} tokens already: revoke some first")
        token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        now = time.time()
        try:
            record = StoredToken(
                id=token_id,
                tenant=tenant,
                verbs=wanted,  # type: ignore[arg-type]
                agents=sorted(set(agents)) if agents is not None else None,
                note=note,
                created_at=now,
                expires_at=now + ttl_seconds if ttl_seconds is not None else None,
                digest=_digest(secret),
            )
        except ValidationError as exc:
            raise InvalidArgument(f"the token cannot be made: {exc.errors()[0]['msg']}") from None
        await self.board.write(
            AccessProtocol.token_key(token_id),
            record.model_dump(mode="json"),
            tags={AccessProtocol.token_index_tag()},
            created_by="api",
            ttl_seconds=ttl_seconds,
        )
        return AccessToken.model_validate(
            record.model_dump(exclude={"digest"})
        ), f"{PREFIX}{token_id}-{secret}"

    def _agents_of(self, tenant: str, agents: list[str]) -> list[str]:
        """The agent ids a token of `tenant` is given (names completed with the tenant's prefix);
        InvalidArgument for one of another tenant."""
        held = []
        for name in agents:
            try:
                agent_id = owned_id(tenant, self.tenant, name)
            except ValueError as exc:
                raise InvalidArgument(f"agents: {exc}") from None
            if tenant_of(agent_id, self.tenant) != tenant:
                raise InvalidArgument(f"agents: {name[:60]!r} is not an agent of tenant {tenant!r}")
            held.append(agent_id)
        return held

    async def list(self, tenant: str | None = None) -> list[AccessToken]:
        """Every token kept (expired ones are gone) of `tenant` (None: of every tenant), newest first."""
        held = []
        async for entry in self.board.iter_query(
            AccessProtocol.pattern("token"), tags={"all_of": [AccessProtocol.token_index_tag()]}
        ):
            record = _valid(entry.value)
            if record is None or _expired(record) or (tenant is not None and record.tenant != tenant):
                continue
            held.append(AccessToken.model_validate(record.model_dump(exclude={"digest"})))
        return sorted(held, key=lambda t: (-t.created_at, t.id))

    async def revoke(self, token_id: str, tenant: str | None = None) -> bool:
        """Remove a token (True when there was one, of `tenant` when given: another tenant's is no
        token to it); other API processes stop taking it within CACHE_SECONDS, this one at once."""
        if not re.fullmatch(r"[0-9a-f]{16}", token_id):
            return False
        self._cache.pop(token_id, None)
        if tenant is not None:
            entry = await self.board.read(AccessProtocol.token_key(token_id))
            record = _valid(entry.value) if entry is not None else None
            if record is None or record.tenant != tenant:
                return False
        return await self.board.delete(AccessProtocol.token_key(token_id))

    async def principal(self, presented: str) -> Principal | None:
        """The principal a presented token acts as; None for no token of this colony (unknown,
        revoked, expired, malformed, or a record that does not validate)."""
        match = TOKEN.fullmatch(presented)
        if match is None:
            return None
        token_id, secret = match.groups()
        record = await self._record(token_id)
        if record is None or _expired(record):
            return None
        if not hmac.compare_digest(record.digest, _digest(secret)):
            return None
        agents = frozenset(record.agents) if record.agents is not None else None
        return Principal(
            record.id, record.tenant, frozenset(record.verbs), agents, record.expires_at, home=self.tenant
        )

    async def _record(self, token_id: str) -> StoredToken | None:
        now = time.monotonic()
        held = self._cache.get(token_id)
        if held is not None and now - held[0] < CACHE_SECONDS:
            return held[1]
        entry = await self.board.read(AccessProtocol.token_key(token_id))
        record = _valid(entry.value) if entry is not None else None
        if record is not None and record.id != token_id:
            record = None  # a record copied under another id is no token
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.pop(next(iter(self._cache)))
        self._cache[token_id] = (now, record)
        return record


def _valid(value: object) -> StoredToken | None:
    try:
        return StoredToken.model_validate(value)
    except ValidationError:
        return None


def _expired(record: AccessToken) -> bool:
    return record.expires_at is not None and time.time() >= record.expires_at
