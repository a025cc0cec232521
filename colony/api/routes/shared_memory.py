"""Shared memory over HTTP: define a collective, task or global scope with its access rules, list
and describe them, write entries and recall from one.

The access rules govern agents (colony.memory.shared); a caller of these routes holds a token of
a tenant, which defines, reads and writes all of its tenant's scopes (each tenant has its own, in
its own keys: another tenant's scope of the same name is another scope). A scope is
named `global`, `collective:NAME` or `task:NAME` (the path pattern checks it before any key is
built); a scope nobody defined is a 404 for reads and writes.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response

from colony.api.access import request_tenant
from colony.api.deps import GUARDED, ApiContext, Context, settings_of
from colony.api.routes.memory import WRITER, checked, recall, write_entry
from colony.api.schemas import (
    COMMON,
    MEMORY,
    MEMORY_WRITE,
    SHARED_MEMORY,
    EntryBody,
    RecallBody,
    RecalledEntries,
    SharedScopeBody,
    SharedScopes,
    WrittenMemory,
    _errors,
)
from colony.api.tenancy import within_bytes
from colony.errors import SharedMemoryNotFound
from colony.memory.service import MemoryService, memory_service
from colony.memory.shared import SHARED_NAME, SHARED_NAME_RULE, SharedScopeInfo
from colony.memory.shared import SharedScopes as Scopes

router = APIRouter(dependencies=[*GUARDED, Depends(within_bytes)])  # 429 past a tenant's bytes
SharedName = Annotated[
    str, Path(min_length=1, max_length=75, pattern=SHARED_NAME, description=SHARED_NAME_RULE)
]


async def _scopes(ctx: ApiContext, request: Request) -> tuple[Scopes, MemoryService]:
    """The shared scopes of the request's tenant (another tenant's token: its own, in its own keys;
    colony.wire.tenants) and the memory service holding them."""
    services = await ctx.services()
    settings = settings_of(services)
    service = memory_service(services.runs.api_board, settings)
    tenant = request_tenant(request, settings.tenant_id)
    return Scopes(service.store, tenant_id=tenant, colony_id=settings.colony_id), service


@router.get("/v1/memory/shared", response_model=SharedScopes, responses=_errors(*COMMON))
async def list_shared(ctx: Context, request: Request) -> SharedScopes:
    """The colony's shared memory scopes (rules, counts, the agents' scopes feeding each)."""
    scopes, _ = await _scopes(ctx, request)
    listed = []
    for name in await scopes.names():
        try:
            listed.append(await scopes.info(name))
        except SharedMemoryNotFound:  # its keys were removed from Redis: not defined any more
            continue
    return SharedScopes(scopes=listed)


@router.get("/v1/memory/shared/{name}", response_model=SharedScopeInfo, responses=MEMORY)
async def show_shared(name: SharedName, ctx: Context, request: Request) -> SharedScopeInfo:
    """One shared scope: its rules, purpose, TTL, cap, entry count and the scopes feeding it."""
    scopes, _ = await _scopes(ctx, request)
    return await scopes.info(name)


@router.put(
    "/v1/memory/shared/{name}",
    response_model=SharedScopeInfo,
    responses={**SHARED_MEMORY, 201: {"model": SharedScopeInfo, "description": "the scope was created"}},
)
async def define_shared(
    name: SharedName, body: SharedScopeBody, ctx: Context, request: Request, response: Response
) -> SharedScopeInfo:
    """Define a shared scope (201), or change what the body gives of a defined one (200; what it
    leaves out keeps its value, a list given replaces that list; its entries stay). Agents read the
    new rules at their next read or write."""
    scopes, _ = await _scopes(ctx, request)
    info, created = await scopes.define(name, **body.model_dump(), by=WRITER)
    response.status_code = 201 if created else 200
    return info


@router.post(
    "/v1/memory/shared/{name}/entries",
    status_code=201,
    response_model=WrittenMemory,
    responses={**MEMORY_WRITE, 200: {"model": WrittenMemory, "description": "the scope already held it"}},
)
async def write_shared(
    name: SharedName, body: EntryBody, ctx: Context, request: Request, response: Response
) -> WrittenMemory:
    """Store an entry in a shared scope (as POST /v1/agents/{id}/memory: dedup, the scope's TTL
    and cap, Idempotency-Key); agents that may read the scope recall it."""
    checked(body, ctx.api.max_input_depth)
    scopes, service = await _scopes(ctx, request)
    info = await scopes.info(name)  # 404 when not defined
    return await write_entry(service, info.scope_id, body, request, response)


@router.post("/v1/memory/shared/{name}/query", response_model=RecalledEntries, responses=MEMORY_WRITE)
async def query_shared(name: SharedName, body: RecallBody, ctx: Context, request: Request) -> RecalledEntries:
    """Recall from a shared scope: its entries passing the filters, most relevant first."""
    checked(body, ctx.api.max_input_depth)
    scopes, service = await _scopes(ctx, request)
    info = await scopes.info(name)
    return await recall(service, [info.scope_id], body)
