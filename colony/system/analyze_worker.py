"""The analyze job's page worker: one agent bound to a group of pages, which summarises each page
with the model (checked against the page's facts) and reports to its coordinator
(colony.system.analyze). Kept apart from the coordinator, which places and follows the workers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from colony.agents import (
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentMetadata,
    AgentRunCapability,
    AgentType,
    ResourceRequirements,
    ScriptedActionPolicy,
    action_executor,
)
from colony.blackboard import AgentRunProtocol, Blackboard, BlackboardScope, scope_id
from colony.config import ColonySettings, RunsSettings
from colony.errors import (
    AgentUsageError,
    ConcurrentModificationError,
    PageNotResident,
    PageSlotsBusy,
)
from colony.inference import ChatMessage
from colony.system.analyze_check import (
    Verdict,
    Vocabulary,
    check_summary,
    first_sentences,
    whole_sentences,
)
from colony.system.analyze_facts import FileFacts, extract_facts, extractive_summary, facts_text
from colony.system.analyze_report import RETRY_ASK, SUMMARY_SYSTEM
from colony.system.builtin import RUNS_NAMESPACE
from colony.vcm import PageTable
from colony.wire.run_events import AgentRunEvent

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost

log = logging.getLogger(__name__)
# how long a worker waits in all for a page slot its siblings hold (they take turns on one replica)
SLOT_WAIT_SECONDS = 1800.0
DEFAULT_PAGE_TOKENS = 1024
MAX_DEFINES = 24  # names listed under a section
WORKER_DONE = "worker_done"  # a page worker's progress event in its coordinator's run stream
SUMMARY_ASK = (
    "Facts taken from the code above:\n{facts}\n\n"
    "Summarise these facts in at most two sentences: what the code is for and its main definitions. "
    "Name only files and definitions that appear in the facts."
)


def _files_of(record: Any) -> list[str]:
    return sorted({span.path for span in record.files}) if record is not None else []


def _spans_of(record: Any) -> list[str]:
    """`path:first-last` of each file (or part of a split file) in the page; adjacent parts of one
    file (a split that left its last line in the same page) read as one span."""
    merged: list[list[Any]] = []
    for span in record.files if record is not None else []:
        if merged and merged[-1][0] == span.path and merged[-1][2] + 1 >= span.start_line:
            merged[-1][2] = max(merged[-1][2], span.end_line)
        else:
            merged.append([span.path, span.start_line, span.end_line])
    return [f"{path}:{first}-{last}" for path, first, last in merged]


MAX_FAULTS = 1_000_000  # a worker's `faulted` read back from Redis above this is not one it counted


def _bounded_count(value: Any) -> int:
    """A count from a worker's output (untrusted): an int in [0, MAX_FAULTS], else 0."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FAULTS
    return value if ok else 0


def page_groups(pages: list[str], per_worker: int, max_workers: int) -> list[list[str]]:
    """Consecutive pages in groups of `per_worker`, larger where that would take more than
    `max_workers` workers (a big folder gets bigger groups, not more agents than replicas host)."""
    size = max(1, per_worker, -(-len(pages) // max(1, max_workers)))
    return [pages[i : i + size] for i in range(0, len(pages), size)]


async def generate_when_a_slot_frees(
    replica: ReplicaHost, request: dict[str, Any], page_id: str, holder: str | None
) -> dict[str, Any]:
    """`replica.generate` over one page, waiting for a page slot as long as other workers hold them
    all: more workers than slots on one replica take turns (each waits `vcm.page_wait_seconds` per
    try), up to `SLOT_WAIT_SECONDS` in all; only then does the page's work fail."""
    deadline = time.monotonic() + SLOT_WAIT_SECONDS
    while True:
        try:
            return await replica.generate(request, [page_id], holder=holder)
        except PageSlotsBusy:
            if time.monotonic() >= deadline:
                raise
            log.info("page %s: every slot is busy with other workers' pages; waiting on", page_id)


class ReportTo(BaseModel):
    """Where a page worker reports its progress: its coordinator's run (the request being served)."""

    agent_id: str
    request_id: str
    namespace: str = RUNS_NAMESPACE


async def emit_child_event(
    board: Blackboard,
    owner: Agent,
    report_to: ReportTo,
    child_id: str,
    event_type: str,
    data: dict[str, Any],
    settings: ColonySettings | None,
) -> bool:
    """Write one progress event of `child_id` into the run stream of `report_to` (so
    `GET /v1/runs/{id}/events` of the coordinator's run streams it, though the coordinator is
    suspended). Create-only under a key per child and type: written once, whoever writes it (the
    worker, its `summarize_pages` redone after a crash, or its coordinator for a worker that died
    first): `summarize_pages`'s one effect happens once (docs/effects.md). Tagged with the run's request tag,
    so the run's retention removes it; `seq` 0: it is not one of the run's own numbered events.
    True when this call stored it; a failure is logged, never raised (progress is not the result)."""
    meta = owner.metadata
    scope = AgentRunProtocol.namespaced_scope(
        scope_id(
            BlackboardScope.AGENT,
            tenant_id=meta.tenant_id,
            colony_id=meta.colony_id,
            agent_id=report_to.agent_id,
        ),
        report_to.namespace,
    )
    runs = settings.runs if settings is not None else RunsSettings()
    event = AgentRunEvent(request_id=report_to.request_id, event_type=event_type, data=data, seq=0)
    try:
        await board.scoped(scope).write(
            AgentRunProtocol.child_event_key(report_to.request_id, child_id, event_type),
            event.model_dump(mode="json"),
            tags={AgentRunProtocol.request_tag(report_to.request_id)},
            created_by=owner.agent_id,
            ttl_seconds=runs.retention_seconds + runs.default_timeout_seconds,
            expected_version=0,
        )
    except ConcurrentModificationError:
        return False
    except Exception as exc:
        log.warning(
            "%s event of %s for run %s not stored: %r", event_type, child_id, report_to.request_id, exc
        )
        return False
    return True


class PageSummaryCapability(AgentCapability):
    """A worker's one job: summarise its pages with the engine of the replica that holds them,
    from facts extracted from each page, checked against the page (see docs/analyze.md)."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        replica: ReplicaHost | None = None,
        pages: PageTable | None = None,
        max_tokens: int = 96,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.replica = replica
        self.pages = pages
        self.max_tokens = max_tokens

    @action_executor(action_type=ActionType.CONTEXT_SUMMARIZE, effects=("colony_write",))
    async def summarize_pages(
        self,
        page_ids: list[str],
        files: list[str] | None = None,
        root: str | None = None,
        report_to: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Summarise each page (its files) with the page's KV cache as the prompt prefix; `files`:
        every mapped file (imports between them are facts), `root`: the mapped folder,
        `report_to`: the coordinator's run, which gets one `worker_done` event when this ends."""
        if self.replica is None or self.pages is None:
            raise AgentUsageError(
                "page workers run on an engine replica (no replica/page table was injected)"
            )
        summaries: list[dict[str, Any]] = []
        faulted = 0
        seen: list[str] = []
        try:
            for page_id in page_ids:
                record = await self.pages.page(page_id)
                if record is None:  # a section naming no files would pass a lost file off as done
                    raise PageNotResident(
                        f"page {page_id!r} has no page record (unmapped meanwhile?); map the folder again"
                    )
                seen.extend(f for f in _files_of(record) if f not in seen)
                section, faults = await self._summarize(page_id, record, files, root)
                faulted += faults
                summaries.append(section)
        except Exception:  # (not a cancellation: a step cut off by its host's end is redone elsewhere)
            await self._report_done(report_to, False, page_ids, faulted, seen)
            raise
        await self._report_done(report_to, True, page_ids, faulted, seen)
        return {"replica_id": self.replica.replica_id, "pages": summaries, "faulted": faulted}

    async def _summarize(
        self, page_id: str, record: Any, files: list[str] | None, root: str | None
    ) -> tuple[dict[str, Any], int]:
        """One page's section: facts, a checked summary (or the extractive one), the faults it took."""
        assert self.pages is not None
        text = (await self.pages.content(page_id)).text
        spans = record.files if record is not None else []
        # off the event loop: parsing a large page must not stall the replica's other agents
        facts = await asyncio.to_thread(
            extract_facts, text, spans, mapped_files=files or _files_of(record), root=root
        )
        described = facts_text(facts)
        vocabulary = Vocabulary(text, described)
        if not any(f.doc or f.names or f.comments for f in facts):  # e.g. a split file's last lines
            # nothing to ground a model's summary on: it would make one up (no model is asked)
            section = self._section(page_id, record, facts, extractive_summary(facts), "extractive", 0)
            return {**section, "asked": False}, 0
        summary, faults, cached = await self._ask(page_id, described, None)
        verdict = check_summary(summary, vocabulary)
        grounding = "accepted"
        if not verdict.ok:
            log.info("summary of %s rejected (%s); asking again", page_id, verdict.problems())
            summary, more, cached = await self._ask(page_id, described, verdict)
            faults += more
            grounding = "regenerated"
            retry = check_summary(summary, vocabulary)
            if not retry.ok:
                log.info("summary of %s rejected again (%s); extractive", page_id, retry.problems())
                summary, grounding = extractive_summary(facts), "extractive"
        return self._section(page_id, record, facts, summary, grounding, cached), faults

    @staticmethod
    def _section(
        page_id: str, record: Any, facts: list[FileFacts], summary: str, grounding: str, cached: int
    ) -> dict[str, Any]:
        return {
            "page_id": page_id,
            "files": _files_of(record),
            "spans": _spans_of(record),
            "defines": [n for f in facts for n in f.names][:MAX_DEFINES],
            "summary": summary,
            "grounding": grounding,
            "facts": [f.to_dict() for f in facts],
            "cached_tokens": cached,
        }

    async def _ask(self, page_id: str, described: str, rejected: Verdict | None) -> tuple[str, int, int]:
        """(at most two whole sentences of the model's summary, pages faulted in, cached tokens)."""
        assert self.replica is not None
        ask = SUMMARY_ASK.format(facts=described)
        if rejected is not None:
            ask += RETRY_ASK.format(problems=rejected.problems())
        request = {
            "messages": [
                ChatMessage(role="system", content=SUMMARY_SYSTEM).model_dump(),
                ChatMessage(role="user", content=ask).model_dump(),
            ],
            "max_tokens": self.max_tokens,
        }
        # pinned from fault to answer (no other worker's fault evicts it meanwhile); as the holder
        # of its bound pages this worker may evict its own previous page for its next one
        holder = self.agent.agent_id if self.agent is not None else None
        answer = await generate_when_a_slot_frees(self.replica, request, page_id, holder)
        cached = int(answer.get("usage", {}).get("cached_tokens", 0))
        if self.agent is not None:
            self.agent.record_page_access([page_id], self.replica.replica_id, cached)
        text = first_sentences(whole_sentences(str(answer.get("text", ""))), 2)
        return text, len(answer.get("faulted") or []), cached

    async def _report_done(
        self, report_to: dict[str, Any] | None, ok: bool, page_ids: list[str], faulted: int, files: list[str]
    ) -> None:
        if report_to is None or self.agent is None:
            return
        try:
            target = ReportTo.model_validate(report_to)
        except ValueError as exc:
            log.warning("worker %s: bad report_to %r: %s", self.agent.agent_id, report_to, exc)
            return
        if target.agent_id != self.agent.metadata.parent_id:  # it reports to its own coordinator only
            log.warning("worker %s: report_to %s is not its parent", self.agent.agent_id, target.agent_id)
            return
        requester = await self._requester()
        if requester != self.agent.metadata.parent_id:  # anyone may submit a run naming a report_to
            log.warning(
                "worker %s: report_to ignored: the run was requested by %r, not its parent %r",
                self.agent.agent_id,
                requester,
                self.agent.metadata.parent_id,
            )
            return
        if not ok and self.pages is not None:  # name the files of the pages it did not get to
            for page_id in page_ids:
                with contextlib.suppress(Exception):
                    files.extend(f for f in _files_of(await self.pages.page(page_id)) if f not in files)
        data = {
            "worker": self.agent.agent_id,
            "ok": ok,
            "pages": len(page_ids),
            "faulted": faulted,
            "files": sorted(files),
        }
        settings = self.replica.settings if self.replica is not None else None
        await emit_child_event(
            self.agent.blackboard, self.agent, target, self.agent.agent_id, WORKER_DONE, data, settings
        )

    async def _requester(self) -> str | None:
        """Who wrote the request this run serves: `AgentHandle` stores its owner's id as the
        request's `requester` (the HTTP API stores its own name), read from the worker's runs
        namespace. None when there is no such request (or it cannot be read)."""
        agent = self.agent
        run = agent.current_run if agent is not None else None
        if agent is None or run is None or not run.request_id:
            return None
        for capability in agent.capabilities.values():
            if isinstance(capability, AgentRunCapability) and capability.namespace == RUNS_NAMESPACE:
                try:
                    entry = await capability.blackboard.read(capability.protocol.request_key(run.request_id))
                except Exception as exc:
                    log.warning("worker %s: its request not read: %r", agent.agent_id, exc)
                    return None
                value = entry.value if entry is not None else None
                requester = value.get("requester") if isinstance(value, dict) else None
                return requester if isinstance(requester, str) else None
        return None


def page_worker_blueprint(
    agent_id: str, page_ids: list[str], *, parent_id: str, priority: int = 0
) -> AgentBlueprint:
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(
            agent_id=agent_id,
            agent_type=AgentType.VCM_BOUND,
            role="page-worker",
            parent_id=parent_id,
            priority=priority,
            bound_pages=page_ids,
        ),
        capabilities=[
            PageSummaryCapability.bind(),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE, one_shot=True),
        ],
        action_policy=ScriptedActionPolicy.bind(
            steps=[
                {
                    "action": "summarize_pages",
                    "parameters": {
                        "page_ids": "$input.pages",
                        "files": "$input.files",
                        "root": "$input.root",
                        "report_to": "$input.report_to",
                    },
                }
            ]
        ),
        resources=ResourceRequirements(preferred_pages=page_ids),
    )
