"""Data the blackboard hands out: entries, events, query pages, tag filters, batched writes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, field_validator

from colony.blackboard.protocol import validate_key, validate_tag
from colony.blackboard.scripts import TAG_SEPARATOR
from colony.errors import InvalidArgument

EVENT_VALUE_BYTES = 8192  # the largest value a write with `value_in_event` copies into its event

M = TypeVar("M", bound=BaseModel)


def encode_value(value: Any) -> str:
    """JSON text of a value; pydantic models, dataclasses, datetimes, enums and sets are accepted."""
    try:
        return pydantic_core.to_json(value).decode()
    except pydantic_core.PydanticSerializationError as exc:
        raise InvalidArgument(
            f"blackboard values must be JSON-serialisable (dicts, lists, str, numbers, bool, None, "
            f"pydantic models, dataclasses): {exc}"
        ) from None


def decode_value(text: str | None) -> Any:
    return None if text is None else pydantic_core.from_json(text)


def encode_tags(tags: Iterable[str]) -> str:
    return TAG_SEPARATOR.join(sorted({validate_tag(t) for t in tags}))


def decode_tags(text: str | None) -> frozenset[str]:
    return frozenset(text.split(TAG_SEPARATOR)) if text else frozenset()


def ttl_to_ms(ttl_seconds: float | None) -> str:
    """A TTL as the millisecond string the Lua scripts take ("" = no TTL)."""
    if ttl_seconds is None:
        return ""
    if ttl_seconds <= 0:
        raise InvalidArgument(f"ttl_seconds must be positive, got {ttl_seconds}")
    return str(max(1, round(ttl_seconds * 1000)))


def _ms(value: str | int | None) -> float | None:
    if value in (None, ""):
        return None
    return int(value) / 1000.0


class BlackboardEntry(BaseModel):
    """One key's current value with its bookkeeping."""

    model_config = ConfigDict(frozen=True)

    key: str
    value: Any
    version: int = Field(description="Starts at 1 and grows by 1 with every write.")
    tags: frozenset[str] = frozenset()
    created_by: str | None = None
    updated_by: str | None = None
    created_at: float = Field(description="Unix time (s) of the first write, by Redis' clock.")
    updated_at: float = Field(description="Unix time (s) of the latest write, by Redis' clock.")
    expires_at: float | None = Field(None, description="Unix time (s) the entry expires; None = never.")

    @property
    def ttl_seconds(self) -> float | None:
        """Seconds the entry had to live when it was last written (None = no TTL)."""
        return None if self.expires_at is None else round(self.expires_at - self.updated_at, 3)

    def value_as(self, model: type[M]) -> M:
        """The value validated as `model`."""
        return model.model_validate(self.value)

    @classmethod
    def from_hash(cls, key: str, fields: Mapping[str, Any]) -> BlackboardEntry:
        """Build from the Redis hash of an entry."""
        return cls(
            key=key,
            value=decode_value(fields.get("v")),
            version=int(fields["ver"]),
            tags=decode_tags(fields.get("tags")),
            created_by=fields.get("cb") or None,
            updated_by=fields.get("ub") or None,
            created_at=_ms(fields.get("ca")) or 0.0,
            updated_at=_ms(fields.get("ua")) or 0.0,
            expires_at=_ms(fields.get("exp")),
        )


class BlackboardEvent(BaseModel):
    """A write or delete as recorded on the scope's event stream."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Redis stream id; pass it as from_id to resume after this event.")
    scope_id: str
    op: Literal["write", "delete"]
    key: str
    version: int = Field(description="Version written, or the version that was deleted.")
    tags: frozenset[str] = frozenset()
    created_by: str | None = Field(None, description="Who made this write or delete.")
    ts: float = Field(description="Unix time (s) of the operation, by Redis' clock.")
    value: Any = Field(None, description="The value written, when values go into events.")

    @classmethod
    def from_stream(cls, scope_id: str, event_id: str, fields: dict[str, str]) -> BlackboardEvent:
        return cls(
            id=event_id,
            scope_id=scope_id,
            op=fields["op"],
            key=fields["key"],
            version=int(fields["ver"]),
            tags=decode_tags(fields.get("tags")),
            created_by=fields.get("by") or None,
            ts=int(fields["ts"]) / 1000.0,
            value=_event_value(fields.get("v")),
        )


def _event_value(text: str | None) -> Any:
    """The value an event carries, or None when it cannot be decoded here (e.g. nested deeper than
    the JSON parser goes): the event is still delivered, and a subscriber that needs the value
    reads the entry (and meets the error there, in its own handling), so one odd value never ends
    an event feed."""
    try:
        return decode_value(text)
    except ValueError:
        return None


class TagFilter(BaseModel):
    """Which tags a queried entry must carry: every one of all_of, at least one of any_of, none of none_of."""

    model_config = ConfigDict(frozen=True)

    all_of: frozenset[str] = frozenset()
    any_of: frozenset[str] = frozenset()
    none_of: frozenset[str] = frozenset()

    @field_validator("all_of", "any_of", "none_of")
    @classmethod
    def _valid(cls, tags: frozenset[str]) -> frozenset[str]:
        for tag in tags:
            validate_tag(tag)
        return tags

    def matches(self, tags: frozenset[str]) -> bool:
        return (
            self.all_of <= tags
            and (not self.any_of or not self.any_of.isdisjoint(tags))
            and self.none_of.isdisjoint(tags)
        )


class QueryPage(BaseModel):
    """One page of a query; pass `cursor` back to get the next one (None = no more)."""

    entries: list[BlackboardEntry]
    cursor: str | None


class WriteRequest(BaseModel):
    """One write of a `write_many` batch or a transaction."""

    key: str
    value: Any
    tags: frozenset[str] = frozenset()
    created_by: str | None = None
    ttl_seconds: float | None = Field(None, gt=0)
    expected_version: int | None = Field(None, ge=0)

    @field_validator("key")
    @classmethod
    def _valid_key(cls, key: str) -> str:
        return validate_key(key)
