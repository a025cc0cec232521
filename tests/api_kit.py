"""The Colony API served over real HTTP on 127.0.0.1 from a background event loop (its own thread),
for tests and benchmarks that talk to it as a client would.

A subclass says what stands behind the API (`start_services`, and `stop_services` to release it);
this class owns the socket, the uvicorn server and the thread.
"""

from __future__ import annotations

import abc
import asyncio
import socket
import threading
from collections.abc import Coroutine
from typing import Any, Self

import uvicorn

from colony.api.app import ApiServices, create_app
from colony.config import ColonySettings


class ServedApi(abc.ABC):
    """`with Subclass(...) as served:` serves the API at `served.url` until the block ends."""

    def __init__(self, settings: ColonySettings, token: str, *, start_timeout: float = 30.0) -> None:
        self.settings = settings
        self.token = token
        self.start_timeout = start_timeout
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP;
        # without it every response waits ~40 ms on Nagle and the client's delayed ACK
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.app = create_app(
            self._services,
            token=token,
            api=settings.api,
            max_import_bytes=settings.context.max_export_bytes,
        )
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready: ApiServices | None = None

    @abc.abstractmethod
    async def start_services(self) -> ApiServices:
        """What the API serves (Redis clients, a ReplicaHost, ...), built in the server's loop."""

    async def stop_services(self) -> None:
        """Release what `start_services` made (after the server stopped)."""
        return None

    async def _services(self) -> ApiServices:
        assert self.ready is not None
        return self.ready

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.ready = await self.start_services()
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            await self.stop_services()

    def call(self, make: Any, timeout: float = 60) -> Any:
        """Run a coroutine (made by `make()`) in the server's loop, where its clients live."""
        assert self.loop is not None
        coroutine: Coroutine[Any, Any, Any] = make()
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def __enter__(self) -> Self:
        self.thread.start()
        for _ in range(int(self.start_timeout / 0.05)):
            if self.server.started:
                return self
            self.thread.join(0.05)
            if not self.thread.is_alive():
                break
        raise RuntimeError("the API did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)


class BareApi(ServedApi):
    """The API over the colony's Redis with no replica behind it: what routes that read and write
    Redis alone (memory blocks) need."""

    def __init__(self, settings: ColonySettings, token: str) -> None:
        super().__init__(settings, token)
        self._client: Any = None

    async def start_services(self) -> ApiServices:
        from colony.blackboard import Blackboard, create_redis
        from colony.system.registry import AgentRegistry
        from colony.system.runs import RunService

        settings = self.settings
        assert settings.redis_url
        self._client = create_redis(settings.redis_url, settings.blackboard)
        board = Blackboard(self._client, f"colony:{settings.colony_id}", settings=settings.blackboard)
        registry = AgentRegistry(board, settings=settings)
        ids = {"tenant_id": settings.tenant_id, "colony_id": settings.colony_id}
        return ApiServices(
            runs=RunService(board, registry, settings=settings, **ids),
            registry=registry,
            token=self.token,
            settings=settings,
        )

    async def stop_services(self) -> None:
        await self._client.aclose()
