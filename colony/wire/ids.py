"""The identifiers that cross the API (run, agent, namespace, page and replica ids): every one that
reaches a Redis key is checked against `ID_PATTERN` at the edge, so a key is never built from raw
input. Clients use the same rule to refuse a bad id before sending it."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
ID_RULE = "1-128 characters: letters, digits, '_', '.', '-' (starting with a letter or digit)"
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ID_PATTERN)]
