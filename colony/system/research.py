"""The `research` job: a question over a mapped folder, answered with citations (path and line).

The coordinator (`research`, a built-in SUPERVISOR agent) indexes the folder's definitions
(colony.context.code_index, read from the page table), and the model plans the work: it chooses,
as schema-constrained JSON, which of the files the index ranks for the question to examine (the
index's best file is always examined too: a small model's choice adds files, it cannot drop the
best-ranked one). For the pages of those files that hold the best-matching definitions, it spawns
one page-bound worker each (colony.system.research_worker) through the meta-actions' machinery
(colony.system.collaborate: placed where the page is held, named from the run so a resumed
coordinator never spawns twice, bounded fan-out, a failed worker restarted once) and is suspended
until they have answered. Resumed, it ranks their evidence (the index's score, plus the weight of a
worker's model having chosen it), and the model writes the answer from the cited definition's
lines, its tokens streamed as run events.

Output: {"answer", "citations": [{"path", "line", "text"}], "agents", "pages", "files",
"not_finished", "stats"}; paths are relative to the mapped folder. Progress: `mapped`, `plan`,
`children` and the workers' `evidence` events (pages faulted included) in the run's stream.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from colony.agents import (
    ActionResult,
    ActionType,
    Agent,
    AgentBlueprint,
    AgentHandle,
    AgentMetadata,
    AgentRunCapability,
    AgentType,
    ScriptedActionPolicy,
    action_executor,
)
from colony.agents.reply_stream import stream_reply
from colony.blackboard import Blackboard
from colony.config import VcmSettings
from colony.context.code_index import CodeIndex, Scored
from colony.errors import AgentUsageError, InvalidArgument
from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine
from colony.system.analyze_check import Vocabulary, check_summary, first_sentences, whole_sentences
from colony.system.analyze_worker import DEFAULT_PAGE_TOKENS, ReportTo, _bounded_count
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.children import ChildAgents
from colony.system.research_worker import MAX_QUESTION, code_index, research_worker_blueprint
from colony.vcm import PageSource, PageTable
from colony.vcm.mapped_files import MappedFiles

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost, Spawner

log = logging.getLogger(__name__)
WORKER = "research-worker"
# what a worker's model choosing a candidate adds to its index score (the best's = 1): set on the
# development set with the embedded 135M model, whose choice carries little signal; a stronger
# model deserves more (`model_vote`, docs/research.md)
MODEL_VOTE = 0.1
MAX_PAGES_GIVEN = 20_000
MAX_EVIDENCE_SHOWN = 15
CACHED_INDEXES = 2  # folders whose index a replica keeps between questions ...
CACHED_CHARS = 16_000_000  # ... each of at most this much text
_indexes: OrderedDict[tuple[str, float, tuple[str, ...]], tuple[MappedFiles, CodeIndex]] = OrderedDict()
ANSWER_LINES = 14  # of the cited definition shown to the model writing the answer
MAX_PLAN_PATH, MAX_PLAN_CHARS = 240, 4_000  # past these, the index's files are read, unasked
PLAN_SYSTEM = "You plan research in a code base: which files to read to answer a question."
PLAN_ASK = (
    "Question: {question}\n\nFiles that may hold the answer, each with its definitions that best "
    "match the question:\n{files}\n\nWhich files should be read to answer the question? Choose one or two."
)
ANSWER_SYSTEM = "You answer questions about code briefly and only from the code shown."
ANSWER_ASK = (
    "Code from {path}:\n{code}\n\nQuestion: {question}\nAnswer in one sentence that starts with `{name}`."
)
Question = Annotated[str, Field(min_length=1, max_length=MAX_QUESTION)]


class ResearchCapability(ChildAgents):
    """The coordinator's `research` action; its workers are its children (colony.system.children).
    `max_pages`: pages examined (one worker each); `candidate_files`: files offered to the model's
    plan; `model_vote`: the weight of a worker's model choosing a definition. The job's plan is
    capability state, so it survives the coordinator's suspension."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        spawner: Spawner | None = None,
        pages: PageTable | None = None,
        engine: InferenceEngine | None = None,
        replica: ReplicaHost | None = None,
        max_pages: int = 3,
        candidate_files: int = 6,
        answer_tokens: int = 60,
        model_vote: float = MODEL_VOTE,
        capability_key: str = "research",
    ) -> None:
        settings = replica.settings if replica is not None else None
        super().__init__(
            agent,
            scope_id,
            blackboard=blackboard,
            spawner=spawner,
            settings=settings,
            agents=[WORKER],
            max_children_per_run=2 * max_pages,  # a worker and its one restart each
            max_children=2 * max_pages,
            capability_key=capability_key,
        )
        self.pages = pages
        self.engine = engine
        self.vcm = settings.vcm if settings is not None else VcmSettings()
        self.max_pages = max_pages
        self.candidate_files = candidate_files
        self.answer_tokens = answer_tokens
        self.model_vote = model_vote
        # {"run_id", "question", "source_id", "root", "files", "model_files", "examine": page ids,
        #  "candidates": {"path:line": {"score", "name", "text"}}, "report_to"}
        self.job: dict[str, Any] = {}

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "job": self.job}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        held = state.get("job")
        self.job = dict(held) if isinstance(held, dict) else {}

    def _catalog(self) -> dict[str, Any]:
        return {WORKER: research_worker_blueprint}

    def child_blueprint(self, name: str, child_id: str, pages: list[str]) -> AgentBlueprint:
        made = super().child_blueprint(name, child_id, pages)
        return made.model_copy(
            update={"metadata": made.metadata.model_copy(update={"bound_pages": list(pages)})}
        )

    @action_executor(action_type=ActionType.ANALYZE, effects=("spawn",))
    async def research(
        self,
        question: Question,
        path: Annotated[str, Field(max_length=4096)] | None = None,
        pages: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=MAX_PAGES_GIVEN)]
        | None = None,
        page_tokens: Annotated[int, Field(ge=64, le=65536)] | None = None,
    ) -> ActionResult:
        """Answer `question` over a folder (`path`, mapped here) or its mapped `pages`, citing the
        lines that hold the answer; page-bound workers gather the evidence."""
        if self.pages is None or self.spawner is None or self.engine is None:
            raise AgentUsageError("the research agent runs on an engine replica with a control plane")
        agent = self._agent()
        run = agent.current_run
        run_id = run.run_id if run is not None else "none"
        if self.job.get("run_id") != run_id:
            await self._plan(run_id, question, path, pages, page_tokens or DEFAULT_PAGE_TOKENS)
        children: dict[str, str] = {}
        extra = {"source_id": self.job.get("source_id")}
        if self.job.get("report_to"):
            extra["report_to"] = self.job["report_to"]
        for page_id in self.job["examine"]:
            call_id = self._call("examine", {"page": page_id, "question": question})
            record = await self._start(call_id, "examine", WORKER, question, 1, [page_id], extra)
            children.update(record["children"])
        waited = await self._waited(children, lambda answers: answers)
        if waited.blocked:
            return waited
        if await self._cancelled():
            return ActionResult(success=False, error="the run was cancelled")
        answers = waited.output or {}
        failed = [a for a in answers.values() if (a or {}).get("status") != "succeeded"]
        if answers and len(failed) == len(answers):
            reasons = "; ".join(str((a or {}).get("error"))[:300] for a in failed[:3])
            return ActionResult(success=False, error=f"no worker could examine its page ({reasons})")
        return ActionResult(success=True, output=await self._answer(question, answers))

    async def _cancelled(self) -> bool:
        """Whether this run's request was answered already (cancelled or timed out by its requester)."""
        agent = self._agent()
        request_id = agent.current_run.request_id if agent.current_run else None
        if not request_id:
            return False
        held = await AgentHandle(agent.agent_id, owner=agent).result(request_id, namespace=RUNS_NAMESPACE)
        return held is not None

    # -- planning -------------------------------------------------------------------------------------

    async def _plan(
        self, run_id: str, question: str, path: str | None, pages: list[str] | None, page_tokens: int
    ) -> None:
        assert self.pages is not None
        agent = self._agent()
        if pages is None:
            if not path:
                raise InvalidArgument("research needs a folder `path` or its mapped `pages`")
            source = await self.pages.map_source(
                await PageSource.open(path, self.vcm, page_tokens=page_tokens)
            )
            pages, path = source.page_ids, source.path
            await agent.emit_run_event("mapped", {"path": path, "pages": len(pages)})
        pages = list(dict.fromkeys(pages))
        if not pages:
            raise InvalidArgument(
                f"there is nothing to research in {path or 'the given pages'} (no text files)"
            )
        records = await asyncio.gather(*(self.pages.page(p) for p in pages))
        missing = [p for p, r in zip(pages, records, strict=True) if r is None]
        if missing:
            raise InvalidArgument(f"pages: no page {missing[0][:128]!r}; map the folder first")
        source_id = await self._source_of(pages, {r.source_id for r in records if r is not None})
        spans = {
            (s.path, s.start_line, s.end_line): r.page_id for r in records if r is not None for s in r.files
        }
        paths = {key[0] for key in spans}
        files, index = await self._indexed(source_id, paths)
        ranked = await asyncio.to_thread(index.files, question, limit=self.candidate_files)
        model_files = await self._choose_files(question, ranked) if ranked else []
        examined = list(dict.fromkeys([r[0] for r in ranked[:1]] + model_files))
        hits = await asyncio.to_thread(index.search, question, limit=50, paths=examined)
        examine: list[str] = []
        for hit in hits:
            page = _page_of(hit, spans)
            if page is not None and page not in examine:
                examine.append(page)
            if len(examine) >= self.max_pages:
                break
        request_id = agent.current_run.request_id if agent.current_run else None
        self.job = {
            "run_id": run_id,
            "question": question,
            "source_id": source_id,
            "root": files.source.path,
            "files": examined,
            "model_files": model_files,
            "examine": examine,
            "candidates": {
                f"{h.definition.path}:{h.definition.line}": {
                    "score": h.score,
                    "name": h.definition.name,
                    "text": h.definition.text.strip()[:400],
                }
                for h in hits
            },
            "report_to": ReportTo(agent_id=agent.agent_id, request_id=request_id).model_dump()
            if request_id
            else None,
        }
        await agent.emit_run_event(
            "plan",
            {"files": examined, "chosen_by_model": model_files, "pages": examine, "candidates": len(ranked)},
        )

    async def _source_of(self, pages: list[str], named: set[str]) -> str:
        """The mapped folder the pages are of. A page's record names the last source that mapped
        it: a folder mapped twice (a copy of it, other page sizes) shares pages with the first, so
        the source is the one that holds every page given."""
        assert self.pages is not None
        if len(named) == 1:
            return next(iter(named))
        wanted = set(pages)
        for source_id in sorted(named):
            record = await self.pages.source(source_id)
            if record is not None and wanted <= set(record.page_ids):
                return source_id
        raise InvalidArgument(f"pages: they come from {len(named)} mapped folders; research one at a time")

    async def _indexed(self, source_id: str, paths: set[str]) -> tuple[MappedFiles, CodeIndex]:
        """The files and the index of a source's `paths`: kept for the next question while the
        source is mapped as it was (the newest CACHED_INDEXES, of at most CACHED_CHARS of text)."""
        assert self.pages is not None
        record = await self.pages.source(source_id)
        key = (source_id, record.mapped_at if record is not None else 0.0, tuple(sorted(paths)))
        held = _indexes.get(key)
        if held is not None:
            _indexes.move_to_end(key)
            return held
        files = await MappedFiles.load(self.pages, source_id, paths=paths)
        index = await code_index(files, paths, self.settings)
        if files.chars() <= CACHED_CHARS and not files.missing_pages:
            _indexes[key] = (files, index)
            while len(_indexes) > CACHED_INDEXES:
                _indexes.popitem(last=False)
        return files, index

    async def _choose_files(self, question: str, ranked: list[tuple[str, float, list[Any]]]) -> list[str]:
        """The files the model chooses to read among those the index ranked (schema-constrained);
        the index's two best when the list would not fit a small model's prompt (paths of hundreds
        of characters: the model must answer one of them whole)."""
        assert self.engine is not None
        listing = "\n".join(
            f"{n}. {path}: {', '.join(d.name for d in best)}" for n, (path, _, best) in enumerate(ranked, 1)
        )
        names = [path for path, _, _ in ranked]
        if len(listing) > MAX_PLAN_CHARS or max(len(n) for n in names) > MAX_PLAN_PATH:
            return names[:2]
        schema = {
            "type": "object",
            "properties": {
                "files": {"type": "array", "items": {"enum": names}, "minItems": 1, "maxItems": 2}
            },
            "required": ["files"],
            "additionalProperties": False,
        }
        request = InferenceRequest(
            messages=[
                ChatMessage(role="system", content=PLAN_SYSTEM),
                ChatMessage(role="user", content=PLAN_ASK.format(question=question, files=listing)),
            ],
            response_format=schema,
            max_tokens=24 + 16 * max(len(n) // 3 for n in names),
            temperature=0.0,
        )
        response = await self.engine.generate(request)
        chosen = response.parsed.get("files") if isinstance(response.parsed, dict) else None
        return [n for n in dict.fromkeys(chosen or []) if n in names][:2]

    # -- the answer -----------------------------------------------------------------------------------

    async def _answer(self, question: str, answers: dict[str, Any]) -> dict[str, Any]:
        job = self.job
        ranked, agents, not_finished, faulted = self._rank(answers)
        best = ranked[:3]
        citations = [{"path": i["path"], "line": i["line"], "text": i["text"]} for i in best]
        answer = (
            await self._write(question, best[0])
            if best
            else "No definition in the folder matches the question."
        )
        return {
            "answer": answer,
            "citations": citations,
            "agents": agents,
            "pages": list(job.get("examine") or []),
            "files": list(job.get("files") or []),
            "not_finished": not_finished,
            "evidence": [
                {k: i[k] for k in ("path", "line", "name", "chosen", "score")}
                for i in ranked[:MAX_EVIDENCE_SHOWN]
            ],
            "stats": {
                "faulted": faulted,
                "chosen_by_model": list(job.get("model_files") or []),
                "answer_from": job.get("answer_from", "none"),
            },
        }

    def _rank(
        self, answers: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], int]:
        """The definitions the workers examined, best first, each scored by the index (its best =
        1) plus MODEL_VOTE when a worker's model chose it; the workers that answered; those that
        could not finish; pages faulted. Only the coordinator's own candidates count: what a
        worker's output (read back from Redis) says is matched against them, never cited as is."""
        candidates: dict[str, Any] = self.job.get("candidates") or {}
        top = max((c["score"] for c in candidates.values()), default=0.0) or 1.0
        seen: dict[str, dict[str, Any]] = {}
        agents, not_finished, faulted = [], [], 0
        for child, answer in sorted(answers.items()):
            output = (answer or {}).get("output")
            if (answer or {}).get("status") != "succeeded" or not isinstance(output, dict):
                retried = (answer or {}).get("retried") is True
                error = str((answer or {}).get("error"))[:500]
                not_finished.append({"agent": child, "error": error, "retried": retried})
                continue
            page, replica = output.get("page"), output.get("replica_id")
            agents.append({"agent": child, "page": _short(page), "replica_id": _short(replica)})
            faulted += _bounded_count(output.get("faulted"))
            evidence = output.get("evidence")
            for item in evidence[:50] if isinstance(evidence, list) else []:
                key = f"{item.get('path')}:{item.get('line')}" if isinstance(item, dict) else ""
                known = candidates.get(key)
                if known is None:
                    continue
                chosen = item.get("chosen") is True or seen.get(key, {}).get("chosen", False)
                score = known["score"] / top + (self.model_vote if chosen else 0.0)
                path, line = key.rsplit(":", 1)
                seen[key] = {
                    **known,
                    "path": path,
                    "line": int(line),
                    "chosen": chosen,
                    "score": round(score, 4),
                }
        ranked = sorted(seen.values(), key=lambda i: (-i["score"], i["path"], i["line"]))
        return ranked, agents, not_finished, faulted

    async def _write(self, question: str, cited: dict[str, Any]) -> str:
        """The answer's sentence, by the model from the cited definition's lines (streamed)."""
        assert self.pages is not None and self.engine is not None
        files = await MappedFiles.load(self.pages, self.job["source_id"], paths={cited["path"]})
        window = files.window(cited["path"], cited["line"], ANSWER_LINES)
        code = "\n".join(f"{row['line']}: {row['text']}" for row in own_lines(window["lines"]))
        request = InferenceRequest(
            messages=[
                ChatMessage(role="system", content=ANSWER_SYSTEM),
                ChatMessage(
                    role="user",
                    content=ANSWER_ASK.format(
                        question=question, path=cited["path"], code=code, name=cited["name"]
                    ),
                ),
            ],
            max_tokens=self.answer_tokens,
            temperature=0.0,
        )
        said = await stream_reply(self._agent(), self.engine, request)
        said = said.split("Question:", 1)[0]  # (a small model may go on to repeat the prompt)
        text = first_sentences(whole_sentences(said), 1).strip()
        self.job["answer_from"] = "model"
        if text and not grounded(text, code, question):  # it names what the code does not hold
            text, self.job["answer_from"] = docstring_line(own_lines(window["lines"])), "docstring"
        path = cited["path"].replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")  # one line
        lead = f"`{cited['name']}` ({path}, line {cited['line']})"
        return f"{lead}: {text}" if text else lead


def grounded(text: str, code: str, question: str) -> bool:
    """Whether a model's sentence names only what the code shown (or the question) holds: no
    identifier, file or library it lacks (the `analyze` check) and no number of two digits or more
    it lacks (a small model invents line numbers and ids)."""
    if not check_summary(text, Vocabulary(code, question)).ok:
        return False
    return all(n in code or n in question for n in re.findall(r"\d{2,}", text))


def docstring_line(rows: list[dict[str, Any]]) -> str:
    """The first line of a definition's docstring (what its author said it does), or ""."""
    for row in rows[1:8]:
        text = row["text"].strip()
        for quote in ('"""', "'''"):
            if text.startswith(quote):
                line = text[3:].split(quote, 1)[0].strip()
                return line[:300] if line else ""
    return ""


def own_lines(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a definition (from its first line): up to the next line indented no deeper than
    the first, past the decorators and the signature's own lines (the next definition is not shown)."""
    if not rows:
        return rows
    first = rows[0]["text"]
    depth = len(first) - len(first.lstrip())
    out = [rows[0]]
    opened = first.lstrip().startswith(("def ", "async def ", "class "))
    for row in rows[1:]:
        text = row["text"]
        stripped = text.lstrip()
        if stripped and len(text) - len(stripped) <= depth:
            if stripped.startswith((")", "]")):  # the closing line of a long signature
                pass
            elif not opened and stripped.startswith(("@", "def ", "async def ", "class ")):
                opened = not stripped.startswith("@")  # past the decorators
            else:
                break
        out.append(row)
    return out


def _page_of(hit: Scored, spans: dict[tuple[str, int, int], str]) -> str | None:
    definition = hit.definition
    for (path, first, last), page in spans.items():
        if path == definition.path and first <= definition.line <= last:
            return page
    return None


def _short(value: Any) -> str | None:
    return value[:128] if isinstance(value, str) else None


def research_blueprint(agent_id: str = "research") -> AgentBlueprint:
    """The `research` coordinator."""
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SUPERVISOR, role="research"),
        capabilities=[
            ResearchCapability.bind(),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE),
        ],
        action_policy=ScriptedActionPolicy.bind(
            steps=[
                {
                    "action": "research",
                    "parameters": {
                        "question": "$input.question",
                        "path": "$input.path",
                        "pages": "$input.pages",
                        "page_tokens": "$input.page_tokens",
                    },
                }
            ]
        ),
    )
