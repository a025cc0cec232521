"""An ended agent's retirement expires the event streams it owns (its scope and its capabilities'
scopes inside it), never a stream other agents share: a capability on the colony's scope, or a pool
member's run capability on its role's scope, leaves that stream as it was."""

from __future__ import annotations

import pytest
from agent_kit import counter_blueprint

from colony.agents import AgentCapability, LocalAgentRuntime
from colony.agents.ended_state import owned_scopes
from colony.agents.models import AgentState
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import ConcurrentModificationError


async def _ttl(board: Blackboard) -> int:
    return int(await board.redis.pttl(board.keyspace.events_key))


async def test_stopping_an_agent_expires_its_own_streams_only(
    runtime: LocalAgentRuntime, bb: Blackboard
) -> None:
    shared_id = scope_id(BlackboardScope.COLONY, tenant_id=runtime.tenant_id, colony_id=runtime.colony_id)
    other_id = scope_id(
        BlackboardScope.AGENT, tenant_id=runtime.tenant_id, colony_id=runtime.colony_id, agent_id="role"
    )
    extra = [
        AgentCapability.bind(scope_id=shared_id, capability_key="colony_scope"),
        AgentCapability.bind(scope_id=f"{other_id}:namespace:runs", capability_key="role_scope"),
    ]
    agent = await runtime.spawn(counter_blueprint("ender", [], serve_namespace="runs", extra=extra))
    boards = {c.blackboard.scope_id: c.blackboard for c in agent.capabilities.values()}
    for board in [agent.blackboard, *boards.values()]:
        await board.write("probe", 1)  # every scope has an event stream
    await runtime.stop("ender")

    own = agent.blackboard
    runs = next(b for sid, b in boards.items() if sid.startswith(f"{own.scope_id}:namespace:"))
    assert await _ttl(own) > 0
    assert await _ttl(runs) > 0
    assert await _ttl(boards[shared_id]) == -1
    assert await _ttl(boards[f"{other_id}:namespace:runs"]) == -1


def test_owned_scopes_are_the_agents_and_those_inside_it(bb: Blackboard) -> None:
    own = bb.scoped("tenant:t:colony:c:agent:a")
    inside = bb.scoped("tenant:t:colony:c:agent:a:namespace:runs")
    lookalike = bb.scoped("tenant:t:colony:c:agent:ab:namespace:runs")
    colony = bb.scoped("tenant:t:colony:c")
    assert [b.scope_id for b in owned_scopes(own, [inside, lookalike, colony, inside])] == [
        own.scope_id,
        inside.scope_id,
    ]


async def test_an_id_is_taken_again_once_its_agent_ended_never_while_it_lives(
    runtime: LocalAgentRuntime, bb: Blackboard
) -> None:
    """Spawn writes create-only and clears an ended agent's state only when refused (a fresh id
    costs no read): a live agent of the id stands, untouched; a stopped one gives way, its pending
    expiries taken off so the new agent's state does not vanish with the old one's retention."""
    first = await runtime.spawn(counter_blueprint("reused", [], serve_namespace="runs"))
    lifecycle_key = first.blackboard.keyspace.entry_key(AgentStateProtocol.key("lifecycle"))
    before = await bb.redis.hgetall(lifecycle_key)
    with pytest.raises(ConcurrentModificationError):
        await LocalAgentRuntime(bb, tenant_id=runtime.tenant_id, colony_id=runtime.colony_id).spawn(
            counter_blueprint("reused", [], serve_namespace="runs")
        )
    assert await bb.redis.hgetall(lifecycle_key) == before  # the live agent's record is as it was
    await runtime.stop("reused")
    assert await bb.redis.pttl(lifecycle_key) > 0  # retiring
    second = await runtime.spawn(counter_blueprint("reused", [], serve_namespace="runs"))
    assert second.state is not AgentState.STOPPED
    assert await bb.redis.pttl(lifecycle_key) == -1  # the new agent's record has no expiry
    assert await _ttl(second.blackboard) == -1  # nor its event stream
    await runtime.stop("reused")
