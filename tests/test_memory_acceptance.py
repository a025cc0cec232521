"""#15 acceptance on real parts: a StructuredActionPolicy agent on the embedded SmolLM2 model leaves
its action memories through producers; recall works with networking off (a network namespace with
only loopback, a real redis-server and Chroma server, the packaged embedder)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from colony.agents import Agent, AgentBlueprint, AgentMetadata, LocalAgentRuntime, RunStatus
from colony.agents.blueprint import CapabilitySpec
from colony.blackboard import Blackboard, TagFilter, create_redis
from colony.config import ColonySettings, EngineSettings
from colony.inference.embedded import EmbeddedEngine
from colony.memory.capability import MemoryCapability
from colony.memory.producers import action_producer
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.tools import MemoryToolsCapability
from colony.memory.types import PLANNING_LENS, MemoryQuery
from colony.planning import StructuredActionPolicy
from tests.memory_kit import TripDesk

CHECK = Path(__file__).with_name("memory_offline_check.py")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def model(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEngine]:
    engine = EmbeddedEngine(EngineSettings(page_slots=1), data_dir=tmp_path_factory.mktemp("memory-model"))
    await engine.start()
    yield engine
    await engine.close()


def trip_agent(agent_id: str) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id),
        capabilities=[
            TripDesk.bind(),
            MemoryCapability.bind(level="working", producers=[action_producer()]),
            # lenses only: its actions are not offered, so the model follows the workflow
            CapabilitySpec(blueprint=MemoryToolsCapability.bind(lenses=[PLANNING_LENS]), include_actions=[]),
        ],
        action_policy=StructuredActionPolicy.bind(goals=["Book the traveller's train."], allow_finish=False),
    )


@pytest.mark.asyncio(loop_scope="module")
async def test_structured_agent_on_smollm2_leaves_three_tagged_working_memories(
    redis_url: str, model, tmp_path: Path
) -> None:
    client = create_redis(redis_url)
    board = Blackboard(client, "test:memory-acceptance")
    settings = ColonySettings(data_dir=tmp_path)  # recall's index: in-process Chroma under tmp_path
    runtime = LocalAgentRuntime(board, colony_id="memory-acceptance", engine=model, settings=settings)
    prompts: list[str] = []
    try:
        agent = await runtime.spawn(trip_agent("traveller"))
        original = model.generate

        async def spy(request, *args, **kwargs):  # what the planner saw, step by step
            prompts.append(request.messages[-1].content)
            return await original(request, *args, **kwargs)

        model.generate = spy  # type: ignore[method-assign]
        try:
            run = await agent.run({"task": "I need a window seat on a train to Lyon; my name is Ana Ruiz."})
        finally:
            model.generate = original  # type: ignore[method-assign]
        assert run.status is RunStatus.SUCCEEDED, run.error
        store = MemoryStore(board, settings)
        working = MemoryScope.agent_working("traveller", colony_id="memory-acceptance")
        entries = await store.entries(working)
        assert len(entries) == 3
        assert {next(t for t in e.tags if t.startswith("action_type:")) for e in entries} == {
            "action_type:context_fetch",
            "action_type:decision_make",
            "action_type:output_write",
        }
        assert all({"action", "success"} <= e.tags for e in entries)
        assert all(e.entry_id.startswith("p-") and e.created_by == "traveller" for e in entries)
        done = await store.entries(
            working, query=MemoryQuery(tag_filter=TagFilter(all_of={"action:find_train"}))
        )
        assert len(done) == 1 and "Lyon" in done[0].content
        # the PLANNING lens put the first action's memory in the later prompts' memory section
        assert "## Memory: planning" not in prompts[0]
        assert "## Memory: planning" in prompts[1] and "find_train" in prompts[1]
    finally:
        await runtime.shutdown()
        await client.aclose()


def test_recall_with_networking_off(tmp_path: Path) -> None:
    """50 facts; paraphrased questions find the right fact first, min_relevance drops unrelated
    entries, a tag filter returns only matching ones; nothing is downloaded."""
    ip = shutil.which("ip") or "/usr/sbin/ip"
    env = {**os.environ, "HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    script = f"{ip} link set lo up && exec {sys.executable} {CHECK} {tmp_path / 'data'}"
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["vector"] is True  # the Chroma server answered inside the namespace
    for first in report["firsts"]:
        assert first["got"] == first["want"], first
    assert report["dropped"]["kept"] == ["Lena plays the cello in a community orchestra."]
    assert report["tagged"] and all(tags == ["topic:infra"] for tags in report["tagged"])
    assert not (tmp_path / "home" / ".cache" / "chroma").exists()  # no model was downloaded
