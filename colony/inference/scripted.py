"""ScriptedEngine: canned replies for tests where the model's words do not matter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from colony.errors import InvalidArgument, PageNotResident
from colony.inference.engine import InferenceEngine, prefixed_messages
from colony.inference.models import (
    InferenceRequest,
    InferenceResponse,
    PageLoad,
    StreamChunk,
    Usage,
)
from colony.inference.openai_format import parse_output
from colony.vcm.page import Page

Reply = str | dict[str, Any] | list[Any]


class ScriptedEngine(InferenceEngine):
    """Replies from a list (in order, the last one repeated) or from a function of the request.

    Dict/list replies are sent as JSON text. Token counts are word counts; a page's words count as
    cached once the page is loaded, so page-affinity logic can be tested without a model.
    `delay` (seconds) is spent before each reply, to stand in for a slow model.
    """

    kind = "scripted"

    def __init__(
        self, replies: Iterable[Reply] | Callable[[InferenceRequest], Reply] = ("ok",), *, delay: float = 0.0
    ) -> None:
        super().__init__()
        self.delay = delay
        self._fn = replies if callable(replies) else None
        self._replies = [] if callable(replies) else list(replies)
        if self._fn is None and not self._replies:
            raise InvalidArgument("ScriptedEngine needs at least one reply (or a function)")
        self._pages: dict[str, Page] = {}
        self.requests: list[InferenceRequest] = []

    def _reply(self, request: InferenceRequest) -> str:
        self.requests.append(request)
        if self._fn is not None:
            reply = self._fn(request)
        else:
            reply = self._replies.pop(0) if len(self._replies) > 1 else self._replies[0]
        return reply if isinstance(reply, str) else json.dumps(reply)

    def _usage(self, request: InferenceRequest, text: str) -> Usage:
        pages = [self._pages[p] for p in request.page_ids if p in self._pages]
        missing = [p for p in request.page_ids if p not in self._pages]
        if missing:
            raise PageNotResident(f"pages {missing} are not loaded in this engine")
        prompt = sum(len(m.content.split()) for m in prefixed_messages(pages, request))
        cached = sum(len(p.text.split()) for p in pages)
        return Usage(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=len(text.split()))

    async def generate(self, request: InferenceRequest) -> InferenceResponse:
        if self.delay:
            await asyncio.sleep(self.delay)
        text = self._reply(request)
        usage = self._usage(request, text)
        return self._record(
            InferenceResponse(
                text=text,
                parsed=parse_output(text, request.response_format),
                usage=usage,
                finish_reason="stop",
                model="scripted",
            )
        )

    async def stream(self, request: InferenceRequest) -> AsyncIterator[StreamChunk]:
        if self.delay:
            await asyncio.sleep(self.delay)
        text = self._reply(request)
        usage = self._usage(request, text)
        for word in text.split(" "):
            yield StreamChunk(text=word + " ")
        yield StreamChunk(finish_reason="stop", usage=usage)

    async def load_page(self, page: Page) -> PageLoad:
        self._pages[page.page_id] = page
        load = PageLoad(page_id=page.page_id, prompt_tokens=len(page.text.split()))
        self._record_page_load(load)
        return load

    async def evict_page(self, page_id: str) -> bool:
        return self._pages.pop(page_id, None) is not None

    def resident_pages(self) -> dict[str, int | None]:
        return dict.fromkeys(self._pages)
