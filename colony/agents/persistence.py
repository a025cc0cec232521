"""Persisting an agent to its blackboard scope and rebuilding it from there.

`persist_agent` writes everything an agent holds (run, policy and capability states, context) in
one transaction; `restore_agent` rebuilds an identical agent from it; `build_agent` instantiates
an agent from a blueprint (no I/O). `Agent.persist` / `Agent.restore` call these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from colony.agents.blueprint import AgentBlueprint, Blueprint, CapabilitySpec, fail_refused_agent
from colony.agents.models import ActionResult, AgentMetadata, AgentRun, AgentState, SuspensionRequest
from colony.agents.ring import ContextRing
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.errors import AgentNotFound, BlueprintTampered

if TYPE_CHECKING:
    from colony.agents.base import Agent

# Context entries an agent keeps (a ring: the oldest go first; compaction comes with context management).
MAX_CONTEXT_ITEMS = 1000
# The agent's own state entries (besides its runs, its capabilities' states and its context ring).
STATE_NAMES = ("blueprint", "metadata", "lifecycle", "current_run", "policy_state", "context", "suspension")


async def persist_agent(agent: Agent) -> None:
    """Write the run, policy state, capability states and context in one transaction.

    The context goes by appends (only entries added since the last persist) to a capped list;
    the `context` entry holds the small rest (its position, the last result, page accesses).
    A finished run's record expires after the retention. Entries an event handler appends while
    the transaction commits stay pending for the next persist."""
    context = agent.context
    pending, position = context.pending(), len(context)
    async with agent.blackboard.transaction() as tx:
        if agent.current_run is not None:
            run = agent.current_run
            tx.write(
                Keys.run_key(run.run_id),
                run.model_dump(mode="json"),
                created_by=agent.agent_id,
                ttl_seconds=agent.retention_seconds if run.done else None,
            )
            tx.write(Keys.key("current_run"), run.run_id, created_by=agent.agent_id)
        if agent.action_policy is not None:
            tx.write(Keys.key("policy_state"), agent.action_policy.get_state(), created_by=agent.agent_id)
        for name, capability in agent.capabilities.items():
            state = {"state": capability.get_state(), "events_from": agent._event_positions.get(name)}
            tx.write(Keys.capability_state_key(name), state, created_by=agent.agent_id)
        last = agent.last_result.model_dump(mode="json") if agent.last_result else None
        tx.ring_push(Keys.key("context"), pending, context.cap)
        tx.write(
            Keys.key("context"),
            {"context_total": position, "last_result": last, "page_accesses": agent.page_accesses},
            created_by=agent.agent_id,
        )
    context.mark_persisted(position)


async def restore_agent(
    agent_id: str,
    blackboard: Blackboard,
    *,
    tenant_id: str = "default",
    colony_id: str = "default",
    **services: Any,
) -> Agent:
    """Rebuild an agent, with everything it had, from its blackboard scope."""
    board = blackboard.scoped(
        scope_id(BlackboardScope.AGENT, tenant_id=tenant_id, colony_id=colony_id, agent_id=agent_id)
    )
    entries = await board.read_many([Keys.key(n) for n in STATE_NAMES])
    blueprint_e, metadata_e, lifecycle_e, current_e, policy_e, context_e, suspension_e = entries
    if blueprint_e is None or metadata_e is None or lifecycle_e is None:
        raise AgentNotFound(f"no restorable agent {agent_id!r} in scope {board.scope_id}")
    try:
        blueprint = AgentBlueprint.from_text(blueprint_e.value)
    except BlueprintTampered as exc:  # never run it: the agent ends FAILED with the reason
        current = current_e.value if current_e is not None else None
        await fail_refused_agent(board, agent_id, str(exc), lifecycle_e, current)
        raise
    metadata = AgentMetadata.model_validate(metadata_e.value)
    metadata.action_policy_blueprints = blueprint.metadata.action_policy_blueprints  # not in JSON
    blueprint = blueprint.model_copy(update={"metadata": metadata})
    agent = build_agent(blueprint, blackboard, **services)
    agent._blueprint = blueprint
    agent._state = AgentState(lifecycle_e.value["state"])
    agent._state_version = lifecycle_e.version
    if current_e is not None:
        run_e = await board.read(Keys.run_key(current_e.value))
        if run_e is not None:
            agent.current_run = AgentRun.model_validate(run_e.value)
    if policy_e is not None and agent.action_policy is not None:
        agent.action_policy.set_state(policy_e.value)
    if context_e is not None:
        stored = context_e.value
        items = None if "context" in stored else await board.ring(Keys.key("context"))
        agent.context = ContextRing.restored(MAX_CONTEXT_ITEMS, stored, items)
        agent.page_accesses = list(stored.get("page_accesses", []))
        last = stored.get("last_result")
        agent.last_result = ActionResult.model_validate(last) if last else None
    if suspension_e is not None:
        agent.suspension = SuspensionRequest.model_validate(suspension_e.value)
    states = await board.read_many([Keys.capability_state_key(n) for n in agent.capabilities])
    for (name, capability), entry in zip(agent.capabilities.items(), states, strict=True):
        if entry is not None:
            capability.set_state(entry.value.get("state") or {})
            if entry.value.get("events_from"):
                agent._event_positions[name] = entry.value["events_from"]
    return agent


def build_agent(blueprint: AgentBlueprint, blackboard: Blackboard, **services: Any) -> Agent:
    """Instantiate an agent with its capabilities and policy from a blueprint (no I/O).

    `services` (e.g. `engine=`) are injected into capabilities whose constructor takes them."""
    agent = blueprint.agent_class(blueprint.metadata, blackboard, **blueprint.agent_kwargs)
    for item in blueprint.capabilities:
        spec = item if isinstance(item, CapabilitySpec) else CapabilitySpec(blueprint=item)
        capability = spec.blueprint.local_instance(agent=agent, blackboard=blackboard, **services)
        agent._capability_specs[capability.name] = spec
        agent.add_capability(
            capability, include_actions=spec.include_actions, exclude_actions=spec.exclude_actions
        )
    if blueprint.action_policy is not None:
        resolved = {
            name: [b.local_instance() if isinstance(b, Blueprint) else b for b in value]
            if isinstance(value, list)
            else (value.local_instance() if isinstance(value, Blueprint) else value)
            for name, value in blueprint.metadata.action_policy_blueprints.items()
        }
        agent.action_policy = blueprint.action_policy.local_instance(agent=agent, **services, **resolved)
    return agent
