"""Which agent ids may hold blocks and shares: those the colony knows, read from the blackboard
alone (the memory layer never asks colony.system), and those reserved by pre-provisioning.

An agent is known when the colony's registry has its record (COLONY scope, `registry:agent:{id}`)
or its own scope holds its state (`agent:lifecycle` / `agent:metadata`: a suspended or ended agent
whose registry record expired). An id is reserved once blocks were provisioned for it (it owns
blocks, or blocks are shared with it): a block or share made with `provision` for a valid agent id
that does not exist yet. Without either, creating a block for it or sharing one with it is refused,
so text cannot be planted for an agent that a later spawn, session or import would give that id.
"""

from __future__ import annotations

import re

import redis.asyncio as aioredis

from colony.blackboard.protocol import (
    AgentRegistryProtocol,
    AgentStateProtocol,
    BlackboardKeyspace,
    BlockProtocol,
)
from colony.blackboard.scopes import BlackboardScope, scope_id
from colony.errors import AgentNotFound, InvalidArgument
from colony.wire.ids import ID_PATTERN, ID_RULE

_AGENT_ID = re.compile(ID_PATTERN)


def agent_keys(tenant_id: str, colony_id: str, namespace: str, agent_id: str) -> dict[str, str]:
    """The Redis keys whose presence makes `agent_id` known (or reserved) in the colony, by what
    each says."""
    colony = BlackboardKeyspace(scope_id(BlackboardScope.COLONY, tenant_id=tenant_id, colony_id=colony_id))
    own = BlackboardKeyspace(
        scope_id(BlackboardScope.AGENT, tenant_id=tenant_id, colony_id=colony_id, agent_id=agent_id)
    )
    return {
        "registered": colony.entry_key(AgentRegistryProtocol.agent_key(agent_id)),
        "state": own.entry_key(AgentStateProtocol.key("lifecycle")),
        "metadata": own.entry_key(AgentStateProtocol.key("metadata")),
        "owns blocks": BlockProtocol.owner_index(namespace, agent_id),
        "has shared blocks": BlockProtocol.shared_index(namespace, agent_id),
    }


async def agent_known(
    redis: aioredis.Redis, tenant_id: str, colony_id: str, namespace: str, agent_id: str
) -> bool:
    """Whether the colony knows `agent_id` or has reserved it (module docstring)."""
    keys = agent_keys(tenant_id, colony_id, namespace, agent_id)
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys.values():
            pipe.exists(key)
        found = await pipe.execute()
    return any(int(n) for n in found)


def check_provisionable(agent_id: str) -> str:
    """`agent_id` when it can name an agent (colony.wire.ids): what a provisioned id must be, so
    that an agent of that id can exist later."""
    if not isinstance(agent_id, str) or not _AGENT_ID.fullmatch(agent_id):
        raise InvalidArgument(f"agent id {str(agent_id)[:80]!r} cannot name an agent: {ID_RULE}")
    return agent_id


def unknown_agent(agent_id: str, what: str) -> AgentNotFound:
    """The refusal of `what` (a block, a share) for an agent the colony neither knows nor reserved."""
    return AgentNotFound(
        f"no agent {agent_id!r} in this colony: {what} only for agents it knows (GET /v1/agents lists "
        "them). To prepare one for an agent that will start later under that id, send provision=true "
        "(CLI: --provision); that agent then starts with it, and importing that id is refused until "
        "its provisioned blocks are deleted or the import passes replace=true (which replaces them with the "
        "document's)"
    )
