"""The default memory hierarchy: working -> STM -> LTM episodic, plus LTM semantic and procedural.

A starting point, not a constraint: each level is a MemoryCapability blueprint, so an agent may take
these, change them, or assemble a graph of its own.

    working (actions, conversation; 1 h, 200)  --copy-->  stm (1 day, 500)
    stm --(conversation, summaries, failures: copied, and summarised by the model)-->  ltm:episodic
    ltm:semantic (facts the agent chose to remember; 10,000)
    ltm:procedural (what worked: the actions of runs that succeeded; 1,000)

STM reaches LTM episodic as it was said (copies) and as summaries the model writes of batches of
CONSOLIDATE_BATCH entries (or of what came within CONSOLIDATE_WAIT_SECONDS), each naming its
sources and stored only when they back it (colony.memory.transformers). The lenses the planner
sees: planning (recent), reflection (past outcomes) and skill (procedures that worked).
"""

from __future__ import annotations

from colony.agents.blueprint import Blueprint, CapabilitySpec
from colony.blackboard import TagFilter
from colony.memory.capability import MemoryCapability
from colony.memory.producers import action_producer, conversation_producer, skill_producer
from colony.memory.tools import MemoryToolsCapability
from colony.memory.transformers import SummarizingTransformer
from colony.memory.types import (
    PLANNING_LENS,
    REFLECTION_LENS,
    SKILL_LENS,
    MemoryIngestPolicy,
    MemoryLens,
    MemorySubscription,
)

EPISODIC_TAGS = frozenset({"conversation", "summary", "failure", "fact"})
CONSOLIDATE_BATCH = 8
CONSOLIDATE_WAIT_SECONDS = 900.0


def consolidation() -> SummarizingTransformer:
    """STM into LTM: the entries copied as they are, and a summary by the model per batch."""
    return SummarizingTransformer(
        min_batch=CONSOLIDATE_BATCH, max_wait_seconds=CONSOLIDATE_WAIT_SECONDS, keep_sources=True
    )


def default_memory_hierarchy(
    *,
    working_ttl_seconds: float = 3600.0,
    working_max_entries: int = 200,
    stm_ttl_seconds: float = 86400.0,
    stm_max_entries: int = 500,
    ltm_max_entries: int = 10_000,
    summarize_stm: bool = False,
    lenses: tuple[MemoryLens, ...] = (PLANNING_LENS, REFLECTION_LENS, SKILL_LENS),
    consolidate: bool = True,
    exclude_actions: list[str] | None = None,
) -> list[Blueprint[object] | CapabilitySpec]:
    """Blueprints of the default levels and of the memory actions (MemoryToolsCapability, less
    `exclude_actions`). `summarize_stm` consolidates working memory into STM with the model
    instead of copying; `consolidate=False` copies STM into LTM episodic without summaries."""
    tools = MemoryToolsCapability.bind(lenses=list(lenses))
    return [
        MemoryCapability.bind(
            level="working",
            ttl_seconds=working_ttl_seconds,
            max_entries=working_max_entries,
            producers=[action_producer(), conversation_producer()],
        ),
        MemoryCapability.bind(
            level="stm",
            ttl_seconds=stm_ttl_seconds,
            max_entries=stm_max_entries,
            ingestion_policy=MemoryIngestPolicy(
                subscriptions=[MemorySubscription(source_scope_id="working")],
                transformer=SummarizingTransformer() if summarize_stm else None,
            ),
        ),
        MemoryCapability.bind(
            level="ltm:episodic",
            max_entries=ltm_max_entries,
            ingestion_policy=MemoryIngestPolicy(
                subscriptions=[
                    MemorySubscription(source_scope_id="stm", tag_filter=TagFilter(any_of=EPISODIC_TAGS))
                ],
                transformer=consolidation() if consolidate else None,
            ),
        ),
        MemoryCapability.bind(level="ltm:semantic", max_entries=ltm_max_entries),
        MemoryCapability.bind(level="ltm:procedural", max_entries=1000, producers=[skill_producer()]),
        CapabilitySpec(blueprint=tools, exclude_actions=exclude_actions) if exclude_actions else tools,
    ]
