"""The colony's block directories (each owner's labels, the blocks shared with each agent, the
owners set), changed only by Lua scripts that check and write in one step: a label is checked
against the owner's view (its colony, shared and own labels) and the owner's block count in the
same script that lists it, so concurrent creates can neither pass `max_blocks_per_owner` nor give
one view two blocks of one label (checked, then written by separate calls, they did both).

A block's own keys live in another hash slot than the directories, so creating one is two writes:
the label is listed first, then the block's keys are written (`scripts.CREATE`, which alone decides
whether the block exists). A crash in between leaves a listed label without a block: listing skips
it and a re-create of that label fills it. Deletion is the reverse (keys, then the label).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from colony.blackboard.protocol import BlockProtocol
from colony.errors import BlockContended, BlockExists, InvalidArgument
from colony.memory.blocks import scripts

COLONY = BlockProtocol.COLONY_OWNER
# A colony block's label is checked against the index of every owner read just before; an owner
# that got its first block meanwhile makes the script answer 'stale' and the owners are read again.
LIST_ATTEMPTS = 8


class BlockListing:
    """The directories of one colony (`namespace`) on one Redis client."""

    def __init__(self, redis: aioredis.Redis, namespace: str, max_blocks: int, max_shares: int) -> None:
        self.redis = redis
        self.namespace = namespace
        self.max_blocks = max_blocks
        self.max_shares = max_shares
        self._agent = redis.register_script(scripts.LIST_AGENT_LABEL)
        self._colony = redis.register_script(scripts.LIST_COLONY_LABEL)
        self._unlist = redis.register_script(scripts.UNLIST_LABEL)
        self._grant = redis.register_script(scripts.GRANT_SHARE)

    def _index(self, owner: str) -> str:
        return BlockProtocol.owner_index(self.namespace, owner)

    async def list_label(self, owner: str, label: str, block_id: str) -> None:
        """List `label` -> `block_id` in `owner`'s index, or raise why it cannot be (BlockExists:
        it would collide in a view; InvalidArgument: the owner has `max_blocks`). A label listed
        already passes: the block's own CREATE script tells whether the block exists."""
        owners = BlockProtocol.owners_key(self.namespace)
        if owner != COLONY:
            keys = [
                self._index(owner),
                owners,
                self._index(COLONY),
                BlockProtocol.shared_index(self.namespace, owner),
            ]
            reply = await self._agent(keys=keys, args=[label, block_id, self.max_blocks, owner])
        else:
            reply = await self._list_colony_label(label, block_id)
        code = str(reply[0])
        if code in ("ok", "listed"):
            return
        if code == "full":
            raise InvalidArgument(
                f"{owner} has {self.max_blocks} blocks (blocks.max_blocks_per_owner); delete one first"
            )
        if code == "colony":
            raise BlockExists(
                f"{label!r} is a colony-wide block every agent sees; pick another label for {owner}'s"
            )
        if code == "shared":
            raise BlockExists(
                f"agent {owner} already sees a shared block labelled {label!r}; pick another label"
            )
        raise BlockExists(
            f"agent {reply[1]} has a block labelled {label!r}; a colony block of that label would collide "
            "with it in its view"
        )

    async def _list_colony_label(self, label: str, block_id: str) -> list[str]:
        owners = BlockProtocol.owners_key(self.namespace)
        for _ in range(LIST_ATTEMPTS):
            agents = sorted(a for a in await self.redis.smembers(owners) if a != COLONY)
            keys = [self._index(COLONY), owners, *(self._index(a) for a in agents)]
            reply = await self._colony(keys=keys, args=[label, block_id, self.max_blocks, COLONY, *agents])
            if str(reply[0]) != "stale":
                return list(reply)
        raise BlockContended(
            f"agents kept getting their first blocks while colony block {label!r} was checked against "
            f"theirs ({LIST_ATTEMPTS} tries); nothing was created, try again",
            current_version=0,
        )

    async def unlist(self, owner: str, label: str) -> bool:
        """Remove `label` from `owner`'s index (and the owner from the owners set when it has no
        label left), in one step: a create listing the owner's first label meanwhile is kept."""
        owners = BlockProtocol.owners_key(self.namespace)
        return bool(await self._unlist(keys=[self._index(owner), owners], args=[label, owner]))

    async def grant(self, agent_id: str, block_id: str, label: str, grant: str) -> None:
        """Record in `agent_id`'s shared index that `block_id` (labelled `label`) is shared with
        it, unless the label collides in its view or it has `max_shares` shared blocks."""
        keys = [self._index(agent_id), BlockProtocol.shared_index(self.namespace, agent_id)]
        reply = await self._grant(keys=keys, args=[block_id, label, grant, self.max_shares])
        code = str(reply[0])
        if code == "own":
            raise BlockExists(f"{agent_id} has its own block labelled {label!r}; it cannot see a second one")
        if code == "shared":
            raise BlockExists(f"{agent_id} already sees another shared block labelled {label!r}")
        if code == "full":
            raise InvalidArgument(
                f"{agent_id} has {self.max_shares} blocks shared with it (blocks.max_shares_per_block); "
                "unshare one first"
            )
