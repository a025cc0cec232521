"""The embedded engine with the real SmolLM2 model: structured output, page KV cache, swap tier,
and the OpenAI-compatible engine against the embedded engine's own localhost server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from jsonschema import validate

from colony.config import EngineSettings
from colony.errors import EngineUnavailable, PageNotResident
from colony.inference import InferenceRequest, Page
from colony.inference.embedded import EmbeddedEngine
from colony.inference.openai_compat import OpenAICompatibleEngine

SCHEMAS = {
    "enum choice": {"type": "string", "enum": ["approve", "reject", "escalate"]},
    "object": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "array of objects": {
        "type": "array",
        "minItems": 2,
        "maxItems": 3,
        "items": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
            "required": ["city", "population"],
            "additionalProperties": False,
        },
    },
}
PROMPTS = {
    "enum choice": "A customer asks for a refund of a broken kettle. Decide: approve, reject or escalate.",
    "object": "Describe Alice, who is 31 years old, as JSON with her name and age.",
    "array of objects": "List two cities with their populations as JSON.",
}


def make_page(page_id: str, lines: int = 45) -> Page:
    text = " ".join(f"Line {i}: function step_{i}(x) returns x plus {i * 3}." for i in range(lines))
    return Page(page_id=page_id, text=text)


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEngine]:
    eng = EmbeddedEngine(EngineSettings(page_slots=2), data_dir=tmp_path_factory.mktemp("engine"))
    await eng.start()
    yield eng
    await eng.close()


@pytest.mark.parametrize("name", list(SCHEMAS))
async def test_real_model_output_validates_against_schema(engine: EmbeddedEngine, name: str) -> None:
    request = InferenceRequest(
        prompt=PROMPTS[name], response_format=SCHEMAS[name], max_tokens=120, temperature=0
    )
    response = await engine.generate(request)
    validate(response.parsed, SCHEMAS[name])
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0
    assert response.finish_reason == "stop"


async def test_page_prefix_is_cached_evicted_and_swapped(engine: EmbeddedEngine) -> None:
    page = make_page("cache-page")
    cold = await engine.load_page(page)
    assert cold.source == "prefill" and cold.cached_tokens == 0 and cold.prompt_tokens > 400
    question = InferenceRequest(prompt="What does step_4 return?", page_ids=["cache-page"], max_tokens=12)
    warm = await engine.generate(question)
    assert warm.usage.cached_tokens >= 0.9 * cold.prompt_tokens
    assert warm.timings.ttft < cold.seconds / 3  # no prefill of the page
    again = await engine.generate(question.model_copy(update={"prompt": "What does step_9 return?"}))
    assert again.usage.cached_tokens >= 0.9 * cold.prompt_tokens

    assert await engine.evict_page("cache-page") is True
    assert "cache-page" not in engine.resident_pages()
    with pytest.raises(PageNotResident):
        await engine.generate(question)
    reloaded = await engine.load_page(page)  # evicted means erased: this is a cold prefill again
    assert reloaded.cached_tokens == 0 and reloaded.prompt_tokens == cold.prompt_tokens

    swapped = await engine.swap_out_page("cache-page")
    assert swapped.source == "swap_out"
    assert engine.resident_pages() == {} or "cache-page" not in engine.resident_pages()
    assert "cache-page" in engine.swapped_pages()
    restored = await engine.swap_in_page("cache-page")
    assert restored.source == "swap_in" and restored.seconds < cold.seconds / 5
    after_swap = await engine.generate(question)
    assert after_swap.usage.cached_tokens >= 0.9 * cold.prompt_tokens
    assert after_swap.timings.ttft < cold.seconds / 3
    await engine.evict_page("cache-page")
    assert engine.swapped_pages() == []


async def test_the_least_used_page_is_evicted_when_slots_are_full(engine: EmbeddedEngine) -> None:
    for page_id in list(engine.resident_pages()):
        await engine.evict_page(page_id)
    await engine.load_page(make_page("lru-a", 5))
    await engine.load_page(make_page("lru-b", 5))
    await engine.generate(InferenceRequest(prompt="hi", page_ids=["lru-a"], max_tokens=2))  # a is now newer
    third = await engine.load_page(make_page("lru-c", 5))
    assert third.evicted == ["lru-b"]
    assert set(engine.resident_pages()) == {"lru-a", "lru-c"}
    requests_without_pages = await engine.generate(InferenceRequest(prompt="hello", max_tokens=2))
    assert requests_without_pages.slot == engine.general_slot  # never a page's slot
    for page_id in ("lru-a", "lru-c"):
        await engine.evict_page(page_id)


async def test_streaming_yields_text_then_usage(engine: EmbeddedEngine) -> None:
    chunks = [
        c async for c in engine.stream(InferenceRequest(prompt="Count from one to five.", max_tokens=16))
    ]
    text = "".join(c.text for c in chunks)
    assert text.strip()
    assert any(c.finish_reason for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


async def test_openai_engine_against_the_embedded_server(engine: EmbeddedEngine) -> None:
    client = OpenAICompatibleEngine(engine.base_url, model="smollm2", timeout_seconds=60)
    try:
        plain = await client.generate(InferenceRequest(prompt="Say hello.", max_tokens=8))
        assert plain.text and plain.usage.completion_tokens > 0
        streamed = [c async for c in client.stream(InferenceRequest(prompt="Say hello.", max_tokens=8))]
        assert "".join(c.text for c in streamed).strip()
        assert streamed[-1].usage is not None
        schema = SCHEMAS["object"]
        structured = await client.generate(
            InferenceRequest(prompt=PROMPTS["object"], response_format=schema, max_tokens=80)
        )
        validate(structured.parsed, schema)
        page = make_page("remote-page", 20)
        load = await client.load_page(page)
        assert load.prompt_tokens > 100
        warm = await client.generate(
            InferenceRequest(prompt="What does step_2 return?", page_ids=["remote-page"], max_tokens=8)
        )
        assert warm.usage.cached_tokens > 0  # the page block is a stable leading prefix
    finally:
        await client.close()


async def test_openai_engine_typed_error_when_server_stopped(tmp_path) -> None:
    doomed = EmbeddedEngine(EngineSettings(page_slots=1, slot_context_tokens=512), data_dir=tmp_path)
    await doomed.start()
    url = doomed.base_url
    await doomed.close()
    client = OpenAICompatibleEngine(url, timeout_seconds=5, max_retries=1)
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match="cannot reach"):
        await client.generate(InferenceRequest(prompt="hi", max_tokens=2))
    assert time.monotonic() - started < 5
    await client.close()
