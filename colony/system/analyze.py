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
import logging
import secrets
from typing import TYPE_CHECKING, Any

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
    ScriptedActionPolicy,
    action_executor,
)
from colony.agents.state.action_log import current_idempotency_key
from colony.agents.state.log_records import effect_id
from colony.blackboard import Blackboard
from colony.config import VcmSettings
from colony.errors import (
    AgentUsageError,
    InvalidArgument,
)
from colony.inference.engine import InferenceEngine
from colony.system.analyze_report import build_report, run_failed
from colony.system.analyze_worker import (
    DEFAULT_PAGE_TOKENS,
    SLOT_WAIT_SECONDS,
    WORKER_DONE,
    PageSummaryCapability,
    ReportTo,
    _bounded_count,
    _files_of,
    emit_child_event,
    page_groups,
    page_worker_blueprint,
)
from colony.system.builtin import RUNS_NAMESPACE
from colony.vcm import PageSource, PageTable

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost, Spawner

log = logging.getLogger(__name__)

# The worker's names stay importable from here: blueprints stored in Redis (pickled by reference)
# name colony.system.analyze.PageSummaryCapability, and so do earlier users of this module.
__all__ = [
    "SLOT_WAIT_SECONDS",
    "AnalyzeCapability",
    "PageSummaryCapability",
    "analyze_blueprint",
    "page_groups",
    "page_worker_blueprint",
]


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

    @action_executor(action_type=ActionType.REPORT_GENERATE, effects=("spawn",))
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
        # from the action's idempotency key: the step redone after the coordinator's replica died
        # mid-dispatch (before the action's result was recorded) names the same workers and
        # requests, so it finds those the cut-off dispatch placed and asked instead of starting a
        # second set; random outside a run (no key)
        key = current_idempotency_key()
        dispatch = effect_id(key, "dispatch", length=6) if key is not None else secrets.token_hex(3)
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
        """Place a page worker for `group` and submit its pages (with where to report progress).

        In a run, the request's id comes from the action's idempotency key (and the worker and its
        pages): redone after a crash, the call finds the request it wrote (create-only) and places
        the worker only while that request is unanswered (placing a placed id finds it; a one-shot
        worker that answered already is not started again)."""
        assert self.spawner is not None
        agent = self._agent()
        key = current_idempotency_key()
        request_id = None if key is None else f"req-{effect_id(key, worker_id, *group, length=12)}"
        handle = AgentHandle(worker_id, owner=agent)
        if request_id is None or await handle.result(request_id, namespace=RUNS_NAMESPACE) is None:
            blueprint = page_worker_blueprint(
                worker_id, group, parent_id=agent.agent_id, priority=agent.metadata.priority
            )
            await self.spawner(blueprint)
        request = {"pages": group, "files": self.job.get("files"), "root": self.job.get("path")}
        if self.job.get("request_id"):
            request["report_to"] = {"agent_id": agent.agent_id, "request_id": self.job["request_id"]}
        named = {} if request_id is None else {"request_id": request_id}
        self.job["workers"][worker_id] = await handle.submit(request, namespace=RUNS_NAMESPACE, **named)
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
