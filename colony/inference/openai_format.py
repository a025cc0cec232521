"""The OpenAI chat-completions wire format, shared by the engines that speak it."""

from __future__ import annotations

import json
from typing import Any

from colony.errors import StructuredOutputError
from colony.inference.models import Usage


def response_format_body(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The OpenAI-style response_format for a JSON Schema (constrained decoding)."""
    if schema is None:
        return {}
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}}


def parse_output(text: str, schema: dict[str, Any] | None) -> Any:
    """The decoded JSON of a schema-constrained reply (None without a schema)."""
    if schema is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StructuredOutputError(
            f"model output is not the JSON the schema asked for ({exc.msg}); raise max_tokens if it was cut "
            f"off: {text[:200]!r}"
        ) from None


def usage_from_result(result: dict[str, Any]) -> Usage:
    """Usage of a completion; cached tokens from `prompt_tokens_details`, else llama.cpp `timings.cache_n`."""
    usage = result.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = (result.get("timings") or {}).get("cache_n", 0)
    return Usage(
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int(cached or 0),
        completion_tokens=int(usage.get("completion_tokens", 0)),
    )
