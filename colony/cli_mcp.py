"""`colony mcp --stdio`: the MCP server (colony.api.mcp_door) on stdin/stdout for a local MCP client
(a desktop assistant, an IDE agent), calling a colony's API with a token: the local cluster `colony
up` started, or `--url`/`--token` (docs/clients.md). Nothing but the protocol goes to stdout."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

import httpx

from colony.cli_memory import remote_options
from colony.cli_target import target_of


def cmd_mcp(args: argparse.Namespace) -> int:
    from colony.api.mcp_door import HttpBackend, build_server  # here: the SDK only for this command

    target = target_of(args)
    backend = HttpBackend(httpx.AsyncClient(base_url=target.url, timeout=120), f"Bearer {target.token}")

    async def backend_of(_: Any) -> HttpBackend:
        return backend

    async def serve() -> None:
        try:
            await build_server(backend_of).run_stdio_async()
        finally:
            await backend.close()

    asyncio.run(serve())
    return 0


def add_mcp_command(subparsers: Any, parents: Sequence[argparse.ArgumentParser] | None = None) -> None:
    """Add `mcp --stdio` to the `colony` command's subparsers."""
    parser = subparsers.add_parser(
        "mcp", help="the MCP server on stdin/stdout for a local MCP client", parents=list(parents or [])
    )
    if parents is None:
        remote_options(parser)
    parser.add_argument(
        "--stdio",
        action="store_true",
        required=True,
        help="talk MCP on stdin/stdout (the only transport here)",
    )
    parser.set_defaults(func=cmd_mcp)
