"""Agents with memory for the memory tests (a module, so their blueprints pickle by reference)."""

from __future__ import annotations

from typing import Any, Literal

from colony.agents import (
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    ScriptedActionPolicy,
    action_executor,
)
from colony.memory.capability import MemoryCapability
from colony.memory.producers import action_producer
from colony.memory.types import MemoryIngestPolicy, MemorySubscription


class ToolboxCapability(AgentCapability):
    """Three actions of different types, and one that fails."""

    @action_executor(action_type=ActionType.CONTEXT_FETCH)
    async def lookup(self, topic: str) -> str:
        """Look a topic up."""
        return f"notes on {topic}"

    @action_executor(action_type=ActionType.ANALYZE)
    async def weigh(self, options: list[str]) -> str:
        """Pick the best option."""
        return max(options, key=len) if options else ""

    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def report(self, text: str) -> str:
        """Write the result."""
        return text.upper()

    @action_executor(action_type=ActionType.TOOL_USE)
    async def explode(self) -> None:
        """Always fails."""
        raise RuntimeError("boom")


def two_level_memory(stm_max: int | None = None, working_ttl: float | None = None) -> list[Any]:
    return [
        MemoryCapability.bind(level="working", ttl_seconds=working_ttl, producers=[action_producer()]),
        MemoryCapability.bind(
            level="stm",
            max_entries=stm_max,
            ingestion_policy=MemoryIngestPolicy(
                subscriptions=[MemorySubscription(source_scope_id="working")]
            ),
        ),
    ]


def scripted_memory_agent(agent_id: str, steps: list[dict[str, Any]], **memory: Any) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id),
        capabilities=[ToolboxCapability.bind(), *two_level_memory(**memory)],
        action_policy=ScriptedActionPolicy.bind(steps=steps, continue_on_error=True),
    )


class TripDesk(AgentCapability):
    """A three-step workflow, one action possible at a time (so a small model can only follow it)."""

    def __init__(
        self, agent: Agent | None = None, scope_id: str | None = None, *, blackboard: Any = None
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.stage = "new"

    def available_actions(self) -> set[str]:
        return {"new": {"find_train"}, "found": {"choose_seat"}, "chosen": {"book_ticket"}}.get(
            self.stage, set()
        )

    @action_executor(action_type=ActionType.CONTEXT_FETCH)
    async def find_train(self, destination: str) -> str:
        """Find a train to the destination the traveller named."""
        self.stage = "found"
        return f"train found to {destination}: departs 10:04"

    @action_executor(action_type=ActionType.DECISION_MAKE)
    async def choose_seat(self, seat: Literal["window", "aisle"]) -> str:
        """Choose the seat the traveller prefers."""
        self.stage = "chosen"
        return f"{seat} seat held"

    @action_executor(action_type=ActionType.OUTPUT_WRITE)
    async def book_ticket(self, passenger: str) -> str:
        """Book the ticket in the passenger's name."""
        self.stage = "booked"
        return f"ticket booked for {passenger}"

    def get_state(self) -> dict[str, Any]:
        return {"stage": self.stage}

    def set_state(self, state: dict[str, Any]) -> None:
        self.stage = state.get("stage", "new")


def tools_memory_agent(agent_id: str) -> AgentBlueprint:
    """Two levels of memory and the memory actions, driven by the test itself (no policy)."""
    from colony.memory.tools import MemoryToolsCapability

    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id),
        capabilities=[*two_level_memory(), MemoryToolsCapability.bind()],
    )
