"""Consolidation for real (issue 36, deliverable 5), on a real redis-server: the default hierarchy
copies STM into LTM episodic and summarises batches of it with the model, keeping provenance and
storing only summaries their sources back; runs that succeed leave their actions in procedural LTM;
the SKILL lens puts them in the planner's prompt. The summary and the lens are also run on the
embedded SmolLM2 model."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from colony import metrics
from colony.agents import (
    Agent,
    AgentBlueprint,
    AgentMetadata,
    LocalAgentRuntime,
    RunStatus,
    ScriptedActionPolicy,
)
from colony.blackboard import Blackboard, create_redis
from colony.config import ColonySettings, EngineSettings
from colony.errors import InferenceError
from colony.inference import InferenceRequest
from colony.inference.embedded import EmbeddedEngine
from colony.inference.scripted import ScriptedEngine
from colony.memory.grounding import check_grounded
from colony.memory.hierarchy import CONSOLIDATE_BATCH, default_memory_hierarchy
from colony.memory.scopes import MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.transformers import SUMMARY_COVERAGE, SummarizingTransformer
from colony.memory.types import MemoryEntry, NewMemory
from colony.planning import StructuredActionPolicy

FACTS = [
    "Ana moved to Lisbon in March.",
    "Ana works at the harbour office.",
    "The harbour office opens at eight.",
    "Ana takes the tram to work.",
    "Ana's tram is the number 28.",
    "Ana has a cat called Pimenta.",
    "Pimenta likes the balcony.",
    "Ana is learning to surf.",
]


def _entry(content: str, age: float = 0.0) -> MemoryEntry:
    now = time.time()
    return MemoryEntry(
        entry_id=f"e{uuid.uuid4().hex[:8]}",
        scope_id="s",
        content=content,
        created_at=now - age,
        updated_at=now,
    )


def test_a_consolidating_scope_waits_for_a_batch_or_for_its_oldest_entry_to_age() -> None:
    summarising = SummarizingTransformer(min_batch=3, max_wait_seconds=60)
    assert summarising.waits([_entry("a"), _entry("b")])
    assert not summarising.waits([_entry("a"), _entry("b"), _entry("c")])
    assert not summarising.waits([_entry("a", age=61), _entry("b")])  # waited long enough
    assert not summarising.waits([])
    assert not SummarizingTransformer().waits([_entry("a")])  # the plain transformer never waits


class Kit:
    def __init__(self, board: Blackboard, runtime: LocalAgentRuntime) -> None:
        self.board, self.runtime = board, runtime
        self.store = MemoryStore(board, ColonySettings())

    def scope(self, agent_id: str, level: str) -> str:
        return MemoryScope.agent(agent_id, level, colony_id=self.runtime.colony_id)

    async def entries(self, agent_id: str, level: str) -> list[MemoryEntry]:
        return await self.store.entries(self.scope(agent_id, level))

    async def fill_stm(self, agent_id: str, facts: list[str]) -> list[str]:
        refs = []
        for fact in facts:
            written = await self.store.write(
                self.scope(agent_id, "stm"), NewMemory(content=fact, tags={"conversation", "user"})
            )
            refs.append(written.entry.ref)
        return refs

    async def ltm_when(self, agent_id: str, count: int, timeout: float = 60.0) -> list[MemoryEntry]:
        deadline = time.monotonic() + timeout
        while True:
            found = await self.entries(agent_id, "ltm:episodic")
            if len(found) >= count or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.2)


@pytest_asyncio.fixture
async def kit(redis_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    made: list[LocalAgentRuntime] = []
    client = create_redis(redis_url)

    def runtime(engine: Any) -> Kit:
        board = Blackboard(client, f"test:{uuid.uuid4().hex[:12]}")
        rt = LocalAgentRuntime(
            board,
            colony_id=f"c{uuid.uuid4().hex[:10]}",
            engine=engine,
            settings=ColonySettings(data_dir=tmp_path),
        )
        made.append(rt)
        return Kit(board, rt)

    yield runtime
    for rt in made:
        await rt.shutdown()
    await client.aclose()


def _hierarchy_agent(agent_id: str, policy: Any = None) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id),
        capabilities=list(default_memory_hierarchy()),
        action_policy=policy,
    )


def _summary_of(found: list[MemoryEntry]) -> list[MemoryEntry]:
    return [e for e in found if e.kind == "summary"]


async def test_stm_reaches_ltm_as_copies_and_a_grounded_summary_naming_its_sources(kit: Any) -> None:
    grounded = "Ana moved to Lisbon in March and works at the harbour office; she has a cat called Pimenta."
    engine = ScriptedEngine(lambda request: grounded)
    k = kit(engine)
    await k.runtime.spawn(_hierarchy_agent("ana"))
    refs = await k.fill_stm("ana", FACTS[: CONSOLIDATE_BATCH - 1])
    await asyncio.sleep(1.0)
    assert await k.entries("ana", "ltm:episodic") == []  # fewer than a batch: the scope waits
    refs += await k.fill_stm("ana", FACTS[CONSOLIDATE_BATCH - 1 : CONSOLIDATE_BATCH])
    found = await k.ltm_when("ana", CONSOLIDATE_BATCH + 1)
    copies = sorted(e.content for e in found if e.kind != "summary")
    assert copies == sorted(FACTS[:CONSOLIDATE_BATCH])  # word for word
    (summary,) = _summary_of(found)
    assert summary.content == grounded and "summary" in summary.tags
    assert sorted(summary.sources) == sorted(refs)  # provenance: the STM entries it summarises
    assert len(engine.requests) == 1  # one model call for the batch


async def test_a_summary_its_sources_do_not_back_is_dropped_and_a_failing_model_leaves_the_copies(
    kit: Any,
) -> None:
    ungrounded = ScriptedEngine(lambda request: "Ana lives on Mars and owns 42 rockets.")
    k = kit(ungrounded)
    await k.runtime.spawn(_hierarchy_agent("ana"))
    before = metrics.MEMORY_SUMMARIES.labels("ungrounded")._value.get()
    await k.fill_stm("ana", FACTS)
    found = await k.ltm_when("ana", CONSOLIDATE_BATCH)
    await asyncio.sleep(0.5)
    found = await k.entries("ana", "ltm:episodic")
    assert len(found) == CONSOLIDATE_BATCH and _summary_of(found) == []
    assert metrics.MEMORY_SUMMARIES.labels("ungrounded")._value.get() == before + 1

    def broken(request: InferenceRequest) -> str:
        raise InferenceError("the model is gone")

    k2 = kit(ScriptedEngine(broken))
    await k2.runtime.spawn(_hierarchy_agent("bea"))
    failed = metrics.MEMORY_SUMMARIES.labels("failed")._value.get()
    await k2.fill_stm("bea", FACTS)
    found = await k2.ltm_when("bea", CONSOLIDATE_BATCH)
    assert sorted(e.content for e in found) == sorted(FACTS)
    assert metrics.MEMORY_SUMMARIES.labels("failed")._value.get() >= failed + 1


async def test_a_waiting_scope_is_not_starved_by_entries_its_filter_leaves_out(kit: Any) -> None:
    """3 matching entries, 70 the tag filter leaves out, then 20 matching: a look that read a full
    window of events does not wait (found by review: LTM waited the full 15 minutes)."""
    k = kit(ScriptedEngine(lambda request: "Ana moved to Lisbon in March."))
    await k.runtime.spawn(_hierarchy_agent("ana"))
    await k.fill_stm("ana", FACTS[:1])
    await asyncio.sleep(1.0)  # the LTM subscription holds a position
    await k.fill_stm("ana", FACTS[1:3])
    stm = k.scope("ana", "stm")
    for n in range(70):
        await k.store.write(stm, NewMemory(content=f"action noise {n}", tags={"action"}))
    await k.fill_stm("ana", [f"Ana wrote note number {n} today." for n in range(20)])
    found = await k.ltm_when("ana", CONSOLIDATE_BATCH, timeout=30)
    assert len([e for e in found if e.kind != "summary"]) >= CONSOLIDATE_BATCH


def test_a_summary_is_grounded_in_its_sources_pronouns_allowed_inversions_refused() -> None:
    sources = ["Ana moved to Lisbon in March.", "Alice approved the budget.", "The deploy failed."]

    def stored(text: str) -> bool:
        return check_grounded(text, sources, min_coverage=SUMMARY_COVERAGE, pronouns=False).grounded

    assert stored("She moved to Lisbon in March.") and stored("Ana moved to Lisbon in March.")
    assert not stored("Alice rejected the budget.")  # a word the sources do not hold
    assert not stored("The deploy succeeded.")
    assert not stored("Bob moved to Lisbon in March.")  # an invented name, even starting a sentence
    assert not check_grounded("She moved to Lisbon in March.", sources).grounded  # a user's fact: no


async def test_a_run_that_succeeds_leaves_what_worked_in_procedural_memory(kit: Any) -> None:
    k = kit(ScriptedEngine(["unused"]))
    steps = [
        {"action": "remember", "parameters": {"fact": "The report is due on Friday."}},
        {"action": "recall", "parameters": {"query": "report due"}},
    ]
    agent = await k.runtime.spawn(_hierarchy_agent("planner", ScriptedActionPolicy.bind(steps=steps)))
    run = await agent.run({"task": "note the report deadline"})
    assert run.status is RunStatus.SUCCEEDED, run.error
    (skill,) = await k.entries("planner", "ltm:procedural")
    assert skill.entry_id == f"skill-{run.run_id}" and skill.kind == "procedure"
    assert skill.content == "Task: note the report deadline\nWhat worked: remember -> recall"
    assert {"skill", "success", "action:remember"} <= skill.tags

    failing = [{"action": "forget", "parameters": {"entry_id": "nope", "scope": "nowhere"}}]
    other = await k.runtime.spawn(_hierarchy_agent("loser", ScriptedActionPolicy.bind(steps=failing)))
    lost = await other.run({"task": "forget something"})
    assert lost.status is RunStatus.FAILED
    assert await k.entries("loser", "ltm:procedural") == []


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def model(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEngine]:
    engine = EmbeddedEngine(
        EngineSettings(page_slots=1), data_dir=tmp_path_factory.mktemp("consolidation-model")
    )
    await engine.start()
    yield engine
    await engine.close()


class Spy:
    """The embedded engine, keeping every request it was sent."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine, self.requests = engine, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, request: InferenceRequest) -> Any:
        self.requests.append(request)
        return await self.engine.generate(request)


@pytest_asyncio.fixture(loop_scope="module")
async def model_kit(redis_url: str, model: EmbeddedEngine, tmp_path: Path) -> AsyncIterator[Kit]:
    """A runtime on the embedded model (spied), in the module's event loop as the model is."""
    client = create_redis(redis_url)
    board = Blackboard(client, f"test:{uuid.uuid4().hex[:12]}")
    runtime = LocalAgentRuntime(
        board,
        colony_id=f"c{uuid.uuid4().hex[:10]}",
        engine=Spy(model),
        settings=ColonySettings(data_dir=tmp_path),
    )
    yield Kit(board, runtime)
    await runtime.shutdown()
    await client.aclose()


@pytest.mark.asyncio(loop_scope="module")
async def test_on_the_embedded_model_stm_is_summarised_and_the_skill_lens_reaches_the_planner(
    model_kit: Kit,
) -> None:
    k = model_kit
    spy = k.runtime.services["engine"]
    await k.runtime.spawn(_hierarchy_agent("ana"))
    stored = metrics.MEMORY_SUMMARIES.labels("stored")._value.get()
    dropped = metrics.MEMORY_SUMMARIES.labels("ungrounded")._value.get()
    refs = await k.fill_stm("ana", FACTS)
    found = await k.ltm_when("ana", CONSOLIDATE_BATCH, timeout=240)
    deadline = time.monotonic() + 240
    while metrics.MEMORY_SUMMARIES.labels("stored")._value.get() == stored and (
        metrics.MEMORY_SUMMARIES.labels("ungrounded")._value.get() == dropped
    ):
        assert time.monotonic() < deadline, "no summary was written or refused"
        await asyncio.sleep(0.5)
    found = await k.entries("ana", "ltm:episodic")
    summaries = _summary_of(found)
    print("model summary:", [s.content for s in summaries], "requests:", len(spy.requests))
    assert any(
        "Ana moved to Lisbon in March." in line for line in spy.requests[0].messages[-1].content.splitlines()
    )
    assert sorted(e.content for e in found if e.kind != "summary") == sorted(FACTS)
    # the 135M model's summary of these facts is grounded (at temperature 0 it lists them): stored,
    # naming its sources
    (summary,) = summaries
    assert sorted(summary.sources) == sorted(refs) and "Lisbon" in summary.content

    # the skill lens: a procedure that worked reaches a planner's prompt on a similar task
    await k.store.write(
        MemoryScope.agent("writer", "ltm:procedural", colony_id=k.runtime.colony_id),
        NewMemory(
            content="Task: save the user's address\nWhat worked: remember -> answer",
            tags={"skill", "success"},
            kind="procedure",
        ),
    )
    spy.requests.clear()
    planner = await k.runtime.spawn(
        _hierarchy_agent("writer", StructuredActionPolicy.bind(goals=["Do the task."], max_tokens=128))
    )
    await planner.begin_run({"task": "save the user's new address"})
    await planner.run_step()  # one planning step: its prompt is what the lens must reach
    prompt = "\n".join(m.content for r in spy.requests for m in (r.messages or []))
    assert "## Memory: skill" in prompt
    assert "What worked: remember -> answer" in prompt


async def test_a_summary_names_as_sources_only_the_entries_the_model_was_shown() -> None:
    """Found by review: one entry too long for what was left of the model's input ended the list,
    and the summary still named every entry of the batch as its source."""
    from types import SimpleNamespace

    seen: list[str] = []

    class Engine:
        async def generate(self, request: Any) -> Any:
            seen.append(request.messages[-1].content)
            return SimpleNamespace(text="Dana moved to Oslo in May.")

    long = "Notes. " + "word " * 1300  # ~6,500 characters: allowed in an entry, past what is left
    texts = ["Dana moved to Oslo in May.", long, "Dana's locker code is 7291.", "Tom likes tea."]
    entries = [
        MemoryEntry(entry_id=f"e{n}", scope_id="s", content=text, created_at=time.time())
        for n, text in enumerate(texts)
    ]
    capability = SimpleNamespace(engine=Engine(), ttl_seconds=None, name="t")
    made = await SummarizingTransformer(keep_sources=False).transform(entries, capability)
    shown = [e.ref for e in entries if e.content in seen[0]]
    assert len(shown) == 3 and made[0].sources == shown  # the long one skipped, the later ones kept
    assert made[0].metadata == {"summarised": 3}
