"""Engine selection, request validation, the vLLM mapping (without vllm) and the scripted engine."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from typing import Any

import httpx
import pytest

from colony.config import EngineSettings, load_settings
from colony.errors import (
    ConfigError,
    EngineUnavailable,
    InferenceError,
    InvalidSchema,
    PageNotResident,
    ResourceExhausted,
)
from colony.inference import InferenceRequest, Page, create_engine
from colony.inference.openai_compat import OpenAICompatibleEngine
from colony.inference.scripted import ScriptedEngine
from colony.inference.vllm_engine import VLLMEngine, build_sampling_params, sampling_options, usage_of


@pytest.mark.parametrize(
    "schema",
    [{"type": "strng"}, {"properties": 5}, {"enum": "notalist"}, {"required": "name"}, "not-a-dict"],
)
def test_malformed_schema_is_rejected_when_the_request_is_built(schema: Any) -> None:
    with pytest.raises(InvalidSchema, match="response_format"):
        InferenceRequest(prompt="x", response_format=schema)


def test_request_needs_exactly_one_input() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        InferenceRequest()
    with pytest.raises(ValueError, match="exactly one"):
        InferenceRequest(prompt="a", messages=[{"role": "user", "content": "b"}])


def test_unknown_engine_kind_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLONY_ENGINE__KIND", "gpt-magic")
    with pytest.raises(ConfigError, match=r"engine\.kind"):
        load_settings()


def test_create_engine_picks_the_kind() -> None:
    assert isinstance(create_engine(EngineSettings(kind="scripted")), ScriptedEngine)
    engine = create_engine(EngineSettings(kind="openai", base_url="http://127.0.0.1:9/v1"))
    assert isinstance(engine, OpenAICompatibleEngine) and engine.base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(EngineUnavailable, match="base_url"):
        create_engine(EngineSettings(kind="openai"))
    with pytest.raises(EngineUnavailable, match=r"engine\.model"):
        create_engine(EngineSettings(kind="vllm"))


def _fake_vllm(structured: bool) -> types.ModuleType:
    vllm = types.ModuleType("fakevllm")
    params_mod = types.ModuleType("fakevllm.sampling_params")

    class SamplingParams:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

    class StructuredOutputsParams:
        def __init__(self, json: Any) -> None:
            self.json = json

    class GuidedDecodingParams(StructuredOutputsParams):
        pass

    vllm.SamplingParams = SamplingParams
    if structured:
        params_mod.StructuredOutputsParams = StructuredOutputsParams
    params_mod.GuidedDecodingParams = GuidedDecodingParams
    sys.modules["fakevllm"] = vllm
    sys.modules["fakevllm.sampling_params"] = params_mod
    return vllm


@pytest.mark.parametrize("structured", [True, False])
def test_vllm_request_mapping(structured: bool) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = InferenceRequest(
        prompt="x", max_tokens=7, temperature=0.2, stop=["\n"], seed=3, response_format=schema
    )
    options = sampling_options(request)
    assert options == {"max_tokens": 7, "temperature": 0.2, "stop": ["\n"], "seed": 3, "json_schema": schema}
    params = build_sampling_params(_fake_vllm(structured), options)
    key = "structured_outputs" if structured else "guided_decoding"
    assert params.kwargs[key].json == schema
    assert params.kwargs["max_tokens"] == 7 and "json_schema" not in params.kwargs
    plain = build_sampling_params(_fake_vllm(structured), sampling_options(InferenceRequest(prompt="y")))
    assert set(plain.kwargs) == {"max_tokens", "temperature"}


def test_vllm_usage_mapping_and_conservative_residency() -> None:
    output = types.SimpleNamespace(
        prompt_token_ids=list(range(120)),
        num_cached_tokens=96,
        outputs=[types.SimpleNamespace(token_ids=[1, 2, 3], text="abc", finish_reason="stop")],
    )
    usage = usage_of(output)
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (120, 96, 3)
    engine = VLLMEngine(EngineSettings(kind="vllm", model="some/model"))
    engine._capacity_tokens = 250
    for n, page_id in enumerate(["p1", "p2", "p3"]):
        engine._pages[page_id] = (Page(page_id=page_id, text="t"), 100 + n)
    assert set(engine.resident_pages()) == {"p2", "p3"}  # p1 no longer fits beside the newer two


class _FakeTokenizer:
    """Word tokens: a page's prefix counts as many tokens as it has words."""

    def apply_chat_template(self, messages: list[dict[str, Any]], **_: Any) -> str:
        return "\n".join(m["content"] for m in messages)

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))


class _FakeAsyncLLM:
    """What VLLMEngine uses of vllm.AsyncLLMEngine: `generate` yielding RequestOutputs."""

    async def generate(self, prompt: str, params: Any, request_id: str) -> Any:
        yield types.SimpleNamespace(
            prompt_token_ids=list(range(len(prompt.split()))),
            num_cached_tokens=0,
            finished=True,
            outputs=[types.SimpleNamespace(token_ids=[1], text="ok", finish_reason="stop")],
        )


def _fake_vllm_engine(capacity_tokens: int) -> VLLMEngine:
    engine = VLLMEngine(EngineSettings(kind="vllm", model="some/model"))
    engine._vllm, engine._engine, engine._tokenizer = _fake_vllm(True), _FakeAsyncLLM(), _FakeTokenizer()
    engine._capacity_tokens = capacity_tokens
    return engine


def _words(page_id: str, n: int) -> Page:
    return Page(page_id=page_id, text=" ".join(["w"] * n))


async def test_vllm_never_counts_a_pinned_page_out_and_waits_for_room() -> None:
    """Before: a load dropped the oldest pages past the KV capacity, pinned or not, and the request
    using the dropped page failed with PageNotResident."""
    engine = _fake_vllm_engine(capacity_tokens=250)
    p1, p2, p3, p4 = (_words(f"p{i}", 100) for i in range(1, 5))
    await engine.load_page(p1)
    async with engine.pinned(["p1"]):
        await engine.load_page(p2)
        assert (await engine.load_page(p3)).evicted == ["p2"]  # the unpinned one makes room, not p1
        assert set(engine.resident_pages()) == {"p1", "p3"}
        answer = await engine.generate(InferenceRequest(prompt="q", page_ids=["p1"]))
        assert answer.text == "ok"
        async with engine.pinned(["p3"]):  # p1 + p3 in use: p4 does not fit beside them
            engine.pin_wait_seconds = 0.3
            with pytest.raises(ResourceExhausted, match="every page slot holds a page in use"):
                await engine.load_page(p4)
            assert set(engine.resident_pages()) == {"p1", "p3"}
            engine.pin_wait_seconds = 30
            waiting = asyncio.create_task(engine.load_page(p4))
            await asyncio.sleep(0.2)
            assert not waiting.done()
        load = await waiting  # p3's pin ended: p4 loads, p3 is counted out, p1 (pinned) stays
        assert load.evicted == ["p3"] and set(engine.resident_pages()) == {"p1", "p4"}
    assert engine._pin_waiters == []


async def test_scripted_engine_replies_and_pages() -> None:
    engine = ScriptedEngine(["first", {"answer": 42}])
    assert (await engine.generate(InferenceRequest(prompt="a"))).text == "first"
    structured = await engine.generate(InferenceRequest(prompt="b", response_format={"type": "object"}))
    assert structured.parsed == {"answer": 42}
    with pytest.raises(PageNotResident):
        await engine.generate(InferenceRequest(prompt="c", page_ids=["missing"]))
    await engine.load_page(Page(page_id="p", text="one two three four"))
    warm = await engine.generate(InferenceRequest(prompt="c d", page_ids=["p"]))
    assert warm.usage.cached_tokens == 4
    chunks = [c async for c in engine.stream(InferenceRequest(prompt="x"))]
    assert chunks[-1].finish_reason == "stop" and chunks[-1].usage is not None
    echo = ScriptedEngine(lambda req: req.chat_messages()[-1].content.upper())
    assert (await echo.generate(InferenceRequest(prompt="shout"))).text == "SHOUT"
    assert echo.stats().requests == 1


async def test_openai_engine_retries_then_reports_http_errors() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] < 3:
            return httpx.Response(503, json={"error": {"message": "busy"}})
        if calls["n"] == 3:
            return httpx.Response(
                200,
                json={
                    "choices": [{"message": {"content": "fine"}, "finish_reason": "stop"}],
                    "usage": {
                        "prompt_tokens": 5,
                        "completion_tokens": 1,
                        "prompt_tokens_details": {"cached_tokens": 2},
                    },
                },
            )
        return httpx.Response(400, json={"error": {"message": "bad request: max_tokens too large"}})

    engine = OpenAICompatibleEngine("http://test", max_retries=3, transport=httpx.MockTransport(handler))
    ok = await engine.generate(InferenceRequest(prompt="x"))
    assert ok.text == "fine" and ok.usage.cached_tokens == 2 and calls["n"] == 3
    with pytest.raises(InferenceError, match="400: bad request"):
        await engine.generate(InferenceRequest(prompt="x"))
    await engine.close()


async def test_openai_engine_warms_a_loaded_page_unless_told_not_to_and_counts_the_warm_up() -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        usage = {"prompt_tokens": 40, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}], "usage": usage})

    page = Page(page_id="pg-0123456789abcdef", text="the page")
    warm = OpenAICompatibleEngine("http://test", transport=httpx.MockTransport(handler))
    await warm.load_page(page)
    assert len(sent) == 1 and "<page id=pg-0123456789abcdef>" in sent[0]["messages"][0]["content"]
    assert warm.stats().page_loads == 1 and warm.stats().page_load_tokens == 40
    cold = OpenAICompatibleEngine("http://test", transport=httpx.MockTransport(handler), warm_pages=False)
    await cold.load_page(page)
    assert len(sent) == 1 and "pg-0123456789abcdef" in cold.resident_pages()  # kept, nothing sent
    await cold.generate(InferenceRequest(prompt="q", page_ids=[page.page_id]))
    assert len(sent) == 2 and "<page id=pg-0123456789abcdef>" in sent[1]["messages"][0]["content"]
    assert cold.stats().page_loads == 0
    await warm.close()
    await cold.close()
