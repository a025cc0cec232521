"""Inference engines behind one interface: embedded CPU model, OpenAI-compatible HTTP, vLLM, scripted."""

from colony.inference.engine import InferenceEngine, create_engine, render_page_prefix
from colony.inference.models import (
    ChatMessage,
    EngineStats,
    InferenceRequest,
    InferenceResponse,
    Page,
    PageLoad,
    StreamChunk,
    Timings,
    Usage,
)

__all__ = [
    "ChatMessage",
    "EngineStats",
    "InferenceEngine",
    "InferenceRequest",
    "InferenceResponse",
    "Page",
    "PageLoad",
    "StreamChunk",
    "Timings",
    "Usage",
    "create_engine",
    "render_page_prefix",
]
