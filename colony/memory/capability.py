"""MemoryCapability: one memory scope of an agent, its ingestion, its producers and its upkeep.

Pull model: a capability manages only its own scope. It *pulls* from the scopes it subscribes to
(their event streams), turns what it pulled into entries of its own with its transformer, and
keeps its scope within its cap and TTL. Nothing pushes into it, and agents never write their own
action memories: producers (hooks on `@hookable` methods) do.

Exactly once: the derived entries of a batch and the subscription's new position are written in
one blackboard transaction on this scope, and a derived entry's id is a function of its sources.
A capability that stops (suspension, replica death) between two batches resumes from the stored
position on whichever replica hosts the agent next; a batch is never half applied, never applied
twice. Everything is in Redis: this object holds no state worth persisting.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from colony import metrics
from colony.agents.capability import AgentCapability, agent_settings
from colony.agents.hooks import HookContext, HookType, Pointcut
from colony.blackboard import Blackboard
from colony.blackboard.protocol import MemoryProtocol
from colony.config import ColonySettings
from colony.errors import BlackboardUnavailable, ConcurrentModificationError, InvalidArgument
from colony.memory.scopes import AGENT_LEVELS, PURPOSES, MemoryScope
from colony.memory.service import memory_service
from colony.memory.store import MemoryStore
from colony.memory.types import (
    MaintenanceConfig,
    MemoryEntry,
    MemoryIngestPolicy,
    MemoryProducerConfig,
    MemoryScopeConfig,
    MemorySubscription,
    NewMemory,
    content_hash,
)

if TYPE_CHECKING:
    from colony.agents.base import Agent

log = logging.getLogger(__name__)
Keys = MemoryProtocol
IDLE_WAIT_SECONDS = 0.5
SHARED_TYPES = frozenset({"collective", "task", "global"})
MAX_IDLE_WAIT_SECONDS = 8.0


def derived_id(prefix: str, refs: Sequence[str]) -> str:
    """The id of an entry derived from `refs`: the same sources always give the same id."""
    digest = hashlib.sha256("\n".join(sorted(refs)).encode()).hexdigest()[:32]
    return f"{prefix}-{digest}"


def copy_transform(entries: Sequence[MemoryEntry], ttl_seconds: float | None) -> list[NewMemory]:
    """The default transformer: each source entry once, with its provenance."""
    return [
        NewMemory(
            content=e.content,
            data=e.data,
            tags=e.tags,
            kind=e.kind,
            ttl_seconds=ttl_seconds,
            entry_id=derived_id("d", [e.ref]),
            sources=[e.ref],
            importance=e.importance,
            metadata={"source_created_at": e.created_at},
        )
        for e in entries
    ]


def private_memory(agent: Agent | None) -> list[MemoryCapability]:
    """The agent's own memory levels: its MemoryCapabilities less shared scopes (what the agent's
    recall, forget and blocks reach; shared memory goes through colony.memory.shared_tools)."""
    if agent is None:
        return []
    return [c for c in agent.capabilities.values() if isinstance(c, MemoryCapability) and not c.shared]


def _check_sources(capability: MemoryCapability) -> None:
    """No subscription reads a shared scope (its rules are for `recall_shared`, read by the reader),
    and an agent's scopes take in only its own levels (another agent's memory is not its to copy;
    a capability without an agent, library code, may name any scope but a shared one): ValueError."""
    own = capability.agent.scope_id + ":namespace:" if capability.agent is not None else None
    for subscription in capability.ingestion_policy.subscriptions:
        named = subscription.source_scope_id
        if named in AGENT_LEVELS:
            continue
        if MemoryScope.is_memory_scope(named) and MemoryScope.scope_type(named) in SHARED_TYPES:
            raise ValueError(f"{capability.name}: a subscription may not read shared memory {named!r}")
        if (own is not None or capability.shared) and (own is None or not named.startswith(own)):
            raise ValueError(
                f"{capability.name}: an agent's memory takes in only its own levels "
                f"({', '.join(AGENT_LEVELS)}), not {named!r}"
            )


def resolve_memory_scope(agent: Agent | None, ref: str | None, level: str | None) -> str:
    """A full memory scope id from a full id, or a level name of the agent's own hierarchy."""
    candidate = ref or level
    if candidate is None:
        raise ValueError("MemoryCapability needs scope_id (a memory scope id) or level (e.g. 'working')")
    if ":" in candidate and candidate not in AGENT_LEVELS:
        return candidate
    if agent is None:
        raise ValueError(f"memory level {candidate!r} needs the agent it belongs to")
    return MemoryScope.agent(
        agent.agent_id, candidate, tenant_id=agent.metadata.tenant_id, colony_id=agent.metadata.colony_id
    )


class MemoryCapability(AgentCapability):
    """One memory scope: `scope_id` (full id) or `level` ("working", "stm", "ltm:episodic", ...).
    A shared scope (collective, task, global) takes colony.memory.shared.SharedMemoryCapability,
    which keeps its access rules."""

    shared = False

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        blackboard: Blackboard | None = None,
        level: str | None = None,
        ingestion_policy: MemoryIngestPolicy | None = None,
        ttl_seconds: float | None = None,
        max_entries: int | None = None,
        maintenance: MaintenanceConfig | None = None,
        producers: Sequence[MemoryProducerConfig] = (),
        purpose: str = "",
        capability_key: str | None = None,
        engine: Any = None,
        settings: ColonySettings | None = None,
    ) -> None:
        memory_scope = resolve_memory_scope(agent, scope_id, level)
        self.scope_type = MemoryScope.scope_type(memory_scope)
        if self.scope_type in SHARED_TYPES and not self.shared:
            raise ValueError(
                f"{memory_scope!r} is shared memory: use colony.memory.shared.SharedMemoryCapability "
                "(it checks the scope's access rules)"
            )
        super().__init__(
            agent,
            memory_scope,
            blackboard=blackboard,
            capability_key=capability_key or f"memory-{self.scope_type.replace(':', '-')}",
        )
        self.memory_scope = memory_scope
        self.ingestion_policy = ingestion_policy or MemoryIngestPolicy()
        _check_sources(self)
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self.maintenance = maintenance or MaintenanceConfig()
        self.producers = list(producers)
        self.purpose = purpose or PURPOSES.get(self.scope_type, "")
        self.engine = engine
        self.settings = settings
        self._ingest_wakeup = asyncio.Event()
        if agent is not None:
            for producer in self.producers:
                self._register_producer(agent, producer)

    # -- wiring -----------------------------------------------------------------------------------

    @property
    def store(self) -> MemoryStore:
        return MemoryStore(self.blackboard, self._settings())

    def _settings(self) -> ColonySettings:
        if self.settings is None:
            self.settings = agent_settings(self)
        return self.settings

    @property
    def cap(self) -> int:
        return self.max_entries or self._settings().memory.default_max_entries

    def source_scopes(self) -> list[str]:
        return [self._source(s) for s in self.ingestion_policy.subscriptions]

    def _source(self, subscription: MemorySubscription) -> str:
        return resolve_memory_scope(self.agent, subscription.source_scope_id, None)

    def scope_config(self) -> MemoryScopeConfig:
        return MemoryScopeConfig(
            scope_id=self.memory_scope,
            scope_type=self.scope_type,
            purpose=self.purpose,
            ttl_seconds=self.ttl_seconds,
            max_entries=self.cap,
            subscribed_to=self.source_scopes(),
            maintenance=self.maintenance,
            owner=self.agent.agent_id if self.agent is not None else None,
        )

    async def start(self) -> None:
        """Record the scope (config, and in the agent's list of scopes), then ingest."""
        store = self.store
        await store.configure(self.scope_config())
        if self.agent is not None:
            await register_scope(self.agent.blackboard, self.memory_scope)
        if self.ingestion_policy.subscriptions:
            self._tasks.append(asyncio.create_task(self._ingest_forever(), name=f"{self.name}-ingest"))

    # -- writes -----------------------------------------------------------------------------------

    async def write(self, memory: NewMemory, *, dedup: bool = True) -> Any:
        """Store an entry in this scope (its TTL defaults to the scope's), then keep the cap."""
        if memory.ttl_seconds is None and self.ttl_seconds is not None:
            memory = memory.model_copy(update={"ttl_seconds": self.ttl_seconds})
        creator = self.agent.agent_id if self.agent is not None else None
        outcome = await self.store.write(
            self.memory_scope,
            memory,
            created_by=creator,
            dedup=dedup,
            similar=self._nearest if dedup else None,
        )
        metrics.MEMORY_WRITES.labels(self.scope_type, "created" if outcome.created else "duplicate").inc()
        if outcome.created:
            self._wake_subscribers()
        return outcome

    def _wake_subscribers(self) -> None:
        """The agent's scopes that pull from this one ingest now, not at their next look."""
        if self.agent is None:
            return
        for capability in self.agent.capabilities.values():
            if isinstance(capability, MemoryCapability) and self.memory_scope in capability.source_scopes():
                capability.wake()

    async def _nearest(self, scope_id: str, text: str) -> tuple[str, float] | None:
        """The most similar entry of the scope (near-duplicate check); None without a vector index."""
        try:
            return await memory_service(self.blackboard, self._settings()).nearest(scope_id, text)
        except Exception as exc:  # no index now: the write goes on with exact dedup only
            log.warning("%s: near-duplicate check skipped (%r)", self.name, exc)
            return None

    async def enforce_cap(self) -> int:
        pruned = await self.store.enforce_cap(self.memory_scope, self.cap, self.maintenance)
        if pruned:
            metrics.MEMORY_PRUNED.labels("cap").inc(pruned)
        return pruned

    # -- producers --------------------------------------------------------------------------------

    def _register_producer(self, agent: Agent, producer: MemoryProducerConfig) -> None:
        pointcut = producer.pointcut
        if isinstance(pointcut, str):
            pointcut = Pointcut.pattern(pointcut)

        async def produce(ctx: HookContext, result: Any) -> None:
            try:
                await self._produce(producer, ctx, result)
            except Exception:  # a memory that could not be formed never fails the action
                log.exception("agent %s: memory producer %s failed", agent.agent_id, producer.name)

        agent.hooks.register(pointcut, HookType.AFTER, produce, priority=-100, owner=self)

    async def _produce(self, producer: MemoryProducerConfig, ctx: HookContext, result: Any) -> None:
        extracted = producer.extractor(ctx, result)
        if inspect.isawaitable(extracted):
            extracted = await extracted
        if extracted is None:
            return
        items = extracted if isinstance(extracted, list) else [extracted]
        agent = self.agent
        run = agent.current_run if agent is not None else None
        for n, item in enumerate(items):
            memory = item if isinstance(item, NewMemory) else NewMemory.model_validate(item)
            if memory.entry_id is None:  # the same call (a re-run step) gives the same entry
                where = [
                    producer.name,
                    ctx.join_point,
                    run.run_id if run is not None else "-",
                    str(run.steps if run is not None else time.time()),
                    str(n),
                ]
                memory = memory.model_copy(update={"entry_id": derived_id("p", where)})
            if memory.ttl_seconds is None and producer.ttl_seconds is not None:
                memory = memory.model_copy(update={"ttl_seconds": producer.ttl_seconds})
            await self.write(memory, dedup=False)

    # -- ingestion --------------------------------------------------------------------------------

    async def _ingest_forever(self) -> None:
        """Ingest until closed. Idle, it looks again after a wait that doubles up to
        `MAX_IDLE_WAIT_SECONDS` (an idle agent costs little Redis), and at once when a scope of
        the same agent it pulls from is written (`wake`)."""
        delay, idle = 0.2, IDLE_WAIT_SECONDS
        while True:
            try:
                moved = await self.ingest_once()
                delay = 0.2
            except BlackboardUnavailable as exc:
                log.warning("%s of agent %s: ingestion paused (%s)", self.name, self._who(), exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            except Exception:
                log.exception("%s of agent %s: ingestion failed; retrying", self.name, self._who())
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if moved:
                idle = IDLE_WAIT_SECONDS
                continue
            self._ingest_wakeup.clear()
            try:
                await asyncio.wait_for(self._ingest_wakeup.wait(), idle)
                idle = IDLE_WAIT_SECONDS
            except TimeoutError:
                idle = min(idle * 2, MAX_IDLE_WAIT_SECONDS)

    def _who(self) -> str:
        return self.agent.agent_id if self.agent is not None else "-"

    async def ingest_once(self) -> int:
        """One batch from every subscription; how many source entries were taken in."""
        total = 0
        for subscription in self.ingestion_policy.subscriptions:
            total += await self._ingest_batch(subscription)
        if total:
            await self.enforce_cap()
        return total

    async def _position(self, source: str) -> str | None:
        stored = await self.blackboard.read(Keys.position_key(source))
        return str(stored.value["position"]) if stored is not None else None

    async def _ingest_batch(self, subscription: MemorySubscription) -> int:
        store = self.store
        source = self._source(subscription)
        settings = self._settings().memory
        position_key = Keys.position_key(source)
        stored = await self.blackboard.read(position_key)
        seen = stored.version if stored is not None else 0
        if stored is None:  # a new subscription: what the source holds, whatever its stream kept
            return await self._catch_up(subscription, source, position_key, seen, since=None)
        position = str(stored.value["position"])
        batch = await store.changes(source, position, count=settings.ingest_batch)
        if batch.truncated:  # events lost to the stream cap: the entries written since then
            since = int(position.split("-")[0]) / 1000.0  # stream ids and write times: Redis' clock
            return await self._catch_up(subscription, source, position_key, seen, since=since)
        if batch.position == position:
            return 0
        wanted = list(dict.fromkeys(batch.upserted))
        found = await store.get_many([(source, i) for i in wanted])
        entries = [e for e in found if e is not None]
        if subscription.tag_filter is not None:
            entries = [e for e in entries if subscription.tag_filter.matches(e.tags)]
        waits = getattr(self.ingestion_policy.transformer, "waits", None)
        if callable(waits) and waits(entries) and batch.position == await store.latest_position(source):
            return 0  # a larger batch later: the position stays (never while more events are behind)
        derived = await self._transform(entries)
        await self._commit(derived, position_key, source, batch.position, seen)
        self._count_ingested(entries)
        return max(1, len(entries))

    async def _catch_up(
        self,
        subscription: MemorySubscription,
        source: str,
        position_key: str,
        seen: int,
        since: float | None,
    ) -> int:
        """Ingest the source's live entries created since `since` (its stream cannot say which
        ones are new: a new subscription, or a stream trimmed past the stored position), in chunks;
        the position moves to the stream's newest event with the last chunk. Entries derived
        before are skipped (their ids are the same), so a catch-up cut short is simply redone."""
        store = self.store
        newest = await store.latest_position(source)  # first: later writes come through the stream
        entries = sorted(
            await store.entries(source, written_since=since), key=lambda e: (e.created_at, e.entry_id)
        )
        if subscription.tag_filter is not None:
            entries = [e for e in entries if subscription.tag_filter.matches(e.tags)]
        size = self._settings().memory.ingest_batch
        chunks = [entries[n : n + size] for n in range(0, len(entries), size)] or [[]]
        for n, chunk in enumerate(chunks):
            final = n == len(chunks) - 1
            derived = await self._transform(chunk)
            await self._commit(derived, position_key, source, newest if final else None, seen)
        self._count_ingested(entries)
        return max(1, len(entries))

    def _count_ingested(self, entries: list[MemoryEntry]) -> None:
        for entry in entries:
            metrics.MEMORY_INGESTED.labels(self.scope_type).inc()
            metrics.MEMORY_INGESTION_LAG_SECONDS.observe(max(0.0, time.time() - entry.created_at))

    async def _transform(self, entries: list[MemoryEntry]) -> list[NewMemory]:
        if not entries:
            return []
        transformer = self.ingestion_policy.transformer
        if transformer is None:
            return copy_transform(entries, self.ttl_seconds)
        out: list[NewMemory] = []
        size = self.ingestion_policy.batch_size
        for start in range(0, len(entries), size):
            group = entries[start : start + size]
            made = await transformer.transform(group, self)
            for index, memory in enumerate(made):
                memory = memory if isinstance(memory, NewMemory) else NewMemory.model_validate(memory)
                updates: dict[str, Any] = {}
                if memory.entry_id is None:
                    updates["entry_id"] = derived_id(
                        "t", [e.ref for e in group] + [content_hash(memory.content), str(index)]
                    )
                if not memory.sources:
                    updates["sources"] = [e.ref for e in group][:256]
                if memory.ttl_seconds is None and self.ttl_seconds is not None:
                    updates["ttl_seconds"] = self.ttl_seconds
                out.append(memory.model_copy(update=updates) if updates else memory)
        return out

    def _ingestible(self, memory: NewMemory) -> bool:
        """Whether a derived entry is within this colony's bounds; one that is not (an entry
        written before a bound was lowered) is left out with a warning, so it never stalls the
        scope's ingestion in a retry loop."""
        try:
            self.store._check(memory)
        except InvalidArgument as exc:
            who = self._who()
            log.warning("%s of agent %s: entry %s not ingested: %s", self.name, who, memory.entry_id, exc)
            return False
        return True

    async def _commit(
        self,
        derived: list[NewMemory],
        position_key: str,
        source: str,
        position: str | None,
        seen_version: int,
    ) -> None:
        """Derived entries (those not already held) and the new position (None: not moved, a
        catch-up's earlier chunk), in one transaction that applies only if the position is still
        the one this batch started from."""
        store = self.store
        board = self.blackboard
        creator = self.agent.agent_id if self.agent is not None else None
        derived = [m for m in derived if self._ingestible(m)]
        built = [store._build(self.memory_scope, m, creator) for m in derived]
        present = await board.read_many([Keys.entry_key(e.entry_id) for e in built])
        holders = await board.read_many([Keys.hash_key(e.content_hash) for e in built])
        try:
            async with board.transaction() as tx:
                current = await tx.read(position_key)
                if (current.version if current else 0) != seen_version:
                    raise ConcurrentModificationError(
                        position_key, seen_version, current.version if current else 0
                    )
                hashes: set[str] = set()
                for entry, memory, same, holder in zip(built, derived, present, holders, strict=True):
                    if same is not None:
                        continue
                    # same text already held: keep the entry, not a second hash key
                    fresh = holder is None and entry.content_hash not in hashes
                    store._stage(tx, entry, memory.ttl_seconds, creator, hash_key=fresh)
                    hashes.add(entry.content_hash)
                if position is not None:
                    tx.write(position_key, {"source": source, "position": position}, created_by=creator)
        except ConcurrentModificationError:
            log.info("%s: ingestion batch from %s raced another copy; it is retried", self.name, source)
            return
        written = [e for e, same in zip(built, present, strict=True) if same is None]
        await store.ordered(self.memory_scope, written, self.scope_config())
        metrics.MEMORY_WRITES.labels(self.scope_type, "created").inc(len(written))
        if written:
            self._wake_subscribers()

    def wake(self) -> None:
        """Ingest now rather than at the next poll (e.g. after `consolidate`)."""
        self._ingest_wakeup.set()


async def register_scope(agent_board: Blackboard, memory_scope: str, *, keep: int = 64) -> None:
    """Add a memory scope to the agent's list (what the MemoryMap and the HTTP API read), or to
    the colony's list of shared scopes; the newest `keep` are kept."""

    def add(current: Any) -> list[str]:
        scopes = list(current) if isinstance(current, list) else []
        if memory_scope not in scopes:
            scopes.append(memory_scope)
        return scopes[-keep:]

    stored = await agent_board.read(Keys.scopes_key())
    if stored is not None and isinstance(stored.value, list) and memory_scope in stored.value:
        return
    await agent_board.update(Keys.scopes_key(), add)
