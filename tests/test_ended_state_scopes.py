"""An ended agent's retirement expires the event streams it owns (its scope and its capabilities'
scopes inside it), never a stream other agents share: a capability on the colony's scope, or a pool
member's run capability on its role's scope, leaves that stream as it was."""

from __future__ import annotations

from agent_kit import counter_blueprint

from colony.agents import AgentCapability, LocalAgentRuntime
from colony.agents.ended_state import owned_scopes
from colony.blackboard import Blackboard, BlackboardScope, scope_id


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
