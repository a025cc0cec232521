"""Inference engines behind one interface: embedded CPU model, OpenAI-compatible HTTP, vLLM, scripted.

The engine classes are exported lazily (module `__getattr__`): `from colony.inference import
EmbeddedEngine` works, but importing this package does not import an engine module, so a process
that never runs a model (the CLI, the API replica) never loads llama.cpp, vLLM or their weights.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from colony.inference.engine import InferenceEngine, create_engine, render_page_prefix
from colony.inference.models import (
    ChatMessage,
    EngineStats,
    InferenceRequest,
    InferenceResponse,
    PageLoad,
    StreamChunk,
    Timings,
    Usage,
)
from colony.vcm.page import Page

if TYPE_CHECKING:
    from colony.inference.embedded import EmbeddedEngine
    from colony.inference.openai_compat import OpenAICompatibleEngine
    from colony.inference.scripted import ScriptedEngine
    from colony.inference.vllm_engine import VLLMEngine

# engine class -> the module defining it, imported on first access
_LAZY_ENGINES = {
    "EmbeddedEngine": "colony.inference.embedded",
    "OpenAICompatibleEngine": "colony.inference.openai_compat",
    "ScriptedEngine": "colony.inference.scripted",
    "VLLMEngine": "colony.inference.vllm_engine",
}

__all__ = [
    "ChatMessage",
    "EmbeddedEngine",
    "EngineStats",
    "InferenceEngine",
    "InferenceRequest",
    "InferenceResponse",
    "OpenAICompatibleEngine",
    "Page",
    "PageLoad",
    "ScriptedEngine",
    "StreamChunk",
    "Timings",
    "Usage",
    "VLLMEngine",
    "create_engine",
    "render_page_prefix",
]


def __getattr__(name: str) -> Any:
    module = _LAZY_ENGINES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_ENGINES))
