"""The planner's side of shared memory: `share_memory`, `recall_shared`, and a prompt lens.

The actions reach only the shared scopes the agent is a member of (its SharedMemoryCapabilities,
from its blueprint): a scope the model names is looked up among them, never used as a key. Each
call reads the scope's access rules first (colony.memory.shared), so a refusal is a failed action
naming the scope and how to get access. What the user told this agent is not the agent's to share:
a fact that retells it (colony.memory.user_words) is refused (the user's words stay with
the agent they were told to, as with blocks).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from colony.agents.actions import action_executor
from colony.agents.capability import AgentCapability, agent_settings
from colony.agents.models import ActionType
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.errors import AgentUsageError, MemoryAccessDenied
from colony.memory.capability import private_memory
from colony.memory.grounding import refuse_user_tag
from colony.memory.service import MemoryService, memory_service
from colony.memory.shared import SHARED_TAG, SharedMemoryCapability
from colony.memory.tools import (
    Query,
    Relevance,
    Results,
    TagName,
    action_query,
    entry_id_for,
    render_lens,
    run_message,
)
from colony.memory.types import MemoryLens, NewMemory
from colony.memory.user_words import UserWords, user_messages

if TYPE_CHECKING:
    from colony.agents.base import Agent

log = logging.getLogger(__name__)
SHARED_LENS = MemoryLens(
    name="shared",
    description="What agents of your team and task shared",
    scopes=["collective", "task", "global"],
    max_results=5,
)


class SharedMemoryToolsCapability(AgentCapability):
    """`share_memory` and `recall_shared` over the agent's shared scopes, and the shared lens in
    the planning prompt (what the agent may read of them, ranked by the task)."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        lens: MemoryLens | None = SHARED_LENS,
        settings: ColonySettings | None = None,
        capability_key: str = "shared-memory",
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard, capability_key=capability_key)
        self.lens = lens
        self.settings = settings

    def members(self) -> dict[str, SharedMemoryCapability]:
        """The agent's shared scopes by name (`collective:team-a`, `task:t1`, `global`)."""
        if self.agent is None:
            return {}
        found = self.agent.capabilities.values()
        return {c.name_shared: c for c in found if isinstance(c, SharedMemoryCapability)}

    def member(self, scope: str | None) -> SharedMemoryCapability:
        """The shared scope the model named (None: the only one the agent has)."""
        members = self.members()
        names = ", ".join(sorted(members)) or "none"
        if scope is None:
            if len(members) == 1:
                return next(iter(members.values()))
            raise AgentUsageError(f"name the shared memory (scope); yours: {names}")
        if scope not in members:
            raise AgentUsageError(f"you are not a member of shared memory {scope[:80]!r}; yours: {names}")
        return members[scope]

    def service(self) -> MemoryService:
        if self.settings is None:
            self.settings = agent_settings(self)
        return memory_service(self.blackboard, self.settings)

    async def readable(self, members: Sequence[SharedMemoryCapability]) -> list[str]:
        """Scope ids of `members` this agent may read now."""
        out = []
        for member in members:
            try:
                await member.check("read")
            except MemoryAccessDenied:
                continue
            out.append(member.memory_scope)
        return out

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write", "colony_write"))
    async def share_memory(
        self,
        fact: Annotated[str, Field(min_length=1, max_length=4000)],
        scope: Annotated[str, Field(max_length=80)] | None = None,
        tag: Annotated[str, Field(max_length=64)] | None = None,
    ) -> dict[str, Any]:
        """Share a finding (a whole sentence) with the other agents of a shared memory (`scope`,
        e.g. collective:team-a; default: your only one). Not for what the user told you."""
        member = self.member(scope)
        await member.check("write")
        refuse_user_tag([tag] if tag else [])
        text = fact.strip()
        await self._refuse_user_words(text)
        tags = frozenset({SHARED_TAG, tag} if tag else {SHARED_TAG})
        entry_id = entry_id_for(member.memory_scope, 0, text)
        outcome = await member.write(NewMemory(content=text, tags=tags, kind="fact", entry_id=entry_id))
        made = outcome.created or outcome.entry.entry_id == entry_id  # (by this call, cut off before)
        return {
            "scope": member.name_shared,
            "entry_id": outcome.entry.entry_id,
            "shared": made,
            "duplicate_of": None if made else outcome.duplicate_of,
        }

    async def _refuse_user_words(self, text: str) -> None:
        scopes = [c.memory_scope for c in private_memory(self.agent)]
        messages = [run_message(self.agent), *await user_messages(self.service().store, scopes)]
        why = UserWords(messages).retold_by(text)
        if why is not None:
            raise MemoryAccessDenied(
                f"that retells what the user told you ({why}); the user's words stay with you and "
                "are not shared with other agents. Share what you found or concluded instead"
            )

    @action_executor(action_type=ActionType.MEMORY_SEARCH)
    async def recall_shared(
        self,
        query: Query,
        scope: Annotated[str, Field(max_length=80)] | None = None,
        tag: TagName | None = None,
        max_results: Results = 5,
        min_relevance: Relevance = 0.0,
    ) -> list[dict[str, Any]]:
        """Search what other agents shared (one `scope`, or every shared memory you may read),
        most relevant first, with who shared each entry."""
        if scope is not None:
            member = self.member(scope)
            await member.check("read")
            scope_ids = [member.memory_scope]
        else:
            scope_ids = await self.readable(list(self.members().values()))
            if not scope_ids:
                raise AgentUsageError("you may read no shared memory")
        found = await self.service().recall(action_query(query, tag, max_results, min_relevance), scope_ids)
        names = {c.memory_scope: name for name, c in self.members().items()}
        return [
            {
                "scope": names.get(item.entry.scope_id, ""),
                "entry_id": item.entry.entry_id,
                "content": item.entry.content[:1000],
                "shared_by": item.entry.created_by,
                "relevance": round(item.relevance, 4),
            }
            for item in found
        ]

    async def memory_sections(self, task: str | None = None) -> list[str]:
        """The shared lens: what the agent may read of its shared scopes, ranked by the task."""
        if self.lens is None:
            return []
        members = [
            c for c in self.members().values() if not self.lens.scopes or c.scope_type in self.lens.scopes
        ]
        scope_ids = await self.readable(members)
        if not scope_ids:
            return []
        found = await self.service().recall(
            self.lens.to_query(task).model_copy(update={"scopes": None}), scope_ids
        )
        rendered = render_lens(self.lens, found)
        return [rendered] if rendered else []
