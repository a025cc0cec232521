"""The lifecycle fence of an agent's writes: a copy that wrote its `agent:lifecycle` itself checks
that exact value in its commit (no read first); anything else Redis holds (another value at the
same version, a newer version) refuses the write as the read-and-judge path does. Real redis-server."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from agent_kit import counter_blueprint

from colony.agents import Agent, AgentState, LocalAgentRuntime, RunStatus
from colony.agents.state.persistence import LIFECYCLE
from colony.blackboard import Blackboard
from colony.blackboard.protocol import AgentStateProtocol
from colony.config import load_settings
from colony.errors import AgentStateConflict, ConcurrentModificationError

CURRENT_RUN = AgentStateProtocol.key("current_run")
STEPS = [{"action": "add", "parameters": {"amount": 1}}]


async def test_an_expected_value_must_be_the_stored_text_at_that_version(bb: Blackboard) -> None:
    first = await bb.write("k", {"a": 1})
    text = json.dumps({"a": 1}, separators=(",", ":"))
    async with bb.transaction() as tx:  # same version, same text: applied
        tx.expect("k", first.version, text)
        tx.write("out", 1)
    assert (await bb.read("out")).value == 1
    with pytest.raises(ConcurrentModificationError, match="another value at that version"):
        async with bb.transaction() as tx:  # same version, another text: nothing applied
            tx.expect("k", first.version, '{"a":2}')
            tx.write("out", 2)
    with pytest.raises(ConcurrentModificationError, match="holds version 2"):
        await bb.write("k", {"a": 1})
        async with bb.transaction() as tx:  # the same text at a newer version: refused too
            tx.expect("k", first.version, text)
            tx.write("out", 3)
    assert (await bb.read("out")).value == 1


def count_lifecycle_reads(agent: Agent) -> dict[str, int]:
    board, read, seen = agent.blackboard, agent.blackboard.read, {"n": 0}

    async def counting(key: str):  # type: ignore[no-untyped-def]
        if key == LIFECYCLE:
            seen["n"] += 1
        return await read(key)

    board.read = counting  # type: ignore[method-assign]
    return seen


async def test_a_copy_reads_its_lifecycle_only_until_it_has_written_it(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(counter_blueprint("own", STEPS))
    await runtime.drop("own")
    restored = await Agent.restore(
        "own", runtime.blackboard, colony_id=runtime.colony_id, settings=load_settings()
    )
    reads = count_lifecycle_reads(restored)
    await restored.persist()  # read from Redis, not written by this copy: judged from a read
    await restored.transition(AgentState.LOADED, "test")  # ... as long as it has not written it
    assert reads["n"] == 2
    await restored.persist()
    await restored.transition(AgentState.IDLE, "test")
    await restored.persist()
    assert reads["n"] == 2  # from its own write on, its value is checked inside the commits
    assert (await restored.blackboard.read(LIFECYCLE)).version == restored.stored.version
    assert agent is not restored


async def test_another_value_at_the_same_version_is_never_written_over(runtime: LocalAgentRuntime) -> None:
    """Redis lost the agent's state and another live copy wrote its own lifecycle, reaching the
    very version this copy holds: the commit sees another value, the recovery reads it, and this
    copy yields, writing nothing."""
    agent = await runtime.spawn(counter_blueprint("twin", STEPS))
    run = await runtime.start_run("twin", 1)
    assert (await runtime.wait_for_run("twin", run.run_id, timeout=10)).status is RunStatus.SUCCEEDED
    for _ in range(100):
        if agent.state is AgentState.IDLE:
            break
        await asyncio.sleep(0.05)
    board = agent.blackboard
    stored = await board.read(LIFECYCLE)
    assert stored is not None and stored.version == agent.stored.version
    other = {**stored.value, "holder": "other-copy", "since": time.time()}
    entry_key = board.keyspace.entry_key(LIFECYCLE)
    await board.redis.hset(entry_key, "v", json.dumps(other))  # same version, another copy's value
    before = await board.read(CURRENT_RUN)
    with pytest.raises(AgentStateConflict, match="another live copy"):
        await agent.persist()
    with pytest.raises(AgentStateConflict):
        await agent.transition(AgentState.RUNNING, "refused")
    assert (await board.read(LIFECYCLE)).value["holder"] == "other-copy"
    assert (await board.read(CURRENT_RUN)).version == before.version  # nothing written
