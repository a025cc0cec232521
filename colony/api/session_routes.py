"""HTTP routes of context management: sessions and their conversation trees (docs/sessions.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI

from colony.config import ApiSettings

if TYPE_CHECKING:
    from colony.api.app import ApiServices


def add_session_routes(
    router: FastAPI | APIRouter,
    services: Callable[[], Awaitable[ApiServices]],
    authorized: Any,
    api: ApiSettings,
) -> None:
    """Declare the routes on `router` (the app itself)."""
