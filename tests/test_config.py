"""Settings: YAML file, env overrides, precedence, and one error naming every bad field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from colony.config import ColonySettings, load_settings
from colony.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("COLONY_"):
            monkeypatch.delenv(name)


def test_defaults_without_any_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert settings.redis_url is None
    assert settings.data_dir == Path("~/.colony").expanduser()
    assert settings.engine.kind == "embedded"
    assert settings.blackboard.events_maxlen == 100_000


def test_yaml_then_env_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "redis_url: redis://example:6390/1\ndata_dir: /tmp/x\nblackboard:\n  events_maxlen: 500\n"
        "  op_timeout_seconds: 2\n"
    )
    settings = load_settings(config)
    assert settings.redis_url == "redis://example:6390/1"
    assert settings.blackboard.events_maxlen == 500
    monkeypatch.setenv("COLONY_BLACKBOARD__EVENTS_MAXLEN", "700")
    monkeypatch.setenv("COLONY_API_TOKEN", "s3cret")
    monkeypatch.setenv("COLONY_CONFIG", str(config))
    settings = load_settings()
    assert settings.blackboard.events_maxlen == 700  # env beats the file ...
    assert settings.blackboard.op_timeout_seconds == 2  # ... and the file's other fields stay
    assert settings.api_token is not None and settings.api_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    assert load_settings(config, data_dir="/tmp/y").data_dir == Path("/tmp/y")  # keyword args beat all


def test_every_bad_field_is_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "redis_url: http://nope\nblackboard:\n  events_maxlen: 3\nengine:\n  kind: gpt\nbogus: 1\n"
    )
    monkeypatch.setenv("COLONY_LOG_LEVEL", "LOUD")
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    text = str(info.value)
    for field in ("redis_url", "blackboard.events_maxlen", "engine.kind", "bogus", "log_level"):
        assert field in text, text
    assert len(info.value.problems) == 5


def test_missing_or_malformed_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(listing)


def test_repository_config_loads() -> None:
    root = Path(__file__).resolve().parents[1]
    settings = load_settings(root / "configs" / "local.yaml")
    assert settings.redis_url is None and settings.engine.kind == "embedded"


def test_misspelt_yaml_key_names_the_closest_valid_one(tmp_path: Path) -> None:
    """Nested sections ignore unknown keys by themselves; a typo must not silently keep the default."""
    config = tmp_path / "typo.yaml"
    config.write_text("serve:\n  replcas: 3\n  port: 8100\nredis_urll: redis://x:1/0\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    assert "serve.replcas: unknown setting; did you mean serve.replicas?" in info.value.problems
    assert "redis_urll: unknown setting; did you mean redis_url?" in info.value.problems
    assert len(info.value.problems) == 2  # the top-level typo is not listed twice
    config.write_text("serve:\n  replicas: 3\n")
    assert load_settings(config).serve.replicas == 3


def test_misspelt_env_var_names_the_closest_valid_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLONY_SERVE__REPLCAS", "3")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.problems == [
        "environment variable COLONY_SERVE__REPLCAS: matches no setting; did you mean COLONY_SERVE__REPLICAS?"
    ]
    monkeypatch.delenv("COLONY_SERVE__REPLCAS")
    monkeypatch.setenv("COLONY_APITOKEN", "x")
    with pytest.raises(ConfigError, match="did you mean COLONY_API_TOKEN"):
        load_settings()
    monkeypatch.delenv("COLONY_APITOKEN")
    monkeypatch.setenv("COLONY_SERVE__PORT__X", "1")  # below a leaf
    with pytest.raises(ConfigError, match="COLONY_SERVE__PORT__X: matches no setting"):
        load_settings()


def test_legitimate_env_vars_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field's variable (any case), whole sections as JSON, and COLONY_CONFIG itself."""
    config = tmp_path / "c.yaml"
    config.write_text("serve:\n  port: 8100\n")
    monkeypatch.setenv("COLONY_CONFIG", str(config))
    monkeypatch.setenv("COLONY_REDIS_URL", "redis://h:1/0")
    monkeypatch.setenv("COLONY_API_TOKEN", "t")
    monkeypatch.setenv("colony_serve__replicas", "2")
    monkeypatch.setenv("COLONY_ENGINE", '{"kind": "scripted"}')
    monkeypatch.setenv("COLONY_VCM__ALLOWED_ROOTS", f'["{tmp_path}"]')
    settings = load_settings()
    assert (settings.serve.port, settings.serve.replicas, settings.engine.kind) == (8100, 2, "scripted")
    assert settings.vcm.allowed_roots == [tmp_path] and settings.redis_url == "redis://h:1/0"


def test_misspelt_keyword_override_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_settings(serve={"prot": 1})
    assert info.value.problems == ["serve.prot: unknown setting; did you mean serve.port?"]


def test_kubernetes_service_links_are_not_settings_typos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod sees COLONY_SERVICE_HOST, COLONY_API_PORT_8000_TCP, ... for Services named colony or
    colony-*: they must not stop it, while a real typo still does."""
    monkeypatch.chdir(tmp_path)
    links = {
        "COLONY_SERVICE_HOST": "10.0.0.1",
        "COLONY_SERVICE_PORT": "8000",
        "COLONY_SERVICE_PORT_HTTP": "8000",
        "COLONY_PORT": "tcp://10.0.0.1:8000",
        "COLONY_PORT_8000_TCP": "tcp://10.0.0.1:8000",
        "COLONY_PORT_8000_TCP_ADDR": "10.0.0.1",
        "COLONY_PORT_8000_TCP_PORT": "8000",
        "COLONY_PORT_8000_TCP_PROTO": "tcp",
        "COLONY_REDIS_SERVICE_HOST": "10.0.0.2",
        "COLONY_REDIS_PORT_6379_TCP_ADDR": "10.0.0.2",
    }
    for name, value in links.items():
        monkeypatch.setenv(name, value)
    assert load_settings().serve.port == 8000
    monkeypatch.setenv("COLONY_SERVE__PROT", "1")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.problems == [
        "environment variable COLONY_SERVE__PROT: matches no setting; did you mean COLONY_SERVE__PORT?"
    ]


def test_a_user_agent_cannot_take_a_reserved_name() -> None:
    with pytest.raises(ValidationError, match="'catalog' is reserved"):
        ColonySettings(agents={"catalog": "pkg.mod:factory"})


def test_hostile_config_sources_are_clear_errors_not_tracebacks_or_bombs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: an environment variable that is not the JSON it must be and a binary config
    file were tracebacks; 360 bytes of nested YAML aliases took gigabytes to describe."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLONY_AGENTS", "{bad")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "agents" in str(caught.value)
    monkeypatch.delenv("COLONY_AGENTS")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not valid YAML text"):
        load_settings(binary)
    rows = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for name, prior in zip("bcdefg", "abcdef", strict=True):
        rows.append(f"{name}: &{name} [{', '.join([f'*{prior}'] * 9)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join([*rows, "serve: {port: *g}"]) + "\n")
    with pytest.raises(ConfigError, match="aliases"):
        load_settings(bomb)
    deep = tmp_path / "deep.yaml"
    deep.write_text("serve: {port: [" + ", ".join(str(n) for n in range(5000)) + "]}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(deep)
    assert len(str(caught.value)) < 1000  # the rejected value is shown in short
