"""The embedded Chroma server (a real `chroma run` process) and the clients memory builds on it:
start, reuse, stop, what `colony up | down | status` do with it, and that nothing is downloaded
(the embedding function is always ours, never Chroma's default ONNX one) nor reported home."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from colony import cli
from colony.blackboard.redis_server import EmbeddedRedis, free_port, process_alive
from colony.config import ChromaServerSettings, ColonySettings, MemorySettings, ServeSettings
from colony.errors import ClusterError
from colony.memory.chroma_http import CHROMA_CALL_SECONDS
from colony.memory.chroma_server import (
    EmbeddedChroma,
    chroma_client,
    heartbeat,
    resolve_chroma_url,
)
from colony.memory.embedding import get_embedder
from colony.serve import cluster


def _settings(data_dir: Path, **memory: object) -> ColonySettings:
    chroma = ChromaServerSettings(port=free_port(), start_timeout_seconds=60)
    return ColonySettings(data_dir=data_dir, memory=MemorySettings(chroma=chroma, **memory))


@pytest.fixture
def no_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Chroma's default embedding function is never used: its model folder is pointed at a temp
    dir that must stay absent, and a download fails the test."""
    from chromadb.utils.embedding_functions.onnx_mini_lm_l6_v2 import ONNXMiniLM_L6_V2

    onnx = tmp_path / "onnx_models"
    home_cache = Path.home() / ".cache" / "chroma" / "onnx_models"
    existed = home_cache.exists()
    monkeypatch.setattr(ONNXMiniLM_L6_V2, "DOWNLOAD_PATH", onnx)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("chroma tried to download its default embedding model")

    monkeypatch.setattr(ONNXMiniLM_L6_V2, "_download", refuse)
    yield onnx
    assert not onnx.exists()
    assert existed or not home_cache.exists()


def _remember_and_recall(client: object, data_dir: Path) -> list[str]:
    embedder = get_embedder(ColonySettings(data_dir=data_dir))
    collection = client.get_or_create_collection(  # type: ignore[attr-defined]
        "colony-test-memory", embedding_function=embedder, configuration={"hnsw": {"space": "cosine"}}
    )
    collection.upsert(
        ids=["cat", "stocks", "password"],
        documents=[
            "The cat sits on the mat.",
            "Stock markets fell sharply after the interest rate announcement.",
            "How do I reset my password?",
        ],
    )
    found = collection.query(query_texts=["a kitten resting on a rug"], n_results=3, include=["distances"])
    distances = found["distances"][0]
    assert distances[0] < 0.6 < distances[1]  # cosine distance: the paraphrase is near, the rest far
    return list(found["ids"][0])


def test_start_reuse_stop_and_the_url_memory_uses(tmp_path: Path, no_download: Path) -> None:
    settings = _settings(tmp_path)
    server = EmbeddedChroma(settings.data_dir, settings.memory.chroma)
    assert server.status() is None and resolve_chroma_url(settings) is None
    try:
        info = server.start()
        assert info.port == settings.memory.chroma.port and heartbeat(info.url)
        assert json.loads((tmp_path / "chroma-server.json").read_text())["pid"] == info.pid
        assert EmbeddedChroma(tmp_path, settings.memory.chroma).start() == info  # reused, not a second one
        assert resolve_chroma_url(settings) == info.url == f"http://127.0.0.1:{info.port}"
        external = _settings(tmp_path, chroma_url="http://chroma.example:8000")
        assert resolve_chroma_url(external) == "http://chroma.example:8000"  # the setting wins

        client = chroma_client(settings)
        assert client.get_settings().anonymized_telemetry is False
        assert _remember_and_recall(client, tmp_path)[0] == "cat"
        # every later call is bounded (colony.memory.chroma_http: chromadb's own waits without limit)
        session = client._server._session
        assert session.timeout.read == CHROMA_CALL_SECONDS
        assert session.headers.get("Content-Type") == "application/json"  # its own headers kept (auth too)
        assert (tmp_path / "chroma").is_dir() and not (tmp_path / "chroma-local").exists()
        # the server talks to nobody but its loopback clients (no telemetry, no update checks)
        for connection in psutil.Process(info.pid).net_connections(kind="inet"):
            for address in (connection.laddr, connection.raddr):
                if address:
                    assert ipaddress.ip_address(address.ip).is_loopback, connection
        assert (tmp_path / "logs" / "chroma.log").stat().st_size > 0
    finally:
        stopped = server.stop()
    assert stopped and not process_alive(info.pid) and not heartbeat(info.url)
    assert server.status() is None and resolve_chroma_url(settings) is None
    assert not (tmp_path / "chroma-server.json").exists()
    assert server.stop() is False


def test_a_killed_server_comes_back_on_its_port_and_foreign_pids_are_left_alone(tmp_path: Path) -> None:
    settings = ColonySettings(data_dir=tmp_path)  # no port configured: a free one is picked
    server = EmbeddedChroma(tmp_path, settings.memory.chroma)
    first = server.start()
    try:
        client = chroma_client(settings)
        client.list_collections()  # connections the dead server leaves in TIME_WAIT on its port
        os.kill(first.pid, signal.SIGKILL)
        assert server.status() is None and resolve_chroma_url(settings) is None
        assert cluster.start_chroma(settings) is True  # what `up` does, also for a running cluster
        second = server.status()
        assert second is not None and second.pid != first.pid and second.url == first.url
        assert client.list_collections() == []  # the client made before the crash carries on
    finally:
        server.stop()
    (tmp_path / "chroma-server.json").write_text(json.dumps({**first.__dict__, "pid": os.getpid()}))
    assert server.status() is None and resolve_chroma_url(settings) is None  # this process: no chroma
    assert server.stop() is False and process_alive(os.getpid())  # a foreign pid is never signalled


async def test_a_chroma_server_that_never_answers_leaves_recall_to_keywords(
    bb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a server that takes connections and never answers held recall of the whole
    process (no time limit in chromadb's client)."""
    import asyncio
    import socket
    import threading

    from colony.memory import chroma_http
    from colony.memory.scopes import MemoryScope
    from colony.memory.service import MemoryService
    from colony.memory.types import MemoryQuery, NewMemory

    monkeypatch.setattr(chroma_http, "CHROMA_CALL_SECONDS", 1.0)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(silent.accept()[0])  # read nothing, answer nothing
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    settings = _settings(tmp_path, chroma_url=f"http://127.0.0.1:{silent.getsockname()[1]}")
    service = MemoryService(bb, settings)
    scope = MemoryScope.agent_working(f"a{uuid.uuid4().hex[:10]}")
    try:
        await service.store.write(scope, NewMemory(content="The deploy key is in vault A"))
        found = await asyncio.wait_for(service.recall(MemoryQuery(query="deploy key vault"), [scope]), 10)
        assert [r.entry.content for r in found] == ["The deploy key is in vault A"]
        assert service.vector_error is not None and "heartbeat" in service.vector_error
    finally:
        silent.close()
        for connection in held:
            connection.close()


def test_bad_settings_are_refused_by_name(tmp_path: Path) -> None:
    remote = ChromaServerSettings(host="0.0.0.0")
    with pytest.raises(ClusterError, match="loopback"):
        EmbeddedChroma(tmp_path, remote).start()
    missing = ChromaServerSettings(binary=tmp_path / "no-chroma")
    with pytest.raises(ClusterError, match=r"memory\.chroma\.binary"):
        EmbeddedChroma(tmp_path, missing).start()


def test_without_a_server_the_client_is_in_process(tmp_path: Path, no_download: Path) -> None:
    settings = _settings(tmp_path)
    client = chroma_client(settings)
    assert client.get_settings().anonymized_telemetry is False
    assert _remember_and_recall(client, tmp_path)[0] == "cat"
    assert (tmp_path / "chroma-local").is_dir()


def test_up_down_and_status_handle_the_embedded_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`down` stops the server `up` started; `status --json` shows it; an `up` that fails stops
    the Chroma (and Redis) it started. (The cluster tests run the whole `up` with Ray.)"""
    settings = _settings(tmp_path)
    settings.serve = ServeSettings(port=free_port())
    assert cluster.start_chroma(settings) is True
    assert cluster.start_chroma(settings) is False  # running: reused
    info = EmbeddedChroma(tmp_path, settings.memory.chroma).status()
    assert info is not None
    monkeypatch.setenv("COLONY_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("COLONY_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["status", "--json"]) == 1  # no cluster, yet the local parts are reported
    report = json.loads(capsys.readouterr().out)
    assert report["chroma"] == {
        "kind": "embedded",
        "running": True,
        "pid": info.pid,
        "url": info.url,
        "path": str(tmp_path / "chroma"),
    }
    assert cluster.down(settings) is False  # no cluster ran; the Chroma server is stopped all the same
    assert not process_alive(info.pid) and EmbeddedChroma(tmp_path).status() is None

    def fail(settings: ColonySettings, env: dict[str, str]) -> cluster.ClusterInfo:
        assert heartbeat(resolve_chroma_url(settings) or "")  # up started it before the daemon
        assert "COLONY_MEMORY__CHROMA_URL" not in env  # replicas read the state file; no secret
        raise ClusterError("the daemon did not start (test)")

    monkeypatch.setattr(cluster, "_launch", fail)
    with pytest.raises(ClusterError, match="test"):
        cluster.up(settings)
    assert EmbeddedChroma(tmp_path).status() is None and EmbeddedRedis(tmp_path).status() is None

    off = ColonySettings(
        data_dir=tmp_path / "off", memory=MemorySettings(chroma=ChromaServerSettings(enabled=False))
    )
    assert cluster.start_chroma(off) is False and EmbeddedChroma(off.data_dir).status() is None
    external = _settings(tmp_path / "ext", chroma_url="http://127.0.0.1:1")
    assert cluster.start_chroma(external) is False
