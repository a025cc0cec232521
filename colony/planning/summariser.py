"""Compaction's summariser: the entries taken out of an agent's prompt folded into its history
summary by the model, a bounded batch per call (colony/planning/compaction.py describes the whole;
`Compactor` holds one `Summariser`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from colony import metrics
from colony.agents.protocols import HistorySummaryLog
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.tokens import Budget, TokenCounter, estimate_tokens
from colony.planning.archives import agent_label, as_text

if TYPE_CHECKING:
    from colony.inference.engine import InferenceEngine
    from colony.planning.compaction import CompactionState, Compactor

log = logging.getLogger(__name__)

LINE_CHARS = 600  # one history item as the summariser sees it
MAX_SUMMARY_CALLS = 3  # summariser calls one compaction makes at most
MAX_BATCH_COUNTS = 16  # token counts one summariser batch may take to fit its input bound
MIN_LINE_CHARS = 40  # a history item is never cut shorter than this for the summariser
MAX_BACKOFF_STEPS = 8  # a failed summary is retried after 1, 2, 4, then every 8 steps
SUMMARISER_SYSTEM = (
    "You keep the memory of an agent. Merge the earlier summary and the new history items into one "
    "short summary: facts learned, actions taken and their results, decisions, open questions. "
    "Plain sentences, no preamble."
)


def item_line(entry: dict[str, Any]) -> str:
    """One stream entry as the summariser reads it (bounded)."""
    if entry.get("kind") == "event":
        body = "; ".join(f"{k}: {as_text(v)}" for k, v in (entry.get("contexts") or {}).items())
        line = f"event - {body}"
    else:
        call = entry.get("call") or {}
        outcome = "ok" if call.get("success", True) else f"failed: {call.get('error')}"
        value = call.get("output_preview", call.get("output"))
        params = as_text(call.get("parameters") or {})
        line = f"action {call.get('action_key')}({params}) {outcome} -> {as_text(value)}"
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 3] + "..."


async def fit_summary(text: str, limit: int, counter: TokenCounter) -> str:
    """The summary cut to at most `limit` tokens when it is longer (a coarse estimate, without
    a tokenizer, can count a summary the model kept within its max_tokens as longer: refusing
    it would leave the history unsummarised for good). Cut at the proportion the count gives,
    a few tries at most, then to a quarter character per token, which always fits."""
    for _ in range(4):
        tokens = await counter.count(text)
        if tokens <= limit:
            return text
        keep = max(1, int(len(text) * limit / tokens * 0.9) - 3)
        text = text[:keep].rstrip() + "..."
    return text[: max(1, limit)]


class Summariser:
    """Folds the pending entries of a compactor's view into its summary (stage `summarized`)."""

    def __init__(self, compactor: Compactor) -> None:
        self.compactor = compactor

    @property
    def state(self) -> CompactionState:
        """The compactor's view (replaced whole when a checkpoint is restored)."""
        return self.compactor.state

    async def summarise(
        self, engine: InferenceEngine | None, budget: Budget, counter: TokenCounter, step: int
    ) -> bool:
        """Fold pending entries into the summary, a bounded batch per call. False when the
        summariser failed (the entries stay pending and archived; the next steps try again)."""
        if engine is None:
            return self._failed(step, "no engine to summarise with")
        calls = 0
        while self.state.pending and calls < MAX_SUMMARY_CALLS:
            calls += 1
            batch = await self._batch(budget, counter)
            if batch is None:
                return self._failed(
                    step, "one history item and the summary do not fit context.summariser_input_tokens"
                )
            size, request = batch
            try:
                response = await self.compactor.policy.generate(engine, request, channel="summary")
            except Exception as exc:
                return self._failed(step, f"the summariser failed: {type(exc).__name__}: {exc}")
            text = (response.text or "").strip()
            if not text:
                return self._failed(step, "the summariser wrote nothing")
            text = await fit_summary(text, budget.summary_max, counter)
            taken = self.state.pending[:size]
            ref = self.compactor.archive_span(taken)
            self.state.summary = text
            self.state.summarized_items += len(taken)
            del self.state.pending[:size]
            await self._log_summary(text, len(taken), ref)
        self.state.failures = 0
        metrics.CONTEXT_COMPACTIONS.labels(stage="summarized").inc()
        return True

    def _summary_request(self, lines: list[str], budget: Budget) -> InferenceRequest:
        previous = self.state.summary or "(none yet)"
        return InferenceRequest(
            messages=[
                ChatMessage(role="system", content=SUMMARISER_SYSTEM),
                ChatMessage(
                    role="user",
                    content=f"Earlier summary:\n{previous}\n\nNew history items:\n"
                    + "\n".join(lines)
                    + "\n\nThe merged summary:",
                ),
            ],
            max_tokens=budget.summary_max,
            temperature=0.0,
        )

    async def _batch(self, budget: Budget, counter: TokenCounter) -> tuple[int, InferenceRequest] | None:
        """The next summariser request: as many pending entries (from the oldest) as its whole
        input, counted with the engine's tokenizer, keeps within `budget.summariser_input` (so the
        call and its summary fit the window). A first guess from the chars/4 estimate, then
        halved (a single oversize line cut in half) until the count fits, at most
        MAX_BATCH_COUNTS counts; None when not even a cut line fits (the caller backs off)."""
        room = budget.summariser_input - await counter.count(self.state.summary) - 64
        lines: list[str] = []
        used = 0
        for entry in self.state.pending:
            line = item_line(entry)
            cost = estimate_tokens(line) + 2
            if lines and used + cost > room:
                break
            lines.append(line[: max(MIN_LINE_CHARS, room * 4)])
            used += cost
        for _ in range(MAX_BATCH_COUNTS):
            request = self._summary_request(lines, budget)
            tokens = await counter.count_messages(*(m.content for m in request.messages))
            if tokens <= budget.summariser_input:
                return len(lines), request
            if len(lines) > 1:
                lines = lines[: len(lines) // 2]
            elif len(lines[0]) > MIN_LINE_CHARS:
                lines = [lines[0][: max(MIN_LINE_CHARS, len(lines[0]) // 2 - 3)] + "..."]
            else:
                break
        return None

    def _failed(self, step: int, why: str) -> bool:
        self.state.failures += 1
        self.state.retry_at_step = step + min(2 ** (self.state.failures - 1), MAX_BACKOFF_STEPS)
        metrics.CONTEXT_COMPACTIONS.labels(stage="failed").inc()
        log.warning(
            "agent %s: history not summarised (%s); retrying at step %d",
            agent_label(self.compactor.policy),
            why,
            self.state.retry_at_step,
        )
        return False

    async def _log_summary(self, text: str, items: int, ref: str) -> None:
        """The summary also goes to a capability that keeps summaries (the memory blocks'
        `history_summary` log block) when the agent has one."""
        agent = self.compactor.policy.agent
        if agent is None:
            return
        sink = next((c for c in agent.capabilities.values() if isinstance(c, HistorySummaryLog)), None)
        if sink is None:
            return
        try:
            await sink.log_history_summary(text, items=items, ref=ref)
        except Exception as exc:
            log.warning("agent %s: summary not logged: %r", agent.agent_id, exc)
