"""Virtual context memory: map a folder into pages, list the page table, and the live replicas
that hold the pages (their heartbeats carry engine stats and agent counts)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from colony.api.access import visible
from colony.api.deps import GUARDED, Context
from colony.api.schemas import MAP_SOURCE, NO_PARAMS, PAGES, MappedSource, MapSource
from colony.config import VcmSettings
from colony.vcm import PageSource
from colony.wire.ids import ID_PATTERN

router = APIRouter(dependencies=GUARDED)
ReplicaFilter = Annotated[str | None, Query(min_length=1, max_length=128, pattern=ID_PATTERN)]


@router.post("/v1/vcm/sources", response_model=MappedSource, responses=MAP_SOURCE)
async def map_source(body: MapSource, ctx: Context) -> dict[str, Any]:
    """Cut a folder into pages and record them in the page table: only under `vcm.allowed_roots`
    (PathNotAllowed: 403), within the caps (SourceTooLarge: 413), walked in a worker thread."""
    table = await ctx.page_table()
    vcm = (await ctx.services()).vcm or VcmSettings()  # no settings: no roots, nothing may be mapped
    source = await PageSource.open(body.path, vcm, page_tokens=body.page_tokens)
    record = await table.map_source(source)
    pages = [await table.page(page_id) for page_id in record.page_ids]
    return {
        "source_id": record.source_id,
        "path": record.path,
        "pages": [p.model_dump() for p in pages if p],
    }


@router.get("/v1/vcm/pages", responses=PAGES)
async def list_pages(ctx: Context, replica: ReplicaFilter = None) -> list[dict[str, Any]]:
    table = await ctx.page_table()
    return [p.model_dump() for p in await table.pages(replica=replica)]


@router.get("/v1/replicas", responses=NO_PARAMS)
async def list_replicas(request: Request, ctx: Context) -> list[dict[str, Any]]:
    replicas = await (await ctx.services()).registry.replicas()
    for replica in replicas:  # a token given some agents sees those among each replica's agents
        held = replica.get("agent_ids")
        if (
            isinstance(held, list)
            and (shown := visible(request, [a for a in held if isinstance(a, str)])) is not None
        ):
            replica["agent_ids"] = sorted(shown)
    return replicas
