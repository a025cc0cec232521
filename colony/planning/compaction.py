"""Compaction: an agent's planning prompt kept under a token budget, reversibly.

History reaches the prompt through the policy's consciousness streams (colony/planning/streams.py).
Kept whole, it grows with every event and action until the prompt no longer fits the model, and it
is rewritten whole into Redis at every step. Compaction works in three places:

1. At record time, an action output longer than `context.mask_output_chars` is stored aside under
   `AgentStateProtocol.archived_output_key(ref)` and the call keeps a short preview and the
   reference: a 100 KB output never reaches the prompt, the policy state or a checkpoint.
2. When the rendered prompt passes the budget's trigger (colony/inference/tokens.py), old large
   outputs still in the streams are masked the same way (stage `masked`).
3. If that is not enough, the middle of each stream (all but the first `keep_first_items` and the
   recent `keep_recent_items` entries; pinned entries stay) is taken out and summarised by the
   model (colony/planning/summariser.py), through `policy.generate` so the write-ahead log records
   the call, into the `<chat_history_summary>` section (stage `summarized`). Entries the streams'
   own windows drop are summarised as well, so the summary covers everything that left the prompt.

Never compacted: the system prompt, goals and task, constraints, memory sections (they are not
stream entries) and stream entries of a pinned context key (user corrections). Everything
summarised is archived (a span of entries, by reference) and stays recallable with the policy's
`recall_archived` action. The compacted view (summary, pending entries, references) is part of
the policy state, so restoring a checkpoint taken before a compaction restores the uncompacted
view. A summariser that fails never fails the run: the entries it should have summarised wait in
the policy state (the oldest past MAX_PENDING archived as a span), counted in the summary section,
the metric counts stage `failed`, and the next steps try again (backing off). A summary longer
than its limit is cut; a summary cannot help a prompt whose fixed parts alone pass the trigger,
so then the summariser waits for SUMMARISE_PENDING_AT items instead of running at every step.

Calls fit the window whatever the settings (colony/inference/tokens.py clamps the budget); the
summariser's input is measured with the engine's tokenizer; its model calls are numbered apart
from the planner's in the action log (channel "summary"). Long event context values are archived
at record time like outputs (pinned ones stay verbatim); stream windows keep pinned entries.
Archives expire with `runs.retention_seconds` (the listed ones are refreshed).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from colony import metrics
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.config import ContextSettings
from colony.errors import AgentUsageError
from colony.inference.tokens import Budget, TokenCounter, engine_window, plan_budget
from colony.planning.archives import (
    RECALL,
    REF_PATTERN,
    ArchivedHistory,
    agent_label,
    as_text,
    ref_of,
)
from colony.planning.summariser import SUMMARISER_SYSTEM as SUMMARISER_SYSTEM
from colony.planning.summariser import Summariser, item_line

if TYPE_CHECKING:
    from colony.inference.engine import InferenceEngine
    from colony.planning.policies import EventDrivenActionPolicy

log = logging.getLogger(__name__)

RECALL_ACTION: dict[str, Any] = {
    "name": RECALL,
    "description": "Read an archived action output or a span of earlier history by its ref.",
    "parameters": {
        "type": "object",
        "properties": {
            "ref": {"type": "string", "pattern": REF_PATTERN},
            "offset": {"type": "integer", "minimum": 0},
        },
        "required": ["ref"],
    },
}
# The agent-scope entry each compaction writes (its write is the blackboard event); a fixed name
# that holds the latest report.
COMPACTION_KEY = Keys.key("compaction")
DEFAULT_PINNED_KEYS = ("user_correction",)
OLD_OUTPUT_CHARS = 400  # stage 1 masks older outputs longer than this
MAX_SPANS = 32  # refs of summarised spans the view lists (each is also in `archives`)
MAX_PENDING = 128  # entries awaiting a summary kept in state (older ones: archived only)
SUMMARISE_PENDING_AT = 32  # window-dropped entries that call for a summary without budget pressure
MAX_LISTED_REFS = 3


class CompactionState(BaseModel):
    """The compacted view: what the policy state holds besides the streams' own entries."""

    summary: str = ""
    summarized_items: int = Field(0, ge=0)
    pending: list[dict[str, Any]] = Field(default_factory=list, description="taken out, not summarised yet")
    spans: list[str] = Field(default_factory=list, description="refs of archived history spans, oldest first")
    archives: list[str] = Field(default_factory=list, description="refs of every archive this agent holds")
    compactions: int = Field(0, ge=0)
    failures: int = Field(0, ge=0)
    retry_at_step: int = Field(0, ge=0)


@dataclass
class FittedPrompt:
    """A prompt after compaction, with its token figures (for `--show-prompt` and events)."""

    text: str
    tokens: int
    budget: Budget | None
    stage: str | None = None  # masked | summarized | failed | deferred | None (nothing done)


def _entry_key(entry: dict[str, Any]) -> str:
    return json.dumps(entry, default=str, sort_keys=True)


class Compactor(ArchivedHistory):
    """The compaction of one policy's history (the policy owns it; its state is policy state)."""

    def __init__(
        self,
        policy: EventDrivenActionPolicy,
        settings: ContextSettings | None = None,
        pinned_context_keys: Iterable[str] = DEFAULT_PINNED_KEYS,
    ) -> None:
        self.policy = policy
        self._settings = settings
        self.pinned_keys = frozenset(pinned_context_keys)
        self.state = CompactionState()
        self._counter: TokenCounter | None = None
        self._unsaved: dict[str, dict[str, Any]] = {}  # archives masked in a sync path, to write
        self._refreshed_at = -math.inf  # when the listed archives' expiry was last refreshed
        self.summariser = Summariser(self)
        for stream in policy.streams:  # the streams' windows keep pinned entries too
            stream.pinned_keys = self.pinned_keys

    # -- settings ----------------------------------------------------------------------------------

    @property
    def settings(self) -> ContextSettings:
        """`context` of the settings its agent works under (`Agent.colony_settings`)."""
        if self._settings is None:
            agent = self.policy.agent
            if agent is None:
                raise AgentUsageError("compaction runs for a policy's agent; this policy has none")
            self._settings = agent.colony_settings().context
        return self._settings

    def counter(self, engine: InferenceEngine | None) -> TokenCounter:
        if self._counter is None or self._counter.engine is not engine:
            self._counter = TokenCounter(engine)
        return self._counter

    def budget(self, engine: InferenceEngine | None, planner_max_tokens: int) -> Budget | None:
        return plan_budget(self.settings, engine_window(engine), planner_max_tokens)

    # -- the view ----------------------------------------------------------------------------------

    def summary_section(self) -> str:
        """The body of `<chat_history_summary>` ('' when nothing was compacted)."""
        parts = [self.state.summary] if self.state.summary else []
        if self.state.pending:
            parts.append(f"({len(self.state.pending)} earlier items are not summarised yet.)")
        if self.state.spans:
            refs = ", ".join(self.state.spans[-MAX_LISTED_REFS:])
            parts.append(f"(Earlier history is archived; {RECALL}(ref) reads it. Latest refs: {refs}.)")
        return "\n".join(parts)

    @property
    def has_archives(self) -> bool:
        return bool(self.state.archives)

    def _pinned(self, entry: dict[str, Any]) -> bool:
        return entry.get("kind") == "event" and bool(self.pinned_keys & set(entry.get("contexts") or {}))

    def _take(self, entries: list[dict[str, Any]]) -> None:
        """Entries leave the view for the summariser (kept once, in time order)."""
        seen = {_entry_key(e) for e in self.state.pending}
        for entry in entries:
            key = _entry_key(entry)
            if key not in seen:
                seen.add(key)
                self.state.pending.append(entry)
        self.state.pending.sort(key=lambda e: float(e.get("timestamp", 0.0)))
        if len(self.state.pending) > MAX_PENDING:
            self.archive_span(self.state.pending[: len(self.state.pending) - MAX_PENDING])
            del self.state.pending[: len(self.state.pending) - MAX_PENDING]

    def archive_span(self, entries: list[dict[str, Any]]) -> str:
        """Archive `entries` as one span (listed in the view's spans); its ref."""
        text = "\n".join(item_line(e) for e in entries)
        ref = ref_of(text)
        self._remember(ref, {"kind": "span", "items": len(entries), "text": text, "at": time.time()})
        self.state.spans = [*[s for s in self.state.spans if s != ref], ref][-MAX_SPANS:]
        return ref

    def drain_overflow(self, active: bool) -> None:
        """Entries the streams' windows dropped go to the summariser instead of being lost (only
        under a budget: without one, nothing is summarised and the windows drop as before)."""
        for stream in self.policy.streams:
            if not active:
                stream.overflow = None
            elif stream.overflow is None:
                stream.overflow = []
            elif stream.overflow:
                self._take(stream.overflow)
                stream.overflow.clear()

    def _mask_old(self) -> bool:
        """Stage 1: outputs longer than OLD_OUTPUT_CHARS outside the recent tail become previews
        with a reference. True when something was masked."""
        keep_recent, changed = self.settings.keep_recent_items, False
        for stream in self.policy.streams:
            for i, entry in enumerate(stream.entries[: max(0, len(stream.entries) - keep_recent)]):
                call = entry.get("call")
                if entry.get("kind") != "action" or not isinstance(call, dict):
                    continue
                text = as_text(call.get("output_preview", call.get("output")))
                output = call.get("output")
                if len(text) <= OLD_OUTPUT_CHARS or (isinstance(output, dict) and "archived" in output):
                    continue
                new_call = self._masked_output(call, as_text(output))
                stream.entries[i] = {**entry, "call": new_call}
                changed = True
        return changed

    def _cut(self, keep_first: int, keep_recent: int) -> list[tuple[Any, list[dict[str, Any]]]]:
        """Per stream: the entries a cut keeping `keep_first` and `keep_recent` would take out."""
        cuts = []
        for stream in self.policy.streams:
            entries = stream.entries
            middle = entries[keep_first : max(keep_first, len(entries) - keep_recent)]
            cuts.append((stream, [e for e in middle if not self._pinned(e)]))
        return cuts

    # -- the prompt --------------------------------------------------------------------------------

    async def fit(
        self,
        step: int,
        engine: InferenceEngine | None,
        render: Callable[[], str],
        *,
        system: str,
        planner_max_tokens: int,
    ) -> FittedPrompt:
        """The prompt `render()` makes, compacted first if it passes the trigger."""
        budget = self.budget(engine, planner_max_tokens)
        self.drain_overflow(budget is not None)
        counter = self.counter(engine)
        prompt = render()
        tokens = await counter.count_messages(system, prompt)
        if budget is None:
            await self.flush_archives()
            return FittedPrompt(prompt, tokens, None)
        # pending entries are summarised once enough gathered, or when a failed summary is retried
        waiting = len(self.state.pending) >= SUMMARISE_PENDING_AT or self.state.failures > 0
        pending_due = bool(self.state.pending) and waiting and step >= self.state.retry_at_step
        if tokens <= budget.trigger and not pending_due:
            await self.flush_archives()
            return FittedPrompt(prompt, tokens, budget)
        before, stage = tokens, None
        if tokens > budget.trigger and self._mask_old():
            prompt = render()
            tokens = await counter.count_messages(system, prompt)
            stage = "masked"
            metrics.CONTEXT_COMPACTIONS.labels(stage="masked").inc()
        if tokens > budget.trigger or pending_due:
            worth = pending_due
            if tokens > budget.trigger:
                # when even the smallest cut leaves the prompt over the trigger (its fixed parts
                # alone pass it), a summary gains next to nothing: the items taken out wait until
                # SUMMARISE_PENDING_AT gather instead of a summariser call at every step
                fits = await self._make_room(budget, counter, render, system)
                room = fits or await counter.count_messages(system, render()) < budget.trigger
                worth = room or len(self.state.pending) >= SUMMARISE_PENDING_AT
            if self.state.pending and step >= self.state.retry_at_step and worth:
                summarised = await self.summariser.summarise(engine, budget, counter, step)
                stage = "summarized" if summarised else "failed"
            elif self.state.pending and step < self.state.retry_at_step:
                stage = stage or "failed"  # still backing off: the archived view stands in
            elif self.state.pending:
                stage = stage or "deferred"  # taken out; summarised once enough gather
                metrics.CONTEXT_COMPACTIONS.labels(stage="deferred").inc()
            prompt = render()
            tokens = await counter.count_messages(system, prompt)
            if tokens > budget.limit:
                prompt, tokens = await self._squeeze(budget, counter, render, system, tokens)
        await self.flush_archives()
        if stage is not None:
            self.state.compactions += 1
            metrics.CONTEXT_COMPACTED_TOKENS.inc(max(0, before - tokens))
            await self._report(step, stage, before, tokens, budget)
        if tokens > budget.limit:
            log.warning(
                "agent %s: the prompt holds %d tokens after compaction, over the budget of %d: its pinned "
                "parts (goals, task, memory sections, actions) alone pass it; raise context.token_budget",
                agent_label(self.policy),
                tokens,
                budget.limit,
            )
        return FittedPrompt(prompt, tokens, budget, stage)

    async def _tokens_without_summary(
        self, counter: TokenCounter, render: Callable[[], str], system: str
    ) -> int:
        saved = self.state.summary, self.state.pending, self.state.spans
        self.state.summary, self.state.pending, self.state.spans = "", [], []
        try:
            return await counter.count_messages(system, render())
        finally:
            self.state.summary, self.state.pending, self.state.spans = saved

    async def _make_room(
        self, budget: Budget, counter: TokenCounter, render: Callable[[], str], system: str
    ) -> bool:
        """Take out the middle of every stream, keeping as much of the first and recent entries as
        leaves room for a full summary under the trigger. False when even the smallest cut (no
        first entries, one recent) does not leave that room."""
        reserve = budget.summary_max + 48  # the summary and its section around it
        keep_first, keep_recent = self.settings.keep_first_items, self.settings.keep_recent_items
        while True:
            cuts = self._cut(keep_first, keep_recent)
            held = [list(stream.entries) for stream, _ in cuts]
            for stream, taken in cuts:
                ids = {id(e) for e in taken}
                stream.entries = [e for e in stream.entries if id(e) not in ids]
            fits = await self._tokens_without_summary(counter, render, system) + reserve <= budget.trigger
            if fits or (keep_first == 0 and keep_recent <= 1):
                for _stream, taken in cuts:
                    self._take(taken)
                return fits
            for (stream, _), entries in zip(cuts, held, strict=True):
                stream.entries = entries  # undo; try a smaller cut
            if keep_recent > 1:
                keep_recent = max(1, keep_recent // 2)
            else:
                keep_first = 0

    async def _squeeze(
        self, budget: Budget, counter: TokenCounter, render: Callable[[], str], system: str, tokens: int
    ) -> tuple[str, int]:
        """Last resort when the summary made the prompt pass the limit: shorten the summary. Not
        when the prompt passes the limit without it as well (its fixed parts alone do): cutting
        the summary would then lose what it holds for nothing."""
        saved = self.state.summary
        self.state.summary = ""
        bare = await counter.count_messages(system, render())
        self.state.summary = saved
        if bare > budget.limit:
            return render(), tokens
        while tokens > budget.limit and self.state.summary:
            over = tokens - budget.limit
            keep = max(0, len(self.state.summary) - over * 5 - 16)
            self.state.summary = self.state.summary[:keep].rstrip() + ("..." if keep else "")
            if not keep:
                self.state.summary = ""
            prompt = render()
            tokens = await counter.count_messages(system, prompt)
        return render(), tokens

    # -- reporting ---------------------------------------------------------------------------------

    async def _report(self, step: int, stage: str, before: int, after: int, budget: Budget) -> None:
        """The compaction event: a run event for whoever follows the run and an agent-scope write."""
        agent = self.policy.agent
        if agent is None:
            return
        data = {
            "step": step,
            "stage": stage,
            "tokens_before": before,
            "tokens_after": after,
            "limit": budget.limit,
            "trigger": budget.trigger,
            "summarized_items": self.state.summarized_items,
            "pending_items": len(self.state.pending),
            "at": time.time(),
        }
        try:
            await agent.emit_run_event("compaction", data)
            await agent.blackboard.write(COMPACTION_KEY, data, created_by=agent.agent_id)
        except Exception as exc:
            log.warning("agent %s: compaction event not written: %r", agent.agent_id, exc)

    # -- state -------------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        return self.state.model_dump(mode="json")

    def set_state(self, state: Any) -> None:
        """Restore the view (a checkpoint's, or a stored one); invalid or absent -> empty view."""
        try:
            self.state = CompactionState.model_validate(state or {})
        except Exception as exc:
            log.warning(
                "agent %s: stored compaction state unreadable (%r); starting empty",
                agent_label(self.policy),
                exc,
            )
            self.state = CompactionState()
        self._unsaved = {}
        self._refreshed_at = -math.inf  # the restored view's archives get their expiry refreshed
