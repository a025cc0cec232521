"""This copy's hold on an agent's stored lifecycle: the state it last wrote or read, that value's
version, holder mark and exact text, the state entries it committed, the newest checkpoint it
pushed, and whether another live copy has taken the agent over. One owner: persistence, the
checkpoint ring and the action log read and write these fields here (never the Agent's private
attributes); the Agent reads `state` and moves through `transition`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from colony.agents.models import (
    TERMINAL_STATES,
    AgentState,
    ResumptionCondition,
    SuspensionRequest,
    check_transition,
)
from colony.agents.state.persistence import (
    LIFECYCLE,
    Verdict,
    adopt_lifecycle,
    fence,
    hold_own_lifecycle,
    judge_lifecycle,
    recover_lifecycle,
    yield_to_other_copy,
)
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.errors import ConcurrentModificationError

if TYPE_CHECKING:
    from colony.agents.base import Agent


class StoredState:
    """What one copy of an agent holds of its stored lifecycle (see the module doc)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.state = AgentState.INITIALIZED
        self.version = 0  # of the `agent:lifecycle` value this copy last wrote or read
        self.mark: str | None = None  # ... and that value's holder mark
        # ... and its exact stored text, when this copy wrote it: a fenced write then checks it in
        # its commit instead of reading it first (None: the read-and-judge path, `check_fence`)
        self.text: str | None = None
        # state entries this copy committed, key -> (version, encoded value): a persist leaves an
        # unchanged one as it is (colony.agents.state.persistence, `persist_agent`)
        self.written: dict[str, tuple[int, str]] = {}
        # the newest checkpoint pushed, (run id, step): one checkpoint per step
        self.checkpointed: tuple[str, int] | None = None
        # Another live copy of this agent wrote its state after this copy came to life: this copy
        # writes nothing more and its host drops it (`ReplicaHost`'s heartbeat). Logged once.
        self.yielded = False

    @property
    def terminated(self) -> bool:
        return self.state in TERMINAL_STATES

    def value(
        self, state: AgentState, reason: str | None, previous: AgentState | None = None
    ) -> dict[str, Any]:
        """The `agent:lifecycle` value this copy writes (with its holder mark)."""
        value: dict[str, Any] = {"state": state.value, "since": time.time(), "reason": reason}
        if previous is not None:
            value["previous"] = previous.value
        value["holder"] = self.agent.holder
        return value

    async def reload(self) -> AgentState:
        """Take the lifecycle state (and its version) from the blackboard, e.g. after a write whose
        reply was lost to a cancellation. When Redis lost it (gone, older), the agent re-persists
        what it holds instead; another live copy's is not taken: `AgentStateConflict`
        (see `judge_lifecycle`)."""
        agent = self.agent
        entry = await agent.blackboard.read(LIFECYCLE)
        verdict = judge_lifecycle(agent, entry)
        if verdict is Verdict.LOST:
            await recover_lifecycle(agent)
        elif verdict is Verdict.OTHER_COPY:
            assert entry is not None
            raise yield_to_other_copy(agent, entry)
        elif verdict is not Verdict.IN_SYNC:
            assert entry is not None
            adopt_lifecycle(agent, entry)
        return self.state

    async def transition(self, new_state: AgentState, reason: str | None = None) -> None:
        """Move to `new_state` (checked against the transition table; a blackboard event records it).

        The write applies only over the lifecycle value this copy holds (version and holder mark).
        A conflict caused by Redis losing the agent's state is recovered once (`recover_lifecycle`);
        another copy's write is never overwritten."""
        agent = self.agent
        for attempt in (1, 2):
            check_transition(self.state, new_state)
            try:
                async with agent.blackboard.transaction() as tx:
                    await fence(tx, agent)
                    lifecycle = self.value(new_state, reason, previous=self.state)
                    tx.write(LIFECYCLE, lifecycle, created_by=agent.agent_id)
            except ConcurrentModificationError:
                if attempt == 2 or not await recover_lifecycle(agent):
                    raise
                if self.state is new_state:  # its own write, whose answer was lost, had done it
                    return
                continue
            hold_own_lifecycle(agent, tx, lifecycle)
            self.state = new_state
            return

    async def request_suspension(self, condition: ResumptionCondition) -> SuspensionRequest:
        """Ask the host to suspend this agent until `condition` holds; the agent waits meanwhile."""
        request = await self.record_suspension(condition)
        if self.state is AgentState.RUNNING:
            await self.transition(AgentState.WAITING, condition.reason or condition.kind.value)
        return request

    async def record_suspension(self, condition: ResumptionCondition) -> SuspensionRequest:
        """Store when this agent may resume (no state change: its host is suspending it)."""
        agent = self.agent
        agent.suspension = SuspensionRequest(agent_id=agent.agent_id, condition=condition)
        await agent.blackboard.write(
            Keys.key("suspension"), agent.suspension.model_dump(mode="json"), created_by=agent.agent_id
        )
        return agent.suspension

    async def clear_suspension(self) -> None:
        self.agent.suspension = None
        await self.agent.blackboard.delete(Keys.key("suspension"))
