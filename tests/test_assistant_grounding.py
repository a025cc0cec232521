"""Issue 36, deliverable 7, on the embedded SmolLM2 model: the built-in `assistant` told
"Hi, my name is Dana." keeps the user's words (verbatim in memory; in its `human` block nothing the
user did not say), and the texts a model was seen storing ("This is a list of your memories...",
an invented name, one sentence 16 times) are refused by the real assistant with the reason."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from colony.agents import Agent, AgentBlueprint, AgentMetadata, LocalAgentRuntime, RunStatus
from colony.agents.blueprint import CapabilitySpec
from colony.blackboard import Blackboard, TagFilter, create_redis
from colony.config import ColonySettings, EngineSettings
from colony.inference.embedded import EmbeddedEngine
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.tools import MemoryBlocksCapability
from colony.memory.blocks.types import SYSTEM
from colony.memory.capability import MemoryCapability
from colony.memory.grounding import STOP_WORDS, check_lines, stem, words
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import MemoryQuery
from colony.planning import StructuredActionPolicy
from colony.system.assistant import assistant_blueprint

DANA = "Hi, my name is Dana."
MEMORY_LIST = "This is a list of your memories. Use them to answer the user's question."
LOOP = "I'm here to help you with anything you need. " * 16
REFUSED = "holds only what the user said; not stored: "
KEEPER_GOAL = (
    "Keep what the user tells you about themselves in your `human` block: call core_memory_append "
    'with label "human" and the content to keep.'
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def model(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEngine]:
    engine = EmbeddedEngine(EngineSettings(page_slots=1), data_dir=tmp_path_factory.mktemp("grounding-model"))
    await engine.start()
    yield engine
    await engine.close()


@pytest_asyncio.fixture(loop_scope="module")
async def runtime(redis_url: str, model: EmbeddedEngine, tmp_path: Path) -> AsyncIterator[LocalAgentRuntime]:
    client = create_redis(redis_url)
    board = Blackboard(client, f"test:{uuid.uuid4().hex[:12]}")
    made = LocalAgentRuntime(
        board, colony_id=f"c{uuid.uuid4().hex[:10]}", engine=model, settings=ColonySettings(data_dir=tmp_path)
    )
    yield made
    await made.shutdown()
    await client.aclose()


def _actions(entries: list, prefix: str) -> list[str]:
    return [e.content for e in entries if e.content.startswith(f"Action {prefix}")]


@pytest.mark.asyncio(loop_scope="module")
async def test_told_a_name_the_assistant_stores_only_what_was_said(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(assistant_blueprint("assistant"))
    told = await agent.run({"task": DANA})
    assert told.status is RunStatus.SUCCEEDED, told.error
    asked = await agent.run({"task": "What is my name?"})
    assert asked.status is RunStatus.SUCCEEDED, asked.error
    print("answers:", repr(told.output), repr(asked.output))
    assert "Dana" in asked.output and "Emily" not in asked.output, asked.output  # "I'm Emily." once

    # the user's message is in memory word for word (the conversation producer)
    store = MemoryStore(runtime.blackboard, ColonySettings())
    working = MemoryScope.agent_working("assistant", colony_id=runtime.colony_id)
    said = await store.entries(working, query=MemoryQuery(tag_filter=TagFilter(all_of={"user"})))
    assert f"User: {DANA}" in [e.content for e in said]

    # the human block holds nothing the user did not say: every content word of it is Dana's
    blocks = BlockStore(runtime.blackboard.redis, ColonySettings(colony_id=runtime.colony_id))
    human = (await blocks.read(SYSTEM, "human", owner="assistant")).content
    print("human block:", repr(human))
    heard = {stem(w) for w in words(DANA)}
    assert {stem(w) for w in words(human) if w not in STOP_WORDS} <= heard, human
    assert check_lines(human, [DANA]).grounded or human == ""

    # what the model tried to store and was refused failed with the reason, nothing else failed
    entries = await store.entries(working, query=MemoryQuery(tag_filter=TagFilter(all_of={"action"})))
    writes = [c for c in _actions(entries, "") if "core_memory" in c or "memory_" in c or "archival" in c]
    print("writes:", *writes, sep="\n  ")
    for refused in (c for c in writes if " failed: " in c and "save_message" not in c):
        assert REFUSED in refused, refused


def _keeper(agent_id: str) -> AgentBlueprint:
    """A planner whose only action is core_memory_append into a `human` block held to what the
    user said (as the assistant's is): the block's content is the model's own words."""
    blocks = MemoryBlocksCapability.bind(templates=["human"], tool_log=False, user_blocks=["human"])
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id),
        capabilities=[
            MemoryCapability.bind(level="working"),
            CapabilitySpec(blueprint=blocks, include_actions=["core_memory_append"]),
        ],
        action_policy=StructuredActionPolicy.bind(goals=[KEEPER_GOAL], allow_finish=False, max_tokens=160),
    )


@pytest.mark.asyncio(loop_scope="module")
async def test_what_the_model_writes_itself_is_stored_only_when_the_user_said_it(
    runtime: LocalAgentRuntime,
) -> None:
    """Seen on SmolLM2-135M: for "I like green tea." it appends the block's own description
    ("Storing key details about the person you are conversing with"), for "What is my name?" a
    template ("Hello, my name is {name}!"); for Dana's message its plan loops ("I'm a person." over
    and over) and is cut off. Each refused, with the reason; what was stored is the user's."""
    blocks = BlockStore(runtime.blackboard.redis, ColonySettings(colony_id=runtime.colony_id))
    refusals = 0
    for n, task in enumerate(
        [DANA, "My cat is called Tom and I live in Oslo.", "I like green tea.", "What is my name?"]
    ):
        agent = await runtime.spawn(_keeper(f"keeper-{n}"))
        await agent.begin_run({"task": task})
        for _ in range(2):
            await agent.run_step()
        trace = agent.action_policy.call_trace
        print(task, "->", [(c["parameters"].get("content"), c["success"], c["error"]) for c in trace])
        for call in trace:
            if not call["success"]:
                assert REFUSED in call["error"], call
                refusals += 1
        human = (await blocks.read(SYSTEM, "human", owner=f"keeper-{n}")).content
        heard = {stem(w) for w in words(task)}
        assert {stem(w) for w in words(human) if w not in STOP_WORDS} <= heard, (task, human)
    assert refusals >= 1  # the model did try to store what nobody said


@pytest.mark.asyncio(loop_scope="module")
async def test_the_transcripts_texts_are_refused_by_the_assistant(runtime: LocalAgentRuntime) -> None:
    agent = await runtime.spawn(assistant_blueprint("assistant"))
    await agent.begin_run({"task": DANA})
    dispatch = agent.dispatcher.dispatch
    blocks = BlockStore(runtime.blackboard.redis, ColonySettings(colony_id=runtime.colony_id))
    cases = [
        ("core_memory_append", {"label": "human", "content": MEMORY_LIST}, "the user never said"),
        ("memory_rethink", {"label": "human", "new_content": "I'm Emily."}, "the user never said emily"),
        ("core_memory_append", {"label": "human", "content": LOOP}, "16 times"),
        ("archival_insert", {"content": LOOP}, "16 times"),
    ]
    for action, parameters, reason in cases:
        result = await dispatch(action, parameters)
        assert not result.success and reason in (result.error or ""), (action, result.error)
        assert "not stored" in (result.error or "")
    assert (await blocks.read(SYSTEM, "human", owner="assistant")).content == ""
    assert (await dispatch("core_memory_save_message", {"label": "human"})).success
    assert (await dispatch("core_memory_append", {"label": "human", "content": "Name: Dana"})).success
    human = (await blocks.read(SYSTEM, "human", owner="assistant")).content
    assert human == f"User said: {DANA}\nName: Dana\n"
