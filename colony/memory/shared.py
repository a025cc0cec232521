"""Shared memory: collective (a team's), task and global scopes, their access rules and writers.

A shared scope is a memory scope of the colony (`MemoryScope.collective/task/global_`) named
`collective:{team}`, `task:{task}` or `global`. It exists once the operator (HTTP, CLI) or code
defines it with `SharedScopes.define`: its configuration (TTL, cap, purpose) and its access rules
(`SharedAccess`: which agents may read, which may write; `*` is every agent of the colony) are
stored with it, in Redis, and read again before every agent read and write, so a revoked agent
stops at its next one. A scope nobody defined is closed to agents.

Agents take part through `SharedMemoryCapability` (one per shared scope, on each member): it
reads the rules, and it may subscribe to the agent's own levels (e.g. STM) with
`SharingTransformer`, the same exactly-once ingestion as any scope. What the user said (entries
tagged `user`) never leaves the agent that way. The planner's actions over shared scopes
(`share_memory`, `recall_shared`) are in colony.memory.shared_tools. The rules govern agents: the
API token is the operator's and reads and writes every shared scope.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from colony.blackboard import Blackboard, TagFilter
from colony.blackboard.protocol import MemoryProtocol
from colony.config import ColonySettings
from colony.errors import (
    ConcurrentModificationError,
    InvalidArgument,
    MemoryAccessDenied,
    SharedMemoryNotFound,
)
from colony.memory.capability import MemoryCapability, copy_transform, private_memory, register_scope
from colony.memory.scopes import NAMESPACE_PREFIX, PURPOSES, MemoryScope
from colony.memory.store import MemoryStore
from colony.memory.types import (
    MaintenanceConfig,
    MemoryEntry,
    MemoryIngestPolicy,
    MemoryScopeConfig,
    MemorySubscription,
    NewMemory,
)
from colony.memory.user_words import USER_TAG, UserWords, user_messages
from colony.wire.ids import ID_PATTERN
from colony.wire.tenants import tenant_of

if TYPE_CHECKING:
    from colony.agents.base import Agent

log = logging.getLogger(__name__)
Keys = MemoryProtocol
ANYONE = "*"
SHARED_KINDS = ("collective", "task", "global")
SHARED_NAME = r"^(global|(collective|task):[A-Za-z0-9][A-Za-z0-9_.\-]{0,63})$"
SHARED_NAME_RULE = "'global', or 'collective:NAME' or 'task:NAME' (NAME: 1-64 letters, digits, '_', '.', '-')"
AGENT_REF = r"^(\*|" + ID_PATTERN[1:-1] + r")$"
MAX_MEMBERS = 256
MAX_SHARED_SCOPES = 1000  # per colony: the list the API and the CLI show
MAX_DEFINE_TRIES = 8
SHARED_TAG = "shared"
AgentRef = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=AGENT_REF)]
Verb = Literal["read", "write"]


def check_name(name: str) -> str:
    """`name` when it names a shared scope (InvalidArgument, with the rule, otherwise)."""
    if not isinstance(name, str) or not re.fullmatch(SHARED_NAME, name):
        raise InvalidArgument(
            f"shared memory {str(name)[:80]!r} is not a shared scope name: {SHARED_NAME_RULE}"
        )
    return name


def shared_scope_id(name: str, *, tenant_id: str = "default", colony_id: str = "default") -> str:
    """The memory scope id of a shared scope named `collective:x`, `task:x` or `global`."""
    kind, _, part = check_name(name).partition(":")
    where = {"tenant_id": tenant_id, "colony_id": colony_id}
    if kind == "global":
        return MemoryScope.global_(**where)
    return MemoryScope.collective(part, **where) if kind == "collective" else MemoryScope.task(part, **where)


def shared_name(scope_id: str) -> str | None:
    """The name of a shared scope from its id (None for any other memory scope)."""
    if not MemoryScope.is_memory_scope(scope_id):
        return None
    suffix = scope_id.rpartition(":namespace:")[2][len(NAMESPACE_PREFIX) :]
    kind, _, part = suffix.partition("-")
    if kind == "global" and not part:
        return "global"
    return f"{kind}:{part}" if kind in SHARED_KINDS and part else None


class SharedAccess(BaseModel):
    """Who may read and who may write a shared scope: agent ids, or `*` (every agent of the
    colony). A writer may also read. Default: every agent reads, none writes (the operator does)."""

    model_config = ConfigDict(extra="forbid")

    readers: list[AgentRef] = Field(default_factory=lambda: [ANYONE], max_length=MAX_MEMBERS)
    writers: list[AgentRef] = Field(default_factory=list, max_length=MAX_MEMBERS)

    def may(self, verb: Verb, agent_id: str) -> bool:
        allowed = self.writers if verb == "write" else [*self.readers, *self.writers]
        return ANYONE in allowed or agent_id in allowed


class SharedScopeInfo(BaseModel):
    """A shared scope as the API and the CLI show it."""

    name: str
    scope_id: str
    scope_type: str
    purpose: str = ""
    ttl_seconds: float | None = None
    max_entries: int | None = None
    readers: list[str] = Field(default_factory=list)
    writers: list[str] = Field(default_factory=list)
    entry_count: int = 0
    subscribed_to: list[str] = Field(default_factory=list, description="agents' scopes feeding it")
    updated_at: float | None = None
    updated_by: str | None = None


class SharedScopes:
    """The shared scopes of one colony: defined, listed, and their rules checked (all in Redis)."""

    def __init__(self, store: MemoryStore, *, tenant_id: str = "default", colony_id: str = "default") -> None:
        self.store = store
        self.tenant_id, self.colony_id = tenant_id, colony_id

    def scope_id(self, name: str) -> str:
        return shared_scope_id(name, tenant_id=self.tenant_id, colony_id=self.colony_id)

    def _colony_board(self) -> Any:
        return self.store.board(MemoryScope.owner_scope(MemoryScope.global_(**self._where())))

    def _where(self) -> dict[str, str]:
        return {"tenant_id": self.tenant_id, "colony_id": self.colony_id}

    async def define(
        self,
        name: str,
        *,
        readers: Sequence[str] | None = None,
        writers: Sequence[str] | None = None,
        purpose: str | None = None,
        ttl_seconds: float | None = None,
        max_entries: int | None = None,
        by: str | None = None,
    ) -> tuple[SharedScopeInfo, bool]:
        """Create the scope, or change what is given of a defined one (what is not given keeps its
        value: a new scope takes the defaults, every agent reads and none writes); its entries and
        the agents' subscriptions stay. `ttl_seconds=0`: entries without a TTL from now on. The info
        and whether this call created it (of concurrent creators, one). A lower cap prunes at the next
        write."""
        scope = self.scope_id(name)
        board = self.store.board(scope)
        # what it gives is checked before the scope takes a place in the colony's list
        self._defined(scope, None, None, readers, writers, purpose, ttl_seconds, max_entries)
        await self._listed(scope)
        for _ in range(MAX_DEFINE_TRIES):
            try:
                async with board.transaction() as tx:  # rules and settings together, from what was read
                    held_access, held_config = (
                        await tx.read(Keys.access_key()),
                        await tx.read(Keys.config_key()),
                    )
                    created = held_access is None or held_config is None
                    held = None if created else held_access.value
                    # a scope whose stored rules cannot be read stays closed but for what this names
                    rules = (
                        None
                        if created
                        else _parsed(SharedAccess, held.get("access") if isinstance(held, dict) else None)
                    )
                    access, config = self._defined(
                        scope,
                        None if created else (rules or SharedAccess(readers=[], writers=[])),
                        None if created else _parsed(MemoryScopeConfig, held_config.value),
                        readers,
                        writers,
                        purpose,
                        ttl_seconds,
                        max_entries,
                    )
                    record = {"access": access.model_dump(), "updated_at": time.time(), "updated_by": by}
                    tx.write(Keys.access_key(), record, created_by=by)
                    tx.write(Keys.config_key(), config.model_dump(mode="json"), created_by=by)
            except ConcurrentModificationError:
                continue  # another definition landed in between: apply this one over it
            return await self.info(name), created
        raise ConcurrentModificationError(Keys.access_key(), 0, 0)

    async def _listed(self, scope: str) -> None:
        """Put the scope in the colony's list of shared scopes (if it is not there yet), refused past
        MAX_SHARED_SCOPES in the same optimistic write, so concurrent creators cannot pass the bound
        nor push an older scope out of the list. (A definition that then fails leaves its name
        listed; the listing skips names whose scope is not defined.)"""
        board = self._colony_board()
        stored = await board.read(Keys.scopes_key())
        if stored is not None and isinstance(stored.value, list) and scope in stored.value:
            return

        def add(current: Any) -> list[str]:
            scopes = list(current) if isinstance(current, list) else []
            if scope in scopes:
                return scopes
            if len(scopes) >= MAX_SHARED_SCOPES:
                raise InvalidArgument(
                    f"this colony has {MAX_SHARED_SCOPES} shared memory scopes, the most it keeps"
                )
            return [*scopes, scope]

        await board.update(Keys.scopes_key(), add)

    def _defined(
        self,
        scope: str,
        access: SharedAccess | None,
        held: MemoryScopeConfig | None,
        readers: Sequence[str] | None,
        writers: Sequence[str] | None,
        purpose: str | None,
        ttl_seconds: float | None,
        max_entries: int | None,
    ) -> tuple[SharedAccess, MemoryScopeConfig]:
        """The rules and settings a definition leaves: what it gives, else what was held, else defaults."""
        access = access or SharedAccess()
        access = SharedAccess(
            readers=list(readers) if readers is not None else access.readers,
            writers=list(writers) if writers is not None else access.writers,
        )
        scope_type = MemoryScope.scope_type(scope)
        config = MemoryScopeConfig(
            scope_id=scope,
            scope_type=scope_type,
            purpose=purpose
            if purpose is not None
            else (held.purpose if held else PURPOSES.get(scope_type, "")),
            ttl_seconds=(ttl_seconds or None)
            if ttl_seconds is not None
            else (held.ttl_seconds if held else None),
            max_entries=max_entries
            or (held.max_entries if held else None)
            or self.store.settings.memory.default_max_entries,
            subscribed_to=held.subscribed_to if held is not None else [],
        )
        return access, config

    async def access(self, scope_id: str) -> SharedAccess | None:
        """The scope's rules (None: not defined, or not readable as rules: closed to agents)."""
        stored = await self.store.board(scope_id).read(Keys.access_key())
        if stored is None or not isinstance(stored.value, dict):
            return None
        try:
            return SharedAccess.model_validate(stored.value.get("access"))
        except ValueError:
            log.warning("shared memory %s: access rules unreadable; closed to agents", scope_id)
            return None

    async def check(self, scope_id: str, agent_id: str, verb: Verb) -> None:
        """MemoryAccessDenied (naming the scope and how to get access) unless `agent_id` may `verb` it."""
        access = await self.access(scope_id)
        if access is not None and access.may(verb, agent_id):
            return
        name = shared_name(scope_id) or scope_id
        why = "is not defined" if access is None else f"does not let agent {agent_id!r} {verb} it"
        raise MemoryAccessDenied(
            f"shared memory {name!r} {why}; the operator grants access with "
            f"`colony memory shared define {name} --{verb.rstrip('e')}ers ...` (the whole list)"
        )

    async def names(self) -> list[str]:
        """Names of the colony's defined shared scopes, in the order they were defined."""
        stored = await self._colony_board().read(Keys.scopes_key())
        ids = stored.value if stored is not None and isinstance(stored.value, list) else []
        return [n for n in (shared_name(s) for s in ids if isinstance(s, str)) if n is not None]

    async def info(self, name: str) -> SharedScopeInfo:
        scope = self.scope_id(name)
        board = self.store.board(scope)
        config = await self.store.config(scope)
        record = await board.read(Keys.access_key())
        if config is None or record is None or not isinstance(record.value, dict):
            raise SharedMemoryNotFound(
                f"no shared memory {name!r} in this colony; define it first "
                f"(`colony memory shared define {name}` or PUT /v1/memory/shared/{name})"
            )
        access = await self.access(scope) or SharedAccess(readers=[], writers=[])
        return SharedScopeInfo(
            name=name,
            scope_id=scope,
            scope_type=config.scope_type,
            purpose=config.purpose,
            ttl_seconds=config.ttl_seconds,
            max_entries=config.max_entries,
            readers=access.readers,
            writers=access.writers,
            entry_count=await self.store.count(scope),
            subscribed_to=config.subscribed_to,
            updated_at=record.value.get("updated_at"),
            updated_by=record.value.get("updated_by"),
        )


class SharingTransformer:
    """What an agent's own memory passes to a shared scope: each entry copied with its provenance
    and tagged `shared`, less any tagged `user` or in `exclude`, and less any that retells what the
    user told the agent (colony.memory.user_words: an action record holding the user's message,
    say). What the user said is read once per batch."""

    def __init__(self, exclude: Sequence[str] = (USER_TAG,)) -> None:
        self.exclude = frozenset(exclude) | {USER_TAG}

    async def transform(
        self, entries: Sequence[MemoryEntry], capability: MemoryCapability
    ) -> list[NewMemory]:
        private = [c.memory_scope for c in private_memory(capability.agent)]
        heard = UserWords(await user_messages(capability.store, private))
        kept = [e for e in entries if not (e.tags & self.exclude) and heard.retold_by(e.content) is None]
        copies = copy_transform(kept, capability.ttl_seconds)
        return [c.model_copy(update={"tags": frozenset(sorted(c.tags | {SHARED_TAG})[:32])}) for c in copies]


def share_from(level: str = "stm", *, tags: Sequence[str] | None = None) -> MemorySubscription:
    """A subscription of a shared scope to one of the agent's own levels (entries with one of
    `tags`; None: every entry the SharingTransformer lets through)."""
    tag_filter = TagFilter(any_of=frozenset(tags)) if tags else None
    return MemorySubscription(source_scope_id=level, tag_filter=tag_filter)


class SharedMemoryCapability(MemoryCapability):
    """An agent's membership of one shared scope (`name`: `collective:team-a`, `task:t1`, `global`).

    The scope's TTL and cap are the definition's. With `subscriptions` (e.g. `[share_from("stm",
    tags=["assistant"])]`) the agent's entries flow in through `transformer` (SharingTransformer by
    default) while the agent may write the scope; without write access its ingestion waits (its
    position stays) and says so in the log, and takes up from there once access is granted."""

    shared = True

    def __init__(
        self,
        agent: Agent | None = None,
        scope_id: str | None = None,
        *,
        name: str,
        subscriptions: Sequence[MemorySubscription] = (),
        transformer: Any = None,
        blackboard: Blackboard | None = None,
        maintenance: MaintenanceConfig | None = None,
        engine: Any = None,
        settings: ColonySettings | None = None,
    ) -> None:
        where = _where(agent)
        self.name_shared = check_name(name)
        policy = MemoryIngestPolicy(
            subscriptions=list(subscriptions), transformer=transformer or SharingTransformer()
        )
        super().__init__(
            agent,
            shared_scope_id(name, **where),
            blackboard=blackboard,
            ingestion_policy=policy,
            maintenance=maintenance,
            capability_key=f"memory-shared-{name.replace(':', '-')}",
            engine=engine,
            settings=settings,
        )
        self._refused = False
        self._recorded = False  # this agent's sources are in the scope's `subscribed_to`

    async def check(self, verb: Verb) -> None:
        """Take the definition's current TTL and cap, then MemoryAccessDenied unless this agent may
        `verb` the scope now (both read from Redis at every call, so a redefinition holds from the
        next one). A writer's sources are added to the scope's `subscribed_to` once."""
        config = await self.store.config(self.memory_scope)
        if config is not None:
            self.ttl_seconds, self.max_entries = config.ttl_seconds, config.max_entries
        await SharedScopes(self.store, **_where(self.agent)).check(self.memory_scope, self._who(), verb)
        sources = self.source_scopes()
        if verb == "write" and config is not None and sources and not self._recorded:
            if not set(sources) <= set(config.subscribed_to):
                await self.blackboard.update(Keys.config_key(), lambda held: _with_sources(held, sources))
            self._recorded = True

    async def start(self) -> None:
        """Take the definition, list the scope among the agent's, then ingest (each look at the
        sources checks the rules first)."""
        try:
            await self.check("read")
        except MemoryAccessDenied as exc:
            log.warning("agent %s: %s", self._who(), exc)
        if self.agent is not None:
            await register_scope(self.agent.blackboard, self.memory_scope)
        if self.ingestion_policy.subscriptions:
            self._tasks.append(asyncio.create_task(self._ingest_forever(), name=f"{self.name}-ingest"))

    async def write(self, memory: NewMemory, *, dedup: bool = True) -> Any:
        await self.check("write")
        return await super().write(memory, dedup=dedup)

    async def ingest_once(self) -> int:
        """One look at every subscription while the agent may write the scope (a catch-up of many
        chunks is one look); none (the positions stay) while it may not."""
        try:
            await self.check("write")
        except MemoryAccessDenied as exc:
            if not self._refused:
                log.warning("agent %s: not sharing into %r: %s", self._who(), self.name_shared, exc)
            self._refused = True
            return 0
        self._refused = False
        return await super().ingest_once()


def _parsed(model: Any, value: Any) -> Any:
    """`value` as `model`, or None when it is not one (a record some writer of Redis spoilt)."""
    try:
        return model.model_validate(value)
    except ValueError:
        return None


def _with_sources(held: Any, sources: list[str]) -> Any:
    """A stored scope config with `sources` among its `subscribed_to` (the newest MAX_MEMBERS kept)."""
    if not isinstance(held, dict):
        return held
    current = [s for s in held.get("subscribed_to") or [] if isinstance(s, str)]
    merged = [*[s for s in current if s not in sources], *sources][-MAX_MEMBERS:]
    return {**held, "subscribed_to": merged}


def unreadable_by(store: MemoryStore, agent_id: str) -> Callable[[str], Awaitable[bool]]:
    """Whether a scope is shared memory `agent_id` may not read now (by the scope's stored rules):
    what an agent's MemoryMap leaves out (introspection.agent_memory_map's `hidden`)."""
    rules = SharedScopes(store)

    async def hidden(scope_id: str) -> bool:
        if shared_name(scope_id) is None:
            return False
        try:
            await rules.check(scope_id, agent_id, "read")
        except MemoryAccessDenied:
            return True
        return False

    return hidden


def _where(agent: Agent | None) -> dict[str, str]:
    """The tenant and colony of the shared scopes `agent` reaches: its tenant's (read from its id,
    colony.wire.tenants: another tenant's agent never reaches the colony's own scopes)."""
    if agent is None:
        return {}
    meta = agent.metadata
    return {"tenant_id": tenant_of(agent.agent_id, meta.tenant_id), "colony_id": meta.colony_id}
