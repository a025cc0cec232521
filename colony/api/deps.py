"""What the routes are given: the services behind the API, reached through one typed holder that
`create_app` puts on `app.state` and every route receives by `Depends` (no module globals, so two
apps in one process, as the tests build, never share a service).

The holder hands the services out lazily (`await ctx.services()`), where the route asks for them:
a Serve replica builds its Redis clients in its own event loop on first use, and a request refused
by its parameters never waits for (or fails on) that.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from colony.api.access import AccessServices
from colony.blackboard import Blackboard
from colony.blackboard.access_keys import AccessProtocol
from colony.config import ApiSettings, ColonySettings, VcmSettings
from colony.memory.blocks import BlockStore, block_store
from colony.system.access_tokens import TokenStore
from colony.system.audit import AuditTrail
from colony.system.registry import AgentRegistry
from colony.system.runs import RunService
from colony.vcm import PageTable
from colony.wire.token import TokenSource

# enforced by colony.api.limits.GuardMiddleware before any route runs; declared on the routes for
# the OpenAPI document's security requirement
bearer = HTTPBearer(auto_error=False, description="the API token (`colony status` prints it)")
GUARDED = [Depends(bearer)]
MAX_TRAILS = 4096  # audit trail handles kept (one per tenant seen; a handle holds no entries)


class AgentControl(Protocol):
    """Suspend/resume agents (the control plane, in-process or a Serve deployment)."""

    async def suspend(self, agent_id: str) -> Any: ...

    async def resume(self, agent_id: str) -> Any: ...

    async def delete(self, agent_id: str) -> Any: ...

    async def undo(self, agent_id: str) -> Any: ...

    async def restore(self, agent_id: str, step: int, mode: str, run_id: str | None = None) -> Any: ...

    async def place_instance(self, name: str, agent_id: str) -> Any: ...


@dataclass
class ApiServices:
    runs: RunService
    registry: AgentRegistry
    token: str | TokenSource | None
    pages: PageTable | None = None
    control: AgentControl | None = None
    vcm: VcmSettings | None = None  # which folders `POST /v1/vcm/sources` may read
    # the process's settings: the user agents of the catalog, memory bounds, the Chroma server;
    # None (library use, tests): the run service's (settings_of)
    settings: ColonySettings | None = None


ServicesProvider = Callable[[], Awaitable[ApiServices]]


def settings_of(services: ApiServices) -> ColonySettings:
    """The API process's settings; a deployment passes them (ApiServices.settings). Without them
    (library use, tests) those its run service was given."""
    if services.settings is None:
        services.settings = services.runs.settings
    return services.settings


def agent_board(services: ApiServices, agent_id: str) -> Blackboard:
    """The state scope of one agent of the services' colony (its metadata, checkpoints, ...)."""
    return services.runs.api_board.scoped(services.runs.agent_scope(agent_id))


@dataclass(frozen=True)
class ApiContext:
    """One app's services (or an async provider of them), its API settings and its token."""

    provider: ServicesProvider
    api: ApiSettings
    token: TokenSource
    _access: list[AccessServices] = field(default_factory=list)  # built once, on first use

    async def services(self) -> ApiServices:
        return await self.provider()

    async def access(self) -> AccessServices:
        """The scoped tokens of the services' colony and the audit trail of each tenant."""
        if not self._access:
            runs = (await self.services()).runs
            tenant, colony = runs.tenant_id, runs.colony_id
            board = runs.api_board.scoped(AccessProtocol.scope(tenant, colony))
            trails: dict[str, AuditTrail] = {}

            def trail_of(name: str) -> AuditTrail:
                held = trails.get(name)
                if held is None:
                    if len(trails) >= MAX_TRAILS:  # (bounded: the oldest goes; it is only a handle)
                        trails.pop(next(iter(trails)))
                    held = trails[name] = AuditTrail(
                        board.redis,
                        tenant=name,
                        colony=colony,
                        max_entries=self.api.audit_max_entries,
                        retention_seconds=self.api.audit_retention_seconds,
                    )
                return held

            if not self._access:
                self._access.append(AccessServices(TokenStore(board, tenant=tenant), tenant, trail_of))
        return self._access[0]

    async def tokens(self) -> TokenSource:
        return self.token

    async def control(self) -> AgentControl:
        """The control plane; a plain 404 where the deployment has none (a library app)."""
        services = await self.services()
        if services.control is None:
            raise StarletteHTTPException(404, "this deployment has no control plane")
        return services.control

    async def page_table(self) -> PageTable:
        services = await self.services()
        if services.pages is None:
            raise StarletteHTTPException(404, "this deployment has no virtual context memory")
        return services.pages

    async def blocks(self, tenant: str | None = None) -> BlockStore:
        """The block store of `tenant` (default: the colony's own tenant's)."""
        services = await self.services()
        return block_store(services.runs.api_board.redis, settings_of(services), tenant=tenant or None)


async def api_context(request: Request) -> ApiContext:
    """The holder `create_app` set (async: a plain `def` dependency would run in a thread)."""
    context: ApiContext = request.app.state.colony
    return context


Context = Annotated[ApiContext, Depends(api_context)]
