"""A persist leaves the state entries this copy of the agent already wrote unchanged as they are
(no write, no event), and writes every entry whenever what Redis holds may differ: another writer
changed one, or Redis lost one."""

from __future__ import annotations

import uuid

from agent_kit import counter_blueprint

from colony.agents import LocalAgentRuntime
from colony.blackboard.protocol import AgentStateProtocol as Keys

STEPS = [{"action": "add", "parameters": {"amount": "$input"}}]


async def versions(agent, *names: str) -> dict[str, int]:
    entries = await agent.blackboard.read_many([Keys.capability_state_key(n) for n in names])
    return {name: (entry.version if entry else 0) for name, entry in zip(names, entries, strict=True)}


async def test_an_unchanged_state_entry_is_not_written_again(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(counter_blueprint(f"skip{uuid.uuid4().hex[:6]}", STEPS))
    names = list(agent.capabilities)
    await agent.persist()
    await agent.persist()  # the first wrote what this copy holds: nothing of it changed since
    before = await versions(agent, *names)
    events = await agent.blackboard.latest_event_id()
    await agent.persist()
    assert await versions(agent, *names) == before
    assert await agent.blackboard.latest_event_id() == events  # no write, so no event either
    # a changed one is written (its version moves), the unchanged ones still are not
    counter = next(n for n, c in agent.capabilities.items() if hasattr(c, "total"))
    agent.capabilities[counter].total = 41
    await agent.persist()
    after = await versions(agent, *names)
    assert after[counter] == before[counter] + 1
    assert all(after[n] == before[n] for n in names if n != counter)
    stored = await agent.blackboard.read(Keys.capability_state_key(counter))
    assert stored is not None and stored.value["state"] == {"total": 41}


async def test_an_entry_written_behind_the_agent_is_written_over_at_its_next_persist(
    runtime: LocalAgentRuntime,
) -> None:
    agent = await runtime.spawn(counter_blueprint(f"other{uuid.uuid4().hex[:6]}", STEPS))
    counter = next(n for n, c in agent.capabilities.items() if hasattr(c, "total"))
    agent.capabilities[counter].total = 5
    await agent.persist()
    key = Keys.capability_state_key(counter)
    await agent.blackboard.write(key, {"state": {"total": 999}, "events_from": None}, created_by="someone")
    await agent.persist()  # unchanged in this copy, changed in Redis: written, no error
    stored = await agent.blackboard.read(key)
    assert stored is not None and stored.value["state"] == {"total": 5}


async def test_an_entry_redis_lost_is_written_again_at_the_next_persist(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(counter_blueprint(f"lost{uuid.uuid4().hex[:6]}", STEPS))
    counter = next(n for n, c in agent.capabilities.items() if hasattr(c, "total"))
    agent.capabilities[counter].total = 7
    await agent.persist()
    key = Keys.capability_state_key(counter)
    await agent.blackboard.redis.delete(agent.blackboard.keyspace.entry_key(key))
    await agent.persist()
    stored = await agent.blackboard.read(key)
    assert stored is not None and stored.value["state"] == {"total": 7}
    # and a restored copy carries on from it
    await runtime.drop(agent.agent_id)
    again = await runtime.resume(agent.agent_id)
    assert again.capabilities[counter].total == 7


async def test_an_entry_lost_and_written_again_to_the_same_version_is_written_over(
    runtime: LocalAgentRuntime,
) -> None:
    """The check is on the text too: a lost key written again by someone else restarts its
    versions, and may reach the very version this copy wrote."""
    agent = await runtime.spawn(counter_blueprint(f"aba{uuid.uuid4().hex[:6]}", STEPS))
    counter = next(n for n, c in agent.capabilities.items() if hasattr(c, "total"))
    agent.capabilities[counter].total = 5
    await agent.persist()
    key = Keys.capability_state_key(counter)
    mine = await agent.blackboard.read(key)
    assert mine is not None
    await agent.blackboard.redis.delete(agent.blackboard.keyspace.entry_key(key))
    for _ in range(mine.version):
        await agent.blackboard.write(key, {"state": {"total": 999}, "events_from": None}, created_by="x")
    theirs = await agent.blackboard.read(key)
    assert theirs is not None and theirs.version == mine.version
    await agent.persist()
    stored = await agent.blackboard.read(key)
    assert stored is not None and stored.value["state"] == {"total": 5}
