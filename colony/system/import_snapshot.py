"""The exact Redis keys an agent import may touch, taken before its first write, and put back by
its undo (docs/transfer.md, step 4, "All or nothing").

What an import touches of one agent id: its scope family (state entries, rings, memory scopes,
run requests, session tree, event streams, indexes: one hash tag each, found by a bounded SCAN,
`BlackboardKeyspace.family_match`), its block owner index, the keys of every block it owns or
the document names, and the entries of the agents its blocks are shared with that point at them.
Each is kept as Redis' own DUMP payload and its remaining time to live (PTTL), in this process'
memory only, bounded by `context.max_export_bytes` (an agent too large to keep is refused before
anything is written). The undo deletes what was not there before and RESTOREs (REPLACE, with the
original expiry) every kept key: the id is then exactly as it was (pre-provisioned blocks, block
history, a session's conversation, its runs and queued requests), whatever this colony's limits
are now, because nothing is re-planned or re-checked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from colony.blackboard import Blackboard
from colony.blackboard.protocol import BlackboardKeyspace, BlockProtocol
from colony.config import ColonySettings
from colony.errors import ImportRejected
from colony.memory.blocks import SYSTEM, agent_block_store
from colony.system.agent_purge import UNLINK_BATCH, scan

BATCH = 200  # keys dumped or restored per pipeline


@dataclass
class KeySnapshot:
    """One agent id's keys as they were: DUMP payload and PTTL (ms, 0: no expiry) by Redis key."""

    agent_id: str
    namespace: str  # the colony's block namespace
    family: set[str] = field(default_factory=set)  # the scope family's keys (a subset of `dumps`)
    dumps: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    blocks: dict[str, str] = field(default_factory=dict)  # label -> block id owned before
    grants: dict[tuple[str, str], str] = field(default_factory=dict)  # (shared index, block id) -> grant

    @property
    def index(self) -> str:
        return BlockProtocol.owner_index(self.namespace, self.agent_id)


def _block_keys(block_ids: Iterable[str]) -> list[str]:
    return [BlockProtocol.key(b, part) for b in block_ids for part in sorted(BlockProtocol.PARTS)]


async def take_snapshot(
    board: Blackboard, agent_id: str, labels: Iterable[str], settings: ColonySettings
) -> KeySnapshot:
    """The keys of `agent_id` (`board`: its scope) and of the blocks labelled `labels` it would
    own, before an import writes; ImportRejected when they cannot all be kept within
    `context.max_export_bytes` (or the SCAN was cut short)."""
    redis = board.redis
    store = agent_block_store(redis, settings, agent_id)
    snap = KeySnapshot(agent_id, store.namespace)
    family, truncated = await scan(board, BlackboardKeyspace(board.scope_id).family_match())
    async with board.guard("import snapshot"):
        snap.blocks = {str(k): str(v) for k, v in (await redis.hgetall(snap.index)).items()}
    named = {store.block_id(agent_id, label) for label in labels}
    keys = [*family, snap.index, *_block_keys(sorted(set(snap.blocks.values()) | named))]
    limit, size = settings.context.max_export_bytes, 0
    for start in range(0, len(keys), BATCH):
        batch = keys[start : start + BATCH]
        async with board.guard("import snapshot"), redis.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.dump(key)
                pipe.pttl(key)
            found = await pipe.execute()
        for key, payload, ttl in zip(batch, found[::2], found[1::2], strict=True):
            if payload is None:
                continue  # absent (or gone since the SCAN)
            snap.dumps[key] = (bytes(payload), max(int(ttl), 0))
            size += len(payload)
        if truncated or size > limit:
            raise ImportRejected(
                f"agent {agent_id} here holds more than this import can keep to put back should it fail "
                f"({'a SCAN cut short' if truncated else f'over {limit} bytes, context.max_export_bytes'}): "
                "export it and remove it (stop it, `colony doctor --prune-orphans`), or raise that setting"
            )
    snap.family = set(family) & set(snap.dumps)
    for block_id in snap.blocks.values():
        async with board.guard("import snapshot"):
            grantees = await redis.hkeys(BlockProtocol.key(block_id, "acl"))
            for agent in grantees:
                shared = BlockProtocol.shared_index(snap.namespace, str(agent))
                grant = await redis.hget(shared, block_id)
                if grant is not None:
                    snap.grants[(shared, block_id)] = str(grant)
    return snap


async def restore_snapshot(
    board: Blackboard, snap: KeySnapshot, labels: Iterable[str], settings: ColonySettings
) -> None:
    """Put the id back as `snap` found it: blocks it did not own then (those its index lists now
    and `labels`, the document's) are deleted with their shares, every other key of its scope
    family that was not there is removed, and every kept key is restored with its expiry."""
    redis = board.redis
    store = agent_block_store(redis, settings, snap.agent_id)
    async with board.guard("import undo"):
        now_owned = {str(k) for k in await redis.hkeys(snap.index)}
    for label in sorted(now_owned | set(labels)):
        if label not in snap.blocks:
            await store.delete(SYSTEM, snap.agent_id, label)
    family, _ = await scan(board, BlackboardKeyspace(board.scope_id).family_match())
    extra = [k for k in family if k not in snap.dumps]
    extra += [k for k in _block_keys(snap.blocks.values()) if k not in snap.dumps]
    if snap.index not in snap.dumps:
        extra.append(snap.index)
    for start in range(0, len(extra), UNLINK_BATCH):
        async with board.guard("import undo"):
            await redis.unlink(*extra[start : start + UNLINK_BATCH])
    items = sorted(snap.dumps.items())
    for start in range(0, len(items), BATCH):
        async with board.guard("import undo"), redis.pipeline(transaction=False) as pipe:
            for key, (payload, ttl) in items[start : start + BATCH]:
                pipe.restore(key, ttl, payload, replace=True)
            await pipe.execute()
    async with board.guard("import undo"):
        for (shared, block_id), grant in snap.grants.items():
            await redis.hset(shared, block_id, grant)
        owners = BlockProtocol.owners_key(snap.namespace)
        if snap.blocks:
            await redis.sadd(owners, snap.agent_id)
        elif not await redis.hlen(snap.index):
            await redis.srem(owners, snap.agent_id)
    for block_id in snap.blocks.values():
        store.documents.forget(block_id)


def memory_keys(snap: KeySnapshot, scope: str, prefix: str) -> list[str]:
    """The kept family keys of the agent's memory scopes (`<scope>:namespace:<prefix>...`): what a
    `replace` clears so the agent's memory is the document's alone."""
    keyspace = BlackboardKeyspace(scope)
    head = f"{scope}:namespace:{prefix}"
    return sorted(k for k in snap.family if (keyspace.nested_scope(k) or "").startswith(head))
