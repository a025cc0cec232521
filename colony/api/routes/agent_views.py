"""Read-only views of agents for people (the web console, `curl`): an agent's profile (what it is
built with, as it recorded it) and the resumption queue (the suspended agents in the order the
resource monitor resumes them). Both read Redis alone; what is read back is validated."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, ValidationError

from colony.agents.models import AgentMetadata
from colony.agents.profile import AgentProfile
from colony.api.access import visible_records
from colony.api.deps import GUARDED, Context, agent_board
from colony.api.params import AgentId
from colony.api.schemas import LISTING, READ_ONE
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import AgentNotFound
from colony.system.resumption_queue import queue_of

router = APIRouter(dependencies=GUARDED)

MAX_PAGES_SHOWN = 64  # page ids listed per agent (the count says how many there are)
MAX_QUEUE_READ = 20_000  # suspended agents read to order the queue at most (then: `complete` false)


class AgentProfileView(BaseModel):
    agent_id: str
    agent_type: str | None = Field(None, description="null when its metadata is missing or unreadable")
    role: str | None = None
    parent_id: str | None = Field(None, description="the agent that started it, if one did")
    priority: int = 0
    bound_pages: list[str] = Field(default_factory=list, description=f"at most {MAX_PAGES_SHOWN}")
    bound_page_count: int = 0
    profile: AgentProfile | None = Field(
        None,
        description="its class, capabilities, actions, policy and resources; null for an agent "
        "recorded before profiles were kept",
    )


class QueuedAgent(BaseModel):
    position: int = Field(description="1: the first the monitor looks at")
    agent_id: str
    priority: int
    suspended_at: float | None = Field(description="epoch seconds; null when not recorded")
    waits: str = Field(description="the condition it waits for (children_completed, pages_available, ...)")
    pages: list[str] = Field(description=f"the pages it needs (at most {MAX_PAGES_SHOWN})")
    page_bound: bool


class ResumptionQueue(BaseModel):
    agents: list[QueuedAgent] = Field(description="in the order the resource monitor resumes them")
    total: int = Field(description="suspended agents in the queue")
    truncated: bool = Field(description="more agents are queued than are listed")
    complete: bool = Field(
        True,
        description=f"false when over {MAX_QUEUE_READ} agents are queued: only that many were read and "
        "ordered, so the order shown may not be the monitor's",
    )


@router.get("/v1/agents/{agent_id}/profile", response_model=AgentProfileView, responses=READ_ONE)
async def agent_profile(agent_id: AgentId, ctx: Context) -> AgentProfileView:
    """What the agent is built with: type, role, parent, priority, bound pages, and its profile
    (class, capabilities, actions with their declared effects, policy, resources)."""
    services = await ctx.services()
    if await services.registry.get(agent_id) is None:
        raise AgentNotFound(f"no agent named {agent_id!r}; GET /v1/agents lists them")
    entry = await agent_board(services, agent_id).read(AgentStateProtocol.key("metadata"))
    try:
        metadata = AgentMetadata.model_validate(entry.value) if entry is not None else None
    except ValidationError:
        metadata = None  # written by someone else: shown as not recorded
    if metadata is None:
        return AgentProfileView(agent_id=agent_id)
    return AgentProfileView(
        agent_id=agent_id,
        agent_type=metadata.agent_type.value,
        role=metadata.role,
        parent_id=metadata.parent_id,
        priority=metadata.priority,
        bound_pages=metadata.bound_pages[:MAX_PAGES_SHOWN],
        bound_page_count=len(metadata.bound_pages),
        profile=metadata.profile,
    )


@router.get("/v1/colony/resumption", response_model=ResumptionQueue, responses=LISTING)
async def resumption_queue(
    request: Request,
    ctx: Context,
    limit: Annotated[int, Query(ge=1, le=500, description="agents listed, from the head")] = 100,
) -> ResumptionQueue:
    """The suspended agents the resource monitor resumes when their condition holds, in its order:
    highest priority first, then the longest suspended. Agents suspended to make room (an idle
    chat session, `waits` on_demand) are not queued: they are resumed when asked for."""
    services = await ctx.services()
    # a token given some agents sees those
    records = visible_records(request, await services.registry.list(state="suspended", resumable=True))
    read = records[:MAX_QUEUE_READ]
    queued = await queue_of([r.agent_id for r in read], lambda agent_id: agent_board(services, agent_id))
    return ResumptionQueue(
        agents=[
            QueuedAgent(
                position=n,
                agent_id=q.agent_id,
                priority=q.priority,
                suspended_at=q.since or None,
                waits=q.condition.kind.value,
                pages=q.pages[:MAX_PAGES_SHOWN],
                page_bound=q.bound,
            )
            for n, q in enumerate(queued[:limit], start=1)
        ],
        total=len(records),
        truncated=len(records) > limit,
        complete=len(records) <= MAX_QUEUE_READ,
    )
