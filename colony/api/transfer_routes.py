"""HTTP routes of context management: agent export and import (docs/transfer.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI

from colony.config import ApiSettings

if TYPE_CHECKING:
    from colony.api.app import ApiServices


def add_transfer_routes(
    router: FastAPI | APIRouter,
    services: Callable[[], Awaitable[ApiServices]],
    authorized: Any,
    api: ApiSettings,
) -> None:
    """Declare the routes on `router` (the app itself)."""
