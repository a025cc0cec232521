"""ColonyClient methods for sessions (mixed into colony.client.ColonyClient)."""

from __future__ import annotations

import httpx


class SessionClientMixin:
    _http: httpx.Client
