"""Child agents of an agent: placed from the catalog as one-shot workers, asked one task each,
waited for, restarted once when they fail (`ChildAgents`, the machinery under the meta-actions of
colony.system.collaborate and the `research` coordinator).

A child is an agent of the colony's catalog (a built-in or an operator's agent: never code a request
or a model names), placed through the control plane as a one-shot worker of this agent: it answers
the one task it is given and stops. Placement puts it where the pages it is given are held
(`pages`: preferred pages). A call that must wait for children returns *blocked* with their ids:
the agent is suspended with CHILDREN_COMPLETED, and the resumption monitor resumes it once every
one of them has stopped; the same call, made again, finds their answers.

Exactly once: a call's children and their requests are named from the run, the action and its
parameters (`call_id`), so the same call redone (after a crash, or after the resume) finds the
children and requests it made, never starts a second set: placing a placed id finds it, and a
request is written create-only. Fan-out is bounded per run and per agent; a call past a bound fails
naming it. Children inherit this agent's priority.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from colony.agents import (
    ActionResult,
    Agent,
    AgentBlueprint,
    AgentCapability,
    AgentHandle,
    AgentRunCapability,
)
from colony.agents.blueprint import Blueprint, CapabilitySpec
from colony.agents.models import RunServing
from colony.agents.state.log_records import effect_id
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol
from colony.errors import AgentUsageError
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.registry import DONE_STATES

if TYPE_CHECKING:
    from colony.system.host import Spawner

log = logging.getLogger(__name__)
# `session` starts sessions for clients; `analyze` and `research` need a folder or pages, not a task
NOT_SPAWNABLE = frozenset({"session", "analyze", "research"})
MAX_CALLS_KEPT = 64
MAX_TASK_CHARS = 8000
Task = Annotated[str, Field(min_length=1, max_length=MAX_TASK_CHARS)]
CatalogName = Annotated[str, Field(min_length=1, max_length=64)]
PageIds = Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=64)]


class ChildAgents(AgentCapability):
    """An agent's children: what the meta-actions and coordinators start them with. `agents`: the
    catalog names this agent may start (None: every catalog agent but `session`, `analyze` and
    `research`); `max_children_per_run`, `max_children`: fan-out bounds (children of one run;
    children not yet answered); `restart_failed`: start a failed child again once."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        spawner: Spawner | None = None,
        settings: Any = None,
        agents: list[str] | None = None,
        max_children_per_run: int = 8,
        max_children: int = 16,
        restart_failed: bool = True,
        capability_key: str | None = None,
    ) -> None:
        key = capability_key or self.DEFAULT_KEY
        super().__init__(agent, scope_id, blackboard=blackboard, capability_key=key)
        self.spawner = spawner
        self.settings = settings
        self.allowed = list(agents) if agents is not None else None
        self.max_children_per_run = max_children_per_run
        self.max_children = max_children
        self.restart_failed = restart_failed
        # call id -> {"run_id", "action", "name", "task", "pages", "children": {child id: request
        # id}, "retries": {child: [retry id, request id]}, "unrestarted": {child: why}, "settled"}
        self.calls: dict[str, dict[str, Any]] = {}

    DEFAULT_KEY = "children"

    def get_state(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def set_state(self, state: dict[str, Any]) -> None:
        held = state.get("calls")
        self.calls = dict(held) if isinstance(held, dict) else {}

    # -- the catalog --------------------------------------------------------------------------------

    def _catalog(self) -> dict[str, Any]:
        from colony.system.catalog import catalog_factories  # (the catalog imports built-ins using this)

        names = catalog_factories(self.settings or self._agent().colony_settings())
        names = {n: f for n, f in names.items() if n not in NOT_SPAWNABLE}
        if self.allowed is not None:
            names = {n: f for n, f in names.items() if n in self.allowed}
        return names

    def _agent(self) -> Agent:
        if self.agent is None:
            raise AgentUsageError("CollaborationCapability works for an agent; build it with agent=...")
        return self.agent

    def child_blueprint(self, name: str, child_id: str, pages: list[str]) -> AgentBlueprint:
        """Catalog agent `name` as this agent's one-shot child `child_id` (preferring `pages`)."""
        catalog = self._catalog()
        if name not in catalog:
            raise AgentUsageError(
                f"no agent {name[:64]!r} to start; you may start: {', '.join(sorted(catalog))}"
            )
        made: AgentBlueprint = catalog[name](child_id)
        parent = self._agent()
        metadata = made.metadata.model_copy(
            update={"agent_id": child_id, "parent_id": parent.agent_id, "priority": parent.metadata.priority}
        )
        resources = (
            made.resources.model_copy(update={"preferred_pages": list(pages)}) if pages else made.resources
        )
        capabilities = [_one_shot(c) for c in made.capabilities]
        return made.model_copy(
            update={
                "metadata": metadata,
                "capabilities": capabilities,
                "resources": resources,
                "serving": RunServing(),
            }
        )

    # -- calls -------------------------------------------------------------------------------------------

    def _call(self, action: str, parameters: dict[str, Any]) -> str:
        """This call's id: from the run, the action and its parameters."""
        run = self._agent().current_run
        run_id = run.run_id if run is not None else "none"
        return effect_id(run_id, action, json.dumps(parameters, sort_keys=True, default=str), length=10)

    def _keep(self, call_id: str, record: dict[str, Any]) -> None:
        """Keep a call that starts children; past MAX_CALLS_KEPT the oldest settled one goes (all
        its children answered: the bounds count only those working, never more than max_children)."""
        self.calls[call_id] = record
        while len(self.calls) > MAX_CALLS_KEPT:
            settled = next((c for c, r in self.calls.items() if r.get("settled")), None)
            self.calls.pop(settled if settled is not None else next(iter(self.calls)))

    def _children(self, run_id: str | None = None, *, retries: bool = True) -> dict[str, str]:
        """Child id -> request id, of every call (of the run `run_id`), their retries too unless
        `retries` is false (a retry answers for the child it replaces)."""
        out: dict[str, str] = {}
        for record in self.calls.values():
            if run_id is None or record.get("run_id") == run_id:
                out.update(record.get("children") or {})
                if retries:
                    out.update({r[0]: r[1] for r in (record.get("retries") or {}).values()})
        return out

    async def _start(
        self,
        call_id: str,
        action: str,
        name: str,
        task: str,
        count: int,
        pages: list[str],
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Place `count` children for the call (those it placed already are found) and ask each
        (`extra`: more fields of their input); the call's record. A call naming no agent it may
        start, or past a bound, starts none and is not kept."""
        if self.spawner is None:
            raise AgentUsageError("starting agents needs a replica with a control plane (no spawner here)")
        parent = self._agent()
        record = self.calls.get(call_id)
        if record is None:
            self.child_blueprint(name, "checked", pages)  # an agent it may not start: refused here
            run = parent.current_run
            run_id = run.run_id if run is not None else "none"
            await self._check_fan_out(run_id, count)
            record = {
                "run_id": run_id,
                "action": action,
                "name": name,
                "task": task,
                "pages": pages,
                "children": {},
                **({"extra": extra} if extra else {}),
            }
            self._keep(call_id, record)
        held = record["children"]
        known = len(held)
        own = parent.agent_id
        prefix = own if len(own) <= 60 else f"{own[:40]}-{effect_id(own, length=8)}"
        for n in range(count):
            child_id = f"{prefix}-{call_id}-{n}"
            request_id = f"req-{call_id}-{n}"
            handle = AgentHandle(child_id, owner=parent)
            if await handle.result(request_id, namespace=RUNS_NAMESPACE) is None:
                await self.spawner(self.child_blueprint(name, child_id, pages))
            await handle.submit(_child_input(record), namespace=RUNS_NAMESPACE, request_id=request_id)
            held[child_id] = request_id
        if len(held) > known:  # (a call made again after its resume started nobody new)
            await parent.emit_run_event("children", {"agents": sorted(held), "blueprint": name})
        return record

    async def _check_fan_out(self, run_id: str, fresh: int) -> None:
        of_run = len(self._children(run_id))
        if of_run + fresh > self.max_children_per_run:
            raise AgentUsageError(
                f"fan-out limit: this run has started {of_run} agents and may start "
                f"{self.max_children_per_run}; wait_for them, or cancel_children, before asking more"
            )
        waiting = [c for c, _ in (await self._results(self._children())).items() if _ is None]
        if len(waiting) + fresh > self.max_children:
            raise AgentUsageError(
                f"fan-out limit: {len(waiting)} of your agents are still working "
                f"(at most {self.max_children}); wait_for them first"
            )

    async def _results(self, children: dict[str, str]) -> dict[str, Any]:
        """Child id -> its answer ({"status", "output", "error"}), None while it works; a child
        that stopped without answering (stopped by the operator, its run lost) is a failure."""
        parent = self._agent()
        out: dict[str, Any] = {}
        for child_id, request_id in children.items():
            run = await AgentHandle(child_id, owner=parent).result(request_id, namespace=RUNS_NAMESPACE)
            if run is not None:
                out[child_id] = {"status": run.status.value, "output": run.output, "error": run.error}
            elif await self._ended(child_id):
                out[child_id] = {"status": "failed", "output": None, "error": "it stopped without answering"}
            else:
                out[child_id] = None
        for record in self.calls.values():  # calls whose children all answered: settled
            mine = record.get("children") or {}
            if mine and all(out.get(c) is not None for c in mine):
                record["settled"] = True
        return out

    async def _ended(self, child_id: str) -> bool:
        """Whether the child stopped (or failed), by its lifecycle: the source of truth."""
        agent = self._agent()
        meta = agent.metadata
        scope = scope_id(
            BlackboardScope.AGENT, tenant_id=meta.tenant_id, colony_id=meta.colony_id, agent_id=child_id
        )
        held = await agent.blackboard.scoped(scope).read(AgentStateProtocol.key("lifecycle"))
        return held is not None and isinstance(held.value, dict) and held.value.get("state") in DONE_STATES

    async def _waited(self, children: dict[str, str], then: Any) -> ActionResult:
        """Blocked on the children still working, or `then(answers)` once all have answered. A
        child that failed is started again once (`restart_failed`, a fresh child with the same task):
        its retry's answer stands in for it, marked `retried`. A retry that cannot be started leaves
        the failure as the answer, saying so."""
        retries, tried = self._retries(), self._restarts_tried()
        current = {c: retries.get(c, (c, r)) for c, r in children.items()}
        raw = await self._results(dict(current.values()))
        answers = {c: raw[current[c][0]] for c in children}
        again = [
            c for c, a in answers.items() if a is not None and a["status"] == "failed" and c not in tried
        ]
        for child in again if self.restart_failed else []:
            started = await self._retry(child)
            if started is not None:
                current[child], answers[child] = started, None
        for record in self.calls.values():  # calls whose children (or their retries) all answered
            mine = record.get("children") or {}
            if mine and all(answers.get(c) is not None for c in mine):
                record["settled"] = True
        working = sorted(current[c][0] for c, a in answers.items() if a is None)
        if working:
            return ActionResult(
                success=True,
                blocked=True,
                blocked_reason=f"waiting for {len(working)} of {len(answers)} agents",
                blocking_agent_ids=working,
            )
        retries, unstarted = self._retries(), self._restarts_tried()
        marked = {
            c: {**a, "retried": True}
            if c in retries
            else {**a, "not_restarted": unstarted[c]}
            if c in unstarted
            else a
            for c, a in answers.items()
        }
        return ActionResult(success=True, output=then(marked))

    def _retries(self) -> dict[str, tuple[str, str]]:
        """Failed child -> (its retry's id, request id), of every call."""
        out: dict[str, tuple[str, str]] = {}
        for record in self.calls.values():
            out.update({c: (r[0], r[1]) for c, r in (record.get("retries") or {}).items()})
        return out

    def _restarts_tried(self) -> dict[str, str]:
        """Failed child -> why its retry could not start ("" when it did), of every call."""
        out: dict[str, str] = {}
        for record in self.calls.values():
            out.update(dict.fromkeys(record.get("retries") or {}, ""))
            out.update(record.get("unrestarted") or {})
        return out

    async def _retry(self, child: str) -> tuple[str, str] | None:
        """Start a fresh child in place of failed `child` (its call's agent kind, task and pages);
        None, and the reason kept, when it cannot be started (no spawner here, no room)."""
        record = next(r for r in self.calls.values() if child in (r.get("children") or {}))
        retry, request_id = f"{child}-r", f"{record['children'][child]}-r"
        handle = AgentHandle(retry, owner=self._agent())
        try:
            if self.spawner is None:
                raise AgentUsageError("no control plane here to start it with")
            if await handle.result(request_id, namespace=RUNS_NAMESPACE) is None:
                await self.spawner(self.child_blueprint(record["name"], retry, record.get("pages") or []))
            await handle.submit(_child_input(record), namespace=RUNS_NAMESPACE, request_id=request_id)
        except Exception as exc:
            log.warning("agent %s: %s not restarted: %r", self._agent().agent_id, child, exc)
            record.setdefault("unrestarted", {})[child] = f"{type(exc).__name__}: {exc}"[:300]
            return None
        record.setdefault("retries", {})[child] = [retry, request_id]
        record.pop("settled", None)
        await self._agent().emit_run_event("child_restarted", {"agent": child, "retry": retry})
        return retry, request_id


def _child_input(record: dict[str, Any]) -> dict[str, Any]:
    """What a call's children are asked: the task (as `task` and `question`) and the call's extra fields."""
    extra = record.get("extra")
    return {**(extra if isinstance(extra, dict) else {}), "task": record["task"], "question": record["task"]}


def _one_shot(capability: Blueprint[Any] | CapabilitySpec) -> Blueprint[Any] | CapabilitySpec:
    """The run capability of a catalog blueprint made one-shot (the child stops once answered)."""
    blueprint = capability.blueprint if isinstance(capability, CapabilitySpec) else capability
    if not (isinstance(blueprint.cls, type) and issubclass(blueprint.cls, AgentRunCapability)):
        return capability
    made = Blueprint(blueprint.cls, {**blueprint.kwargs, "one_shot": True})
    return (
        capability.model_copy(update={"blueprint": made}) if isinstance(capability, CapabilitySpec) else made
    )
