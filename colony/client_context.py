"""ColonyClient methods for checkpoints, undo, restore (mixed into colony.client.ColonyClient)."""

from __future__ import annotations

import httpx


class ContextClientMixin:
    _http: httpx.Client
