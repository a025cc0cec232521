"""A page: a piece of context an engine can hold in its KV cache as a shared prefix. It belongs to
the virtual context memory; the inference layer, above it, takes pages in its requests."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from colony.blackboard.protocol import validate_segment


class Page(BaseModel):
    """A piece of context that an engine can hold in its KV cache as a shared prefix."""

    page_id: str
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("page_id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        return validate_segment(value, "page_id")
