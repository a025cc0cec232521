"""A colony served on a loopback port for tenant tests (tests/test_tenant_isolation.py,
tests/test_tenant_quotas.py): the API over a real redis-server, a ReplicaHost with the scripted
engine, and an in-process control plane that places each tenant's instances of the catalog's agents
(the colony's own `echo`, single, and `session` starter placed at start)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
from api_kit import ServedApi

from colony.api.app import ApiServices
from colony.blackboard import Blackboard, create_redis
from colony.config import ApiSettings, ColonySettings, ServeSettings
from colony.inference.scripted import ScriptedEngine
from colony.system.builtin import session_starter_blueprint, single_echo_blueprint
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.runs import RunService

TOKEN = "operator-token"
HOME = {"Authorization": f"Bearer {TOKEN}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class TenantApp(ServedApi):
    def __init__(self, redis_url: str, roots: list[Path], **api: Any) -> None:
        colony = ColonySettings(
            redis_url=redis_url,
            colony_id=f"tn{uuid.uuid4().hex[:8]}",
            api=ApiSettings(**api),
            serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2, max_agents_per_replica=32),
            vcm={"allowed_roots": [str(r) for r in roots]},
        )
        super().__init__(colony, TOKEN, start_timeout=60)
        self.engine = ScriptedEngine(lambda request: "a scripted reply")

    async def start_services(self) -> ApiServices:
        settings = self.settings
        self._client = create_redis(settings.redis_url, settings.blackboard)
        board = Blackboard(self._client, "colony:tenants", settings=settings.blackboard)
        self.host = ReplicaHost(settings, "ra", engine=self.engine)
        self.control = ControlPlane(board, {"ra": self.host}, settings)
        self.host.spawner = self.control.place
        await self.host.start(board)
        await self.control.place(session_starter_blueprint())
        await self.control.place(single_echo_blueprint("echo"))
        return ApiServices(
            runs=RunService(board, self.control.registry, settings=settings),
            registry=self.control.registry,
            token=TOKEN,
            pages=self.host.pages,
            control=self.control,
            vcm=settings.vcm,
            settings=settings,
        )

    async def stop_services(self) -> None:
        await self.control.close()
        await self.host.close()
        await self._client.aclose()


def made(http: httpx.Client, tenant: str, verbs: list[str]) -> dict[str, Any]:
    """A token of `tenant` made by the operator (the colony's own API token)."""
    answer = http.post("/v1/tokens", json={"tenant": tenant, "verbs": verbs}, headers=HOME)
    assert answer.status_code == 201, answer.text
    return answer.json()
