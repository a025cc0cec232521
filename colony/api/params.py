"""Path parameter types shared by the routes, declared once so every route checks an id the same
way and the OpenAPI document describes it the same way: an id reaches a Redis key only after
`ID_PATTERN` (colony.wire.ids) or the block label pattern has passed it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from colony.api.schemas import BLOCK_LABEL, BLOCK_LABEL_RULE
from colony.wire.ids import ID_PATTERN

RunId = Annotated[str, Path(min_length=1, max_length=128, pattern=ID_PATTERN, description="run id")]
AgentId = Annotated[str, Path(min_length=1, max_length=128, pattern=ID_PATTERN, description="agent id")]
SessionId = Annotated[
    str, Path(min_length=1, max_length=128, pattern=ID_PATTERN, description="session id (session-<16 hex>)")
]
Label = Annotated[str, Path(min_length=1, max_length=64, pattern=BLOCK_LABEL, description=BLOCK_LABEL_RULE)]
Version = Annotated[int, Path(ge=1, le=2**31, description="a version number (1: the creation)")]
Step = Annotated[
    int, Path(ge=0, le=10_000_000, description="the step of a kept checkpoint (0: a run's beginning)")
]
