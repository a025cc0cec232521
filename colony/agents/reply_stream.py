"""A model's reply streamed to the run's requester: the one place `ask`, `assistant` and the
session agent turn an engine stream into `token` run events (docs/api.md, run events)."""

from __future__ import annotations

import contextlib

from colony.agents.base import Agent
from colony.inference import InferenceRequest
from colony.inference.engine import InferenceEngine


async def stream_reply(agent: Agent | None, engine: InferenceEngine, request: InferenceRequest) -> str:
    """Generate `request` on `engine`, each piece of text streamed to the run's requester as a
    `token` event; the whole text, stripped."""
    parts: list[str] = []
    # aclosing: a run failing mid-stream (e.g. its event cannot be stored) ends the stream, and
    # with it the engine's hold on its slot, at once rather than when it is collected
    async with contextlib.aclosing(engine.stream(request)) as chunks:
        async for chunk in chunks:
            if chunk.text:
                parts.append(chunk.text)
                if agent is not None:
                    await agent.emit_run_event("token", {"text": chunk.text})
    return "".join(parts).strip()
