"""The resumption queue: the suspended agents the resource monitor resumes when their condition
holds, in the order it looks at them (highest priority first, then the longest suspended, then by
id). The monitor and the API (`GET /v1/colony/resumption`, the console's colony view) read it with
the same code, so what people see is the order the monitor follows. Agents suspended to make room
(`waits` on_demand: an idle chat session) are not in it: they are resumed when asked for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import ValidationError

from colony.agents.models import (
    AgentMetadata,
    AgentType,
    ResumptionCondition,
    ResumptionKind,
    SuspensionRequest,
)
from colony.blackboard import Blackboard
from colony.blackboard.protocol import AgentStateProtocol

M = TypeVar("M", AgentMetadata, SuspensionRequest)
READ_AT_ONCE = 64  # agents' states read concurrently


@dataclass(frozen=True, slots=True)
class Suspension:
    """What a suspended agent's state says about its resumption (one read of two entries)."""

    metadata: AgentMetadata | None
    request: SuspensionRequest | None
    condition: ResumptionCondition
    pages: list[str]  # the condition's pages, else the agent's bound pages


@dataclass(frozen=True, slots=True)
class Queued:
    agent_id: str
    priority: int
    since: float  # when it was suspended (0: not recorded)
    condition: ResumptionCondition
    pages: list[str]
    bound: bool  # page-bound (VCM_BOUND): resumed where its pages are


async def read_suspension(board: Blackboard) -> Suspension:
    """The agent's metadata, suspension request, the condition it waits for (CUSTOM when none is
    stored: only a request resumes it) and the pages it needs. A malformed entry (Redis is
    writable by others) counts as absent."""
    metadata_e, suspension_e = await board.read_many(
        [AgentStateProtocol.key("metadata"), AgentStateProtocol.key("suspension")]
    )
    metadata = valid_or_none(AgentMetadata, metadata_e.value if metadata_e else None)
    request = valid_or_none(SuspensionRequest, suspension_e.value if suspension_e else None)
    condition = request.condition if request else ResumptionCondition(kind=ResumptionKind.CUSTOM)
    pages = list(condition.page_ids or (metadata.bound_pages if metadata else []))
    return Suspension(metadata, request, condition, pages)


def valid_or_none(model: type[M], value: object) -> M | None:
    """`value` as `model`, or None when absent or not one (a record a writer of Redis spoilt)."""
    if value is None:
        return None
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


async def queue_of(agent_ids: Iterable[str], board_of: Callable[[str], Blackboard]) -> list[Queued]:
    """The agents `agent_ids` in the monitor's order (`board_of`: an agent's state scope); their
    states are read READ_AT_ONCE at a time."""
    ids = list(agent_ids)
    held: list[Suspension] = []
    for start in range(0, len(ids), READ_AT_ONCE):
        chunk = ids[start : start + READ_AT_ONCE]
        held += await asyncio.gather(*(read_suspension(board_of(agent_id)) for agent_id in chunk))
    items = [
        Queued(
            agent_id=agent_id,
            priority=one.metadata.priority if one.metadata else 0,
            since=one.request.requested_at if one.request else 0.0,
            condition=one.condition,
            pages=one.pages,
            bound=one.metadata is not None and one.metadata.agent_type is AgentType.VCM_BOUND,
        )
        for agent_id, one in zip(ids, held, strict=True)
    ]
    return sorted(items, key=lambda q: (-q.priority, q.since, q.agent_id))
