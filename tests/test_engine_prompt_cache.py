"""`engine.prompt_cache_mib` reaches llama.cpp: the embedded engine's host-memory prompt cache is an
operator setting (llama.cpp's default, 8 GiB, is more than many pods have)."""

from __future__ import annotations

from typing import Any

import pytest
import xllamacpp

from colony.config import ColonySettings, EngineSettings
from colony.inference.embedded import EmbeddedEngine
from colony.inference.engine import create_engine


def _server_params(engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch) -> Any:
    captured: list[Any] = []
    monkeypatch.setattr(xllamacpp, "Server", lambda params: captured.append(params) or object())
    engine._make_server()
    return captured[0]


@pytest.mark.parametrize("mib", [0, 64])
def test_the_setting_sizes_llama_cpps_prompt_cache(
    mib: int, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ColonySettings(engine=EngineSettings(prompt_cache_mib=mib), data_dir=tmp_path)
    engine = create_engine(settings)
    assert isinstance(engine, EmbeddedEngine)
    assert _server_params(engine, monkeypatch).cache_ram_mib == mib


def test_unset_keeps_llama_cpps_default(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    default = xllamacpp.CommonParams().cache_ram_mib
    engine = create_engine(ColonySettings(data_dir=tmp_path))
    assert isinstance(engine, EmbeddedEngine)
    assert _server_params(engine, monkeypatch).cache_ram_mib == default


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt_cache_mib"):
        EngineSettings(prompt_cache_mib=-1)
