"""Block tools make their effect once: a kill test per tool that declares an effect
(core_memory_append, core_memory_save_message, core_memory_replace, memory_insert, memory_rethink,
archival_insert). The first execution runs inside a real run of a real agent over a real
redis-server and "dies" after its effect and before its `done` record (the record's append raises,
as a dying process would leave it); the agent is then dropped and resumed, and the resumed run
redoes the step: the action runs again under the same idempotency key. Counted after: the block
holds the edit once (no second line, no second version), archival memory one entry, and the redo
answers with the first execution's outcome."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from colony import metrics
from colony.agents import Agent, AgentBlueprint, AgentMetadata, LocalAgentRuntime, ScriptedActionPolicy
from colony.agents.models import RunStatus
from colony.agents.state.action_log import ActionLog, LogRecord
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.tools import MemoryBlocksCapability
from colony.memory.blocks.types import SYSTEM, NewBlock
from colony.memory.capability import MemoryCapability
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore

TASK = "My name is Ada and I like green tea"


class Died(Exception):
    """The process died between the action's effect and its `done` record."""


# action, parameters, (block label, text that must occur once) or None for archival memory
CASES: list[tuple[str, dict[str, Any], tuple[str, str] | None]] = [
    ("core_memory_append", {"label": "human", "content": "Likes green tea"}, ("human", "Likes green tea")),
    ("core_memory_save_message", {"label": "human"}, ("human", f"User said: {TASK}")),
    (
        "core_memory_replace",
        {"label": "notes", "old_content": "first line", "new_content": "second line"},
        ("notes", "second line"),
    ),
    ("memory_insert", {"label": "notes", "content": "zeroth line", "line": 0}, ("notes", "zeroth line")),
    ("memory_rethink", {"label": "notes", "new_content": "all new notes"}, ("notes", "all new notes")),
    ("archival_insert", {"content": "The sky is green in this colony.", "tags": ["fact"]}, None),
]


def blueprint(agent_id: str, action: str, parameters: dict[str, Any]) -> AgentBlueprint:
    steps = [{"action": action, "parameters": parameters}]
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id),
        capabilities=[
            MemoryCapability.bind(level="working"),
            MemoryCapability.bind(level="ltm:semantic"),
            MemoryBlocksCapability.bind(
                templates=["human"], blocks=[NewBlock(label="notes", content="first line", char_limit=200)]
            ),
        ],
        action_policy=ScriptedActionPolicy.bind(steps=steps),
    )


@pytest.fixture
async def runtime(bb: Blackboard, tmp_path: Path) -> AsyncIterator[LocalAgentRuntime]:
    made = LocalAgentRuntime(
        bb, colony_id=f"c{uuid.uuid4().hex[:10]}", settings=ColonySettings(data_dir=tmp_path)
    )
    yield made
    await made.shutdown()


def die_before_done(monkeypatch: pytest.MonkeyPatch, action: str) -> list[dict[str, Any]]:
    """Make the first `done` record of `action` fail to be stored (the process dies there); the
    result it would have recorded is kept in the returned list."""
    original = ActionLog._append
    first: list[dict[str, Any]] = []

    async def append(self: ActionLog, records: list[LogRecord]) -> None:
        for record in records:
            if record.kind == "action" and record.status == "done" and record.action == action and not first:
                first.append(dict(record.result or {}))
                raise Died(f"died after {action} and before its done record")
        await original(self, records)

    monkeypatch.setattr(ActionLog, "_append", append)
    return first


async def edits_of(store: BlockStore, owner: str, label: str, op: str) -> int:
    history = await store.history(SYSTEM, label, owner=owner)
    return sum(1 for v in history.versions if v.op == op and v.author == owner)


@pytest.mark.parametrize(("action", "parameters", "where"), CASES, ids=[c[0] for c in CASES])
async def test_a_block_tool_redone_after_a_crash_before_done_makes_its_effect_once(
    runtime: LocalAgentRuntime,
    monkeypatch: pytest.MonkeyPatch,
    action: str,
    parameters: dict[str, Any],
    where: tuple[str, str] | None,
) -> None:
    agent_id = f"once-{uuid.uuid4().hex[:6]}"
    store = BlockStore(runtime.blackboard.redis, ColonySettings(colony_id=runtime.colony_id))
    memory = MemoryStore(runtime.blackboard, ColonySettings())
    ltm = MemoryScope.agent(agent_id, "ltm:semantic", colony_id=runtime.colony_id)
    first_agent = await runtime.spawn(blueprint(agent_id, action, parameters))
    first = die_before_done(monkeypatch, action)

    # the run's step 1, on the first copy: the effect is made, then the process dies
    run = await first_agent.begin_run({"task": TASK})
    with pytest.raises(Died):
        await first_agent.dispatcher.dispatch(action, parameters)
    assert first and first[0]["success"], first
    if where is not None:
        label, text = where
        head = (await store.history(SYSTEM, label, owner=agent_id)).head
        assert first[0]["output"]["version"] == head
    else:
        assert len(await memory.entries(ltm)) == 1
    repeated = metrics.BLOCK_EDITS.labels(action_op(action), "repeated")._value.get()

    # another replica resumes the agent: the step is redone, the action runs again, same key
    await runtime.drop(agent_id)
    await runtime.resume(agent_id)
    done = await runtime.wait_for_run(agent_id, run.run_id, timeout=30)

    assert done.status is RunStatus.SUCCEEDED, done.error
    assert done.output == first[0]["output"]  # the first execution's outcome, not a second one
    if where is None:
        entries = await memory.entries(ltm)
        assert [e.entry_id for e in entries] == [first[0]["output"]["entry_id"]]
        return
    label, text = where
    content = (await store.read(SYSTEM, label, owner=agent_id)).content
    assert content.count(text) == 1, content
    assert await edits_of(store, agent_id, label, action_op(action)) == 1
    assert (await store.history(SYSTEM, label, owner=agent_id)).head == head  # no version added
    assert metrics.BLOCK_EDITS.labels(action_op(action), "repeated")._value.get() == repeated + 1


def action_op(action: str) -> str:
    """The history `op` of a block tool's edit."""
    return {
        "core_memory_append": "append",
        "core_memory_save_message": "append",
        "core_memory_replace": "replace",
        "memory_insert": "insert",
        "memory_rethink": "rethink",
    }.get(action, "none")


async def test_the_same_edit_under_another_key_is_made_again(runtime: LocalAgentRuntime) -> None:
    """The edit id derives from the key: two actions (two keys) appending the same text both land,
    and an edit made outside any action (no key) is never taken for a redo."""
    agent = await runtime.spawn(blueprint("twice", "core_memory_append", {}))
    store = BlockStore(runtime.blackboard.redis, ColonySettings(colony_id=runtime.colony_id))
    await agent.begin_run({"task": TASK})
    params = {"label": "human", "content": "Likes tea"}
    one = await agent.dispatcher.dispatch("core_memory_append", params)
    two = await agent.dispatcher.dispatch("core_memory_append", params)  # the step's second action
    assert one.success and two.success and two.output["version"] == one.output["version"] + 1
    outside = await store.append("twice", "human", "Likes tea")
    again = await store.append("twice", "human", "Likes tea")
    assert again.version == outside.version + 1
    assert (await store.read(SYSTEM, "human", owner="twice")).content.count("Likes tea") == 4
