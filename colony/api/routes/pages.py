"""Virtual context memory: map a folder into pages, list the page table, and the live replicas
that hold the pages (their heartbeats carry engine stats and agent counts)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from colony.api.access import principal_of, visible
from colony.api.deps import GUARDED, Context
from colony.api.schemas import MAP_SOURCE, NO_PARAMS, PAGES, MappedSource, MapSource
from colony.api.tenant_pages import claim_source, tenant_page_ids
from colony.config import VcmSettings
from colony.vcm import PageSource
from colony.wire.ids import ID_PATTERN

router = APIRouter(dependencies=GUARDED)
GUEST_FIELDS = ("replica_id", "engine", "agent_ids", "max_agents", "updated_at")  # what another tenant sees
ReplicaFilter = Annotated[str | None, Query(min_length=1, max_length=128, pattern=ID_PATTERN)]


@router.post("/v1/vcm/sources", response_model=MappedSource, responses=MAP_SOURCE)
async def map_source(body: MapSource, ctx: Context, request: Request) -> dict[str, Any]:
    """Cut a folder into pages and record them in the page table: only under `vcm.allowed_roots`
    (PathNotAllowed: 403), within the caps (SourceTooLarge: 413), walked in a worker thread. The
    folder is then the caller's tenant's to name (colony.api.tenant_pages)."""
    table = await ctx.page_table()
    vcm = (await ctx.services()).vcm or VcmSettings()  # no settings: no roots, nothing may be mapped
    source = await PageSource.open(body.path, vcm, page_tokens=body.page_tokens)
    record = await table.map_source(source)
    await claim_source(ctx, request, record.source_id)
    pages = [await table.page(page_id) for page_id in record.page_ids]
    return {
        "source_id": record.source_id,
        "path": record.path,
        "pages": [p.model_dump() for p in pages if p],
    }


@router.get("/v1/vcm/pages", responses=PAGES)
async def list_pages(request: Request, ctx: Context, replica: ReplicaFilter = None) -> list[dict[str, Any]]:
    """The page table (another tenant's token: the pages of the folders its tenant mapped)."""
    table = await ctx.page_table()
    held = await tenant_page_ids(ctx, request)
    return [p.model_dump() for p in await table.pages(replica=replica) if held is None or p.page_id in held]


@router.get("/v1/replicas", responses=NO_PARAMS)
async def list_replicas(request: Request, ctx: Context) -> list[dict[str, Any]]:
    """The live replicas with their heartbeats. A token sees its own agents among each replica's;
    a token of another tenant than the colony's own sees no more than its agents there and the
    replica's size (the engine's stats and the pages it holds or expects are the operator's)."""
    replicas = await (await ctx.services()).registry.replicas()
    principal = principal_of(request)
    guest = principal is not None and not principal.is_home
    for index, replica in enumerate(replicas):
        held = replica.get("agent_ids")
        held = [a for a in held if isinstance(a, str)] if isinstance(held, list) else []
        shown = visible(request, held)
        if shown is not None:
            replica["agent_ids"] = sorted(shown)
        if guest:
            replicas[index] = {k: replica.get(k) for k in GUEST_FIELDS} | {"agents": len(shown or ())}
    return replicas
