"""AgentCapability: the extension point of agents, in the seed's four modes.

1. local: runs inside its agent, on the agent's own scope (the default);
2. remote: a parent watching a child's scope (`scope_id=child_agent_id`);
3. shared: several agents on one scope (a game, a task pool);
4. detached: no agent at all (external code talking to agents through the blackboard).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from colony.agents.actions import ACTION_ATTR, ActionSpec, discover_actions
from colony.agents.blueprint import Bindable
from colony.agents.events import EVENT_HANDLER_ATTR
from colony.agents.hooks import HOOK_HANDLER_ATTR, HookHandlerSpec
from colony.aio import cancel_and_wait
from colony.blackboard import Blackboard, BlackboardEvent, BlackboardScope, scope_id
from colony.blackboard.connection import OutageBackoff
from colony.blackboard.protocol import AgentRunProtocol, RequestResultProtocol
from colony.config import ColonySettings
from colony.errors import AgentUsageError, BlackboardUnavailable
from colony.wire.tenants import tenant_of

if TYPE_CHECKING:
    from colony.agents.base import Agent

log = logging.getLogger(__name__)


class CapabilityMode(StrEnum):
    LOCAL = "local"
    REMOTE = "remote"
    SHARED = "shared"
    DETACHED = "detached"


@runtime_checkable
class BlackboardPublishable(Protocol):
    """A record that knows its own key (built through a protocol class)."""

    def blackboard_key(self) -> str: ...


def resolve_scope(
    agent: Agent | None,
    scope_ref: str | None,
    scope: BlackboardScope,
    namespace: str | None,
) -> str:
    """The full scope id a capability works on.

    `scope_ref` is a full scope id (has ':'), or a bare id read according to `scope`: an agent id
    (AGENT), a session id (SESSION), or a namespace of the colony scope (COLONY, e.g. a game id).
    """
    tenant = agent.metadata.tenant_id if agent else "default"
    colony = agent.metadata.colony_id if agent else "default"
    if scope_ref is None:
        if agent is None:
            raise AgentUsageError("a detached capability needs a scope_id")
        base = agent.scope_id
    elif ":" in scope_ref:
        base = scope_ref
    elif scope is BlackboardScope.AGENT:
        base = scope_id(BlackboardScope.AGENT, tenant_id=tenant, colony_id=colony, agent_id=scope_ref)
    else:  # a scope shared by agents: their tenant's (read from the id, colony.wire.tenants)
        owner = tenant_of(agent.agent_id, tenant) if agent else tenant
        if scope is BlackboardScope.SESSION:
            base = scope_id(BlackboardScope.SESSION, tenant_id=owner, colony_id=colony, session_id=scope_ref)
        else:
            base = scope_id(scope, tenant_id=owner, colony_id=colony, namespace=scope_ref)
    return RequestResultProtocol.namespaced_scope(base, namespace) if namespace else base


def _mode(agent: Agent | None, base: str, scope_ref: str | None, scope: BlackboardScope) -> CapabilityMode:
    if agent is None:
        return CapabilityMode.DETACHED
    if base == agent.scope_id:
        return CapabilityMode.LOCAL
    if scope is BlackboardScope.AGENT and scope_ref is not None and ":" not in scope_ref:
        return CapabilityMode.REMOTE
    return CapabilityMode.SHARED


class AgentCapability(Bindable):
    """Base class of capabilities: actions, hooks, event handlers and state of one concern."""

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        capability_key: str | None = None,
        scope: BlackboardScope = BlackboardScope.AGENT,
        namespace: str | None = None,
    ) -> None:
        self.agent = agent
        self.capability_key = capability_key or type(self).__name__
        self.scope_id = resolve_scope(agent, scope_id, scope, namespace)
        self.mode = _mode(agent, resolve_scope(agent, scope_id, scope, None), scope_id, scope)
        source = blackboard or (agent.blackboard if agent is not None else None)
        self._board = source.scoped(self.scope_id) if source is not None else None
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def name(self) -> str:
        """The name the agent knows this capability by."""
        return self.capability_key

    @property
    def blackboard(self) -> Blackboard:
        """The blackboard of this capability's scope (its agent's, or the one it was given)."""
        if self._board is None:
            raise AgentUsageError(
                f"capability {self.capability_key} has no blackboard: build it with agent= or blackboard="
            )
        return self._board

    async def publish(
        self, record: Any, *, tags: set[str] | frozenset[str] = frozenset(), key: str | None = None
    ) -> Any:
        """Write `record` under the key its protocol gives (`record.blackboard_key()`), or `key`."""
        if key is None:
            if not isinstance(record, BlackboardPublishable):
                raise TypeError(
                    f"{type(record).__name__} has no blackboard_key(); "
                    "pass key= or implement BlackboardPublishable"
                )
            key = record.blackboard_key()
        creator = self.agent.agent_id if self.agent is not None else None
        return await self.blackboard.write(key, record, tags=tags, created_by=creator)

    def stream_events_to_queue(
        self, queue: asyncio.Queue[BlackboardEvent], pattern: str = "*", *, from_id: str = "$"
    ) -> asyncio.Task[None]:
        """Forward this scope's events matching `pattern` into `queue` until `close()`; a Redis
        outage pauses the forwarding (retried with bounded backoff), it goes on after the last
        event forwarded."""
        subscription = self.blackboard.subscribe(pattern, from_id=from_id)

        async def forward() -> None:
            outage = OutageBackoff(f"{self.name}: events of {self.scope_id}", log)
            while True:
                try:
                    event = await subscription.next()
                except BlackboardUnavailable as exc:
                    await outage.wait(exc)
                    continue
                outage.recovered()
                if event is None:
                    return
                await queue.put(event)

        task = asyncio.create_task(forward(), name=f"{self.name}-events")
        self._tasks.append(task)
        return task

    async def get_result_future(
        self, request_id: str | None = None, *, protocol: type[RequestResultProtocol] = AgentRunProtocol
    ) -> asyncio.Future[Any]:
        """A future resolved with the value of the first result (of `request_id`, or any) on this scope."""
        board = self.blackboard
        pattern = protocol.result_pattern(request_id)
        subscription = await board.subscribe(pattern).start()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if request_id is not None:
            existing = await board.read(protocol.result_key(request_id))
            if existing is not None:
                future.set_result(existing.value)
                subscription.close()
                return future

        async def wait() -> None:
            try:
                while not future.done():  # a cancelled future (caller gave up) ends the wait too
                    event = await subscription.next(timeout=1.0)
                    if event is not None and event.op == "write":
                        entry = await board.read(event.key)
                        if entry is not None and not future.done():
                            future.set_result(entry.value)
            except Exception as exc:  # surface blackboard failures through the future
                if not future.done():
                    future.set_exception(exc)
            finally:
                subscription.close()

        self._tasks.append(asyncio.create_task(wait(), name=f"{self.name}-result"))
        return future

    async def start(self) -> None:
        """Called when the hosting agent starts (also after a restore): start background work here."""

    def available_actions(self) -> set[str] | None:
        """The actions that make sense now (None = all): the planner only sees these. A capability
        with a workflow narrows the choice step by step."""
        return None

    def get_state(self) -> dict[str, Any]:
        """JSON state persisted with the agent after every step (override to keep yours)."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what `get_state` returned (after a suspension or replica loss)."""

    async def close(self) -> None:
        """Stop the background tasks this capability started."""
        await cancel_and_wait(self._tasks)
        self._tasks.clear()


class CapabilityParts(NamedTuple):
    """What a capability class contributes, found once per class (attribute names with their specs)."""

    actions: list[tuple[str, ActionSpec]]
    hooks: list[tuple[str, HookHandlerSpec]]
    handlers: list[tuple[str, str]]


_PARTS: weakref.WeakKeyDictionary[type, CapabilityParts] = weakref.WeakKeyDictionary()


def _unbound(*args: Any, **kwargs: Any) -> Any:
    """The method of a cached action spec: `add_capability` binds each action to its instance."""
    raise AgentUsageError(
        "an action from capability_parts() is not bound to a capability; add it with add_capability"
    )


def capability_parts(capability: AgentCapability) -> CapabilityParts:
    """The actions (with their parameter models), hooks and event handlers of the capability's
    class. Discovering them (a pydantic model per action, a scan of the class) cost about a
    millisecond per capability, paid by every spawn and restore; they depend on the class only, so
    they are found once and bound to each instance (`add_capability`: the cached specs' `method`
    is a placeholder that raises)."""
    cls = type(capability)
    parts = _PARTS.get(cls)
    if parts is not None:
        return parts
    # discover_actions walks dir(cls) keeping the members marked as actions: the same walk here
    # gives each spec its attribute name (whatever the member is: method, staticmethod, classmethod)
    attrs = [attr for attr in dir(cls) if getattr(getattr(cls, attr, None), ACTION_ATTR, None) is not None]
    # cached unbound: a spec bound to this instance would keep it (and its agent, and through it
    # the class, the cache's own key) alive for as long as the process runs
    actions = [
        (attr, dataclasses.replace(spec, method=_unbound))
        for attr, spec in zip(attrs, discover_actions(capability), strict=True)
    ]
    hooks: list[tuple[str, HookHandlerSpec]] = []
    handlers: list[tuple[str, str]] = []
    for attr in dir(cls):
        member = getattr(cls, attr, None)
        hook: HookHandlerSpec | None = getattr(member, HOOK_HANDLER_ATTR, None)
        if hook is not None:
            hooks.append((attr, hook))
        pattern = getattr(member, EVENT_HANDLER_ATTR, None)
        if pattern is not None:
            handlers.append((attr, pattern))
    parts = _PARTS[cls] = CapabilityParts(actions, hooks, handlers)
    return parts


def agent_settings(capability: AgentCapability) -> ColonySettings:
    """The settings of the agent `capability` belongs to (its host's: `Agent.colony_settings`), for a
    capability built without `settings=`. Never looked up from the environment."""
    if capability.agent is None:
        raise AgentUsageError(
            f"capability {capability.name} has neither an agent nor settings: give it settings="
        )
    return capability.agent.colony_settings()
