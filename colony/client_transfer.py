"""ColonyClient methods for agent export and import (mixed into colony.client.ColonyClient)."""

from __future__ import annotations

import httpx


class TransferClientMixin:
    _http: httpx.Client
