"""Agents: the registry's records, the catalog of the agents the colony starts with, and suspend
and resume through the control plane (the agent may live in any replica)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from colony.api.access import principal_of, visible, visible_records
from colony.api.deps import GUARDED, Context
from colony.api.params import AgentId
from colony.api.schemas import CONTROL, LISTING, NO_PARAMS, READ_ONE, AgentStateName, CatalogAgent
from colony.errors import AgentNotFound
from colony.system.catalog import BUILTIN_AGENTS
from colony.system.registry import AgentRecord

router = APIRouter(dependencies=GUARDED)


@router.get("/v1/agents", response_model=list[AgentRecord], responses=LISTING)
async def list_agents(
    request: Request, ctx: Context, state: AgentStateName | None = None
) -> list[AgentRecord]:
    # a token given some agents sees those
    return visible_records(request, await (await ctx.services()).registry.list(state=state))


# before /v1/agents/{agent_id}: routes match in order, so this path is the catalog even if an
# agent were named "catalog" (that agent's record: GET /v1/agents; its memory and control
# routes are unaffected)
@router.get(
    "/v1/agents/catalog",
    response_model=list[CatalogAgent],
    response_model_exclude_none=True,
    responses=NO_PARAMS,
)
async def agent_catalog(request: Request, ctx: Context) -> list[CatalogAgent]:
    """Every agent the colony starts with: the built-ins, then the user agents of the `agents:`
    settings, with role, type, state and replica once placed (read from the registry: the API
    never imports a user agent's package)."""
    services = await ctx.services()
    users = services.settings.agents if services.settings is not None else {}
    listed = [(name, "builtin", None) for name in BUILTIN_AGENTS]
    listed += [(name, "user", path) for name, path in users.items() if name not in BUILTIN_AGENTS]
    principal = principal_of(request)
    # another tenant's token: its own instances (`t.<tenant>.<name>`, placed on first run)
    start = principal.prefix if principal is not None else ""
    shown = visible(request, (f"{start}{name}" for name, _, _ in listed))  # given some agents: those
    listed = listed if shown is None else [entry for entry in listed if f"{start}{entry[0]}" in shown]
    catalog = []
    for name, kind, factory in listed:
        record = await services.registry.get(f"{start}{name}")
        catalog.append(
            CatalogAgent(
                name=name,
                kind=kind,
                factory=factory,
                role=record.role if record else None,
                agent_type=record.agent_type if record else None,
                state=record.state if record else None,
                replica=record.replica if record else None,
            )
        )
    return catalog


@router.get("/v1/agents/{agent_id}", response_model=AgentRecord, responses=READ_ONE)
async def get_agent(agent_id: AgentId, ctx: Context) -> AgentRecord:
    record = await (await ctx.services()).registry.get(agent_id)
    if record is None:
        raise AgentNotFound(f"no agent named {agent_id!r}")
    return record


@router.post("/v1/agents/{agent_id}/suspend", response_model=AgentRecord, responses=CONTROL)
async def suspend_agent(agent_id: AgentId, ctx: Context) -> AgentRecord:
    """Suspend an agent (state kept in Redis) until `POST /v1/agents/{id}/resume`."""
    return AgentRecord.model_validate(await (await ctx.control()).suspend(agent_id))


@router.post("/v1/agents/{agent_id}/resume", response_model=AgentRecord, responses=CONTROL)
async def resume_agent(agent_id: AgentId, ctx: Context) -> AgentRecord:
    """Resume a suspended agent now: same id, state restored, on the best replica for its pages."""
    return AgentRecord.model_validate(await (await ctx.control()).resume(agent_id))
