"""The `analyze` job: a folder mapped as pages, summarised by page-bound workers, reported on.

The coordinator (`analyze`, a built-in SUPERVISOR agent) groups the pages, places one VCM-bound
worker per group through the control plane (so each lands where its pages are, or faults them
in there), asks each for a summary, and blocks on them: it is suspended with CHILDREN_COMPLETED
and the resource monitor resumes it, same id and state, once every worker has stopped. The same
action then runs again, finds the workers' answers and writes the report, naming every file.
Workers are one-shot: they stop once their run is answered.

A folder given as `path` is mapped here, on the replica, so the replica's `vcm` settings apply
(allowed roots, caps) exactly as on the API's `POST /v1/vcm/sources`. A worker holds its page
pinned while it works on it, so workers sharing a replica with fewer slots than pages take turns
instead of evicting each other's pages. Pages whose worker failed are never passed off as done: the
report is `partial` and lists them, and a run where no page could be analysed fails. The report
itself (sections, header, overview, output) is built by colony/system/analyze_report.py from the
answers this coordinator says count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from colony.agents import (
    ActionResult,
    ActionType,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentHandle,
    AgentMetadata,
    AgentRunCapability,
    AgentType,
    ResourceRequirements,
    ScriptedActionPolicy,
    action_executor,
)
from colony.agents.handle import AgentRunEvent
from colony.blackboard import AgentRunProtocol, Blackboard, BlackboardScope, scope_id
from colony.config import ColonySettings, RunsSettings, VcmSettings
from colony.errors import (
    AgentUsageError,
    ConcurrentModificationError,
    InvalidArgument,
    PageNotResident,
    PageSlotsBusy,
)
from colony.inference import ChatMessage
from colony.inference.engine import InferenceEngine
from colony.system.analyze_check import (
    Verdict,
    Vocabulary,
    check_summary,
    first_sentences,
    whole_sentences,
)
from colony.system.analyze_facts import FileFacts, extract_facts, extractive_summary, facts_text
from colony.system.analyze_report import RETRY_ASK, SUMMARY_SYSTEM, build_report, run_failed
from colony.system.builtin import RUNS_NAMESPACE
from colony.vcm import PageSource, PageTable

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost, Spawner

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
    worker, or its coordinator for a worker that died first). Tagged with the run's request tag,
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

    @action_executor(action_type=ActionType.CONTEXT_SUMMARIZE)
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

    async def _generate_when_a_slot_frees(
        self, request: dict[str, Any], page_id: str, holder: str | None
    ) -> dict[str, Any]:
        """`replica.generate`, waiting for a page slot as long as other workers hold them all: more
        workers than slots on one replica take turns (each waits `vcm.page_wait_seconds` per try),
        up to `SLOT_WAIT_SECONDS` in all; only then is the page given up as not analysed."""
        assert self.replica is not None
        deadline = time.monotonic() + SLOT_WAIT_SECONDS
        while True:
            try:
                return await self.replica.generate(request, [page_id], holder=holder)
            except PageSlotsBusy:
                if time.monotonic() >= deadline:
                    raise
                log.info("page %s: every slot is busy with other workers' pages; waiting on", page_id)

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
        answer = await self._generate_when_a_slot_frees(request, page_id, holder)
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


class AnalyzeCapability(AgentCapability):
    """The coordinator's action; its progress (the workers of the current run and their requests)
    is capability state, so it survives the coordinator's suspension."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        pages: PageTable | None = None,
        spawner: Spawner | None = None,
        engine: InferenceEngine | None = None,
        replica: ReplicaHost | None = None,
        pages_per_worker: int = 1,
        max_workers: int = 16,
        overview_tokens: int = 60,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.pages = pages
        self.spawner = spawner
        self.engine = engine
        self.settings = replica.settings if replica is not None else None
        # the replica's settings say which folders may be mapped (none without a replica)
        self.vcm = replica.settings.vcm if replica is not None else VcmSettings()
        self.pages_per_worker = pages_per_worker
        self.max_workers = max_workers  # a big folder gets bigger page groups, not more agents
        self.overview_tokens = overview_tokens
        # {"run_id", "path", "request_id", "workers": {worker_id: request_id},
        #  "groups": {worker_id: page ids}, "retries": {failed worker: its retry}, "retried": bool}
        self.job: dict[str, Any] = {}

    def get_state(self) -> dict[str, Any]:
        return {"job": self.job}

    def set_state(self, state: dict[str, Any]) -> None:
        self.job = dict(state.get("job") or {})

    def _agent(self) -> Agent:
        if self.agent is None:
            raise AgentUsageError("AnalyzeCapability coordinates for an agent; build it with agent=...")
        return self.agent

    @action_executor(action_type=ActionType.REPORT_GENERATE)
    async def analyze(
        self, path: str | None = None, pages: list[str] | None = None, page_tokens: int | None = None
    ) -> ActionResult:
        """Summarise a folder (`path`, mapped here) or already mapped `pages` with page-bound workers
        and report on every file. A worker that failed is retried once (a fresh worker for its
        pages); pages still not analysed make the output `partial` and are named."""
        if self.pages is None or self.spawner is None:
            raise AgentUsageError("the analyze agent runs on an engine replica with a control plane")
        agent = self._agent()
        run_id = agent.current_run.run_id if agent.current_run else "none"
        if self.job.get("run_id") != run_id:
            await self._dispatch(run_id, path, pages, page_tokens or DEFAULT_PAGE_TOKENS)
        results = {
            worker: await AgentHandle(worker, owner=agent).result(request, namespace=RUNS_NAMESPACE)
            for worker, request in self.job["workers"].items()
        }
        waiting = sorted(w for w, run in results.items() if run is None)
        if waiting:
            return ActionResult(
                success=True,
                blocked=True,
                blocked_reason=f"waiting for {len(waiting)} of {len(results)} page workers",
                blocking_agent_ids=waiting,
            )
        await self._backfill_done(results)
        if not self.job.get("retried"):
            retries = await self._retry([w for w, run in results.items() if run_failed(run)])
            if retries:
                return ActionResult(
                    success=True,
                    blocked=True,
                    blocked_reason=f"retrying {len(retries)} failed page worker(s)",
                    blocking_agent_ids=sorted(retries),
                )
        report = await build_report(
            self.job,
            results,
            files_of_pages=self._files_of_pages,
            engine=self.engine,
            overview_tokens=self.overview_tokens,
        )
        if not report["pages"]:
            reasons = "; ".join(f"{n['worker']}: {n['error']}" for n in report["not_analysed"])
            return ActionResult(success=False, error=f"no page could be analysed ({reasons[:2000]})")
        return ActionResult(success=True, output=report)

    async def _dispatch(
        self, run_id: str, path: str | None, pages: list[str] | None, page_tokens: int
    ) -> None:
        assert self.pages is not None and self.spawner is not None
        agent = self._agent()
        if pages is None:
            if not path:
                raise InvalidArgument("analyze needs a folder `path` or mapped `pages`")
            source = await self.pages.map_source(
                await PageSource.open(path, self.vcm, page_tokens=page_tokens)
            )
            pages, path = source.page_ids, source.path
            await agent.emit_run_event("mapped", {"path": path, "pages": len(pages)})
        if not all(isinstance(p, str) for p in pages):
            raise InvalidArgument("analyze's `pages` are page ids (strings, as GET /v1/vcm/pages lists)")
        pages = list(dict.fromkeys(pages))  # a page given twice is analysed (and counted) once
        if not pages:
            raise InvalidArgument(
                f"there is nothing to analyze in {path or 'the given pages'} (no text files)"
            )
        records = await asyncio.gather(*(self.pages.page(p) for p in pages))
        files = sorted({f for record in records for f in _files_of(record)})
        request_id = agent.current_run.request_id if agent.current_run else None
        # unique per dispatch: a step redone after the coordinator's replica died mid-dispatch
        # starts workers under new ids, so their requests, agents and `worker_done` events (one
        # create-only key per worker) are not taken for the abandoned dispatch's
        dispatch = secrets.token_hex(3)
        self.job = {
            "run_id": run_id,
            "dispatch": dispatch,
            "path": path,
            "files": files,
            "request_id": request_id,
            "workers": {},
            "groups": {},
            "retries": {},
        }
        groups = page_groups(pages, self.pages_per_worker, self.max_workers)
        for index, group in enumerate(groups):
            await self._start_worker(f"{agent.agent_id}-{run_id[-8:]}-{dispatch}-w{index}", group)
        await agent.emit_run_event("workers", {"workers": sorted(self.job["workers"]), "pages": len(pages)})
        log.info("analyze %s: %d pages, %d workers", run_id, len(pages), len(groups))

    async def _start_worker(self, worker_id: str, group: list[str]) -> None:
        """Place a page worker for `group` and submit its pages (with where to report progress)."""
        assert self.spawner is not None
        agent = self._agent()
        blueprint = page_worker_blueprint(
            worker_id, group, parent_id=agent.agent_id, priority=agent.metadata.priority
        )
        await self.spawner(blueprint)
        request = {"pages": group, "files": self.job.get("files"), "root": self.job.get("path")}
        if self.job.get("request_id"):
            request["report_to"] = {"agent_id": agent.agent_id, "request_id": self.job["request_id"]}
        self.job["workers"][worker_id] = await AgentHandle(worker_id, owner=agent).submit(
            request, namespace=RUNS_NAMESPACE
        )
        self.job["groups"][worker_id] = group

    async def _retry(self, failed: list[str]) -> list[str]:
        """A fresh worker for the pages of each failed one (once per run); the retries started."""
        self.job["retried"] = True
        started: list[str] = []
        for worker in failed:
            retry = f"{worker}-r"
            try:
                await self._start_worker(retry, list(self.job["groups"][worker]))
            except Exception as exc:  # e.g. no replica can take it: the first failure stands
                log.warning("analyze: retry of %s could not start: %r", worker, exc)
                continue
            self.job["retries"][worker] = retry
            started.append(retry)
        if started:  # the workers whose answers count now: each retry in place of the worker it retries
            retries = self.job["retries"]
            originals = [w for w in self.job["groups"] if w not in retries.values()]
            await self._agent().emit_run_event(
                "workers",
                {
                    "workers": sorted(retries.get(w, w) for w in originals),
                    "pages": sum(len(self.job["groups"][w]) for w in originals),
                    "retrying": started,
                },
            )
        return started

    async def _backfill_done(self, results: dict[str, Any]) -> None:
        """A `worker_done` event for each finished worker that did not write its own (it died, or
        failed before its action ran); create-only, so one the worker wrote stands."""
        request_id = self.job.get("request_id")
        if not request_id:
            return
        agent = self._agent()
        target = ReportTo(agent_id=agent.agent_id, request_id=request_id)
        for worker, run in results.items():
            if run is None:
                continue
            try:
                group = [p for p in self.job["groups"].get(worker, []) if isinstance(p, str)]
                ok = not run_failed(run)
                data = {
                    "worker": worker,
                    "ok": ok,
                    "pages": len(group),
                    "faulted": _bounded_count(run.output.get("faulted")) if ok else 0,
                    "files": await self._files_of_pages(group),
                }
                await emit_child_event(
                    agent.blackboard, agent, target, worker, WORKER_DONE, data, self.settings
                )
            except Exception as exc:  # progress is not the result: the report is still written
                log.warning("analyze: worker_done of %s not backfilled: %r", worker, exc)

    async def _files_of_pages(self, page_ids: list[str]) -> list[str]:
        assert self.pages is not None
        records = await asyncio.gather(*(self.pages.page(p) for p in page_ids))
        return sorted({f for record in records for f in _files_of(record)})


def analyze_blueprint(agent_id: str = "analyze", *, max_workers: int = 16) -> AgentBlueprint:
    """The `analyze` coordinator; `max_workers` bounds its page workers (more pages: bigger groups)."""
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SUPERVISOR, role="analyze"),
        capabilities=[
            AnalyzeCapability.bind(max_workers=max_workers),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE),
        ],
        action_policy=ScriptedActionPolicy.bind(
            steps=[
                {
                    "action": "analyze",
                    "parameters": {
                        "path": "$input.path",
                        "pages": "$input.pages",
                        "page_tokens": "$input.page_tokens",
                    },
                }
            ]
        ),
    )
