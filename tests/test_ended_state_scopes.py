"""An ended agent's retirement expires the event streams it owns (its scope and its capabilities'
scopes inside it), never a stream other agents share: a capability on the colony's scope, or a pool
member's run capability on its role's scope, leaves that stream as it was."""

from __future__ import annotations

import asyncio
import contextvars

import pytest
from agent_kit import counter_blueprint

from colony.agents import Agent, AgentCapability, LocalAgentRuntime, run_capability
from colony.agents.ended_state import owned_scopes
from colony.agents.models import AgentState, RunServing
from colony.agents.run_capability import AgentRunCapability
from colony.agents.run_claims import read_serving, serving_key
from colony.blackboard import AgentRunProtocol, Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import load_settings
from colony.errors import BlackboardUnavailable, ConcurrentModificationError


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
        await LocalAgentRuntime(
            bb, tenant_id=runtime.tenant_id, colony_id=runtime.colony_id, settings=load_settings()
        ).spawn(counter_blueprint("reused", [], serve_namespace="runs"))
    assert await bb.redis.hgetall(lifecycle_key) == before  # the live agent's record is as it was
    await runtime.stop("reused")
    assert await bb.redis.pttl(lifecycle_key) > 0  # retiring
    second = await runtime.spawn(counter_blueprint("reused", [], serve_namespace="runs"))
    assert second.state is not AgentState.STOPPED
    assert await bb.redis.pttl(lifecycle_key) == -1  # the new agent's record has no expiry
    assert await _ttl(second.blackboard) == -1  # nor its event stream
    await runtime.stop("reused")


async def test_two_spawns_of_an_ended_id_make_one_live_agent(
    runtime: LocalAgentRuntime, bb: Blackboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas spawn the same ended id at once: one reads the ended lifecycle, then stalls
    before its deletes while the other clears and starts its agent. The stalled clear must delete
    nothing of that live agent, and its spawn is refused: one live agent, its record intact."""
    first = await runtime.spawn(counter_blueprint("raced", [], serve_namespace="runs"))
    await runtime.stop("raced")
    real_read = Blackboard.read
    slow = contextvars.ContextVar("slow", default=False)
    stalled, other_done = asyncio.Event(), asyncio.Event()

    async def read(self: Blackboard, key: str) -> object:
        entry = await real_read(self, key)
        if slow.get() and key == AgentStateProtocol.key("lifecycle") and not stalled.is_set():
            stalled.set()  # it read the ended lifecycle; it deletes once the other spawn is done
            await other_done.wait()
        return entry

    monkeypatch.setattr(Blackboard, "read", read)
    other = LocalAgentRuntime(
        bb, tenant_id=runtime.tenant_id, colony_id=runtime.colony_id, settings=load_settings()
    )

    async def stalled_spawn() -> object:
        slow.set(True)
        return await other.spawn(counter_blueprint("raced", [], serve_namespace="runs"))

    async def quick_spawn() -> object:
        await stalled.wait()
        try:
            return await runtime.spawn(counter_blueprint("raced", [], serve_namespace="runs"))
        finally:
            other_done.set()

    try:
        stalled_result, live = await asyncio.gather(stalled_spawn(), quick_spawn(), return_exceptions=True)
        assert isinstance(stalled_result, ConcurrentModificationError), stalled_result
        assert isinstance(live, Agent)
        stored = await first.blackboard.read(AgentStateProtocol.key("lifecycle"))
        assert stored is not None and stored.value["holder"] == live.holder
        assert await first.blackboard.read(AgentStateProtocol.key("blueprint")) is not None
    finally:
        await other.shutdown()


async def test_a_respawn_with_the_default_serving_removes_an_old_declaration(
    runtime: LocalAgentRuntime,
) -> None:
    """An id whose earlier agent declared a bound (max_concurrent_runs) is spawned again serving
    with the default: the API must not go on admitting by the old bound for the retention."""
    bounded = counter_blueprint("redeclared", [], serve_namespace="runs").model_copy(
        update={"serving": RunServing(max_concurrent_runs=1)}
    )
    first = await runtime.spawn(bounded)
    board = next(c for c in first.capabilities.values() if isinstance(c, AgentRunCapability)).blackboard
    assert await read_serving(board, AgentRunProtocol) == RunServing(max_concurrent_runs=1)
    await runtime.stop("redeclared")
    await runtime.spawn(counter_blueprint("redeclared", [], serve_namespace="runs"))
    assert await read_serving(board, AgentRunProtocol) == RunServing()
    assert await board.read(serving_key(AgentRunProtocol)) is None
    await runtime.stop("redeclared")


async def test_a_spawn_whose_start_fails_leaves_no_half_started_agent(
    runtime: LocalAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis blinks during the run capability's start: the spawn fails, and the agent is not left
    hosted without its request loop and handlers; restored, it serves."""
    real = run_capability.scope_at_start
    calls = {"n": 0}

    async def blinking(board: Blackboard, protocol: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise BlackboardUnavailable("count", "redis://injected", ConnectionError("blink"))
        return await real(board, protocol)  # type: ignore[arg-type]

    monkeypatch.setattr(run_capability, "scope_at_start", blinking)
    with pytest.raises(BlackboardUnavailable):
        await runtime.spawn(counter_blueprint("blinked", [], serve_namespace="runs"))
    assert not runtime.has("blinked")
    # its record is there (initialize ran), so it is restored from Redis, as a host's
    # ensure_agent does with an agent it does not hold: a whole copy, serving
    again = await runtime.resume("blinked")
    capability = next(c for c in again.capabilities.values() if isinstance(c, AgentRunCapability))
    assert capability._tasks and again.event_delivery.tasks
