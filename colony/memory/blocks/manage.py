"""Tools an agent manages its own blocks with: create and delete them, share them with other agents
of its colony and take the share back, swap a working block out of its prompt and back in.

The edit tools (colony.memory.blocks.tools) change what a block says; these change which blocks
there are, who sees them and whether they are in the prompt. Every call goes through the
BlockStore with the agent as principal, so the store's access rules hold (only the owner shares,
unshares, deletes or swaps; labels never collide in a view; at most `blocks.max_blocks_per_owner`
blocks and `blocks.max_shares_per_block` shares). On top of them, rules the store does not know:

- an agent deletes only blocks it created itself: blocks its blueprint, a template, the system or
  the operator made are not its to remove (they would come back at its next start anyway);
- blocks that hold what the user said (`unshareable`, by default the `human` block and the
  MemoryBlocksCapability's `user_blocks`) are not shared by an agent: that is the operator's call;
- a share names an agent the colony knows; no agent shares with itself.

A refusal raises a typed error whose message says why and what to do; the dispatcher turns it
into a failed action result, and nothing changes. The capability needs a MemoryBlocksCapability
on the same agent (its store and its grounding of `user_blocks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from colony.agents.actions import action_executor
from colony.agents.capability import AgentCapability
from colony.agents.capability_set import capability_of
from colony.agents.models import ActionType
from colony.agents.state.action_log import current_idempotency_key
from colony.blackboard import Blackboard
from colony.errors import (
    AgentNotFound,
    AgentUsageError,
    BlockAccessDenied,
    BlockExists,
    InvalidArgument,
)
from colony.memory.blocks.directory import check_agent
from colony.memory.blocks.rendering import one_line
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.tools import EDIT_CHARS, MemoryBlocksCapability
from colony.memory.blocks.types import (
    MAX_DESCRIPTION_CHARS,
    BlockInfo,
    BlockType,
    Label,
    NewBlock,
    SharedAccess,
)
from colony.memory.blocks.user_lines import quotes_user

if TYPE_CHECKING:
    from colony.agents.base import Agent

UNSHAREABLE = ("human",)  # what the user told the agent about themselves
SWAPPED_HEADER = "## Swapped-out blocks"
MAX_SWAPPED_SHOWN = 20
Description = Annotated[str, Field(min_length=1, max_length=MAX_DESCRIPTION_CHARS)]
AgentId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
CharLimit = Annotated[int, Field(ge=1, le=100_000)]


def _info(info: BlockInfo) -> dict[str, Any]:
    return {
        "label": info.label,
        "block_type": info.block_type.value,
        "char_limit": info.char_limit,
        "swapped_out": info.swapped_out,
    }


class BlockManagementCapability(AgentCapability):
    """`block_create`, `block_delete`, `block_share`, `block_unshare`, `block_swap_out` and
    `block_swap_in` for a planner, and a `## Swapped-out blocks` prompt section naming the working
    blocks it has put away (so it knows what it can bring back). The rules are in the module's
    docstring; `unshareable` adds labels to the blocks an agent may not share."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        unshareable: Sequence[str] = UNSHAREABLE,
        capability_key: str = "block_management",
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard, capability_key=capability_key)
        self.unshareable = frozenset(unshareable)

    def _blocks(self) -> MemoryBlocksCapability:
        if self.agent is None:
            raise AgentUsageError("block management belongs to an agent; this capability has none")
        blocks = capability_of(self.agent, MemoryBlocksCapability)
        if blocks is not None:
            return blocks
        raise AgentUsageError(
            "block management needs memory blocks: add MemoryBlocksCapability to this agent's blueprint"
        )

    def _me(self) -> str:
        if self.agent is None:
            raise AgentUsageError("block management belongs to an agent; this capability has none")
        return self.agent.agent_id

    def _store(self) -> BlockStore:
        return self._blocks().store()

    async def _own(self, label: str) -> BlockInfo:
        """The agent's own block `label`; a block it only sees (shared, colony-wide) is refused."""
        store, me = self._store(), self._me()
        info, _access = await store.resolve(me, label)
        if info.owner != me:
            whose = "a colony-wide block" if info.is_colony else f"{info.owner}'s block, shared with you"
            raise BlockAccessDenied(
                f"block {label!r} is {whose}; only its owner or the operator manages it. "
                "Your own blocks are the ones you can create, delete, share and swap"
            )
        return info

    # -- creation and deletion ------------------------------------------------------------------------

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write", "colony_write"))
    async def block_create(
        self,
        label: Label,
        description: Description,
        content: Annotated[str, Field(max_length=EDIT_CHARS)] = "",
        kind: Literal["working", "core"] = "working",
        char_limit: CharLimit | None = None,
    ) -> dict[str, Any]:
        """Create a new memory block of your own: `label` (lowercase letters, digits, _), a one-line
        `description` of what it is for, optional first `content`. A `working` block can be swapped
        out of your prompt later; a `core` block is always in it."""
        blocks, store, me = self._blocks(), self._store(), self._me()
        if content.strip():
            await blocks.check_user_words(label, lambda _held: content)
        block = NewBlock(
            label=label,
            description=one_line(description),
            content=content,
            block_type=BlockType(kind),
            char_limit=char_limit,
        )
        try:
            info = await store.create(me, block, created_by=me)
        except BlockExists:
            found = await store.info_of(store.block_id(me, label))
            # a redone action (cut off after its create) finds the block it made, untouched since
            if found is None or not await self._made_by_this(found, block):
                raise
            info = found
        return {**_info(info), "created": True}

    async def _made_by_this(self, info: BlockInfo, block: NewBlock) -> bool:
        """Whether `info` is the block this very action made before it was cut off: only under an
        action's key (a redo), made by this agent as asked (description, type, limit, content)
        and never edited since."""
        if current_idempotency_key() is None:
            return False
        if info.created_by != self._me() or info.description != block.description:
            return False
        if info.block_type is not block.block_type or (
            block.char_limit is not None and info.char_limit != block.char_limit
        ):
            return False
        view = await self._store().read(self._me(), info.label)
        asked = block.content if not block.content or block.content.endswith("\n") else block.content + "\n"
        history = await self._store().history(self._me(), info.label)
        return history.head == 1 and view.content == asked

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write", "colony_write"))
    async def block_delete(self, label: Label) -> dict[str, Any]:
        """Delete one of your memory blocks that you created yourself (block_create), with its
        history and its shares. Blocks you were given (persona, human, logs) cannot be deleted."""
        info = await self._own(label)
        me = self._me()
        if info.created_by != me:
            raise BlockAccessDenied(
                f"block {label!r} was made for you ({one_line(info.created_by)}), not by you; you "
                "delete only blocks you created. Rewrite it (memory_rethink) or swap it out "
                "(block_swap_out) instead"
            )
        await self._store().delete(me, me, label)
        return {"label": label, "deleted": True}

    # -- sharing --------------------------------------------------------------------------------------

    async def _refuse_unshareable(self, label: str) -> None:
        """A block holding what the user said is not shared by an agent: a `user_blocks` or
        `unshareable` label, or a block with a line quoting the user ("User said: ...") or a
        line the user said word for word. (Once shared, the edit tools keep such lines out:
        MemoryBlocksCapability.check_user_words.)"""
        blocks = self._blocks()
        private = label in self.unshareable | blocks.user_blocks
        if not private:
            content = (await self._store().read(self._me(), label)).content
            private = await quotes_user(content.splitlines(), blocks.user_words)
        if private:
            raise BlockAccessDenied(
                f"block {label!r} holds what the user told you; you may not share it with other "
                "agents (the operator can). Share a block of your own notes instead"
            )

    async def _known_agent(self, agent_id: str) -> str:
        check_agent(agent_id)
        if agent_id == self._me():
            raise InvalidArgument("you always see your own blocks; name another agent to share with")
        try:
            return await self._store().check_known(agent_id, what="a shared block")
        except AgentNotFound:
            raise AgentNotFound(
                f"no agent {agent_id!r} in this colony; a block is shared only with an agent that exists"
            ) from None

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("colony_write",))
    async def block_share(
        self,
        label: Label,
        agent_id: AgentId,
        access: Literal["read_only", "append_only", "read_write"] = "read_only",
    ) -> dict[str, Any]:
        """Let another agent of your colony see one of your blocks in its prompt: `read_only`,
        `append_only` (it may add lines at the end) or `read_write`. Sharing again changes the
        access; block_unshare takes it back."""
        info = await self._own(label)
        await self._refuse_unshareable(label)
        target = await self._known_agent(agent_id)
        me = self._me()
        share = await self._store().share(me, me, info.label, target, SharedAccess(access))
        return {"label": share.label, "agent_id": share.agent_id, "access": share.access.value}

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("colony_write",))
    async def block_unshare(self, label: Label, agent_id: AgentId) -> dict[str, Any]:
        """Stop sharing one of your blocks with an agent: it no longer sees the block."""
        await self._own(label)
        check_agent(agent_id)
        me = self._me()
        if not await self._store().unshare(me, me, label, agent_id):
            shared = sorted(await self._store().shares_of(me, label))
            raise InvalidArgument(
                f"block {label!r} is not shared with {agent_id}; it is shared with: "
                f"{', '.join(shared) or 'nobody'}"
            )
        return {"label": label, "agent_id": agent_id, "unshared": True}

    # -- swapping -------------------------------------------------------------------------------------

    async def _swap(self, label: str, out: bool) -> dict[str, Any]:
        info = await self._own(label)
        if info.block_type is not BlockType.WORKING:
            raise InvalidArgument(
                f"block {label!r} is a {info.block_type.value} block, always in your prompt; only "
                "working blocks are swapped out and in"
            )
        me = self._me()
        updated = await self._store().update_info(me, label, swapped_out=out)
        return _info(updated)

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write",))
    async def block_swap_out(self, label: Label) -> dict[str, Any]:
        """Take one of your working blocks out of your prompt (it is kept, with its history):
        to make room while it is not needed. block_swap_in brings it back."""
        return await self._swap(label, True)

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write",))
    async def block_swap_in(self, label: Label) -> dict[str, Any]:
        """Bring a swapped-out working block back into your prompt."""
        return await self._swap(label, False)

    # -- the prompt -----------------------------------------------------------------------------------

    async def memory_sections(self, task: str | None = None) -> list[str]:
        """`## Swapped-out blocks`: the working blocks the agent put away, by label and description
        (at most MAX_SWAPPED_SHOWN), or nothing when there are none."""
        if self.agent is None:
            return []
        owned = await self._store().list_owned(self._me())
        away = sorted(
            (i for i in owned if i.block_type is BlockType.WORKING and i.swapped_out), key=lambda i: i.label
        )
        if not away:
            return []
        lines = [f"- {i.label}: {one_line(i.description)[:160]}" for i in away[:MAX_SWAPPED_SHOWN]]
        if len(away) > MAX_SWAPPED_SHOWN:
            lines.append(f"- and {len(away) - MAX_SWAPPED_SHOWN} more")
        intro = "Not in your prompt now; block_swap_in(label) brings one back."
        return ["\n".join([SWAPPED_HEADER, intro, *lines])]
