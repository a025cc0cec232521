"""Persisting an agent to its blackboard scope and rebuilding it from there.

`persist_agent` writes everything an agent holds (run, policy and capability states, context) in
one transaction, with the step's checkpoint (colony.agents.state.checkpoints); `restore_agent` rebuilds
an identical agent from it; `build_agent` instantiates an agent from a blueprint (no I/O).
`Agent.persist` / `Agent.restore` call these.

Every persist and lifecycle write is fenced by the agent's `agent:lifecycle`: it applies only
while Redis holds the value this copy of the agent last wrote or read (its version and holder
mark). `judge_lifecycle` / `recover_lifecycle` decide what a mismatch means: Redis lost data (the
key is gone or went back to an older value; the copy re-persists everything it holds,
`repersist_agent`), the copy's own write whose answer was lost (adopted), or another live copy's
write (never overwritten).
"""

from __future__ import annotations

import inspect
import logging
import math
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from colony.agents.blueprint import AgentBlueprint, Blueprint, CapabilitySpec, fail_refused_agent
from colony.agents.models import ActionResult, AgentMetadata, AgentRun, AgentState, SuspensionRequest
from colony.agents.state import checkpoints
from colony.agents.state.ring import ContextRing
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.models import encode_value
from colony.blackboard.protocol import AgentStateProtocol as Keys
from colony.errors import (
    AgentNotFound,
    AgentStateConflict,
    BlueprintError,
    BlueprintTampered,
    ConcurrentModificationError,
)

if TYPE_CHECKING:
    from colony.agents.base import Agent
    from colony.blackboard.models import BlackboardEntry
    from colony.blackboard.transaction import Transaction

log = logging.getLogger(__name__)
LIFECYCLE = Keys.key("lifecycle")

# Context entries an agent keeps (a ring: the oldest go first; compaction comes with context management).
MAX_CONTEXT_ITEMS = 1000
# The agent's own state entries (besides its runs, its capabilities' states and its context ring).
# ("checkpoints": the head of the checkpoint ring, whose writes are its created/restored events)
STATE_NAMES = (
    "blueprint",
    "metadata",
    "lifecycle",
    "current_run",
    "policy_state",
    "context",
    "suspension",
    "checkpoints",
)


async def persist_agent(agent: Agent, enter: AgentState | None = None, reason: str | None = None) -> None:
    """Write the run, policy state, capability states and context in one transaction.

    The context goes by appends (only entries added since the last persist) to a capped list;
    the `context` entry holds the small rest (its position, the last result, page accesses).
    A finished run's record expires after the retention. Entries an event handler appends while
    the transaction commits stay pending for the next persist.

    Fenced: nothing is written (`ConcurrentModificationError` on `agent:lifecycle`) unless Redis
    still holds the lifecycle value this copy holds (`judge_lifecycle`), so a copy that lost its
    place (another copy wrote after it) or whose state Redis lost never writes blindly over it.

    A state entry (current run, policy and capability states, context head) whose value is what
    this copy last committed there is not written again: the commit expects it unchanged (the
    version and text this copy wrote) instead, so an entry anyone else wrote since, or that Redis lost,
    fails the commit, and the persist is done once more writing every entry.

    The first persist of each step of a run (and of its beginning, step 0) also pushes that step's
    checkpoint onto the agent's capped checkpoint ring, in the same transaction; the results the
    action log holds for it (actions that declare no effect, `ActionLog.write_deferred`) go into
    the log's ring in it too. With `enter`, the
    agent's `agent:lifecycle` moves to that state in it too (the caller checked the transition)."""
    skipping = bool(agent.stored.written)
    try:
        await _persist(agent, enter, reason, agent.stored.written)
    except ConcurrentModificationError:
        if not skipping:
            raise
        # an entry may have changed under this copy (the failed commit forgot them): all written
        await _persist(agent, enter, reason, agent.stored.written)


async def _persist(
    agent: Agent, enter: AgentState | None, reason: str | None, held: dict[str, tuple[int, str]]
) -> None:
    context = agent.context
    pending, position = context.pending(), len(context)
    states = own_states(agent)  # taken once: the state entries and the step's checkpoint share them
    checkpoint = checkpoints.due(agent, states)
    lifecycle = agent.stored.value(enter, reason, previous=agent.state) if enter is not None else None
    written: dict[str, str] = {}
    try:
        async with agent.blackboard.transaction() as tx:
            await fence(tx, agent)
            logged = agent.action_log.write_deferred(tx)  # results of the step's no-effect actions
            write_state(tx, agent, states, written)
            tx.ring_push(Keys.key("context"), pending, context.cap)
            write_context_head(tx, agent, position, written)
            if checkpoint is not None:
                checkpoints.push(tx, agent, checkpoint)
            if lifecycle is not None:  # last: its event follows the run's (as a separate transition's did)
                tx.write(LIFECYCLE, lifecycle, created_by=agent.agent_id)
    except BaseException:
        held.clear()  # not known what Redis holds now (a commit whose answer was lost applied)
        raise
    for entry in tx.results:
        if entry is not None and entry.key in written:
            held[entry.key] = (entry.version, written[entry.key])
    if enter is not None and lifecycle is not None:
        hold_own_lifecycle(agent, tx, lifecycle)
        agent.stored.state = enter
    agent.action_log.deferred_stored(logged)
    context.mark_persisted(position)
    if checkpoint is not None:
        checkpoints.pushed(agent, checkpoint)


def _put(tx: Transaction, agent: Agent, key: str, value: Any, written: dict[str, str] | None) -> None:
    """Write one state entry; with `written` (a persist's), one holding what this copy last
    committed there is only expected unchanged, and the text of one written is noted there."""
    if written is None:
        agent.stored.written.pop(key, None)
        tx.write(key, value, created_by=agent.agent_id)
        return
    text = encode_value(value)
    held = agent.stored.written.get(key)
    if held is not None and held[1] == text:
        tx.expect(key, held[0], text)  # the very text too: a lost key written again is at version 1
        return
    tx.write(key, value, created_by=agent.agent_id, encoded=text)
    written[key] = text


async def fence(tx: Transaction, agent: Agent) -> None:
    """Make the transaction apply only while Redis holds the lifecycle value this copy holds.

    When this copy wrote that value itself (`hold_own_lifecycle`), the commit checks its version
    and exact text, with no read first: stricter than `judge_lifecycle`'s IN_SYNC (same version,
    same holder mark), so it never lets through what the read path refuses. A failed check is a
    `ConcurrentModificationError` like any conflict, and the caller's recovery (`recover_lifecycle`)
    reads and judges the stored value, dropping the text: its retry takes the read path."""
    if agent.stored.text is not None:
        tx.expect(LIFECYCLE, agent.stored.version, agent.stored.text)
    else:
        await check_fence(tx, agent)


def hold_own_lifecycle(agent: Agent, tx: Transaction, value: dict[str, Any]) -> None:
    """After a commit that wrote `value` to `agent:lifecycle`: this copy holds that value (its
    version, its holder mark, its exact text for the next `fence`)."""
    written = next(e for e in tx.results if e is not None and e.key == LIFECYCLE)
    agent.stored.version, agent.stored.mark = written.version, agent.holder
    agent.stored.text = encode_value(value)


async def check_fence(tx: Transaction, agent: Agent) -> None:
    """Put `agent:lifecycle` in the transaction's read set and refuse (`ConcurrentModificationError`)
    unless Redis holds the lifecycle value this copy holds (`judge_lifecycle`)."""
    stored = await tx.read(LIFECYCLE)  # in the read set: the commit checks it did not change
    if judge_lifecycle(agent, stored) is not Verdict.IN_SYNC:
        found = stored.version if stored is not None else 0
        raise ConcurrentModificationError(LIFECYCLE, agent.stored.version, found)


class OwnStates(NamedTuple):
    """The policy's and the capabilities' states at one moment (`get_state()` of each)."""

    policy: dict[str, Any] | None
    capabilities: dict[str, dict[str, Any]]


def own_states(agent: Agent) -> OwnStates:
    policy = agent.action_policy.get_state() if agent.action_policy is not None else None
    return OwnStates(policy, {name: c.get_state() for name, c in agent.capabilities.items()})


def write_state(
    tx: Transaction, agent: Agent, states: OwnStates | None = None, written: dict[str, str] | None = None
) -> None:
    """The run, policy and capability states (what every persist rewrites whole, but for entries a
    persist's `written` finds unchanged, see `_put`); `states`: taken already (else now)."""
    states = states or own_states(agent)
    if agent.current_run is not None:
        run = agent.current_run
        tx.write(
            Keys.run_key(run.run_id),
            run.model_dump(mode="json"),
            created_by=agent.agent_id,
            ttl_seconds=agent.retention_seconds if run.done else None,
        )
        _put(tx, agent, Keys.key("current_run"), run.run_id, written)
    if states.policy is not None:
        _put(tx, agent, Keys.key("policy_state"), states.policy, written)
    for name, state in states.capabilities.items():
        entry = {"state": state, "events_from": agent.event_delivery.positions.get(name)}
        _put(tx, agent, Keys.capability_state_key(name), entry, written)


def write_first_state(tx: Transaction, agent: Agent, positions: dict[str, str]) -> None:
    """A new agent's policy and capability states with its handlers' starting event positions, and
    its context head: written with its record (`Agent.initialize`), as its first persist did."""
    states = own_states(agent)
    for name, state in states.capabilities.items():
        entry = {"state": state, "events_from": positions.get(name)}
        tx.write(Keys.capability_state_key(name), entry, created_by=agent.agent_id)
    if states.policy is not None:
        tx.write(Keys.key("policy_state"), states.policy, created_by=agent.agent_id)
    write_context_head(tx, agent, len(agent.context))


def write_context_head(
    tx: Transaction, agent: Agent, position: int, written: dict[str, str] | None = None
) -> None:
    """The `agent:context` entry: the ring's position, the last result, page accesses."""
    last = agent.last_result.model_dump(mode="json") if agent.last_result else None
    head = {"context_total": position, "last_result": last, "page_accesses": agent.page_accesses}
    _put(tx, agent, Keys.key("context"), head, written)


# -- when Redis lost the agent's state ----------------------------------------------------------


class Verdict(StrEnum):
    """What the stored `agent:lifecycle` says about the one this copy of the agent holds."""

    IN_SYNC = "in_sync"  # the very value this copy last wrote or read (same version, same mark)
    LOST = "lost"  # gone, or an older value no live copy wrote: Redis lost data
    OWN_NEWER = "own_newer"  # this copy's own later write (its answer was lost)
    UNMARKED_NEWER = "unmarked_newer"  # a later write without a holder mark (older code, refusal)
    OTHER_COPY = "other_copy"  # another live copy wrote it: never written over


def stored_holder(entry: BlackboardEntry | None) -> str | None:
    """The holder mark of a stored lifecycle value (None: written without one, e.g. by older code)."""
    value = entry.value if entry is not None and isinstance(entry.value, dict) else {}
    holder = value.get("holder")
    return holder if isinstance(holder, str) and len(holder) <= 64 else None


def _written_before(agent: Agent, entry: BlackboardEntry) -> bool:
    """Whether `entry` was written before this copy came to life (by its `since`, the writer's
    clock). Untrusted: a value no live copy would write (no finite `since`) counts as earlier."""
    value = entry.value if isinstance(entry.value, dict) else {}
    since = value.get("since")
    if isinstance(since, bool) or not isinstance(since, int | float) or not math.isfinite(since):
        return True
    return since < agent.born


def judge_lifecycle(agent: Agent, entry: BlackboardEntry | None) -> Verdict:
    """Compare the stored lifecycle with the one this copy holds (`agent.stored.version` and the
    holder mark of that value, `agent.stored.mark`).

    Without data loss a lifecycle version only grows and every write is checked against the
    version its writer holds, so Redis never holds an older version than a live copy does. A
    stored value that is gone, older, or the same version written by someone else (versions
    restart from 1 after a flush) means Redis lost data. It is taken back by this copy unless
    another live copy wrote it: a mark that is not this copy's on a value written after this copy
    came to life (`born`). Every copy writes its own random mark (`Agent.holder`)."""
    found = entry.version if entry is not None else 0
    held = agent.stored.version
    mark = stored_holder(entry)
    if found == held and (entry is None or mark == agent.stored.mark):
        return Verdict.IN_SYNC
    if entry is None:
        return Verdict.LOST
    if mark == agent.holder:
        return Verdict.OWN_NEWER if found > held else Verdict.LOST
    if found > held:
        return Verdict.UNMARKED_NEWER if mark is None else Verdict.OTHER_COPY
    return Verdict.LOST if _written_before(agent, entry) else Verdict.OTHER_COPY


def yield_to_other_copy(agent: Agent, entry: BlackboardEntry) -> AgentStateConflict:
    """The error for a copy that found another live copy's lifecycle write: it writes nothing
    over it and refuses its runs (logged once per copy at WARNING)."""
    value = entry.value if isinstance(entry.value, dict) else {}
    state = str(value.get("state"))[:32]
    if not agent.stored.yielded:
        agent.stored.yielded = True
        log.warning(
            "agent %s: another live copy of this agent wrote its state (%s, version %d); this "
            "copy writes nothing over it and refuses its runs",
            agent.agent_id,
            state,
            entry.version,
        )
    return AgentStateConflict(
        f"agent {agent.agent_id} is held by another live copy (its lifecycle {state!r} at version "
        f"{entry.version} was written by another replica or runtime); this copy yields. Stop or "
        "drop this copy; the other one serves the agent"
    )


def _stored_state(entry: BlackboardEntry) -> AgentState | None:
    value = entry.value if isinstance(entry.value, dict) else {}
    try:
        return AgentState(value.get("state"))
    except ValueError:
        return None


def adopt_lifecycle(agent: Agent, entry: BlackboardEntry) -> bool:
    """Take a stored lifecycle as this copy's (False when its state is not one)."""
    state = _stored_state(entry)
    if state is None:
        return False
    agent.stored.state, agent.stored.version, agent.stored.mark = state, entry.version, stored_holder(entry)
    agent.stored.text = None  # read, not written by this copy: the next fence reads it
    return True


async def recover_lifecycle(agent: Agent) -> bool:
    """After a conflict on `agent:lifecycle`, make the lifecycle this copy holds Redis's again when
    that is safe (see `judge_lifecycle`). True: the caller retries its write once; False: the
    caller raises its conflict, as before this recovery existed.

    - LOST: logged at WARNING (once per loss: the re-persist ends it) and everything the copy
      holds is re-persisted (`repersist_agent`, one transaction fenced on what was found).
    - OWN_NEWER (a write whose answer was lost): adopted.
    - OTHER_COPY: this copy yields, `AgentStateConflict`, and writes nothing.
    - UNMARKED_NEWER: False (another writer; nothing is written over it).
    """
    agent.stored.text = None  # what it wrote last is not what Redis holds: judged from a read
    for _ in range(3):  # a re-persist that loses a race looks again (bounded)
        entry = await agent.blackboard.read(LIFECYCLE)
        verdict = judge_lifecycle(agent, entry)
        if verdict is Verdict.IN_SYNC:
            return True
        if verdict is Verdict.UNMARKED_NEWER:
            return False
        if verdict is Verdict.OTHER_COPY:
            assert entry is not None
            raise yield_to_other_copy(agent, entry)
        if verdict is Verdict.OWN_NEWER:
            assert entry is not None
            return adopt_lifecycle(agent, entry)
        found = entry.version if entry is not None else 0
        log.warning(
            "agent %s: Redis lost its state (agent:lifecycle %s; this agent holds version %d); "
            "re-persisting the state it holds (%s) and carrying on",
            agent.agent_id,
            "is gone" if entry is None else f"went back to version {found}",
            agent.stored.version,
            agent.state.value,
        )
        try:
            await repersist_agent(agent, found)
        except ConcurrentModificationError:
            continue  # it changed meanwhile (another copy re-created it?): judge again
        return True
    return False


async def repersist_agent(agent: Agent, lifecycle_version: int) -> None:
    """Write everything the agent holds (blueprint, metadata, lifecycle, suspension, run, policy and
    capability states, context) in one transaction, applied only if `agent:lifecycle` is still at
    `lifecycle_version` (0: absent). Context entries the stored ring lacks (it holds those before
    the stored `context_total`) are pushed again."""
    context = agent.context
    position = len(context)
    async with agent.blackboard.transaction() as tx:
        stored = await tx.read(LIFECYCLE)  # in the read set: the commit checks it did not change
        if (stored.version if stored is not None else 0) != lifecycle_version:
            raise ConcurrentModificationError(LIFECYCLE, lifecycle_version, stored.version if stored else 0)
        head = await tx.read(Keys.key("context"))
        stored_total = head.value.get("context_total") if head and isinstance(head.value, dict) else 0
        if isinstance(stored_total, bool) or not isinstance(stored_total, int):
            stored_total = 0
        missing = context[max(0, min(stored_total, position)) : position]
        blueprint = agent.blueprint
        if blueprint is not None:
            tx.write(Keys.key("blueprint"), blueprint.to_text(), created_by=agent.agent_id)
        tx.write(Keys.key("metadata"), agent.metadata.model_dump(mode="json"), created_by=agent.agent_id)
        lifecycle = agent.stored.value(agent.state, "re-persisted: Redis had lost it")
        tx.write(LIFECYCLE, lifecycle, created_by=agent.agent_id)
        if agent.suspension is not None:
            tx.write(
                Keys.key("suspension"), agent.suspension.model_dump(mode="json"), created_by=agent.agent_id
            )
        write_state(tx, agent)
        tx.ring_push(Keys.key("context"), missing, context.cap)
        write_context_head(tx, agent, position)
    hold_own_lifecycle(agent, tx, lifecycle)
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
    blueprint_e, metadata_e, lifecycle_e, current_e, policy_e, context_e, suspension_e, head_e = entries
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
    agent.blueprint = blueprint
    agent.stored.state = AgentState(lifecycle_e.value["state"])
    agent.stored.version, agent.stored.mark = lifecycle_e.version, stored_holder(lifecycle_e)
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
    if head_e is not None:
        checkpoints.adopt_head(agent, head_e.value)
    states = await board.read_many([Keys.capability_state_key(n) for n in agent.capabilities])
    for (name, capability), entry in zip(agent.capabilities.items(), states, strict=True):
        if entry is not None:
            capability.set_state(entry.value.get("state") or {})
            if entry.value.get("events_from"):
                agent.event_delivery.positions[name] = entry.value["events_from"]
    return agent


async def store_blueprint(agent: Agent) -> None:
    """Record the agent's blueprint with its current capabilities (a restored agent gets them)."""
    if agent.blueprint is None:
        return
    specs = list(agent.capability_specs.values())
    agent.blueprint = agent.blueprint.model_copy(update={"capabilities": specs})
    await agent.blackboard.write(Keys.key("blueprint"), agent.blueprint.to_text(), created_by=agent.agent_id)


async def store_superseded_failure(agent: Agent, run: AgentRun) -> None:
    """Store the record of a failed run that is no longer the agent's current one (fenced like
    every write of the agent's state; best effort, logged)."""
    try:
        async with agent.blackboard.transaction() as tx:
            await fence(tx, agent)
            tx.write(
                Keys.run_key(run.run_id),
                run.model_dump(mode="json"),
                created_by=agent.agent_id,
                ttl_seconds=agent.retention_seconds,
            )
    except Exception as exc:
        log.warning("agent %s: failed run %s not stored: %r", agent.agent_id, run.run_id, exc)


def _check_policy_blueprints(blueprint: AgentBlueprint) -> None:
    """Every `metadata.action_policy_blueprints` entry must be a parameter of the policy: one it
    does not take would be dropped without a word (e.g. streams given to a policy without them)."""
    policy = blueprint.action_policy
    assert policy is not None
    parameters = inspect.signature(policy.cls).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(blueprint.metadata.action_policy_blueprints) - set(parameters))
    if unknown:
        raise BlueprintError(
            f"{policy.cls.__qualname__} takes no {', '.join(unknown)} (given in "
            "metadata.action_policy_blueprints); add the parameter to the policy or drop the entry"
        )


def build_agent(blueprint: AgentBlueprint, blackboard: Blackboard, **services: Any) -> Agent:
    """Instantiate an agent with its capabilities and policy from a blueprint (no I/O).

    `services` (e.g. `engine=`) are injected into capabilities whose constructor takes them."""
    agent = blueprint.agent_class(blueprint.metadata, blackboard, **blueprint.agent_kwargs)
    agent.settings = services.get("settings")
    for item in blueprint.capabilities:
        spec = item if isinstance(item, CapabilitySpec) else CapabilitySpec(blueprint=item)
        capability = spec.blueprint.local_instance(agent=agent, blackboard=blackboard, **services)
        agent.capability_specs[capability.name] = spec
        agent.add_capability(
            capability, include_actions=spec.include_actions, exclude_actions=spec.exclude_actions
        )
    if blueprint.action_policy is not None:
        _check_policy_blueprints(blueprint)
        resolved = {
            name: [b.local_instance() if isinstance(b, Blueprint) else b for b in value]
            if isinstance(value, list)
            else (value.local_instance() if isinstance(value, Blueprint) else value)
            for name, value in blueprint.metadata.action_policy_blueprints.items()
        }
        agent.action_policy = blueprint.action_policy.local_instance(agent=agent, **services, **resolved)
    return agent
