"""The agents a request names, as its tenant's: one colony serves many tenants (colony.wire.tenants).

A token of another tenant than the colony's own names the catalog's agents by their catalog names
(`echo`, `analyze`, `session`, an `agents:` name): each means that tenant's own instance
(`t.<tenant>.echo`), placed by the control plane on first use, so its runs, memory and children
are the tenant's and never meet another tenant's. Any other id it names must be its tenant's
(404 else, as for an agent that does not exist).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import Request

from colony import metrics
from colony.agents.models import new_id
from colony.api.access import check_agent, principal_of, verb_of
from colony.api.deps import ApiContext, Context, settings_of
from colony.errors import InvalidArgument, RunNotFound, RunRetired
from colony.system.access_tokens import Principal
from colony.system.catalog import catalog_names
from colony.system.runs import ENDED_STATUSES
from colony.system.tenant_quota import TenantQuota, check_agents, making_an_agent
from colony.system.tenant_usage import check_bytes
from colony.wire.tenants import MARK, local_name, owned_id

log = logging.getLogger(__name__)


def named_agent(request: Request, name: str, *, field: str = "agent") -> str:
    """The id `name` means for the request's token (for another tenant's token, a name without its
    prefix gets it); AgentNotFound (404) for an agent it does not see."""
    principal = principal_of(request)
    if principal is not None and not principal.is_home and not name.startswith(MARK):
        try:
            name = owned_id(principal.tenant, principal.home, name)
        except ValueError as exc:
            raise InvalidArgument(f"{field}: {exc}") from None
    check_agent(request, name)
    return name


async def tenant_agent(ctx: ApiContext, request: Request, name: str, *, field: str = "agent") -> str:
    """`named_agent`, and another tenant's instance of a catalog agent placed when it is missing."""
    agent_id = named_agent(request, name, field=field)
    principal = principal_of(request)
    if principal is None or principal.is_home:
        return agent_id
    services = await ctx.services()
    local = local_name(agent_id, principal.home)
    if local in catalog_names(settings_of(services).agents) and await services.registry.get(agent_id) is None:
        async with making_agent(ctx, principal):
            if await services.registry.get(agent_id) is None:  # (another request made it meanwhile)
                await (await ctx.control()).place_instance(local, agent_id)
    return agent_id


# what a run's body weighs in Redis, times: its input is kept in the request, its events, its
# result, its agent's context and checkpoints (measured: ~14 copies of a large input)
RUN_COPIES = 16
WRITE_COPIES = 4  # a memory entry or a block edit: its record, index and embedding, its snapshot and log


async def _quota(ctx: ApiContext) -> TenantQuota:
    services = await ctx.services()
    return TenantQuota(services.runs.api_board.redis, colony_id=services.runs.colony_id, api=ctx.api)


async def check_agent_quota(ctx: ApiContext, principal: Principal | None) -> None:
    """TenantQuotaExceeded (429) when another tenant's token's tenant may not have one more agent
    (a check ahead of a making elsewhere: the replica making a session's agent checks again)."""
    if principal is None or principal.is_home:
        return
    registry = (await ctx.services()).registry
    await check_agents(ctx.api, registry, principal.tenant, principal.home)


@contextlib.asynccontextmanager
async def making_agent(ctx: ApiContext, principal: Principal | None) -> AsyncIterator[None]:
    """check_agent_quota, and the agent made inside the block, one making at a time per tenant
    (colony.system.tenant_quota.making_an_agent)."""
    if principal is None or principal.is_home:
        yield
        return
    services = await ctx.services()
    redis, colony = services.runs.api_board.redis, services.runs.colony_id
    async with making_an_agent(redis, colony, ctx.api, services.registry, principal.tenant, principal.home):
        yield


async def admit_run(
    ctx: ApiContext, request: Request, run_id: str | None, timeout_s: float | None
) -> str | None:
    """Count a run another tenant's token submits against its tenant's quotas (TenantQuotaExceeded,
    429, beyond them) and return its id (made here when the request has none); the colony's own
    tenant: `run_id` as it is."""
    principal = principal_of(request)
    if principal is None or principal.is_home:
        return run_id
    runs = (await ctx.services()).runs
    run_id = run_id or new_id("run")
    timeout = timeout_s or runs.runs_settings.default_timeout_seconds

    async def ended(held: str) -> bool:
        try:
            return (await runs.get(held)).status in ENDED_STATUSES
        except RunRetired:
            return True
        except RunNotFound:  # its record is not written yet (being submitted): it holds its place
            return False

    await _weigh(ctx, request, principal, RUN_COPIES)
    await (await _quota(ctx)).admit_run(principal.tenant, run_id, timeout, ended)
    metrics.TENANT_RUNS_SUBMITTED.labels(principal.tenant).inc()
    return run_id


async def release_run(ctx: ApiContext, request: Request, run_id: str | None) -> None:
    """A run `admit_run` counted whose submit failed before it was written: its place is given back."""
    principal = principal_of(request)
    if principal is None or principal.is_home or run_id is None:
        return
    try:
        await (await _quota(ctx)).release(principal.tenant, run_id)
    except Exception:  # (it drops out at its deadline anyway)
        log.warning("the open-run place of %s was not given back", run_id, exc_info=True)


async def within_bytes(request: Request, ctx: Context) -> None:
    """A dependency of the routes that store a tenant's data (memory, blocks, imports, restores):
    TenantQuotaExceeded (429) when another tenant's token's tenant holds its Redis bytes already,
    or would with this body (weighed WRITE_COPIES times). Reads and deletes always pass (deleting
    is how a tenant makes room)."""
    principal = principal_of(request)
    if principal is None or principal.is_home or request.method in ("GET", "HEAD", "DELETE"):
        return
    template = str(getattr(request.scope.get("route"), "path", ""))
    if verb_of(request.method, template) == "read":  # (a recall query: a POST that stores nothing)
        return
    await _weigh(ctx, request, principal, WRITE_COPIES)


async def _weigh(ctx: ApiContext, request: Request, principal: Principal, copies: int) -> None:
    """The tenant's Redis bytes with this request's body, `copies` times, added (429 past them)."""
    runs = (await ctx.services()).runs
    adding = len(await request.body()) * copies
    redis = runs.api_board.redis
    await check_bytes(
        ctx.api, redis, principal.tenant, home=principal.home, colony_id=runs.colony_id, adding=adding
    )


@contextlib.asynccontextmanager
async def admitted(
    ctx: ApiContext, request: Request, run_id: str | None, timeout_s: float | None
) -> AsyncIterator[str | None]:
    """`admit_run` for the block that submits the run; a block that fails gives its place back."""
    run_id = await admit_run(ctx, request, run_id, timeout_s)
    try:
        yield run_id
    except BaseException:
        await release_run(ctx, request, run_id)
        raise
