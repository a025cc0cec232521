"""OpenAICompatibleEngine: any server speaking `/v1/chat/completions` (vLLM, llama.cpp, OpenAI, ...).

Pages are sent as a leading system block in a stable order, so the server's own prefix cache
hits on every request naming the same pages. The engine cannot force a remote server to hold or
drop a KV cache: `load_page` warms the server's cache with a one-token request (unless
`engine.warm_pages` is off) and residency means "recently warmed here" — the conservative truth
available over this protocol.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from colony.config import EngineSettings
from colony.errors import EngineUnavailable, InferenceError, InferenceTimeout, PageNotResident
from colony.inference.engine import InferenceEngine, elapsed, prefixed_messages, render_page_prefix
from colony.inference.models import (
    InferenceRequest,
    InferenceResponse,
    PageLoad,
    StreamChunk,
    Timings,
)
from colony.inference.openai_format import parse_output, response_format_body, usage_from_result
from colony.vcm.page import Page

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class OpenAICompatibleEngine(InferenceEngine):
    kind = "openai"

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_seconds: float = 120.0,
        max_retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
        warm_pages: bool = True,
    ) -> None:
        super().__init__()
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_seconds, connect=5.0),
            transport=transport,
        )
        self._pages: dict[str, Page] = {}
        self._stats.model = model
        self.warm_pages = warm_pages

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> OpenAICompatibleEngine:
        if not settings.base_url:
            raise EngineUnavailable(
                "engine.kind is 'openai' but engine.base_url is unset (COLONY_ENGINE__BASE_URL)"
            )
        return cls(
            settings.base_url,
            model=settings.model,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            timeout_seconds=settings.timeout_seconds,
            max_retries=settings.max_retries,
            warm_pages=settings.warm_pages,
        )

    async def close(self) -> None:
        await self._client.aclose()

    def _body(self, request: InferenceRequest) -> dict[str, Any]:
        pages = []
        for page_id in request.page_ids:
            if page_id not in self._pages:
                raise PageNotResident(f"page {page_id!r} is not loaded in this engine; load_page() it first")
            pages.append(self._pages[page_id])
        body: dict[str, Any] = {
            "model": self.model or "default",
            "messages": [m.model_dump() for m in prefixed_messages(pages, request)],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            **response_format_body(request.response_format),
        }
        if request.stop:
            body["stop"] = request.stop
        if request.seed is not None:
            body["seed"] = request.seed
        return body

    async def _post(self, body: dict[str, Any]) -> httpx.Response:
        """POST with retries (exponential backoff with jitter) on connection errors, 429 and 5xx."""
        attempt = 0
        while True:
            try:
                response = await self._client.post("/chat/completions", json=body)
            except httpx.TimeoutException as exc:
                raise InferenceTimeout(
                    f"{self.base_url} did not answer within {self.timeout_seconds}s"
                ) from exc
            except httpx.TransportError as exc:
                if attempt >= self.max_retries:
                    raise EngineUnavailable(f"cannot reach {self.base_url}: {exc}") from exc
            else:
                if response.status_code not in RETRY_STATUS or attempt >= self.max_retries:
                    return _checked(response)
            attempt += 1
            await asyncio.sleep(min(4.0, 0.1 * 2**attempt) * random.uniform(0.5, 1.0))

    async def generate(self, request: InferenceRequest) -> InferenceResponse:
        started = time.perf_counter()
        result = (await self._post(self._body(request))).json()
        choice = result["choices"][0]
        text = choice["message"].get("content") or ""
        timings = result.get("timings") or {}
        ttft = float(timings["prompt_ms"]) / 1000.0 if "prompt_ms" in timings else elapsed(started)
        return self._record(
            InferenceResponse(
                text=text,
                parsed=parse_output(text, request.response_format),
                usage=usage_from_result(result),
                timings=Timings(ttft=ttft, total=elapsed(started)),
                finish_reason=choice.get("finish_reason"),
                model=result.get("model"),
            )
        )

    async def stream(self, request: InferenceRequest) -> AsyncIterator[StreamChunk]:
        body = {**self._body(request), "stream": True, "stream_options": {"include_usage": True}}
        started = time.perf_counter()
        first: float | None = None
        try:
            async with self._client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _checked(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    item = json.loads(data)
                    for choice in item.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content") or ""
                        if text and first is None:
                            first = elapsed(started)
                        if text or choice.get("finish_reason"):
                            yield StreamChunk(text=text, finish_reason=choice.get("finish_reason"))
                    if item.get("usage"):
                        usage = usage_from_result(item)
                        self._record_usage(usage, first or elapsed(started), elapsed(started))
                        yield StreamChunk(usage=usage)
        except httpx.TimeoutException as exc:
            raise InferenceTimeout(f"{self.base_url} stream stalled past {self.timeout_seconds}s") from exc
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"cannot reach {self.base_url}: {exc}") from exc

    async def load_page(self, page: Page) -> PageLoad:
        """Warm the server's prefix cache with the page (one-token request); without `warm_pages`
        only keep it, to send with the requests that name it."""
        if not self.warm_pages:
            self._pages[page.page_id] = page
            return PageLoad(page_id=page.page_id, source="already_resident")
        started = time.perf_counter()
        response = await self._post(
            {
                "model": self.model or "default",
                "messages": [{"role": "system", "content": render_page_prefix([page])}],
                "max_tokens": 1,
                "temperature": 0.0,
            }
        )
        self._pages[page.page_id] = page
        self._page_op("load")
        usage = usage_from_result(response.json())
        load = PageLoad(
            page_id=page.page_id,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            seconds=elapsed(started),
        )
        self._record_page_load(load)
        return load

    async def evict_page(self, page_id: str) -> bool:
        """Forget the page here (the server evicts its cache on its own schedule)."""
        self._page_op("evict")
        return self._pages.pop(page_id, None) is not None

    def resident_pages(self) -> dict[str, int | None]:
        return dict.fromkeys(self._pages)


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code < 400:
        return response
    try:
        detail = response.json().get("error", response.text)
    except ValueError:
        detail = response.text
    if isinstance(detail, dict):
        detail = detail.get("message", detail)
    raise InferenceError(f"inference server answered {response.status_code}: {str(detail)[:300]}")
