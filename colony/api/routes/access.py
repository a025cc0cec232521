"""Access: who the request's token is (`GET /v1/token`, any token), scoped tokens (`POST`, `GET
/v1/tokens`, `DELETE /v1/tokens/{id}`: admin) and the audit trail (`GET /v1/audit`: admin).
docs/api.md, Scoped tokens and Audit trail."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from colony.api.access import AccessServices, principal_of, request_tenant
from colony.api.deps import GUARDED, Context
from colony.api.schemas import LISTING, NO_PARAMS, READ_ONE, WITH_BODY
from colony.errors import AccessDenied, InvalidArgument, TokenNotFound
from colony.system.access_tokens import MAX_AGENTS, MAX_TTL_SECONDS, AccessToken, Verb
from colony.system.audit import MAX_READ, AuditEntry
from colony.wire.ids import ID_PATTERN
from colony.wire.tenants import TENANT_RULE

router = APIRouter(dependencies=GUARDED)
MAX_STREAM_PART = 2**64 - 1  # a Redis stream id is two 64-bit numbers
TokenId = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]


class WhoAmI(BaseModel):
    token_id: str = Field(description="`api`: the deployment's API token")
    tenant: str
    verbs: list[str]
    agents: list[str] | None = Field(description="the agents it may act on; null: every agent")
    expires_at: float | None = None
    prefix: str = Field("", description="what its tenant's agent ids start with (\"\" for the colony's own)")


class NewToken(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verbs: list[Verb] = Field(min_length=1, max_length=4, description="read, run, write, admin")
    agents: list[Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_AGENTS,
        description="restrict it to these agents (default: every agent)",
    )
    ttl_seconds: float | None = Field(None, ge=1, le=MAX_TTL_SECONDS, description="expire after this long")
    note: str = Field("", max_length=200, description="what it is for (listed, never checked)")
    tenant: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=ID_PATTERN,
        description=(
            "the tenant whose agents it reaches (default: the caller's); another tenant than the "
            f"colony's own is named {TENANT_RULE}, and only an admin of the colony's own tenant makes "
            "its tokens"
        ),
    )


class MadeToken(AccessToken):
    token: str = Field(description="the token itself: shown once, kept only as a digest")


class AuditList(BaseModel):
    tenant: str
    entries: list[AuditEntry] = Field(description="newest first")
    next_before: str | None = Field(description="`before` for the next (older) page; null on the last")


@router.get("/v1/token", response_model=WhoAmI, responses=NO_PARAMS)
async def who_am_i(request: Request, ctx: Context) -> WhoAmI:
    """What the request's token may do (any token: the web console reads it after the login)."""
    principal = principal_of(request)
    if principal is None:
        raise AccessDenied("this deployment has no scoped tokens")
    agents = sorted(principal.agents) if principal.agents is not None else None
    return WhoAmI(
        token_id=principal.token_id,
        tenant=principal.tenant or (await ctx.access()).tenant,
        verbs=sorted(principal.verbs),
        agents=agents,
        expires_at=principal.expires_at,
        prefix=principal.prefix,
    )


@router.post("/v1/tokens", status_code=201, response_model=MadeToken, responses=WITH_BODY)
async def create_token(body: NewToken, ctx: Context, request: Request) -> MadeToken:
    """A new token (of the caller's tenant unless `tenant` says otherwise: only an admin of the
    colony's own tenant makes tokens of other tenants); the answer is the only place its secret is
    shown."""
    access = await ctx.access()
    tenant = _tenant_for(request, access, body.tenant, "tenant")
    record, token = await access.tokens.create(
        body.verbs, agents=body.agents, ttl_seconds=body.ttl_seconds, note=body.note, tenant=tenant
    )
    return MadeToken(**record.model_dump(), token=token)


def _tenant_for(request: Request, access: AccessServices, asked: str | None, field: str) -> str:
    """The tenant a token call is about: the caller's own, or `asked` where the caller is an admin
    of the colony's own tenant (the operator's); InvalidArgument (422, naming `field`) else."""
    own = request_tenant(request, access.tenant)
    if asked is None or asked == own:
        return own
    if own != access.tenant:
        raise InvalidArgument(
            f"{field}: a token of tenant {own!r} manages the tokens of its own tenant only "
            f"(not {asked[:40]!r})"
        )
    return asked


@router.get("/v1/tokens", response_model=list[AccessToken], responses=LISTING)
async def list_tokens(
    ctx: Context,
    request: Request,
    tenant: Annotated[
        str | None,
        Query(
            min_length=1, max_length=128, pattern=ID_PATTERN, description="another tenant's (operator only)"
        ),
    ] = None,
) -> list[AccessToken]:
    """The tokens of the caller's tenant (or of `tenant`, for an admin of the colony's own tenant)
    that are kept (no secrets), newest first."""
    access = await ctx.access()
    return await access.tokens.list(_tenant_for(request, access, tenant, "tenant"))


@router.delete("/v1/tokens/{token_id}", status_code=204, response_class=Response, responses=READ_ONE)
async def revoke_token(token_id: str, ctx: Context, request: Request) -> Response:
    """Revoke a token: refused from now on by this API process, within a second by the others. A
    token of another tenant is no token to a tenant's admin (404); the colony's own admins revoke any."""
    access = await ctx.access()
    own = request_tenant(request, access.tenant)
    if not await access.tokens.revoke(token_id, None if own == access.tenant else own):
        raise TokenNotFound(f"no token {token_id[:32]!r}; GET /v1/tokens lists them")
    return Response(status_code=204)


@router.get("/v1/audit", response_model=AuditList, responses=LISTING)
async def read_audit(
    ctx: Context,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=MAX_READ, description="entries, newest first")] = 100,
    before: Annotated[
        str | None, Query(pattern=r"^[0-9]{1,20}-[0-9]{1,20}$", description="older than this entry id")
    ] = None,
    refused: Annotated[bool, Query(description="the calls the guard refused (kept apart)")] = False,
) -> AuditList:
    """The tenant's audit trail: every state-changing call (token id, method, route, ids, status);
    with `refused`, the calls refused because the token may not make them."""
    if before is not None and any(int(part) > MAX_STREAM_PART for part in before.split("-")):
        raise InvalidArgument(f"before: a stream id's parts are at most {MAX_STREAM_PART}")
    access = await ctx.access()
    tenant = request_tenant(request, access.tenant)
    if before is not None and set(before) <= {"0", "-"}:
        entries = []  # nothing is older than the first possible id
    else:
        entries = await access.trail_of(tenant).read(limit, before, refused=refused)
    return AuditList(
        tenant=tenant, entries=entries, next_before=entries[-1].id if len(entries) == limit else None
    )
