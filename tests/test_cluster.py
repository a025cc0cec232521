"""The real thing: `colony up` (daemon owning a local Ray cluster with the Serve app on the embedded
model), runs over HTTP, an API replica killed mid-life, metrics, `colony down` leaving nothing."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from colony import cli
from colony.blackboard.redis_server import EmbeddedRedis, free_port, process_alive
from colony.client import ApiError, ColonyClient
from colony.config import ColonySettings, ServeSettings, VcmSettings
from colony.memory.chroma_server import EmbeddedChroma, heartbeat
from colony.serve import cluster
from colony.system.analyze_check import repetitions


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return pids


def _pid_of(title: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if title in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    return int(entry.name)
            except OSError:
                continue
    return None


@pytest.fixture(scope="module")
def colony_up(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ColonySettings, cluster.ClusterInfo]]:
    settings = ColonySettings(
        data_dir=tmp_path_factory.mktemp("colony-up"),
        serve=ServeSettings(port=free_port(), num_cpus=2, replica_cpus=0.5),
        vcm=VcmSettings(allowed_roots=[tmp_path_factory.getbasetemp()]),  # the folders tests map
    )
    info = cluster.up(settings)
    yield settings, info
    cluster.down(settings)


def test_up_is_idempotent_and_serves_runs(colony_up) -> None:
    settings, info = colony_up
    assert cluster.up(settings).pid == info.pid  # a second `up` reuses the running cluster
    chroma = EmbeddedChroma(settings.data_dir).status()  # memory's vector index, beside Redis
    assert chroma is not None and heartbeat(chroma.url)
    with ColonyClient(info.url, info.token, timeout=120) as client:
        assert client.health()["status"] == "ok"
        echo = client.run("echo", {"ping": [1, 2, 3]})
        assert echo["status"] == "succeeded" and echo["output"] == {"ping": [1, 2, 3]}
        run_id = client.submit("ask", {"question": "What is the capital of France?"})["run_id"]
        events = list(client.events(run_id))
        tokens = "".join(e["data"]["text"] for e in events if e["event_type"] == "token")
        assert tokens.strip() and events[-1]["event_type"] == "completed"
        view = client.get(run_id)
        assert view["status"] == "succeeded" and view["output"] == tokens.strip()
        with pytest.raises(ApiError) as info_401:
            ColonyClient(info.url, "wrong").submit("echo", 1)
        assert info_401.value.status == 401
        metrics = httpx.get(f"{info.url}/metrics", headers={"Authorization": f"Bearer {info.token}"}).text
        assert 'colony_runs_submitted_total{agent="ask"}' in metrics
        assert 'colony_replica_inference_tokens_total{kind="completion"' in metrics
        assert "colony_replica_inference_ttft_seconds_bucket{le=" in metrics  # a real histogram
        pages = httpx.get(f"{info.url}/v1/vcm/pages", headers={"Authorization": f"Bearer {info.token}"})
        assert pages.status_code == 200 and isinstance(pages.json(), list)


def test_runs_survive_a_killed_api_replica(colony_up) -> None:
    _settings, info = colony_up
    with ColonyClient(info.url, info.token, timeout=120) as client:
        run_ids = [client.submit("echo", n)["run_id"] for n in range(5)]
        api_pid = _pid_of("ColonyAPI")
        assert api_pid is not None
        os.kill(api_pid, signal.SIGKILL)  # the API replica dies; Serve starts another
        deadline = time.monotonic() + 120
        views = None
        while time.monotonic() < deadline:
            try:
                views = [client.get(run_id) for run_id in run_ids]
                break
            except (httpx.HTTPError, ApiError):
                time.sleep(1)
        assert views is not None, "the API did not come back"
        assert _pid_of("ColonyAPI") not in (None, api_pid)
        assert [v["run_id"] for v in views] == run_ids
        for run_id in run_ids:
            for _event in client.events(run_id):
                pass
        assert [client.get(r)["output"] for r in run_ids] == [0, 1, 2, 3, 4]


def test_analyze_colony_vcm_with_the_embedded_model(
    colony_up, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13's acceptance, the README's main job: `colony run analyze --map colony/vcm` on the
    embedded model names every file, analyses all of them, its header agrees with its lists, no
    summary repeats itself, and none names an identifier, file or library its page does not hold
    (checked with benchmarks/analyze_quality.py's rules, not the job's own checker)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import analyze_quality as quality

    settings, _info = colony_up
    package = Path(__file__).resolve().parents[1] / "colony" / "vcm"
    folder = tmp_path / "vcm"  # a copy under the cluster's allowed roots
    shutil.copytree(package, folder, ignore=shutil.ignore_patterns("__pycache__"))
    expected = sorted(p.name for p in folder.glob("*.py"))
    monkeypatch.setenv("COLONY_DATA_DIR", str(settings.data_dir))
    started = time.monotonic()
    code = cli.main(
        ["run", "analyze", "--map", str(folder), "--page-tokens", "2048", "--json", "--timeout", "900"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    output = json.loads(out)
    assert output["files"] == expected and not output["partial"] and output["not_analysed"] == []
    report = output["report"]
    assert "Not analysed" not in report and all(name in report for name in expected)
    header = f"{len(expected)} files in {output['pages']} page(s), summarised by {len(output['workers'])}"
    assert header in report and output["pages"] == len(output["sections"])
    for section in output["sections"]:
        page = quality.span_text(section["spans"], folder)
        assert not repetitions(section["summary"]), section
        for name in quality.identifiers(section["summary"]):
            assert quality.grounded(name, page, section["files"]), (name, section)
    print(
        f"analyze of colony/vcm took {time.monotonic() - started:.1f} s: {output['stats']}", file=sys.stderr
    )


def test_research_over_colony_vcm_cites_the_definition_that_answers(
    colony_up, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37's acceptance: `colony run research --map colony/vcm --input '{"question": ...}'` on
    the embedded model, as docs/research.md shows it: progress on stderr (files examined, workers,
    evidence), and the answer's first citation is a line of the class that cuts a folder into pages."""
    settings, _info = colony_up
    folder = tmp_path / "vcm-research"  # a copy under the cluster's allowed roots
    shutil.copytree(
        Path(__file__).resolve().parents[1] / "colony" / "vcm",
        folder,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    monkeypatch.setenv("COLONY_DATA_DIR", str(settings.data_dir))
    question = {"question": "Where is a folder cut into pages of a bounded number of tokens?"}
    code = cli.main(["run", "research", "--map", str(folder), "--input", json.dumps(question), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    output = json.loads(out)
    tree = ast.parse((folder / "pages.py").read_text())
    (page_source,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PageSource"]
    first = output["citations"][0]
    assert first["path"] == "pages.py" and page_source.lineno <= first["line"] <= page_source.end_lineno, (
        output
    )
    assert first["text"] == (folder / "pages.py").read_text().split("\n")[first["line"] - 1].strip()
    assert output["answer"].startswith("`PageSource") and output["agents"] and output["not_finished"] == []
    assert "examining" in err and "research-worker agent(s)" in err and "evidence from" in err


def test_a_worker_that_cannot_analyse_its_page_makes_analyze_exit_non_zero_naming_the_files(
    colony_up, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A page whose text is gone from Redis (its worker fails, and so does its retry): the run is
    `partial`, `colony run` exits 3 and names the file on stderr."""
    settings, info = colony_up
    for name in ("kept", "gone"):  # each bigger than a 64-token page: pages of their own
        body = "".join(f"def {name}_{n}(value):\n    return value + {n}\n\n\n" for n in range(12))
        (tmp_path / f"{name}.py").write_text(f'"""{name.title()}."""\n\n\n{body}')
    with ColonyClient(info.url, info.token, timeout=120) as client:
        mapped = client.map_source(str(tmp_path), 64)
    pages = {page["page_id"]: page for page in mapped["pages"]}
    doomed = [pid for pid, page in pages.items() if "gone.py" in json.dumps(page)]
    assert doomed and len(doomed) < len(pages), mapped

    async def lose_text() -> None:
        from colony.blackboard import Blackboard, BlackboardScope, scope_id
        from colony.blackboard.protocol import VcmProtocol

        board = Blackboard.connect(scope_id(BlackboardScope.COLONY, namespace="vcm"), settings)
        try:
            for page_id in doomed:
                await board.delete(VcmProtocol.content_key(page_id))
        finally:
            await board.close()

    asyncio.run(lose_text())
    monkeypatch.setenv("COLONY_DATA_DIR", str(settings.data_dir))
    body = json.dumps({"path": str(tmp_path), "pages": sorted(pages)})
    code = cli.main(["run", "analyze", "--input", body, "--timeout", "600"])
    out, err = capsys.readouterr()
    assert code == cli.RUN_PARTIAL, err
    assert "not analysed" in err and "gone.py" in err.split("partial")[-1]
    assert "kept.py" in out


def test_cli_runs_on_a_cluster_started_elsewhere_with_url_and_token(colony_up, tmp_path: Path) -> None:
    """Issue 14's acceptance: `colony run echo --url URL --token T` from a machine (a data dir, a
    config) that started no cluster; the same with $COLONY_URL / $COLONY_API_TOKEN; a wrong token
    is refused with what to do."""
    from cli_kit import run_cli

    _settings, info = colony_up
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_")}
    env["COLONY_DATA_DIR"] = str(tmp_path / "elsewhere")  # no state file, no token file of that cluster
    assert run_cli("status", cwd=tmp_path, env=env).returncode == 1  # nothing runs "here"
    ran = run_cli(
        "run",
        "echo",
        "--url",
        info.url,
        "--token",
        info.token,
        "--input",
        '{"from": "afar"}',
        "--json",
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {"from": "afar"}
    by_env = dict(env, COLONY_URL=info.url, COLONY_API_TOKEN=info.token)
    status = run_cli("status", "--json", cwd=tmp_path, env=by_env, timeout=60)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["url"] == info.url and report["health"] == "ok" and report["replicas"] >= 1
    assert "token" not in report and report["agents"] >= 3
    quiet = run_cli("run", "echo", "--input", "7", "-q", cwd=tmp_path, env=by_env, timeout=120)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "7", quiet.stderr
    refused = run_cli("run", "echo", "--url", info.url, "--token", "wrong", cwd=tmp_path, env=env, timeout=60)
    assert refused.returncode == 2 and "HTTP 401" in refused.stderr and "--token" in refused.stderr


def _memory_counts(client: ColonyClient, agent: str) -> tuple[dict[str, int], int]:
    memory_map = client.memory.map(agent)
    counts = {info["scope_type"]: info["entry_count"] for info in memory_map["scopes"].values()}
    return counts, memory_map["total_pending_ingestion"]


def _settled_counts(client: ColonyClient, agent: str, timeout: float = 120.0) -> dict[str, int]:
    """The agent's entry counts once nothing is pending ingestion (the same twice, 1 s apart)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            counts, pending = _memory_counts(client, agent)
        except (httpx.HTTPError, ApiError):
            counts, pending = None, -1
        if pending == 0 and counts == last:
            return counts
        last = counts if pending == 0 else None
        time.sleep(1)
    raise AssertionError(f"the memory of {agent} did not settle: {last}")


def test_assistant_uses_a_fact_from_an_earlier_run(colony_up, tmp_path: Path) -> None:
    """Issue 15's acceptance: `colony run assistant` (planned by the embedded SmolLM2) streams its
    steps by action name, shows its PLANNING lens in the opt-in prompt event, and answers a question
    with a fact it was told in an earlier run."""
    from cli_kit import run_cli

    _settings, info = colony_up
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_")}
    env.update(COLONY_URL=info.url, COLONY_API_TOKEN=info.token)
    task = {"task": "Please remember that my locker code is 7291."}
    told = run_cli("run", "assistant", "--input", json.dumps(task), cwd=tmp_path, env=env, timeout=600)
    assert told.returncode == 0, told.stderr[-3000:]
    assert "step 1: " in told.stderr and ("answer" in told.stderr or "remember" in told.stderr)
    with ColonyClient(info.url, info.token, timeout=600) as client:
        question = {"task": "What is my locker code?", "emit_prompt": True}
        run_id = client.submit("assistant", question)["run_id"]
        events = list(client.events(run_id))
        view = client.get(run_id)
        assert view["status"] == "succeeded", view
        assert "7291" in view["output"], view["output"]
        steps = [e["data"] for e in events if e["event_type"] == "step"]
        assert steps and steps[-1]["name"] == "answer"
        prompts = [e["data"]["text"] for e in events if e["event_type"] == "prompt"]
        assert prompts, [e["event_type"] for e in events]
        assert "## Memory: planning" in prompts[0] and "7291" in prompts[0]
        # its conversation and action streams carry the earlier run into this one's prompt
        assert "## Conversation" in prompts[0] and "## Recent Actions" in prompts[0]
        counts = _settled_counts(client, "assistant")
        assert counts["working"] >= 2 and counts["stm"] == counts["working"]


def test_memory_ingestion_is_exactly_once_across_suspension_and_a_killed_replica(colony_up) -> None:
    """Issue 15's acceptance: 5 writes to working memory with a suspend/resume between the 2nd and
    3rd leave exactly 5 more entries in STM; after the replica hosting the agent is killed, the
    memory map shows the same counts."""
    _settings, info = colony_up
    with ColonyClient(info.url, info.token, timeout=120) as client:
        before = _settled_counts(client, "assistant")
        for n in range(2):
            client.memory.write(
                "assistant", "working", f"Sensor {n} reads {20 + n} degrees.", tags=["reading"]
            )
        client.suspend("assistant")
        for n in range(2, 5):
            client.memory.write(
                "assistant", "working", f"Sensor {n} reads {20 + n} degrees.", tags=["reading"]
            )
        client.resume("assistant")
        after = _settled_counts(client, "assistant")
        assert after["working"] == before["working"] + 5
        assert after["stm"] == before["stm"] + 5
        readings = client.memory.query(
            "assistant", None, tag_filter={"all_of": ["reading"]}, scopes=["stm"], max_results=50
        )
        assert sorted(r["entry"]["content"] for r in readings) == [
            f"Sensor {n} reads {20 + n} degrees." for n in range(5)
        ]
        replica = _pid_of("EngineReplica")
        assert replica is not None
        os.kill(replica, signal.SIGKILL)  # the only engine replica: the one hosting the assistant
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            agents = {a["agent_id"]: a for a in client.agents()}
            if _pid_of("EngineReplica") not in (None, replica) and agents["assistant"]["state"] == "idle":
                break
            time.sleep(1)
        assert _settled_counts(client, "assistant") == after
        again = client.run("assistant", {"task": "Which sensor reads 22 degrees?"})
        assert again["status"] == "succeeded", again


def test_down_leaves_nothing_running(colony_up) -> None:
    settings, info = colony_up
    assert _group_pids(info.pid)
    chroma = EmbeddedChroma(settings.data_dir).status()
    assert chroma is not None
    assert cluster.down(settings) is True
    assert _group_pids(info.pid) == []
    assert cluster.status(settings) is None
    assert EmbeddedRedis(settings.data_dir).status() is None
    assert EmbeddedChroma(settings.data_dir).status() is None and not process_alive(chroma.pid)


def test_a_dead_daemons_leftover_processes_are_reaped(tmp_path: Path) -> None:
    """`up` after the daemon was SIGKILLed stops what is left of its Ray cluster (processes of its
    session carrying its id), and only those: a process of another session, or of a session whose
    leader got the dead daemon's pid since (no id in its environment), is left alone."""
    import subprocess

    from colony.blackboard.redis_server import process_alive
    from colony.serve.cluster import DAEMON_ID_VARIABLE, reap_session

    script = (
        "import os, subprocess, sys, time\n"
        "os.setsid()\n"  # a session leader, as the daemon is
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', 'ray::Fake'])\n"
        "print(os.getpid(), child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", script, "colony-daemon"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, DAEMON_ID_VARIABLE: "d1"},
    )
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "ray::Other"])
    # a session leader the OS could have given the dead daemon's pid: `ray` in its command line
    reused = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "ray::Reused"], start_new_session=True
    )
    try:
        assert leader.stdout is not None
        sid, child = (int(x) for x in leader.stdout.readline().split())
        os.kill(sid, signal.SIGKILL)  # the daemon dies; its child lives on
        leader.wait()
        assert process_alive(child)
        assert reap_session(reused.pid, "d1") == 0 and process_alive(reused.pid)
        assert reap_session(sid, "") == 0 and process_alive(child)  # a record without an id: nothing
        # the daemon's leftover carries its id: it is stopped (asked again for a few seconds: on a
        # busy CI box one listing of /proc once came back without it)
        deadline = time.monotonic() + 10
        killed = 0
        while process_alive(child) and time.monotonic() < deadline:
            killed += reap_session(sid, "d1")
            time.sleep(0.2)
        assert killed >= 1 and not process_alive(child) and process_alive(stranger.pid)
    finally:
        for process in (stranger, reused):
            process.kill()
            process.wait()
