"""User agents from config: a package of the user's own, named in the `agents:` settings, is placed
like a built-in and runs through `POST /v1/runs`; bad entries stop the colony with a message that
says what to fix.

The package is written into a temporary folder. On a real `colony up` it reaches every Serve
replica the way a user would bring it: its folder on PYTHONPATH in the environment `colony up` runs
in (the daemon, Ray and every replica inherit it). In an image it is pip-installed instead
(docker/examples/user-agent)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cli_kit import run_cli

from colony.blackboard.redis_server import free_port
from colony.client import ColonyClient
from colony.config import ColonySettings, load_settings
from colony.errors import ConfigError

PACKAGE = "colony_greeter_test"
MODULE = textwrap.dedent(
    '''
    """A user agent package, as a user writes one (tests/test_user_agents.py)."""

    from colony.agents import (
        ActionType,
        Agent,
        AgentBlueprint,
        AgentCapability,
        AgentMetadata,
        AgentRunCapability,
        AgentType,
        ScriptedActionPolicy,
        action_executor,
    )
    from colony.system.builtin import RUNS_NAMESPACE


    class Greeting(AgentCapability):
        @action_executor(action_type=ActionType.OUTPUT_WRITE)
        async def greet(self, name: str) -> dict:
            """Greet someone by name."""
            return {"greeting": f"Hello, {name}!", "module": __name__}


    def greeter(agent_id: str) -> AgentBlueprint:
        return AgentBlueprint(
            agent_class=Agent,
            metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="greeter"),
            capabilities=[Greeting.bind(), AgentRunCapability.bind(namespace=RUNS_NAMESPACE)],
            action_policy=ScriptedActionPolicy.bind(
                steps=[{"action": "greet", "parameters": {"name": "$input.name"}}]
            ),
        )


    def not_a_blueprint(agent_id: str) -> dict:
        return {"agent_id": agent_id}


    def named_otherwise(agent_id: str) -> AgentBlueprint:
        return greeter("someone-else")
    '''
)


@pytest.fixture(scope="module")
def package_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the user's package (not installed anywhere)."""
    root = tmp_path_factory.mktemp("user-pkg")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    (root / PACKAGE / "agents.py").write_text(MODULE)
    return root


@pytest.fixture
def importable(package_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The package importable in this process (as it is in a replica whose image has it)."""
    monkeypatch.syspath_prepend(str(package_root))
    yield package_root
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def test_agents_settings_refuse_bad_names_and_import_paths(tmp_path: Path) -> None:
    config = tmp_path / "colony.yaml"
    config.write_text(yaml.safe_dump({"agents": {"Greeter!": "pkg.mod:make", "ok": "pkg/mod.py"}}))
    with pytest.raises(ConfigError) as refused:
        load_settings(config)
    message = str(refused.value)
    assert "'Greeter!' is not an agent name" in message
    assert "'pkg/mod.py' is not an import path of the form 'package.module:factory'" in message
    config.write_text(yaml.safe_dump({"agents": {"greeter": f"{PACKAGE}.agents:greeter"}}))
    assert load_settings(config).agents == {"greeter": f"{PACKAGE}.agents:greeter"}


@pytest.mark.parametrize(
    ("agents", "expected"),
    [
        (
            {"greeter": "colony_no_such_package.agents:greeter"},
            "cannot import module 'colony_no_such_package.agents' (no module named "
            "'colony_no_such_package'); install the package where Colony runs",
        ),
        (
            {"echo": f"{PACKAGE}.agents:greeter"},
            "'echo' is a built-in agent (analyze, ask, assistant, echo, research, session) "
            "and cannot be replaced",
        ),
        (
            {"greeter": f"{PACKAGE}.agents:not_a_blueprint"},
            "the factory returned a builtins.dict; it must return a colony.agents.AgentBlueprint",
        ),
        (
            {"greeter": f"{PACKAGE}.agents:named_otherwise"},
            "the factory returned a blueprint for agent 'someone-else'; it must use the agent id",
        ),
        (
            {"greeter": f"{PACKAGE}.agents:no_such_factory"},
            f"module '{PACKAGE}.agents' has no attribute 'no_such_factory'",
        ),
    ],
    ids=["unknown-module", "shadows-echo", "wrong-type", "wrong-agent-id", "no-such-factory"],
)
def test_a_bad_user_agent_stops_the_deploy_naming_the_setting(
    importable: Path, tmp_path: Path, agents: dict[str, str], expected: str
) -> None:
    from colony.serve.app import build_app_with_settings

    name, path = next(iter(agents.items()))
    settings = ColonySettings(data_dir=tmp_path, agents=agents)
    with pytest.raises(ConfigError) as refused:
        build_app_with_settings({"replicas": 1}, settings=settings)
    assert str(refused.value).startswith(f"user agent agents.{name} = {path!r}: ")
    assert expected in str(refused.value)


def test_a_good_user_agent_is_built_beside_the_builtins(importable: Path, tmp_path: Path) -> None:
    from colony.system.catalog import colony_blueprints

    settings = ColonySettings(data_dir=tmp_path, agents={"greeter": f"{PACKAGE}.agents:greeter"})
    blueprints = colony_blueprints(settings)
    assert sorted(blueprints) == ["analyze", "ask", "assistant", "echo", "greeter", "research", "session"]
    assert blueprints["greeter"].metadata.agent_id == "greeter"
    assert blueprints["greeter"].metadata.role == "greeter"


def test_the_documented_example_package_is_a_valid_user_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker/examples/user-agent (the image recipe of docker/README.md): its settings file loads and
    its factory builds the agent it names."""
    from colony.system.catalog import colony_blueprints

    example = Path(__file__).resolve().parent.parent / "docker" / "examples" / "user-agent"
    monkeypatch.syspath_prepend(str(example))
    try:
        settings = load_settings(example / "colony.yaml", data_dir=tmp_path)
        assert settings.agents == {"greeter": "colony_greeter.agents:greeter"}
        assert colony_blueprints(settings)["greeter"].metadata.agent_id == "greeter"
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "colony_greeter"]:
            del sys.modules[name]


def _env(data_dir: Path, port: int, pythonpath: Path | None) -> dict[str, str]:
    env = {
        **os.environ,
        "COLONY_DATA_DIR": str(data_dir),
        "COLONY_SERVE__PORT": str(port),
        "COLONY_SERVE__NUM_CPUS": "2",
        "COLONY_ENGINE__KIND": "scripted",  # the user agent needs no model; keeps `up` quick
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("COLONY_CONFIG", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")]))
    return env


def test_colony_up_serves_a_user_agent_from_pythonpath_over_http(package_root: Path, tmp_path: Path) -> None:
    """The whole path a user takes: the package's folder on PYTHONPATH, `agents:` in the config,
    `colony up`, then a run over HTTP and with `colony run`."""
    config = tmp_path / "colony.yaml"
    config.write_text(yaml.safe_dump({"agents": {"greeter": f"{PACKAGE}.agents:greeter"}}))
    env = _env(tmp_path / "data", free_port(), package_root)
    started = time.monotonic()
    up = run_cli("--config", str(config), "up", cwd=tmp_path, env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((tmp_path / "data" / "cluster.json").read_text())
        with ColonyClient(state["url"], state["token"], timeout=60) as client:
            assert "greeter" in {a["agent_id"] for a in client.agents()}
            view = client.run("greeter", {"name": "Ada"}, timeout_s=60)
            assert view["status"] == "succeeded", view
            # the module ran in the engine replica that hosts the agent, imported from PYTHONPATH
            assert view["output"] == {"greeting": "Hello, Ada!", "module": f"{PACKAGE}.agents"}
        run = run_cli(
            "--config", str(config), "run", "greeter", "--input", '{"name": "Grace"}', "--json",
            cwd=tmp_path, env=env, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert json.loads(run.stdout)["greeting"] == "Hello, Grace!"
    finally:
        down = run_cli("--config", str(config), "down", cwd=tmp_path, env=env)
        assert down.returncode == 0, down.stdout + down.stderr
    print(f"colony up + 2 user-agent runs + down: {time.monotonic() - started:.1f}s")


def test_colony_up_with_an_unimportable_user_agent_exits_2_naming_it(tmp_path: Path) -> None:
    """Without the package on the path, `up` fails at once with the setting and the fix, and leaves
    nothing running."""
    config = tmp_path / "colony.yaml"
    config.write_text(yaml.safe_dump({"agents": {"greeter": f"{PACKAGE}.agents:greeter"}}))
    env = _env(tmp_path / "data", free_port(), None)
    started = time.monotonic()
    up = run_cli("--config", str(config), "up", cwd=tmp_path, env=env)
    took = time.monotonic() - started
    try:
        assert up.returncode == 2, up.stdout + up.stderr
        assert took < 10, f"the bad entry should be named before Ray starts, took {took:.1f}s"
        assert not (tmp_path / "data" / "redis").exists()  # nothing was started, not even Redis
        assert f"user agent agents.greeter = '{PACKAGE}.agents:greeter': cannot import module" in up.stderr
        assert "install the package where Colony runs" in up.stderr
        assert not (tmp_path / "data" / "cluster.json").exists()
    finally:
        run_cli("--config", str(config), "down", cwd=tmp_path, env=env)
