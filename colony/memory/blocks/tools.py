"""The planner's side of memory blocks: block-editing tools, archival memory, recall, the rolling
tool log and the `## Memory blocks` prompt section.

Every edit goes through the BlockStore with the agent's own id as principal (`via="tool"`), so the
access an agent has (own, shared read-only / append-only / read-write, colony-wide) is enforced
there, on the same path as the HTTP API's. A refused edit raises the store's error, which the
dispatcher turns into a failed ActionResult carrying its message (why, and what to do instead);
the block is left as it was. Archival memory is the agent's LTM memory scope (one store, one
index): `archival_insert` writes through its MemoryCapability, searches go through the memory
service's recall.

Effects happen once: each tool that changes a block or writes archival memory passes the action's
idempotency key (`current_idempotency_key()`), from which the edit id or the entry id derives. A
step cut off after the effect and before its `done` record runs the action again under the same
key: the edit (or entry) is found made and its outcome returned, nothing is appended twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from colony.agents.actions import action_executor, discover_actions
from colony.agents.capability import AgentCapability, agent_settings
from colony.agents.hooks import HookContext, HookType, hook_handler
from colony.agents.models import ActionType
from colony.agents.state.action_log import current_idempotency_key
from colony.blackboard import Blackboard
from colony.blackboard.models import TagFilter
from colony.config import BlockSettings, ColonySettings
from colony.errors import AgentUsageError, BlockEditRejected, BlockExists, BlockNotFound, InvalidArgument
from colony.memory.blocks.rendering import one_line, render_blocks
from colony.memory.blocks.store import BlockStore
from colony.memory.blocks.stores import agent_block_store
from colony.memory.blocks.templates import apply_template
from colony.memory.blocks.types import BlockType, BlockView, EditOutcome, Label, NewBlock
from colony.memory.blocks.user_lines import not_for_others, quotes_user, seen_by_others
from colony.memory.capability import MemoryCapability, derived_id, private_memory
from colony.memory.grounding import USER_SAID, check_lines, refusal, refuse_user_tag, said_by_user
from colony.memory.scopes import MemoryScope
from colony.memory.service import MemoryService, memory_service
from colony.memory.types import MemoryQuery, NewMemory, RecalledEntry

if TYPE_CHECKING:
    from colony.agents.base import Agent

MIN_MESSAGE_WORDS = 3  # a message of one or two words states nothing worth keeping
log = logging.getLogger(__name__)
SUMMARY_LOG_LABEL = "history_summary"  # where compaction's summaries go (HistorySummaryLog)
SUMMARY_LOG_DESCRIPTION = "Summaries of your earlier history, written when it was compacted; read-only"

TOOL_LOG = "tool_log"
EVENT_LOG = "event_log"
EVENT_LOG_DESCRIPTION = (
    "What happened in your recent runs (finished, failed) and what came of them; the system writes "
    "it, you cannot edit it"
)
TOOL_LOG_DESCRIPTION = (
    "The actions you ran most recently and how they went; the system writes it, you cannot edit it"
)
# The JSON schema the planner sees is fixed when the class is defined, so the bound is the default
# of blocks.max_edit_chars; the store applies the configured value on every edit as well.
EDIT_CHARS = BlockSettings.model_fields["max_edit_chars"].default
MAX_RESULTS = 20
RESULT_CHARS = 1000
LOG_PREVIEW_CHARS = 160
QUERY_CHARS = 2000
ARCHIVAL_CHARS = 4000
MAX_TAGS = 10
ARCHIVAL_LEVELS = ("ltm:semantic", "ltm:episodic", "ltm:procedural")
_colony_settings: dict[tuple[int, str, str], ColonySettings] = {}

EditText = Annotated[str, Field(max_length=EDIT_CHARS)]
SearchText = Annotated[str, Field(min_length=1, max_length=QUERY_CHARS)]
Limit = Annotated[int, Field(ge=1, le=MAX_RESULTS)]
Tag = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


def _settings_for(base: ColonySettings, tenant_id: str, colony_id: str) -> ColonySettings:
    """`base` for the agent's own tenant and colony (block keys are per colony), one copy each."""
    if (base.tenant_id, base.colony_id) == (tenant_id, colony_id):
        return base
    key = (id(base), tenant_id, colony_id)
    found = _colony_settings.get(key)
    if found is None:
        found = _colony_settings[key] = base.model_copy(
            update={"tenant_id": tenant_id, "colony_id": colony_id}
        )
        while len(_colony_settings) > 64:
            _colony_settings.pop(next(iter(_colony_settings)))
    return found


LABEL_TAG = "label:"


def archival_label_tag(label: str) -> str:
    """The tag archival entries filed under `label` carry."""
    return f"{LABEL_TAG}{label}"


def _brief(item: RecalledEntry) -> dict[str, Any]:
    entry = item.entry
    return {
        "entry_id": entry.entry_id,
        "scope": MemoryScope.scope_type(entry.scope_id),
        "content": entry.content[:RESULT_CHARS],
        "tags": sorted(entry.tags),
        "relevance": round(item.relevance, 4),
    }


def _bound(field: str, text: str, most: int) -> str:
    """Refuse text longer than `most` (the parameter models carry the same bounds; this holds
    whatever the dispatcher does with them)."""
    if len(text) > most:
        raise InvalidArgument(f"{field} has {len(text)} characters; at most {most}")
    return text


def _edited(outcome: EditOutcome) -> dict[str, Any]:
    return {
        "label": outcome.label,
        "owner": outcome.owner,
        "version": outcome.version,
        "chars": outcome.chars,
        "char_limit": outcome.char_limit,
    }


def _tool() -> dict[str, Any]:
    """The edit options of a tool's edit: the channel, and the running action's idempotency key
    (the edit id derives from it: a redone action finds its edit made)."""
    return {"via": "tool", "idempotency_key": current_idempotency_key()}


def _preview(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    text = one_line(text)
    return text if len(text) <= LOG_PREVIEW_CHARS else text[: LOG_PREVIEW_CHARS - 3] + "..."


class MemoryBlocksCapability(AgentCapability):
    """Memory blocks for a planner: its blocks in the prompt, tools to edit them, archival memory
    (the agent's LTM scope) and recall, and a rolling log of the actions it ran.

    `blocks` (NewBlocks) and `templates` (names, or `(name, fields)` pairs; see
    colony.memory.blocks.templates) are created for the agent when it starts, unless it has them
    already (edits survive restarts). `tool_log` keeps a LOG block `tool_log` with one entry per
    action the agent dispatches, written by the system and read-only to the agent; `event_log` a
    LOG block `event_log` with one entry per finished run (status, task, outcome).

    `recall` is also an action of MemoryToolsCapability: an agent holding both must leave it out
    of one, `agent.add_capability(cap, exclude_actions=["recall"])` (in a blueprint, the
    capability spec's `exclude_actions`), or the dispatcher refuses the second. `include_recall=False`
    only hides this capability's `recall` from the planner.

    `user_blocks` (labels, e.g. `["human"]`) are blocks that hold what the user said: a tool's
    write into one (append, insert, replace's new text, rethink) is stored only when it is the
    user's words or an extract of them (colony.memory.grounding; docs/memory.md, "What is
    stored"), else the action fails naming why. `ground_archival` holds `archival_insert` to the
    same rule. Other blocks (persona, the agent's own notes) are the agent's to write freely.
    """

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        blocks: Sequence[NewBlock] = (),
        templates: Sequence[str | tuple[str, dict[str, Any]]] = (),
        tool_log: bool = True,
        event_log: bool = False,
        include_recall: bool = True,
        archival_level: str | None = None,
        settings: ColonySettings | None = None,
        capability_key: str = "memory_blocks",
        user_blocks: Sequence[str] = (),
        ground_archival: bool = False,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard, capability_key=capability_key)
        made = []
        for template in templates:  # applied now: bad fields fail when the agent is built
            name, fields = (template, None) if isinstance(template, str) else template
            made.append(apply_template(name, fields))
        self.blocks: list[NewBlock] = [*made, *(NewBlock.model_validate(b) for b in blocks)]
        self.tool_log = tool_log
        self.event_log = event_log
        self._logged_run: str | None = None
        self.include_recall = include_recall
        self.archival_level = archival_level
        self.settings = settings
        self.user_blocks = frozenset(user_blocks)
        self.ground_archival = ground_archival

    # -- wiring -------------------------------------------------------------------------------------

    def _base_settings(self) -> ColonySettings:
        if self.settings is None:
            self.settings = agent_settings(self)
        return self.settings

    def _me(self) -> str:
        if self.agent is None:
            raise AgentUsageError("memory blocks belong to an agent; this capability has none")
        return self.agent.agent_id

    def store(self) -> BlockStore:
        """The process's block store for the agent's colony."""
        me = self.agent
        if me is None:
            raise AgentUsageError("memory blocks belong to an agent; this capability has none")
        settings = _settings_for(self._base_settings(), me.metadata.tenant_id, me.metadata.colony_id)
        return agent_block_store(me.blackboard.redis, settings, me.agent_id)  # its tenant's blocks

    async def log_history_summary(self, text: str, *, items: int, ref: str) -> None:
        """`HistorySummaryLog`: a compaction's summary goes to the `history_summary` log block."""
        me = self.agent
        if me is None:
            return
        store = self.store()
        await store.ensure(
            me.agent_id,
            NewBlock(label=SUMMARY_LOG_LABEL, block_type=BlockType.LOG, description=SUMMARY_LOG_DESCRIPTION),
        )
        await store.log_append(
            me.agent_id, SUMMARY_LOG_LABEL, {"kind": "summary", "items": items, "ref": ref, "text": text}
        )

    def service(self) -> MemoryService:
        return memory_service(self.blackboard, self._base_settings())

    def memory_scopes(self) -> dict[str, MemoryCapability]:
        """The agent's memory capabilities by scope type."""
        if self.agent is None:
            return {}
        return {c.scope_type: c for c in private_memory(self.agent)}

    def archival(self) -> MemoryCapability:
        """The LTM scope archival memory lives in: `archival_level`, else the first of
        ltm:semantic, ltm:episodic, ltm:procedural the agent has."""
        scopes = self.memory_scopes()
        wanted = [self.archival_level] if self.archival_level else list(ARCHIVAL_LEVELS)
        for level in wanted:
            if level in scopes:
                return scopes[level]
        raise AgentUsageError(
            f"this agent has no long-term memory ({' or '.join(wanted)}) to hold archival memory; "
            f"its memory scopes: {', '.join(sorted(scopes)) or 'none'}"
        )

    def available_actions(self) -> set[str] | None:
        if self.include_recall:
            return None
        return {spec.name for spec in discover_actions(self)} - {"recall"}

    async def start(self) -> None:
        """Create the configured blocks and the tool log the agent does not have yet."""
        if self.agent is None:
            return
        store, me = self.store(), self._me()
        wanted = list(self.blocks)
        if self.tool_log:
            wanted.append(
                NewBlock(label=TOOL_LOG, block_type=BlockType.LOG, description=TOOL_LOG_DESCRIPTION)
            )
        if self.event_log:
            wanted.append(
                NewBlock(label=EVENT_LOG, block_type=BlockType.LOG, description=EVENT_LOG_DESCRIPTION)
            )
        for block in wanted:
            try:
                await store.ensure(me, block)
            except BlockExists as exc:  # a block shared with the agent holds that label
                log.warning("agent %s: block %r not created: %s", me, block.label, exc)

    # -- block edits ----------------------------------------------------------------------------------

    async def _labels_hint(self, exc: BlockNotFound) -> BlockNotFound:
        try:
            seen = await self.store().list_for(self._me())
        except Exception:
            return exc
        writable = sorted(i.label for i, a in seen if a.can_write and i.block_type is not BlockType.LOG)
        return BlockNotFound(f"{exc}. Your writable blocks: {', '.join(writable) or 'none'}")

    async def _edit(self, call: Any) -> dict[str, Any]:
        try:
            return _edited(await call)
        except BlockNotFound as exc:
            raise await self._labels_hint(exc) from None

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write", "colony_write"))
    async def core_memory_append(self, label: Label, content: EditText) -> dict[str, Any]:
        """Add content to the end of one of your memory blocks (persona, human, ...) as a new line,
        without replacing what is there. Useful for building up information bit by bit; the block
        in your prompt shows it at once."""
        await self.check_user_words(label, lambda held: f"{held}\n{content}")
        return await self._edit(self.store().append(self._me(), label, content, **_tool()))

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write", "colony_write"))
    async def core_memory_save_message(self, label: Label = "human") -> dict[str, Any]:
        """Save what the user just told you (their message, word for word) as a new line of one of
        your memory blocks: `human` for what they say about themselves. Questions are not saved."""
        message = self._message()
        if len(message.split()) < MIN_MESSAGE_WORDS or message.endswith("?"):
            raise AgentUsageError("the user's message is a question or too short to keep; nothing saved")
        if await seen_by_others(self.store(), self._me(), label, self.user_blocks):
            raise BlockEditRejected(not_for_others(label))
        return await self._edit(
            self.store().append(self._me(), label, f"{USER_SAID} {message}", message="message", **_tool())
        )

    async def check_user_words(self, label: str, edit: Callable[[str], str]) -> None:
        """Refuse (BlockEditRejected, naming why) an edit that leaves, in a `user_blocks` block,
        a line the user did not say, or in a block other agents see (`user_lines.seen_by_others`), a line
        quoting the user. Only the lines the edit makes (`edit(content)` is the block as the edit
        leaves it, a deletion inside a line included) are checked, against the user's own
        messages; the block itself is no source of words (grounding.check_lines, `kept`)."""
        others = await seen_by_others(self.store(), self._me(), label, self.user_blocks)
        if label not in self.user_blocks and not others:
            return
        try:
            held = (await self.store().read(self._me(), label)).content
        except BlockNotFound:
            held = ""
        kept = set(held.splitlines())
        made = [line for line in edit(held).splitlines() if line not in kept and line.strip()]
        if not made:
            return
        if others:
            if await quotes_user(made, self.user_words):
                raise BlockEditRejected(not_for_others(label))
            return
        verdict = check_lines("\n".join(made), await self.user_words("\n".join(made)))
        if not verdict.grounded:
            raise BlockEditRejected(refusal(f"block {label!r}", verdict))

    async def user_words(self, text: str) -> list[str]:
        """What the user said, newest first (grounding.said_by_user)."""
        scopes = [c.memory_scope for c in self.memory_scopes().values()]
        return await said_by_user(self.service(), scopes, text, self._message(whole=True))

    def _message(self, *, whole: bool = False) -> str:
        """The current run's task as text (what the user said), one line (`whole`: as given)."""
        run = self.agent.current_run if self.agent is not None else None
        if run is None:
            return ""
        task = run.input.get("task") if isinstance(run.input, dict) else run.input
        if not isinstance(task, str):
            return ""
        return task if whole else " ".join(task.split())[: EDIT_CHARS - 20]

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write", "colony_write"))
    async def core_memory_replace(
        self,
        label: Label,
        old_content: Annotated[str, Field(min_length=1, max_length=EDIT_CHARS)],
        new_content: EditText,
    ) -> dict[str, Any]:
        """Replace old_content, which must occur exactly once in the block (copy it exactly as
        shown), with new_content; an empty new_content deletes it. Use this to correct or update
        one detail of a memory block."""
        await self.check_user_words(label, lambda held: held.replace(old_content, new_content, 1))
        return await self._edit(self.store().replace(self._me(), label, old_content, new_content, **_tool()))

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write", "colony_write"))
    async def memory_insert(
        self,
        label: Label,
        content: EditText,
        line: Annotated[int, Field(ge=-1, le=100_000)] = -1,
    ) -> dict[str, Any]:
        """Insert content as a new line of a memory block before line `line` (0 = the top, -1 =
        after the last line)."""
        await self.check_user_words(label, lambda held: f"{held}\n{content}")
        return await self._edit(self.store().insert(self._me(), label, content, line, **_tool()))

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write", "colony_write"))
    async def memory_rethink(self, label: Label, new_content: EditText) -> dict[str, Any]:
        """Rewrite a memory block entirely with new_content: to reorganise or condense it when it
        grows long, or when much of it is out of date."""
        await self.check_user_words(label, lambda _held: new_content)
        return await self._edit(self.store().set_content(self._me(), label, new_content, **_tool()))

    # -- archival memory and recall -------------------------------------------------------------------

    @action_executor(action_type=ActionType.MEMORY_WRITE, effects=("memory_write",))
    async def archival_insert(
        self,
        content: Annotated[str, Field(min_length=1, max_length=ARCHIVAL_CHARS)],
        tags: Annotated[list[Tag], Field(max_length=MAX_TAGS)] | None = None,
        label: Label | None = None,
    ) -> dict[str, Any]:
        """Save important information to your archival memory for future reference: facts worth
        remembering that do not belong in a memory block (learned preferences, important events,
        reference material). `label` files it under a name (e.g. "recipes") that archival_read
        and archival_search can be limited to."""
        _bound("content", content, ARCHIVAL_CHARS)
        if len(tags or []) > MAX_TAGS:
            raise InvalidArgument(f"archival_insert takes at most {MAX_TAGS} tags")
        refuse_user_tag(tags or [])
        if any(t.startswith(LABEL_TAG) for t in tags or []):
            raise InvalidArgument(
                f"tags starting {LABEL_TAG!r} are kept for `label`; file the entry with label="
            )
        if label is not None:
            if len(tags or []) >= MAX_TAGS:
                raise InvalidArgument(f"archival_insert takes at most {MAX_TAGS} tags, a label counted")
            tags = [*(tags or []), archival_label_tag(label)]
        target = self.archival()
        if self.ground_archival:
            verdict = check_lines(content, await self.user_words(content))
            if not verdict.grounded:
                raise AgentUsageError(refusal("archival memory", verdict))
        all_tags = frozenset({"archival", *(tags or [])})
        key = current_idempotency_key()
        # under an action's key the entry id derives from it: a redo finds the entry it wrote
        entry_id = derived_id("a", [key, self._me(), content, *sorted(all_tags)]) if key else None
        memory = NewMemory(content=content.strip(), tags=all_tags, kind="archival", entry_id=entry_id)
        outcome = await target.write(memory)
        redone = entry_id is not None and outcome.duplicate_of == entry_id  # the entry it wrote before
        return {
            "entry_id": outcome.entry.entry_id,
            "stored": outcome.created or redone,
            "duplicate_of": None if redone else outcome.duplicate_of,
            "scope": target.scope_type,
        }

    async def _search(
        self, query: str | None, limit: int, scope_ids: list[str], label: str | None = None
    ) -> list[dict[str, Any]]:
        if query is not None:
            _bound("query", query, QUERY_CHARS)
        if not scope_ids:
            return []
        wanted = None if label is None else TagFilter(all_of=frozenset({archival_label_tag(label)}))
        found = await self.service().recall(
            MemoryQuery(query=query, tag_filter=wanted, max_results=max(1, min(limit, MAX_RESULTS))),
            scope_ids,
        )
        return [_brief(item) for item in found]

    def _ltm_scopes(self) -> list[str]:
        scopes = [c.memory_scope for t, c in self.memory_scopes().items() if t.startswith("ltm:")]
        if not scopes:
            self.archival()  # raises, naming the scopes the agent has
        return scopes

    @action_executor(action_type=ActionType.MEMORY_SEARCH)
    async def archival_search(
        self, query: SearchText, limit: Limit = 5, label: Label | None = None
    ) -> list[dict[str, Any]]:
        """Search your long-term archival memory by meaning (only what you filed under `label`,
        when given). Use this when you need specific facts, past conversations or reference
        material that is not in your current context."""
        return await self._search(query, limit, self._ltm_scopes(), label)

    @action_executor(action_type=ActionType.MEMORY_READ)
    async def archival_read(self, label: Label, limit: Limit = 10) -> list[dict[str, Any]]:
        """Read what you filed in archival memory under `label` (archival_insert's label), newest
        and most important first."""
        return await self._search(None, limit, self._ltm_scopes(), label)

    @action_executor(action_type=ActionType.MEMORY_SEARCH)
    async def recall(self, query: SearchText, limit: Limit = 5) -> list[dict[str, Any]]:
        """Search your conversation history AND your archival memory (all your memory). Use this
        when you are trying to remember something but are not sure whether it was said in a
        conversation or saved to archival memory."""
        if not self.include_recall:
            raise AgentUsageError("recall is not offered by this agent's memory blocks; use archival_search")
        return await self._search(query, limit, [c.memory_scope for c in self.memory_scopes().values()])

    # -- the tool log ---------------------------------------------------------------------------------

    @hook_handler("ActionDispatcher.dispatch", HookType.AFTER, priority=-100)
    async def _log_action(self, ctx: HookContext, result: Any) -> None:
        """One tool-log entry per dispatched action: name, success, a short result. A log that
        cannot be written never fails the action."""
        if not self.tool_log or self.agent is None:
            return None
        action = ctx.args[0] if ctx.args else ctx.kwargs.get("action")
        if not isinstance(action, str):
            return None
        name = one_line(action)[:64] or "?"
        success = bool(getattr(result, "success", False))
        if success:
            short = _preview(result.output)
        else:  # the dispatcher's "<action> failed: " / "<action>: " prefix would say the name twice
            error = str(getattr(result, "error", "") or "")
            for prefix in (f"{action} failed: ", f"{action}: "):
                error = error.removeprefix(prefix)
            short = _preview(error)
        entry = {
            "kind": "tool",
            "tool": name,
            "success": success,
            "text": f"{name} {'ok' if success else 'failed'}: {short}",
        }
        try:
            await self.store().log_append(self._me(), TOOL_LOG, entry)
        except Exception as exc:
            log.warning("agent %s: tool log entry for %s not written: %r", self.agent.agent_id, name, exc)
        return None

    @hook_handler("Agent.run_step", HookType.AFTER, priority=-100)
    async def _log_run_end(self, ctx: HookContext, result: Any) -> None:
        """One event-log entry per finished run: its outcome, what was asked, what came of it. A
        log that cannot be written never fails the run."""
        run = self.agent.current_run if self.agent is not None and self.event_log else None
        if run is None or not run.done or run.run_id == self._logged_run:
            return None
        self._logged_run = run.run_id
        task = run.input.get("task", run.input) if isinstance(run.input, dict) else run.input
        outcome = run.error if run.error else run.output
        entry = {
            "kind": "run",
            "status": run.status.value,
            "text": f"run {run.status.value}: {_preview(task)} -> {_preview(outcome)}",
        }
        try:
            await self.store().log_append(self._me(), EVENT_LOG, entry)
        except Exception as exc:
            log.warning("agent %s: event log entry for run %s not written: %r", self._me(), run.run_id, exc)
        return None

    # -- the prompt -----------------------------------------------------------------------------------

    async def views(self) -> list[BlockView]:
        """The blocks the agent sees (own, shared, colony) that go in its prompt, read at head."""
        store, me = self.store(), self._me()
        infos = [
            info
            for info, _access in await store.list_for(me)
            if not (info.block_type is BlockType.WORKING and info.swapped_out)
        ]
        read = await asyncio.gather(
            *(store.read(me, info.label, owner=info.owner) for info in infos), return_exceptions=True
        )
        views = []
        for item in read:
            if isinstance(item, BlockNotFound):  # deleted since the listing
                continue
            if isinstance(item, BaseException):
                raise item
            views.append(item)
        return views

    async def memory_sections(self, task: str | None = None) -> list[str]:
        """The `## Memory blocks` section (docs/blocks.md), or none when the agent sees no block."""
        if self.agent is None:
            return []
        rendered = render_blocks(await self.views())
        return [rendered] if rendered else []
