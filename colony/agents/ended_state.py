"""What an ended (stopped or failed) agent leaves in Redis: its retirement (the expiry of its state,
rings and event streams) and, before its id is used again, the clearing of what is left. Kept apart
from the runtime because spawn throughput depends on it (one round trip per agent, not per key)."""

from __future__ import annotations

from colony.agents.base import Agent
from colony.agents.models import TERMINAL_STATES, AgentState
from colony.agents.state.persistence import STATE_NAMES
from colony.blackboard import Blackboard
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import ConcurrentModificationError

RINGS = ("context", "checkpoints", "action_log")  # an agent's capped lists (its state entries: STATE_NAMES)


async def retire_state(agent: Agent, ttl_seconds: float | None = None) -> int:
    """Let an ended (stopped or failed) agent's state leave Redis after `ttl_seconds` (default: the
    agent's `runs.retention_seconds`): its entries, its context and checkpoint rings, and the event
    streams of its own scope and of its capabilities' scopes inside it (`owned_scopes`). Returns how
    many entries got the expiry."""
    ttl = agent.retention_seconds if ttl_seconds is None else ttl_seconds
    board = agent.blackboard
    keys = [AgentStateProtocol.key(n) for n in STATE_NAMES]
    keys += [AgentStateProtocol.capability_state_key(n) for n in agent.capabilities]
    expired = await board.expire(keys, ttl)
    for ring in RINGS:
        await board.expire_ring(AgentStateProtocol.key(ring), ttl)
    for scope_board in owned_scopes(board, [c.blackboard for c in agent.capabilities.values()]):
        await scope_board.expire_scope(ttl)
    return expired


def owned_scopes(board: Blackboard, capability_scopes: list[Blackboard]) -> list[Blackboard]:
    """The agent's own scope and those of its capabilities inside it (`<scope>:namespace:...`): the
    streams that end with the agent. A capability on a scope others share (the colony's, a session's,
    a pool's run scope named after its role) leaves that stream alone: other agents still use it."""
    own = board.scope_id
    boards = {own: board}
    for scope_board in capability_scopes:
        if scope_board.scope_id.startswith(f"{own}:"):
            boards.setdefault(scope_board.scope_id, scope_board)
    return list(boards.values())


async def clear_ended_state(board: Blackboard, capability_scopes: list[Blackboard]) -> bool:
    """Before an agent id is used again: if the agent stored in `board` ended (stopped or failed),
    delete its state entries, context and checkpoint rings, and take the pending expiry off the event streams
    of its scope and its capabilities' scopes (`capability_scopes`), so the fresh agent's writes
    do not vanish with the old agent's retention. False (nothing done) if no ended agent is there,
    or if another spawn cleared it first (its new agent is left alone)."""
    try:  # one transaction over the ended lifecycle: a spawn that cleared and started a new
        # agent of the id meanwhile changed it, so this clear deletes nothing of that live agent
        async with board.transaction() as tx:
            lifecycle = await tx.read(AgentStateProtocol.key("lifecycle"))
            if lifecycle is None or AgentState(lifecycle.value["state"]) not in TERMINAL_STATES:
                return False
            for name in STATE_NAMES:
                tx.delete(AgentStateProtocol.key(name))
    except ConcurrentModificationError:
        return False
    async with board.guard("clear_ended_state"):
        for ring in RINGS:
            await board.redis.delete(board.keyspace.ring_key(AgentStateProtocol.key(ring)))
        for scope_board in {b.scope_id: b for b in [board, *capability_scopes]}.values():
            ks = scope_board.keyspace
            await board.redis.persist(ks.events_key)
            await board.redis.persist(ks.expiry_key)
    return True
