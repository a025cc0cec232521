"""Which pages of the colony's page table a tenant other than the colony's own may name and list:
those of the folders its tokens mapped (`POST /v1/vcm/sources`). The page table is the colony's
(one engine cache serves every tenant; mapping the same folder twice makes the same pages), so a
tenant's claim on a source is a set of source ids beside it (AccessProtocol.sources_key), bounded
by MAX_SOURCES."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from colony.api.access import principal_of
from colony.api.deps import ApiContext, settings_of
from colony.blackboard.access_keys import AccessProtocol
from colony.errors import InvalidArgument

MAX_SOURCES = 10_000  # sources one tenant keeps claimed at most
_CLAIM = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"""


async def _key(ctx: ApiContext, request: Request) -> str | None:
    """The set of the request's tenant's sources; None for the colony's own tenant (every page)."""
    principal = principal_of(request)
    if principal is None or principal.is_home:
        return None
    settings = settings_of(await ctx.services())
    return AccessProtocol.sources_key(principal.tenant, settings.colony_id)


async def claim_source(ctx: ApiContext, request: Request, source_id: str) -> None:
    """Record that the request's tenant mapped `source_id` (nothing for the colony's own tenant)."""
    key = await _key(ctx, request)
    if key is None:
        return
    redis = (await ctx.services()).runs.api_board.redis
    if not await claimed(redis, key, source_id, MAX_SOURCES):
        raise InvalidArgument(f"path: this tenant has mapped {MAX_SOURCES} folders already")


async def claimed(redis: Any, key: str, source_id: str, most: int) -> bool:
    """Add `source_id` to the set at `key` unless it holds `most` others: one script, so concurrent
    claims cannot pass the bound between its check and its add (found by review)."""
    return bool(await redis.eval(_CLAIM, 1, key, source_id, most))


async def tenant_page_ids(ctx: ApiContext, request: Request) -> set[str] | None:
    """The page ids the request's tenant may name; None: every page (the colony's own tenant)."""
    key = await _key(ctx, request)
    if key is None:
        return None
    redis = (await ctx.services()).runs.api_board.redis
    table = await ctx.page_table()
    held: set[str] = set()
    for source_id in sorted(str(s) for s in await redis.smembers(key)):
        record = await table.source(source_id)
        if record is not None:
            held.update(record.page_ids)
    return held


async def check_pages(
    ctx: ApiContext, request: Request, pages: list[str] | None, field: str = "pages"
) -> None:
    """InvalidArgument (422, naming the field) for a page the request's tenant did not map."""
    if not pages:
        return
    held = await tenant_page_ids(ctx, request)
    if held is None:
        return
    for index, page_id in enumerate(pages):
        if page_id not in held:
            raise InvalidArgument(
                f"{field}[{index}]: no page {page_id!r} in the page table; map its folder first "
                "(POST /v1/vcm/sources)"
            )
