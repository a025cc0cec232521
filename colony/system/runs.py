"""Runs submitted over the API, kept entirely in Redis.

Submitting writes a run record (`run:{id}` in the colony's `api` namespace) and an AgentRunProtocol
request (`request:run:{id}`) into the agent's `runs` namespace, where its AgentRunCapability serves
it. A run's status is read from what is there: a result → its status; past its deadline → it is
failed with a timeout (written create-only, so the agent's late answer does not overwrite it);
claimed → running (suspended while its agent is); else queued. Nothing lives in API memory, so
runs survive API restarts.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, Field

from colony import metrics
from colony.agents.handle import TERMINAL_EVENTS
from colony.agents.models import new_id
from colony.blackboard import AgentRunProtocol, Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol, ApiRunProtocol
from colony.errors import AgentNotFound, ConcurrentModificationError, RunNotFound
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.registry import AgentRegistry

RunStatusName = Literal["queued", "running", "suspended", "succeeded", "failed", "cancelled"]
API_WRITER = "api"


class RunRecord(BaseModel):
    run_id: str
    agent: str
    namespace: str = RUNS_NAMESPACE
    created_at: float = Field(default_factory=time.time)
    deadline: float | None = None
    events_from: str = "0-0"
    pages: list[str] = Field(default_factory=list)


class RunView(BaseModel):
    run_id: str
    agent: str
    status: RunStatusName
    output: Any = None
    error: str | None = None
    created_at: float
    updated_at: float


class RunService:
    def __init__(
        self,
        blackboard: Blackboard,
        registry: AgentRegistry,
        *,
        tenant_id: str = "default",
        colony_id: str = "default",
    ) -> None:
        self.tenant_id, self.colony_id = tenant_id, colony_id
        self.api_board = blackboard.scoped(
            scope_id(BlackboardScope.COLONY, tenant_id=tenant_id, colony_id=colony_id, namespace="api")
        )
        self._root = blackboard
        self.registry = registry
        self._counted: dict[str, None] = {}  # runs whose end this process has counted (bounded)

    def agent_scope(self, agent: str) -> str:
        return scope_id(
            BlackboardScope.AGENT, tenant_id=self.tenant_id, colony_id=self.colony_id, agent_id=agent
        )

    def run_board(self, record: RunRecord) -> Blackboard:
        return self._root.scoped(
            AgentRunProtocol.namespaced_scope(self.agent_scope(record.agent), record.namespace)
        )

    async def submit(
        self,
        agent: str,
        input_data: Any,
        *,
        namespace: str = RUNS_NAMESPACE,
        timeout_s: float | None = None,
        pages: list[str] | None = None,
    ) -> RunRecord:
        if await self.registry.get(agent) is None:
            raise AgentNotFound(f"no agent named {agent!r}; GET /v1/agents lists them")
        run_id = new_id("run")
        record = RunRecord(
            run_id=run_id,
            agent=agent,
            namespace=namespace,
            pages=pages or [],
            deadline=time.time() + timeout_s if timeout_s else None,
        )
        board = self.run_board(record)
        record.events_from = await board.latest_event_id()
        await self.api_board.write(ApiRunProtocol.run_key(run_id), record, created_by=API_WRITER)
        await board.write(
            AgentRunProtocol.request_key(run_id),
            {"input": input_data, "requester": API_WRITER, "agent_id": agent, "pages": record.pages},
            created_by=API_WRITER,
        )
        metrics.RUNS_SUBMITTED.labels(agent if agent in ("echo", "ask") else "custom").inc()
        return record

    async def record(self, run_id: str) -> RunRecord:
        entry = await self.api_board.read(ApiRunProtocol.run_key(run_id))
        if entry is None:
            raise RunNotFound(f"no run {run_id!r}")
        return entry.value_as(RunRecord)

    async def get(self, run_id: str) -> RunView:
        record = await self.record(run_id)
        board = self.run_board(record)
        result, claim = await board.read_many(
            [AgentRunProtocol.result_key(run_id), AgentRunProtocol.claim_key(run_id)]
        )
        if result is None and record.deadline is not None and time.time() > record.deadline:
            result = await self._finish(record, "failed", "run timed out after its deadline")
        if result is not None:
            value = result.value
            status = {"succeeded": "succeeded", "cancelled": "cancelled"}.get(value.get("status"), "failed")
            self._count(record, status, result.created_at)
            return RunView(
                run_id=run_id,
                agent=record.agent,
                status=status,
                output=value.get("output"),
                error=value.get("error"),
                created_at=record.created_at,
                updated_at=result.updated_at,
            )
        status: RunStatusName = "queued"
        updated = record.created_at
        if claim is not None:
            status, updated = "running", claim.updated_at
            lifecycle = await self._root.scoped(self.agent_scope(record.agent)).read(
                AgentStateProtocol.key("lifecycle")
            )
            if lifecycle is not None and lifecycle.value.get("state") == "suspended":
                status = "suspended"
        return RunView(
            run_id=run_id, agent=record.agent, status=status, created_at=record.created_at, updated_at=updated
        )

    async def cancel(self, run_id: str) -> RunView:
        record = await self.record(run_id)
        await self._finish(record, "cancelled", "cancelled by the client")
        return await self.get(run_id)

    async def _finish(self, record: RunRecord, status: str, error: str) -> Any:
        """End a run from the API side (create-only: an answer already there stands)."""
        board = self.run_board(record)
        try:
            return await board.write(
                AgentRunProtocol.result_key(record.run_id),
                {"status": status, "output": None, "error": error, "run_id": None, "steps": 0},
                created_by=API_WRITER,
                expected_version=0,
            )
        except ConcurrentModificationError:
            return await board.read(AgentRunProtocol.result_key(record.run_id))

    def _count(self, record: RunRecord, status: str, finished_at: float) -> None:
        if record.run_id in self._counted:
            return
        self._counted[record.run_id] = None
        if len(self._counted) > 100_000:
            self._counted.pop(next(iter(self._counted)))
        metrics.RUNS_COMPLETED.labels(status).inc()
        metrics.RUN_DURATION_SECONDS.observe(max(0.0, finished_at - record.created_at))

    async def events(
        self, run_id: str, last_event_id: str | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event id, event) pairs of the run, from the start or after `last_event_id`, ending with
        its terminal event. A run ended by the API (cancel, timeout) gets a terminal event here."""
        record = await self.record(run_id)
        board = self.run_board(record)
        subscription = board.subscribe(f"*:run:{run_id}*", from_id=last_event_id or record.events_from)
        result_key = AgentRunProtocol.result_key(run_id)
        try:
            while True:
                event = await subscription.next(timeout=1.0)
                if event is None:
                    if record.deadline is not None and time.time() > record.deadline:
                        await self._finish(record, "failed", "run timed out after its deadline")
                    continue
                if event.op != "write":
                    continue
                if event.key == result_key:
                    if event.created_by == API_WRITER:
                        entry = await board.read(result_key)
                        status = entry.value.get("status", "failed") if entry else "failed"
                        yield (
                            event.id,
                            {
                                "event_type": status if status == "cancelled" else "failed",
                                "data": {"error": entry.value.get("error") if entry else None},
                                "request_id": run_id,
                            },
                        )
                        return
                    continue  # the agent's terminal event follows its result
                identified = AgentRunProtocol.identify(event.key)
                if identified is None or identified[0] != "event":
                    continue
                entry = await board.read(event.key)
                if entry is None:
                    continue
                yield event.id, entry.value
                if entry.value.get("event_type") in TERMINAL_EVENTS:
                    return
        finally:
            subscription.close()
