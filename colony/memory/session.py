"""A chat session's memory: its turns in the memory hierarchy, what the user says about themselves in
the `human` block, and recall of the turns that left the prompt (colony.agents.protocols.ChatMemory).

The session agent (colony.context.session_agent) stays the owner of the conversation: its tree is
the record, and only messages of the path being answered ever reach the prompt. Memory adds:

- **Turns in the hierarchy.** `session_producer()` turns each stored message (the results of
  `handle_user_message` and `respond_to_user`) into a working-memory entry whose id is the
  message's id, so a turn action run again after a crash writes nothing twice; STM and LTM pull
  them by the scopes' exactly-once ingestion (colony.memory.capability).
- **The `human` block.** `heard(message)` keeps the sentences of the user's message that say
  something about the user (first person, not a question) as "User said: <sentence>" lines, word
  for word: nothing the model wrote is stored as a fact about the user. When the block is full the
  oldest such lines make room.
- **Recall.** `recalled(question, among, limit)` searches the agent's memory scopes for the
  question and keeps only messages of `among` (the path's messages that left the prompt's window):
  a message of another branch, or one reverted past, is never recalled.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from colony.agents.capability import AgentCapability, agent_settings
from colony.agents.capability_set import capability_of
from colony.agents.hooks import HookContext
from colony.agents.state.action_log import current_idempotency_key
from colony.blackboard import Blackboard
from colony.blackboard.models import TagFilter
from colony.errors import BlockLimitExceeded, BlockNotFound
from colony.memory.blocks.rendering import render_blocks
from colony.memory.blocks.tools import MemoryBlocksCapability
from colony.memory.capability import MemoryCapability, private_memory
from colony.memory.grounding import USER_SAID as SAID_PREFIX
from colony.memory.service import memory_service
from colony.memory.types import (
    MemoryIngestPolicy,
    MemoryProducerConfig,
    MemoryQuery,
    MemorySubscription,
    NewMemory,
)

if TYPE_CHECKING:
    from colony.agents.base import Agent

log = logging.getLogger(__name__)
MESSAGE_ACTIONS = {"handle_user_message": "user", "respond_to_user": "assistant"}
MAX_ENTRY_CHARS = 4000
USER_SAID = f"{SAID_PREFIX} "  # a statement's line in the `human` block
MAX_HEARD_LINES = 3  # statements kept of one message
MAX_STATEMENT_CHARS = 300
MIN_STATEMENT_WORDS = 3
RECALL_FETCH = 40  # entries looked at per recall, before keeping the path's
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|i'll|im|my|me|mine|myself|we|our|us)\b", re.IGNORECASE)
# a question, or a request (an imperative: "give me a tip", "please help me"): not about the user
_ASKING = re.compile(
    r"^(please\s+)?(what|who|whom|whose|which|when|where|why|how|do|does|did|can|could|would|should|"
    r"will|is|are|am|was|were|have|has|tell|remind|say|repeat|give|show|help|let|find|suggest|"
    r"recommend|explain|write|make|send|get|list|name|describe|translate|summarise|summarize)\b",
    re.IGNORECASE,
)


def extract_session_message(ctx: HookContext, result: Any) -> NewMemory | None:
    """A session turn action's result -> its message as a `conversation` entry (id: the message id)."""
    action = ctx.args[0] if ctx.args else ctx.kwargs.get("action")
    role = MESSAGE_ACTIONS.get(action) if isinstance(action, str) else None
    if role is None or not getattr(result, "success", False):
        return None
    output = result.output if isinstance(result.output, dict) else {}
    message = output.get("message") if role == "assistant" else output
    if not isinstance(message, dict):
        return None
    message_id, content = message.get("id"), message.get("content")
    if not isinstance(message_id, str) or not isinstance(content, str) or not content.strip():
        return None
    speaker = "User" if role == "user" else "Assistant"
    return NewMemory(
        content=f"{speaker}: {content[:MAX_ENTRY_CHARS]}",
        tags={"conversation", role},
        kind="conversation",
        entry_id=message_id,
        data={"message_id": message_id, "role": role},
        importance=0.8 if role == "user" else 0.5,
    )


def session_producer(ttl_seconds: float | None = None) -> MemoryProducerConfig:
    """The session's messages, as memories of the scope holding this producer."""
    return MemoryProducerConfig(
        pointcut="ActionDispatcher.dispatch",
        extractor=extract_session_message,
        ttl_seconds=ttl_seconds,
        name="session",
    )


def user_statements(message: str, limit: int = MAX_HEARD_LINES) -> list[str]:
    """The sentences of `message` in which the user says something about themselves: first person,
    at least MIN_STATEMENT_WORDS words, not a question or a request to be told something. Word for
    word (whitespace folded), at most `limit`, each at most MAX_STATEMENT_CHARS."""
    found: list[str] = []
    for match in _SENTENCE.finditer(message):
        sentence = " ".join(match.group(0).split())
        words = sentence.split()
        if len(words) < MIN_STATEMENT_WORDS or sentence.endswith("?") or len(sentence) > MAX_STATEMENT_CHARS:
            continue
        if _ASKING.match(sentence) or not _FIRST_PERSON.search(sentence):
            continue
        if sentence not in found:
            found.append(sentence)
        if len(found) == limit:
            break
    return found


class SessionMemoryCapability(AgentCapability):
    """ChatMemory for a session agent: the `human` block kept from what the user says, the agent's
    blocks in every prompt, and recall among the messages that left the prompt. Needs a
    MemoryBlocksCapability for the blocks (without one, `heard` keeps nothing and no block is
    shown) and MemoryCapability scopes for recall."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        human_label: str = "human",
        capability_key: str = "session_memory",
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard, capability_key=capability_key)
        self.human_label = human_label

    def _blocks(self) -> MemoryBlocksCapability | None:
        return capability_of(self.agent, MemoryBlocksCapability)

    def _scopes(self) -> list[str]:
        if self.agent is None:
            return []
        return [c.memory_scope for c in private_memory(self.agent)]

    async def heard(self, message: str) -> list[str]:
        """Append the user's statements about themselves to the `human` block, word for word
        ("User said: ..."), skipping lines it holds already; under the running action's key, so a
        turn redone after a crash appends nothing twice."""
        blocks = self._blocks()
        if blocks is None or self.agent is None:
            return []
        statements = [f"{USER_SAID}{s}" for s in user_statements(message)]
        if not statements:
            return []
        store, me, label = blocks.store(), self.agent.agent_id, self.human_label
        try:
            held = (await store.read(me, label)).content
        except BlockNotFound:
            return []
        key = current_idempotency_key()
        kept = []
        for n, line in enumerate(statements):
            if line in held.splitlines():
                continue
            options: dict[str, Any] = {"via": "system", "message": "what the user said"}
            if key:
                options["idempotency_key"] = f"{key}:heard:{n}"
            try:
                await store.append(me, label, line, **options)
            except BlockLimitExceeded:  # full: the oldest statements make room, then once more
                await self._make_room(len(line) + 1)
                try:
                    await store.append(me, label, line, **options)
                except BlockLimitExceeded:  # a block too small for this line even emptied
                    log.warning("session %s: a statement longer than block %r's room not kept", me, label)
                    continue
            kept.append(line)
            held += line + "\n"
        return kept

    async def _make_room(self, chars: int) -> None:
        """Drop the oldest "User said:" lines of the `human` block until `chars` more fit."""
        blocks = self._blocks()
        if blocks is None or self.agent is None:
            return
        store, me = blocks.store(), self.agent.agent_id
        view = await store.read(me, self.human_label)
        lines = view.content.splitlines()
        while lines and len("\n".join(lines)) + chars > view.info.char_limit:
            oldest = next((i for i, line in enumerate(lines) if line.startswith(USER_SAID)), None)
            if oldest is None:
                break
            del lines[oldest]
        await store.set_content(
            me, self.human_label, "\n".join(lines), via="system", message="oldest statements make room"
        )

    async def standing_sections(self) -> list[str]:
        """The session's own blocks and the colony's (the operator's), never a block another agent
        shared with it: no agent writes into a user's chat prompt."""
        blocks = self._blocks()
        if blocks is None or self.agent is None:
            return []
        me = self.agent.agent_id
        views = [v for v in await blocks.views() if v.info.owner == me or v.info.is_colony]
        rendered = render_blocks(views)
        return [rendered] if rendered else []

    async def recalled(
        self, question: str, among: set[str], limit: int, min_relevance: float = 0.0
    ) -> list[tuple[str, float]]:
        """(message id, relevance) of `among` whose entries recall ranks for `question` at
        `min_relevance` or more, best first."""
        scopes = self._scopes()
        if not among or not scopes or limit < 1 or not question.strip():
            return []
        query = MemoryQuery(
            query=question[:2000],
            tag_filter=TagFilter(all_of=frozenset({"conversation"})),
            max_results=RECALL_FETCH,
            min_relevance=min(max(min_relevance, 0.0), 1.0),
        )
        found = await memory_service(self.blackboard, agent_settings(self)).recall(query, scopes)
        picked: dict[str, float] = {}
        for item in found:
            data = item.entry.data if isinstance(item.entry.data, dict) else {}
            message_id = data.get("message_id")
            if isinstance(message_id, str) and message_id in among and message_id not in picked:
                picked[message_id] = item.relevance
                if len(picked) == limit:
                    break
        return list(picked.items())


def session_memory_hierarchy(
    *,
    working_ttl_seconds: float = 3600.0,
    working_max_entries: int = 200,
    stm_ttl_seconds: float = 86400.0,
    stm_max_entries: int = 500,
    ltm_max_entries: int = 10_000,
) -> Sequence[Any]:
    """A session agent's memory: working (its messages) -> STM (copies) -> LTM episodic."""
    return [
        MemoryCapability.bind(
            level="working",
            ttl_seconds=working_ttl_seconds,
            max_entries=working_max_entries,
            producers=[session_producer()],
        ),
        MemoryCapability.bind(
            level="stm",
            ttl_seconds=stm_ttl_seconds,
            max_entries=stm_max_entries,
            ingestion_policy=MemoryIngestPolicy(
                subscriptions=[MemorySubscription(source_scope_id="working")]
            ),
        ),
        MemoryCapability.bind(
            level="ltm:episodic",
            max_entries=ltm_max_entries,
            ingestion_policy=MemoryIngestPolicy(
                subscriptions=[
                    MemorySubscription(
                        source_scope_id="stm", tag_filter=TagFilter(all_of=frozenset({"conversation"}))
                    )
                ]
            ),
        ),
    ]
