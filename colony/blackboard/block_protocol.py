"""Keys of memory blocks (colony.memory.blocks): Redis Cluster hash-tagged keys outside the scope
key space, so one Lua script edits a block's keys atomically."""

from __future__ import annotations

import hashlib

from colony.blackboard.protocol import validate_segment
from colony.errors import InvalidKey

__all__ = ["BlockProtocol"]


class BlockProtocol:
    """Keys of memory blocks (`colony.memory.blocks`) of one colony (`namespace`, a digest of
    tenant and colony). A block's own keys (metadata hash, Loro snapshot, update log, access list)
    share the block id as a hash tag, so one Lua script edits them atomically (`ver`: edit ids in log
    order, which number the versions). Directories: an
    owner's labels (label -> block id), the blocks shared with an agent (block id -> grant) and
    the owners that have blocks. Block ids are digests of (namespace, owner, label), never raw input."""

    ROOT = "colony:blk"
    PARTS = frozenset({"meta", "snap", "log", "ver", "acl"})
    COLONY_OWNER = "_colony"  # owner of colony-wide blocks; agent names cannot start with "_"

    @staticmethod
    def namespace(tenant_id: str, colony_id: str) -> str:
        return hashlib.sha256(f"{tenant_id}\x00{colony_id}".encode()).hexdigest()[:16]

    @classmethod
    def block_id(cls, namespace: str, owner: str, label: str) -> str:
        validate_segment(owner, "owner")
        validate_segment(label, "label")
        digest = hashlib.sha256(f"{namespace}\x00{owner}\x00{label}".encode()).hexdigest()[:24]
        return f"b{digest}"

    @classmethod
    def key(cls, block_id: str, part: str) -> str:
        if part not in cls.PARTS:
            raise InvalidKey(f"unknown block key part {part!r}")
        return f"{cls.ROOT}:{{{validate_segment(block_id, 'block_id')}}}:{part}"

    @classmethod
    def owner_index(cls, namespace: str, owner: str) -> str:
        return (
            f"{cls.ROOT}-owner:{{{validate_segment(namespace, 'namespace')}}}:"
            f"{validate_segment(owner, 'owner')}"
        )

    @classmethod
    def shared_index(cls, namespace: str, agent_id: str) -> str:
        return (
            f"{cls.ROOT}-shared:{{{validate_segment(namespace, 'namespace')}}}:"
            f"{validate_segment(agent_id, 'agent_id')}"
        )

    @classmethod
    def owners_key(cls, namespace: str) -> str:
        """Every owner that has blocks in this colony (for listing across the colony)."""
        return f"{cls.ROOT}-owners:{{{validate_segment(namespace, 'namespace')}}}"
