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
report is `partial` and lists them, and a run where no page could be analysed fails.
"""

from __future__ import annotations

import logging
import re
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
    ResourceRequirements,
    ScriptedActionPolicy,
    action_executor,
)
from colony.blackboard import Blackboard
from colony.config import VcmSettings
from colony.errors import AgentUsageError, InvalidArgument
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine
from colony.system.builtin import RUNS_NAMESPACE
from colony.vcm import PageSource, PageTable

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost, Spawner

log = logging.getLogger(__name__)
DEFAULT_PAGE_TOKENS = 1024
SUMMARY_SYSTEM = "You summarise source code for an engineer. Be brief, concrete and accurate."
SUMMARY_ASK = "Summarise the code above in two sentences: what it is for and its main classes or functions."


DEFINITION = re.compile(
    r"^(?:export\s+)?(?:pub\s+)?(?:async\s+def|def|class|function|fn|func|interface|struct|enum|trait)\s+([A-Za-z_]\w*)"
)


def _files_of(record: Any) -> list[str]:
    return sorted({span.path for span in record.files}) if record is not None else []


def _spans_of(record: Any) -> list[str]:
    """`path:first-last` of each file (or part of a split file) in the page."""
    return [f"{s.path}:{s.start_line}-{s.end_line}" for s in (record.files if record is not None else [])]


def whole_sentences(text: str) -> str:
    """The text up to its last full stop (a reply cut off by max_tokens ends mid-sentence)."""
    text = text.strip()
    end = text.rfind(". ") + 1 if not text.endswith(".") else len(text)
    return text[:end] if end > 0 else text


def page_groups(pages: list[str], per_worker: int, max_workers: int) -> list[list[str]]:
    """Consecutive pages in groups of `per_worker`, larger where that would take more than
    `max_workers` workers (a big folder gets bigger groups, not more agents than replicas host)."""
    size = max(1, per_worker, -(-len(pages) // max(1, max_workers)))
    return [pages[i : i + size] for i in range(0, len(pages), size)]


def outline(text: str, limit: int = 12) -> list[str]:
    """The top-level definitions in a page's text (classes, functions, types), in order: a map of
    the code that does not depend on the model."""
    names: list[str] = []
    for line in text.splitlines():
        match = DEFINITION.match(line)
        if match and match.group(1) not in names:
            names.append(match.group(1))
    return names[:limit]


class PageSummaryCapability(AgentCapability):
    """A worker's one job: summarise its pages with the engine of the replica that holds them."""

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
    async def summarize_pages(self, page_ids: list[str]) -> dict[str, Any]:
        """Summarise each page (its files) with the page's KV cache as the prompt prefix."""
        if self.replica is None or self.pages is None:
            raise AgentUsageError(
                "page workers run on an engine replica (no replica/page table was injected)"
            )
        summaries = []
        for page_id in page_ids:
            record = await self.pages.page(page_id)
            request = {
                "messages": [
                    ChatMessage(role="system", content=SUMMARY_SYSTEM).model_dump(),
                    ChatMessage(role="user", content=SUMMARY_ASK).model_dump(),
                ],
                "max_tokens": self.max_tokens,
            }
            # pinned from fault to answer (no other worker's fault evicts it meanwhile); as the holder
            # of its bound pages this worker may evict its own previous page for its next one
            holder = self.agent.agent_id if self.agent is not None else None
            answer = await self.replica.generate(request, [page_id], holder=holder)
            text = whole_sentences(str(answer.get("text", "")))
            cached = int(answer.get("usage", {}).get("cached_tokens", 0))
            if self.agent is not None:
                self.agent.record_page_access([page_id], self.replica.replica_id, cached)
            summaries.append(
                {
                    "page_id": page_id,
                    "files": _files_of(record),
                    "spans": _spans_of(record),
                    "defines": outline((await self.pages.content(page_id)).text),
                    "summary": text,
                    "cached_tokens": cached,
                }
            )
        return {"replica_id": self.replica.replica_id, "pages": summaries}


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
            steps=[{"action": "summarize_pages", "parameters": {"page_ids": "$input.pages"}}]
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
        overview_tokens: int = 80,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.pages = pages
        self.spawner = spawner
        self.engine = engine
        # the replica's settings say which folders may be mapped (none without a replica)
        self.vcm = replica.settings.vcm if replica is not None else VcmSettings()
        self.pages_per_worker = pages_per_worker
        self.max_workers = max_workers  # a big folder gets bigger page groups, not more agents
        self.overview_tokens = overview_tokens
        # {"run_id", "path", "workers": {worker_id: request_id}, "groups": {worker_id: page ids}}
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
        and report on every file."""
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
        report = await self._report(results)
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
        if not pages:
            raise InvalidArgument(
                f"there is nothing to analyze in {path or 'the given pages'} (no text files)"
            )
        groups = page_groups(pages, self.pages_per_worker, self.max_workers)
        workers: dict[str, str] = {}
        for index, group in enumerate(groups):
            worker_id = f"{agent.agent_id}-{run_id[-8:]}-w{index}"
            blueprint = page_worker_blueprint(
                worker_id, group, parent_id=agent.agent_id, priority=agent.metadata.priority
            )
            await self.spawner(blueprint)
            workers[worker_id] = await AgentHandle(worker_id, owner=agent).submit(
                {"pages": group}, namespace=RUNS_NAMESPACE
            )
        self.job = {
            "run_id": run_id,
            "path": path,
            "workers": workers,
            "groups": {worker: groups[index] for index, worker in enumerate(workers)},
        }
        await agent.emit_run_event("workers", {"workers": sorted(workers), "pages": len(pages)})
        log.info("analyze %s: %d pages, %d workers", run_id, len(pages), len(workers))

    async def _report(self, results: dict[str, Any]) -> dict[str, Any]:
        assert self.pages is not None
        sections: list[str] = []
        files: list[str] = []
        failures: list[str] = []
        not_analysed: list[dict[str, Any]] = []
        for worker_id, run in sorted(results.items()):
            if run.error or not isinstance(run.output, dict):
                group = list(self.job.get("groups", {}).get(worker_id, []))
                lost = sorted({f for page_id in group for f in _files_of(await self.pages.page(page_id))})
                error = str(run.error or "no output")
                not_analysed.append({"worker": worker_id, "pages": group, "files": lost, "error": error})
                failures.append(f"{worker_id} ({', '.join(lost) or 'its pages'}): {error}")
                continue
            for page in run.output.get("pages", []):
                files.extend(page["files"])
                defines = f"\n\nDefines: {', '.join(page['defines'])}." if page.get("defines") else ""
                heading = ", ".join(page.get("spans") or page["files"])
                sections.append(f"## {heading}\n\n{page['summary'] or '(no summary)'}{defines}\n")
        files = sorted(set(files))
        title = f"# Analysis of {self.job.get('path') or 'the mapped pages'}"
        head = (
            f"{len(files)} files in {len(sections)} page(s), "
            f"summarised by {len(results)} page-bound worker(s)."
        )
        overview = await self._overview(sections) if sections else ""
        parts = [title, "", head, ""]
        if overview:
            parts += ["## Overview", "", overview, ""]
        parts += sections
        if failures:
            parts += ["## Not analysed", "", *(f"- {f}" for f in failures), ""]
        return {
            "report": "\n".join(parts),
            "files": files,
            "pages": len(sections),
            "workers": sorted(results),
            "failed_workers": len(failures),
            "partial": bool(failures),
            "not_analysed": not_analysed,
        }

    async def _overview(self, sections: list[str]) -> str:
        if self.engine is None or self.overview_tokens <= 0:
            return ""
        digest = "\n".join(sections)[:6000]
        request = InferenceRequest(
            messages=[
                ChatMessage(role="system", content=SUMMARY_SYSTEM),
                ChatMessage(
                    role="user", content=f"{digest}\n\nIn two sentences, what is this code base about?"
                ),
            ],
            max_tokens=self.overview_tokens,
        )
        return whole_sentences((await self.engine.generate(request)).text)


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
