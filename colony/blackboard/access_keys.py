"""Keys of access control (COLONY scope, `access` namespace): the scoped API tokens, stored by id
with a digest of their secret (`token:{token_id}`), and each tenant's audit trail, a capped Redis
stream of the state-changing calls made to the API (colony.system.audit)."""

from __future__ import annotations

from typing import ClassVar

from colony.blackboard.protocol import BlackboardKeyspace, BlackboardProtocol


class AccessProtocol(BlackboardProtocol):
    namespace: ClassVar[str] = "access"
    templates = {"token": "token:{token_id}"}

    @classmethod
    def token_key(cls, token_id: str) -> str:
        return cls.build("token", token_id=token_id)

    @classmethod
    def token_index_tag(cls) -> str:
        """The tag of every token record (`colony token ls`)."""
        return "access:tokens"

    @classmethod
    def scope(cls, tenant_id: str, colony_id: str) -> str:
        """The scope id of a tenant's tokens and audit trail (its COLONY scope, this namespace)."""
        from colony.blackboard.scopes import BlackboardScope, scope_id  # (scopes builds on protocol)

        return scope_id(
            BlackboardScope.COLONY, tenant_id=tenant_id, colony_id=colony_id, namespace=cls.namespace
        )

    @classmethod
    def audit_stream_key(cls, tenant_id: str, colony_id: str, *, refused: bool = False) -> str:
        """The Redis stream of a tenant's audit trail (with the scope's hash tag); `refused`: the
        stream of the calls refused (403, 404 for another token's agent), kept apart so that a
        flood of them cannot push the accepted calls out."""
        suffix = "audit-refused" if refused else "audit"
        return f"{BlackboardKeyspace.ROOT}:{{{cls.scope(tenant_id, colony_id)}}}:{suffix}"

    @classmethod
    def sources_key(cls, tenant_id: str, colony_id: str) -> str:
        """The Redis set of the source ids (mapped folders, colony.vcm) a tenant other than the
        colony's own mapped: the page table is the colony's, this says which of it is the tenant's."""
        return f"{BlackboardKeyspace.ROOT}:{{{cls.scope(tenant_id, colony_id)}}}:sources"

    @classmethod
    def quota_key(cls, tenant_id: str, colony_id: str, what: str) -> str:
        """A key of a tenant's quotas (colony.system.tenant_quota): `open` (its runs not yet ended,
        a sorted set by deadline), `rate` (its submits in the current second, a hash) or `making`
        (the lock one making of its agents holds)."""
        return f"{BlackboardKeyspace.ROOT}:{{{cls.scope(tenant_id, colony_id)}}}:quota:{what}"

    @classmethod
    def tenant_patterns(cls, tenant_id: str, home_id: str, colony_id: str) -> list[str]:
        """SCAN patterns of the keys a tenant other than the colony's own holds (colony.system.
        tenant_usage): its agents' scopes (kept under the colony's own tenant, their ids reading
        `t.<tenant>.`) and its own scopes (shared memory, tokens' audit, quotas). Tenant names and
        colony ids hold no glob character (their patterns)."""
        from colony.blackboard.scopes import BlackboardScope, scope_id  # (scopes builds on protocol)

        agents = scope_id(BlackboardScope.COLONY, tenant_id=home_id, colony_id=colony_id)
        own = scope_id(BlackboardScope.COLONY, tenant_id=tenant_id, colony_id=colony_id)
        root = BlackboardKeyspace.ROOT
        return [f"{root}:{{{agents}:agent:t.{tenant_id}.*", f"{root}:{{{own}}}*", f"{root}:{{{own}:*"]
