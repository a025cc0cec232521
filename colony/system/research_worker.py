"""The `research` job's worker: one agent bound to one page of a mapped folder, which looks for
the definitions on its page that answer a question and has the model judge them with the page in
its context (the page's KV cache is the prompt's prefix, faulted in on the replica holding it).

It reports what it found to its coordinator's run as an `evidence` event (create-only, once) and
answers with its candidates, each cited by path and line. Candidates come from the code index
(colony.context.code_index) of the files its page holds; the model picks one of them by number
(schema-constrained), so a citation is always a line that is in the folder.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

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
from colony.blackboard import Blackboard
from colony.config import ColonySettings
from colony.context.code_index import CodeIndex, Embed, Scored
from colony.errors import AgentUsageError, PageNotResident
from colony.inference import ChatMessage
from colony.memory.embedding import get_embedder
from colony.system.analyze_worker import ReportTo, emit_child_event, generate_when_a_slot_frees
from colony.system.builtin import RUNS_NAMESPACE
from colony.vcm import PageTable
from colony.vcm.mapped_files import MappedFiles

if TYPE_CHECKING:
    from colony.system.host import ReplicaHost

log = logging.getLogger(__name__)
EVIDENCE = "evidence"  # a worker's event in its coordinator's run stream
MAX_CANDIDATES = 5
MAX_QUESTION = 2000
JUDGE_SYSTEM = "You read code and find where a question is answered."
JUDGE_ASK = (
    "Question: {question}\n\nDefinitions on this page that may answer it:\n{candidates}\n\n"
    "Which one answers the question? Answer with its number."
)


def definition_embedder(settings: ColonySettings | None) -> Embed | None:
    """The memory's packaged embedder, for the code index's cosine (colony.context.code_index);
    None, logged, when it cannot load: the index then ranks by words alone. Blocking (it may
    unpack the model): call it off the event loop."""
    try:
        return get_embedder(settings).embed
    except Exception as exc:  # an aid to ranking: research goes on without it
        log.warning("research: the code index ranks by words alone (no embedder: %r)", exc)
        return None


async def code_index(files: MappedFiles, paths: set[str], settings: ColonySettings | None) -> CodeIndex:
    """The index of `paths` of a mapped folder, built (and embedded) off the event loop."""

    def build() -> CodeIndex:
        texts = {p: lines for p, lines in files.files.items() if p in paths}
        return CodeIndex(texts, embed=definition_embedder(settings))

    return await asyncio.to_thread(build)


def candidate_line(number: int, hit: Scored) -> str:
    """`2. utils.py line 197: def parsedate_to_datetime(data):  # first docstring line`."""
    definition = hit.definition
    doc = f"  # {definition.doc[:160]}" if definition.doc else ""
    return f"{number}. {definition.path} line {definition.line}: {definition.text.strip()[:200]}{doc}"


def choice_schema(count: int) -> dict[str, Any]:
    """One number among 1..count (what the model may answer)."""
    return {
        "type": "object",
        "properties": {"choice": {"type": "integer", "enum": list(range(1, count + 1))}},
        "required": ["choice"],
        "additionalProperties": False,
    }


def on_page(hit: Scored, spans: list[Any]) -> bool:
    """Whether a definition's line lies in one of the page's spans."""
    definition = hit.definition
    return any(s.path == definition.path and s.start_line <= definition.line <= s.end_line for s in spans)


class EvidenceCapability(AgentCapability):
    """A worker's one job: the definitions of its page that answer the question, judged by the model
    of the replica holding the page."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        replica: ReplicaHost | None = None,
        pages: PageTable | None = None,
        max_candidates: int = MAX_CANDIDATES,
    ) -> None:
        super().__init__(agent, scope_id, blackboard=blackboard)
        self.replica = replica
        self.pages = pages
        self.max_candidates = max_candidates

    @action_executor(action_type=ActionType.CONTEXT_FETCH, effects=("colony_write",))
    async def gather_evidence(
        self,
        question: Annotated[str, Field(min_length=1, max_length=MAX_QUESTION)],
        report_to: dict[str, Any] | None = None,
        source_id: Annotated[str, Field(max_length=128)] | None = None,
    ) -> dict[str, Any]:
        """The definitions on this agent's page that may answer `question`, best first, the one the
        model chose marked `chosen`; `report_to`: the coordinator's run (one `evidence` event)."""
        if self.replica is None or self.pages is None or self.agent is None:
            raise AgentUsageError("research workers run on an engine replica (no replica/page table here)")
        bound = list(self.agent.metadata.bound_pages)
        if len(bound) != 1:
            raise AgentUsageError(f"a research worker is bound to one page (this one: {len(bound)})")
        page_id = bound[0]
        record = await self.pages.page(page_id)
        if record is None:
            raise PageNotResident(
                f"page {page_id!r} has no page record (unmapped meanwhile?); map the folder again"
            )
        paths = {span.path for span in record.files}
        files = await MappedFiles.load(
            self.pages, await self._source(page_id, record, source_id), paths=paths
        )
        index = await code_index(files, paths, self.replica.settings)
        found = await asyncio.to_thread(index.search, question, limit=200)
        hits = [h for h in found if on_page(h, record.files)]
        hits = hits[: self.max_candidates]
        chosen, faulted, cached = (None, 0, 0) if not hits else await self._judge(page_id, question, hits)
        evidence = [
            {**h.definition.cite(), "score": round(h.score, 4), "chosen": n == chosen}
            for n, h in enumerate(hits, 1)
        ]
        output = {
            "page": page_id,
            "replica_id": self.replica.replica_id,
            "evidence": evidence,
            "asked": bool(hits),
            "faulted": faulted,
            "cached_tokens": cached,
        }
        await self._report(report_to, output)
        return output

    async def _source(self, page_id: str, record: Any, given: str | None) -> str:
        """The mapped folder to read the page's files from: the one the coordinator researches
        when it holds the page (a page shared by two mappings names the last one), else the
        page's own."""
        assert self.pages is not None
        if given and given != record.source_id:
            source = await self.pages.source(given)
            if source is not None and page_id in source.page_ids:
                return given
        return str(record.source_id)

    async def _judge(self, page_id: str, question: str, hits: list[Scored]) -> tuple[int, int, int]:
        """(the number the model chose, pages faulted in, cached prompt tokens)."""
        assert self.replica is not None and self.agent is not None
        candidates = "\n".join(candidate_line(n, h) for n, h in enumerate(hits, 1))
        request = {
            "messages": [
                ChatMessage(role="system", content=JUDGE_SYSTEM).model_dump(),
                ChatMessage(
                    role="user", content=JUDGE_ASK.format(question=question, candidates=candidates)
                ).model_dump(),
            ],
            "max_tokens": 24,
            "temperature": 0.0,
            "response_format": choice_schema(len(hits)),
        }
        answer = await generate_when_a_slot_frees(self.replica, request, page_id, self.agent.agent_id)
        cached = int(answer.get("usage", {}).get("cached_tokens", 0))
        self.agent.record_page_access([page_id], self.replica.replica_id, cached)
        parsed = answer.get("parsed")
        choice = parsed.get("choice") if isinstance(parsed, dict) else None
        valid = isinstance(choice, int) and not isinstance(choice, bool) and 1 <= choice <= len(hits)
        return (choice if valid else 1), len(answer.get("faulted") or []), cached

    async def _report(self, report_to: dict[str, Any] | None, output: dict[str, Any]) -> None:
        if report_to is None or self.agent is None:
            return
        try:
            target = ReportTo.model_validate(report_to)
        except ValueError as exc:
            log.warning("worker %s: bad report_to: %s", self.agent.agent_id, exc)
            return
        found = [e for e in output["evidence"] if e["chosen"]] + [
            e for e in output["evidence"] if not e["chosen"]
        ]
        data = {
            "worker": self.agent.agent_id,
            "page": output["page"],
            "replica_id": output["replica_id"],
            "faulted": output["faulted"],
            "found": [{k: e[k] for k in ("path", "line", "name", "chosen")} for e in found[:3]],
        }
        settings = self.agent.colony_settings() if hasattr(self.agent, "colony_settings") else None
        await emit_child_event(
            self.agent.blackboard, self.agent, target, self.agent.agent_id, EVIDENCE, data, settings
        )


def research_worker_blueprint(agent_id: str) -> AgentBlueprint:
    """A research worker (its page is set by the coordinator: `bound_pages`, preferred by placement)."""
    return AgentBlueprint(
        agent_class=Agent,
        metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.VCM_BOUND, role="research-worker"),
        capabilities=[
            EvidenceCapability.bind(),
            AgentRunCapability.bind(namespace=RUNS_NAMESPACE, one_shot=True),
        ],
        action_policy=ScriptedActionPolicy.bind(
            steps=[
                {
                    "action": "gather_evidence",
                    "parameters": {
                        "question": "$input.question",
                        "report_to": "$input.report_to",
                        "source_id": "$input.source_id",
                    },
                }
            ]
        ),
        resources=ResourceRequirements(memory_mb=32),
    )
