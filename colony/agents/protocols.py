"""What an agent's lower layers call in the layers above them, typed as protocols: the upper layer
implements them, the lower one imports only this module (docs/architecture.md). A capability that
implements one is found among the agent's capabilities with `isinstance`."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from colony.agents.base import Agent
    from colony.agents.models import AgentRun


@runtime_checkable
class HistorySummaryLog(Protocol):
    """Keeps the summaries a planner's compaction writes of its earlier history (the memory blocks
    capability's `history_summary` log block)."""

    async def log_history_summary(self, text: str, *, items: int, ref: str) -> None: ...


@runtime_checkable
class ChatMemory(Protocol):
    """What a session agent's memory adds to its turns (colony.memory.session implements it; the
    session capability, colony.context.session_agent, calls it). Messages reach memory by its
    producers, not through this protocol."""

    async def heard(self, message: str) -> list[str]:
        """Keep what the user said about themselves (the `human` block); the lines kept."""
        ...

    async def standing_sections(self) -> list[str]:
        """Prompt sections every turn carries (the agent's memory blocks)."""
        ...

    async def recalled(
        self, question: str, among: set[str], limit: int, min_relevance: float
    ) -> list[tuple[str, float]]:
        """(id, relevance) of messages of `among` (earlier messages of the path being answered)
        that memory finds relevant to `question` (at least `min_relevance`), best first, at most
        `limit`."""
        ...


class AgentHost(Protocol):
    """The runtime that hosts an agent (`LocalAgentRuntime`; on a replica, the one `ReplicaHost`
    holds): it drives the agent's runs and carries out its suspensions. `Agent.host` is typed with
    this, so what the agent and its capabilities may ask of their host is written down here."""

    services: dict[str, Any]  # injected into capabilities that take them: settings=, engine=, ...

    async def start_run(self, agent_id: str, input_data: Any, *, request_id: str | None = None) -> AgentRun:
        """Begin a run and drive it in the background."""
        ...

    def retire(self, agent_id: str) -> None:
        """Stop the agent from inside itself (a one-shot worker whose job is done)."""

    def hosts(self, agent: Agent) -> bool:
        """Whether this very copy of the agent is hosted here (a copy dropped for a restore is not)."""
        ...

    def redo_after_outage(self, agent: Agent, key: str, step: int | None = None) -> bool:
        """Drop this copy and restore the agent from Redis after a Redis outage cut work short."""
        ...

    async def await_redis(self, agent: Agent, attempts: int = 60) -> None:
        """Wait (bounded) until Redis answers again."""

    def driver(self, agent_id: str) -> asyncio.Task[None] | None:
        """The task driving the agent's current run, if one was started here."""
        ...
