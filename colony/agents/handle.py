"""AgentHandle: send work to an agent over the blackboard and get its result or its events.

Parent (or any detached code) writes `request:run:{id}` into the child's namespaced scope; the
child's `AgentRunCapability` (same namespace) sees it through an event handler, runs the agent,
emits `event:run:{id}:{seq}.{type}` entries as it goes and finally writes `result:run:{id}`.
The handle subscribes *before* writing the request, so nothing it waits for can slip past.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from colony.agents.models import AgentRun, RunStatus, new_id
from colony.blackboard import (
    Blackboard,
    BlackboardScope,
    EventSubscription,
    scope_id,
)
from colony.blackboard.protocol import AgentRunProtocol, RequestResultProtocol
from colony.errors import (
    AgentUsageError,
    ConcurrentModificationError,
    RunTimeout,
)
from colony.wire.run_events import TERMINAL_EVENTS, AgentRunEvent

if TYPE_CHECKING:
    from colony.agents.base import Agent

log = logging.getLogger(__name__)
MAX_CHILDREN_LISTED = 256  # requests listed under the one a run serves (its tree's branches)


class AgentHandle:
    """A reference to an agent that can be asked to run; works with an owner agent or detached."""

    def __init__(
        self,
        child_agent_id: str,
        owner: Agent | None = None,
        *,
        blackboard: Blackboard | None = None,
    ) -> None:
        self.child_agent_id = child_agent_id
        self.owner = owner
        self._blackboard = blackboard or (owner.blackboard if owner is not None else None)

    def _board(self, namespace: str, scope: BlackboardScope) -> Blackboard:
        """The child's namespaced partition: of its AGENT scope, or of the COLONY/TENANT scope."""
        if not namespace:
            raise AgentUsageError(
                "namespace is required: it names the capability on the child that handles the request"
            )
        if scope is BlackboardScope.SESSION:
            raise AgentUsageError("AgentHandle talks over AGENT, COLONY or TENANT scopes, not SESSION")
        tenant = self.owner.metadata.tenant_id if self.owner else "default"
        colony = self.owner.metadata.colony_id if self.owner else "default"
        base = scope_id(
            scope,
            tenant_id=tenant,
            colony_id=colony,
            agent_id=self.child_agent_id if scope is BlackboardScope.AGENT else None,
        )
        full = RequestResultProtocol.namespaced_scope(base, namespace)
        if self._blackboard is None:
            raise AgentUsageError(
                "an AgentHandle needs a blackboard to talk over: give it owner= (an agent) or blackboard="
            )
        return self._blackboard.scoped(full)

    async def _submit(
        self, board: Blackboard, protocol: type[RequestResultProtocol], input_data: Any
    ) -> tuple[str, EventSubscription]:
        request_id = new_id("req")
        events = await board.subscribe(f"*:{protocol.kind}:{request_id}*").start()
        await self._write_request(board, protocol, request_id, input_data)
        return request_id, events

    async def _write_request(
        self,
        board: Blackboard,
        protocol: type[RequestResultProtocol],
        request_id: str,
        input_data: Any,
        *,
        create_only: bool = False,
    ) -> None:
        requester = self.owner.agent_id if self.owner is not None else "detached"
        try:
            await board.write(
                protocol.request_key(request_id),
                {"input": input_data, "requester": requester, "agent_id": self.child_agent_id},
                tags={protocol.request_tag(request_id)},
                created_by=requester,
                expected_version=0 if create_only else None,
            )
        except ConcurrentModificationError:
            if not create_only:
                raise
            # written by an earlier call with this id: that request stands (it is the same one)

    async def submit(
        self,
        input_data: Any,
        *,
        protocol: type[RequestResultProtocol] = AgentRunProtocol,
        namespace: str,
        scope: BlackboardScope = BlackboardScope.AGENT,
        request_id: str | None = None,
    ) -> str:
        """Ask the agent to run `input_data` without waiting; its request id, for `result()`.
        (An agent that must wait for the answer blocks on the child instead, and is suspended.)
        With `request_id` (one the caller derived, e.g. from its action's idempotency key), the
        request is written create-only: submitting again under that id keeps the first request,
        so an action redone after a crash does not ask twice."""
        board = self._board(namespace, scope)
        if request_id is None:
            request_id = new_id("req")
            await self._write_request(board, protocol, request_id, input_data)
        else:
            await self._write_request(board, protocol, request_id, input_data, create_only=True)
        if scope is BlackboardScope.AGENT:
            await self._link(protocol, request_id)
        return request_id

    async def _link(self, protocol: type[RequestResultProtocol], request_id: str) -> None:
        """List the request among the children of the request the owner is serving now (the run
        tree, GET /v1/runs/{id}/tree), in the namespace that request is served in and with its tag,
        so they expire together: the newest MAX_CHILDREN_LISTED, and how many more there were.
        Nothing when the owner serves no request now. Best effort: a link that could not be written
        loses a tree branch only."""
        owner = self.owner
        run = owner.current_run if owner is not None else None
        if owner is None or run is None or run.done or not run.request_id:
            return
        parent = run.request_id
        serving = next(
            (c for c in owner.capabilities.values() if getattr(c, "active_request", None) == parent), None
        )
        namespace = getattr(serving, "namespace", None)
        if not isinstance(namespace, str) or not namespace:
            return
        child = {"agent_id": self.child_agent_id, "request_id": request_id}

        def add(held: Any) -> dict[str, Any]:
            held = held if isinstance(held, dict) else {}
            listed = [c for c in held.get("listed") or [] if isinstance(c, dict)]
            more = int(held.get("more") or 0) if isinstance(held.get("more"), int) else 0
            if child in listed:
                return {"listed": listed, "more": more}
            listed.append(child)
            return {
                "listed": listed[-MAX_CHILDREN_LISTED:],
                "more": more + max(0, len(listed) - MAX_CHILDREN_LISTED),
            }

        meta = owner.metadata
        owner_scope = scope_id(
            BlackboardScope.AGENT, tenant_id=meta.tenant_id, colony_id=meta.colony_id, agent_id=owner.agent_id
        )
        owner_board = owner.blackboard.scoped(RequestResultProtocol.namespaced_scope(owner_scope, namespace))
        try:
            await owner_board.update(
                protocol.children_key(parent),
                add,
                tags={protocol.request_tag(parent)},
                created_by=owner.agent_id,
            )
        except Exception as exc:  # the child's request stands; only the tree misses it
            log.warning(
                "agent %s: request %s not linked under %s: %r", owner.agent_id, request_id, parent, exc
            )

    async def cancel(
        self,
        request_id: str,
        *,
        protocol: type[RequestResultProtocol] = AgentRunProtocol,
        namespace: str,
        scope: BlackboardScope = BlackboardScope.AGENT,
    ) -> bool:
        """Answer a submitted request as cancelled (create-only: an answer already there stands);
        the agent working on it cancels its run at its next step. Whether this call cancelled it."""
        board = self._board(namespace, scope)
        requester = self.owner.agent_id if self.owner is not None else "detached"
        try:
            await board.write(
                protocol.result_key(request_id),
                {
                    "status": "cancelled",
                    "output": None,
                    "error": f"cancelled by {requester}",
                    "run_id": None,
                    "steps": 0,
                },
                tags={protocol.request_tag(request_id)},
                created_by=requester,
                expected_version=0,
            )
        except ConcurrentModificationError:
            return False
        return True

    async def result(
        self,
        request_id: str,
        *,
        protocol: type[RequestResultProtocol] = AgentRunProtocol,
        namespace: str,
        scope: BlackboardScope = BlackboardScope.AGENT,
    ) -> AgentRun | None:
        """The outcome of a submitted request, or None while it is not answered."""
        board = self._board(namespace, scope)
        result, request = await board.read_many(
            [protocol.result_key(request_id), protocol.request_key(request_id)]
        )
        if result is None:
            return None
        input_data = request.value.get("input") if request is not None else None
        started = request.created_at if request is not None else result.created_at
        return _run_from_result(self.child_agent_id, request_id, input_data, result.value, started)

    async def run(
        self,
        input_data: Any,
        *,
        protocol: type[RequestResultProtocol] = AgentRunProtocol,
        namespace: str,
        scope: BlackboardScope = BlackboardScope.AGENT,
        timeout: float | None = None,
    ) -> AgentRun:
        """Ask the agent to run `input_data`; its AgentRun once done. Raises `RunTimeout` on time."""
        board = self._board(namespace, scope)
        started = time.time()
        request_id, events = await self._submit(board, protocol, input_data)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                event = await events.next(_left(deadline))
                if event is None:
                    raise RunTimeout(
                        f"agent {self.child_agent_id} did not answer request {request_id} "
                        f"(namespace {namespace!r}) within {timeout}s"
                    )
                if event.op == "write" and event.key == protocol.result_key(request_id):
                    entry = await board.read(event.key)
                    if entry is not None:
                        return _run_from_result(
                            self.child_agent_id, request_id, input_data, entry.value, started
                        )
        finally:
            events.close()

    async def run_streamed(
        self,
        input_data: Any,
        *,
        protocol: type[RequestResultProtocol] = AgentRunProtocol,
        namespace: str,
        scope: BlackboardScope = BlackboardScope.AGENT,
        timeout: float | None = None,
    ) -> AsyncIterator[AgentRunEvent]:
        """Yield the run's events in order; the last one is `completed` (or `failed`)."""
        board = self._board(namespace, scope)
        request_id, events = await self._submit(board, protocol, input_data)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                event = await events.next(_left(deadline))
                if event is None:
                    raise RunTimeout(
                        f"run {request_id} of agent {self.child_agent_id} did not finish in {timeout}s"
                    )
                identified = protocol.identify(event.key)
                if event.op != "write" or identified is None or identified[0] != "event":
                    continue
                entry = await board.read(event.key)
                if entry is None:
                    continue
                run_event = AgentRunEvent.model_validate(entry.value)
                yield run_event
                if run_event.event_type in TERMINAL_EVENTS:
                    return
        finally:
            events.close()


def _left(deadline: float | None) -> float | None:
    """Seconds until `deadline` (None = no deadline), never negative."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _run_from_result(
    agent_id: str, request_id: str, input_data: Any, value: dict[str, Any], started: float
) -> AgentRun:
    return AgentRun(
        run_id=value.get("run_id") or request_id,
        agent_id=agent_id,
        input=input_data,
        status=RunStatus(value.get("status", RunStatus.SUCCEEDED)),
        output=value.get("output"),
        error=value.get("error"),
        steps=int(value.get("steps", 0)),
        started_at=started,
        finished_at=time.time(),
    )
