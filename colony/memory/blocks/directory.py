"""Who sees which block, and with what access: lookup by label through an agent's view (own,
shared with it, colony-wide), sharing grants, settings and deletion. Mixed into BlockStore."""

from __future__ import annotations

import base64
import json
import time
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from colony.blackboard.protocol import BlockProtocol
from colony.config import BlockSettings
from colony.errors import BlockAccessDenied, BlockNotFound, InvalidArgument
from colony.memory.blocks.agents import agent_known, check_provisionable, unknown_agent
from colony.memory.blocks.types import (
    LABEL_PATTERN,
    MAX_DESCRIPTION_CHARS,
    OPERATOR,
    SYSTEM,
    BlockInfo,
    BlockType,
    Principal,
    Share,
    SharedAccess,
)
from colony.wire.input_check import is_utf8

if TYPE_CHECKING:
    from colony.memory.blocks.cache import DocumentCache
    from colony.memory.blocks.listing import BlockListing

COLONY = BlockProtocol.COLONY_OWNER


def b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


encodable = is_utf8  # (text Loro can store)


def clean_text(text: str) -> str:
    """Text that Loro can store (lone surrogates replaced): notes and descriptions are kept, not refused."""
    return text if encodable(text) else text.encode("utf-8", "replace").decode("utf-8")


def check_label(label: str) -> str:
    if not isinstance(label, str) or not LABEL_PATTERN.fullmatch(label):
        raise InvalidArgument(
            f"block label {label!r} is not valid: 1-64 characters, lowercase letters, digits and '_', "
            "starting with a letter"
        )
    return label


def check_agent(agent_id: str) -> str:
    if not isinstance(agent_id, str) or not agent_id or agent_id.startswith("_") or len(agent_id) > 128:
        raise InvalidArgument(f"agent id {agent_id!r} is not valid for memory blocks")
    BlockProtocol.owner_index("x", agent_id)  # the key rules: no ':', wildcards, braces, spaces
    return agent_id


def info_from_fields(fields: dict[str, str], block_id: str) -> BlockInfo:
    def opt_int(name: str) -> int | None:
        value = fields.get(name)
        return int(value) if value else None

    return BlockInfo(
        block_id=block_id,
        owner=fields["owner"],
        label=fields["label"],
        description=fields.get("description", ""),
        block_type=BlockType(fields.get("block_type", "working")),
        char_limit=int(fields.get("char_limit", "5000")),
        read_only=fields.get("read_only") == "1",
        swapped_out=fields.get("swapped_out") == "1",
        template=fields.get("template") or None,
        colony_access=SharedAccess(fields["colony_access"]) if fields.get("colony_access") else None,
        log_max_entries=opt_int("log_max_entries"),
        log_shown_entries=opt_int("log_shown_entries"),
        created_at=float(fields.get("created_at", "0")),
        updated_at=float(fields.get("updated_at", "0")),
        created_by=fields.get("created_by", ""),
    )


def check_access(info: BlockInfo, access: SharedAccess, needs: str, principal: str) -> None:
    where = f"{info.owner}'s block {info.label!r}" if info.owner != principal else f"block {info.label!r}"
    if info.block_type is BlockType.LOG:
        raise BlockAccessDenied(f"{where} is a log the system writes; it is read-only to agents")
    if info.read_only and principal != OPERATOR:
        raise BlockAccessDenied(f"{where} is read-only; only the system or the operator changes it")
    if needs == "write" and access is not SharedAccess.READ_WRITE:
        raise BlockAccessDenied(
            f"{principal} has {access.value} access to {where}; this edit removes or rewrites text"
            + ("; only add text (core_memory_append / memory_insert)" if access.can_write else "")
        )
    if needs == "append" and not access.can_write:
        raise BlockAccessDenied(f"{principal} has read-only access to {where}; it cannot be changed")


def own_access(info: BlockInfo) -> SharedAccess:
    """What an owner may do with its own block."""
    if info.read_only or info.block_type is BlockType.LOG:
        return SharedAccess.READ_ONLY
    return SharedAccess.READ_WRITE


def colony_access(info: BlockInfo) -> SharedAccess:
    """What every agent may do with colony-wide block `info`."""
    if info.read_only or info.block_type is BlockType.LOG or info.colony_access is None:
        return SharedAccess.READ_ONLY
    return info.colony_access


class BlockDirectory:
    """Lookup, access and sharing of blocks (the parts of BlockStore that need no document)."""

    redis: aioredis.Redis
    settings: BlockSettings
    namespace: str
    tenant_id: str
    colony_id: str
    documents: DocumentCache  # the cached documents (a deleted block's are dropped)
    listing: BlockListing  # the owner and shared indexes, changed by checking scripts

    def block_id(self, owner: str, label: str) -> str:
        return BlockProtocol.block_id(self.namespace, owner, check_label(label))

    async def check_known(self, agent_id: str, *, provision: bool = False, what: str = "blocks") -> str:
        """`agent_id` when the colony knows it or has reserved it (colony.memory.blocks.agents);
        with `provision`, any id that can name an agent (reserved by what is made for it).
        AgentNotFound otherwise: the HTTP routes and the CLI refuse blocks and shares for agents
        that do not exist unless asked to pre-provision them."""
        if provision:
            return check_agent(check_provisionable(agent_id))
        check_agent(agent_id)
        if not await agent_known(self.redis, self.tenant_id, self.colony_id, self.namespace, agent_id):
            raise unknown_agent(agent_id, what)
        return agent_id

    async def info_of(self, block_id: str) -> BlockInfo | None:
        fields = await self.redis.hgetall(BlockProtocol.key(block_id, "meta"))
        return info_from_fields(fields, block_id) if fields else None

    async def _infos(self, block_ids: list[str]) -> list[BlockInfo | None]:
        if not block_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for block_id in block_ids:
                pipe.hgetall(BlockProtocol.key(block_id, "meta"))
            rows = await pipe.execute()
        return [info_from_fields(r, b) if r else None for r, b in zip(rows, block_ids, strict=True)]

    async def _shared_label(self, agent_id: str, label: str) -> tuple[str, SharedAccess] | None:
        grants = await self.redis.hgetall(BlockProtocol.shared_index(self.namespace, agent_id))
        for block_id, raw in grants.items():
            grant = json.loads(raw)
            if grant.get("label") == label:
                return block_id, SharedAccess(grant["access"])
        return None

    async def resolve(
        self, principal: Principal, label: str, *, owner: str | None = None
    ) -> tuple[BlockInfo, SharedAccess]:
        """The block `principal` means by `label` (its own, then shared with it, then colony-wide;
        or `owner`'s), and what it may do with it. Raises BlockNotFound / BlockAccessDenied."""
        check_label(label)
        if principal in (SYSTEM, OPERATOR):
            if owner is None:
                raise InvalidArgument("the system and the operator must name the block's owner")
            info = await self.info_of(self.block_id(owner, label))
            if info is None:
                raise BlockNotFound(f"{owner} has no block labelled {label!r}")
            return info, SharedAccess.READ_WRITE
        check_agent(principal)
        if owner in (None, principal):
            info = await self.info_of(self.block_id(principal, label))
            if info is not None:
                return info, own_access(info)
            if owner == principal:
                raise BlockNotFound(f"{principal} has no block labelled {label!r}")
        if owner is None:
            shared = await self._shared_label(principal, label)
            if shared is not None:
                info = await self.info_of(shared[0])
                # the block's own access list decides; the agent's index only finds it
                granted = await self.redis.hget(BlockProtocol.key(shared[0], "acl"), principal)
                if info is not None and granted is not None:
                    access = SharedAccess(granted)
                    return info, SharedAccess.READ_ONLY if info.read_only else access
            info = await self.info_of(self.block_id(COLONY, label))
            if info is not None:
                return info, colony_access(info)
            raise BlockNotFound(
                f"{principal} sees no block labelled {label!r} (not its own, not shared with it, not "
                "colony-wide); list its blocks to see the labels it has"
            )
        block_id = self.block_id(owner, label)
        info = await self.info_of(block_id)
        if info is None:
            raise BlockNotFound(f"{owner} has no block labelled {label!r}")
        if owner == COLONY:
            return info, colony_access(info)
        raw = await self.redis.hget(BlockProtocol.key(block_id, "acl"), principal)
        if raw is None:
            raise BlockAccessDenied(
                f"{principal} has no access to {owner}'s block {label!r}; the owner or the operator can "
                "share it (POST /v1/blocks/share)"
            )
        access = SharedAccess(raw)
        return info, SharedAccess.READ_ONLY if info.read_only else access

    async def list_for(self, principal: Principal) -> list[tuple[BlockInfo, SharedAccess]]:
        """Every block `principal` sees: own, shared with it, colony-wide (own labels first)."""
        check_agent(principal)
        own_ids = list(
            (await self.redis.hgetall(BlockProtocol.owner_index(self.namespace, principal))).values()
        )
        grants = await self.redis.hgetall(BlockProtocol.shared_index(self.namespace, principal))
        colony_ids = list(
            (await self.redis.hgetall(BlockProtocol.owner_index(self.namespace, COLONY))).values()
        )
        out: list[tuple[BlockInfo, SharedAccess]] = []
        seen: set[str] = set()
        for info in await self._infos(sorted(own_ids)):
            if info is not None:
                out.append((info, own_access(info)))
                seen.add(info.label)
        shared_ids = sorted(grants)
        shared_infos = await self._infos(shared_ids)
        async with self.redis.pipeline(transaction=False) as pipe:
            for block_id in shared_ids:
                pipe.hget(BlockProtocol.key(block_id, "acl"), principal)
            granted = dict(zip(shared_ids, await pipe.execute(), strict=True))
        for info in shared_infos:
            if info is not None and info.label not in seen and granted.get(info.block_id):
                access = SharedAccess(granted[info.block_id])
                out.append((info, SharedAccess.READ_ONLY if info.read_only else access))
                seen.add(info.label)
        for info in await self._infos(sorted(colony_ids)):
            if info is not None and info.label not in seen:
                out.append((info, colony_access(info)))
                seen.add(info.label)
        return out

    async def list_owned(self, owner: str) -> list[BlockInfo]:
        ids = list((await self.redis.hgetall(BlockProtocol.owner_index(self.namespace, owner))).values())
        return [i for i in await self._infos(sorted(ids)) if i is not None]

    # -- metadata, sharing, deletion ------------------------------------------------------------------

    async def update_info(
        self,
        principal: Principal,
        label: str,
        *,
        owner: str | None = None,
        description: str | None = None,
        char_limit: int | None = None,
        swapped_out: bool | None = None,
    ) -> BlockInfo:
        """Change description, char limit or swapped-out state (owner, system or operator only)."""
        info, _access = await self.resolve(principal, label, owner=owner)
        if principal not in (SYSTEM, OPERATOR) and info.owner != principal:
            raise BlockAccessDenied(f"only the owner ({info.owner}) changes block {label!r}'s settings")
        fields: dict[str, str] = {}
        if description is not None:
            if len(description) > MAX_DESCRIPTION_CHARS:
                raise InvalidArgument(f"description is longer than {MAX_DESCRIPTION_CHARS} characters")
            fields["description"] = clean_text(description)
        if char_limit is not None:
            if not 1 <= char_limit <= self.settings.max_char_limit:
                raise InvalidArgument(f"char_limit must be 1..{self.settings.max_char_limit}")
            fields["char_limit"] = str(char_limit)
        if swapped_out is not None:
            if info.block_type is not BlockType.WORKING:
                raise InvalidArgument("only WORKING blocks can be swapped out of the prompt")
            fields["swapped_out"] = "1" if swapped_out else "0"
        if fields:
            fields["updated_at"] = repr(time.time())
            await self.redis.hset(BlockProtocol.key(info.block_id, "meta"), mapping=fields)
        return await self.info_of(info.block_id) or info

    async def share(
        self, principal: Principal, owner: str, label: str, agent_id: str, access: SharedAccess
    ) -> Share:
        """Give `agent_id` `access` to `owner`'s block (by the owner, the system or the operator)."""
        check_agent(agent_id)
        if principal not in (SYSTEM, OPERATOR) and principal != owner:
            raise BlockAccessDenied(f"only {owner} (the owner) or the operator shares {owner}'s blocks")
        if owner == COLONY:
            raise InvalidArgument("colony blocks are shared with every agent already (colony_access)")
        if agent_id == owner:
            raise InvalidArgument("an owner always has its own blocks")
        block_id = self.block_id(owner, label)
        if await self.info_of(block_id) is None:
            raise BlockNotFound(f"{owner} has no block labelled {label!r}")
        acl = BlockProtocol.key(block_id, "acl")
        if not await self.redis.hexists(acl, agent_id) and (
            await self.redis.hlen(acl) >= self.settings.max_shares_per_block
        ):
            raise InvalidArgument(
                f"block {label!r} is shared with {self.settings.max_shares_per_block} agents (the most)"
            )
        grant = json.dumps({"owner": owner, "label": label, "access": access.value})
        # the agent's view first (its label checked and the grant recorded in one script), then the
        # block's access list, which alone lets the agent in: a crash between leaves nothing usable
        await self.listing.grant(agent_id, block_id, label, grant)
        await self.redis.hset(acl, agent_id, access.value)
        return Share(block_id=block_id, owner=owner, label=label, agent_id=agent_id, access=access)

    async def unshare(self, principal: Principal, owner: str, label: str, agent_id: str) -> bool:
        check_agent(agent_id)
        if principal not in (SYSTEM, OPERATOR) and principal != owner:
            raise BlockAccessDenied(f"only {owner} (the owner) or the operator unshares {owner}'s blocks")
        block_id = self.block_id(owner, label)
        removed = await self.redis.hdel(BlockProtocol.key(block_id, "acl"), agent_id)
        await self.redis.hdel(BlockProtocol.shared_index(self.namespace, agent_id), block_id)
        return bool(removed)

    async def shares_of(self, owner: str, label: str) -> dict[str, SharedAccess]:
        raw = await self.redis.hgetall(BlockProtocol.key(self.block_id(owner, label), "acl"))
        return {agent: SharedAccess(a) for agent, a in raw.items()}

    async def delete(self, principal: Principal, owner: str, label: str) -> bool:
        """Delete a block with its history and shares (owner, system or operator)."""
        if principal not in (SYSTEM, OPERATOR) and principal != owner:
            raise BlockAccessDenied(f"only {owner} (the owner) or the operator deletes {owner}'s blocks")
        block_id = self.block_id(owner, label)
        agents = await self.redis.hkeys(BlockProtocol.key(block_id, "acl"))
        for agent in agents:
            await self.redis.hdel(BlockProtocol.shared_index(self.namespace, agent), block_id)
        removed = await self.redis.delete(*(BlockProtocol.key(block_id, p) for p in BlockProtocol.PARTS))
        await self.listing.unlist(owner, label)  # after the keys: a crash between is healed by a re-create
        self.documents.forget(block_id)
        return bool(removed)

    async def stored_bytes(self, block_id: str) -> int:
        """Bytes Redis holds for the block's snapshot and update log (base64 text)."""
        snap = await self.redis.strlen(BlockProtocol.key(block_id, "snap"))
        log = await self.redis.lrange(BlockProtocol.key(block_id, "log"), 0, -1)
        return int(snap) + sum(len(x) for x in log)
