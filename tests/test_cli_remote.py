"""`colony run|status --url/--token` (and COLONY_URL / COLONY_API_TOKEN) against an address that is
not the local cluster: what is sent, what is refused, and the messages a user gets. The API here is
a small recording HTTP server (the CLI's behaviour is under test, not the API's); the same commands
against a real cluster started elsewhere are in tests/test_cluster.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from colony import cli


class Recorder:
    """What the fake API saw, and how it answers: `token` None accepts any request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization
        self.token: str | None = None
        self.healthz: tuple[int, bytes] = (200, b'{"status": "ok", "version": "0.1.0"}')
        self.refusal = "bad token"  # the message of a 401


@pytest.fixture
def fake_api() -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            auth = self.headers.get("Authorization")
            recorder.requests.append((self.command, self.path, auth))
            if self.path == "/healthz":
                return self._answer(*recorder.healthz)
            if recorder.token is not None and auth != f"Bearer {recorder.token}":
                return self._answer(401, {"error": {"code": "unauthorized", "message": recorder.refusal}})
            if self.path in ("/v1/agents", "/v1/replicas"):
                listed = [{"agent_id": "echo", "state": "idle"}] if "agents" in self.path else []
                return self._answer(200, listed)
            event = {"event_type": "completed", "run_id": "run-1", "seq": 1, "data": {}}
            events = f"id: 1-0\ndata: {json.dumps(event)}\n\n".encode()
            if self.path == "/v1/runs" and self.command == "POST":
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if body.get("stream") is True:  # as the API answers: the run's events, its id in a header
                    return self._answer(200, events, {"Colony-Run-Id": "run-1"})
                return self._answer(202, {"run_id": "run-1", "status": "queued"})
            if self.path == "/v1/runs/run-1/events":
                return self._answer(200, events)
            if self.path == "/v1/runs/run-1":
                return self._answer(200, {"run_id": "run-1", "status": "succeeded", "output": {"ok": 1}})
            return self._answer(404, {"error": {"code": "not_found", "message": self.path}})

        do_GET = do_POST = _handle

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", recorder
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def no_local_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data dir with a local token file and no running cluster: nothing here may leak it."""
    for name in ("COLONY_URL", "COLONY_API_TOKEN", "COLONY_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLONY_DATA_DIR", str(tmp_path))
    (tmp_path / "api-token").write_text("local-secret-token\n")
    return tmp_path


def test_status_reaches_a_cluster_elsewhere_without_sending_the_local_token(
    fake_api: tuple[str, Recorder], capsys: pytest.CaptureFixture[str]
) -> None:
    url, recorder = fake_api
    assert cli.main(["status", "--url", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["running"] and report["url"] == url and report["health"] == "ok"
    assert report["agents"] == 1 and "redis" not in report and "token" not in report
    assert recorder.requests and all(auth is None for _m, _p, auth in recorder.requests)
    assert not any("local-secret-token" in str(r) for r in recorder.requests)


def test_run_with_url_and_token_from_the_environment(
    fake_api: tuple[str, Recorder], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, recorder = fake_api
    recorder.token = "remote-T"
    monkeypatch.setenv("COLONY_URL", url + "/")
    monkeypatch.setenv("COLONY_API_TOKEN", "remote-T")
    assert cli.main(["run", "echo", "--input", '{"ok": 1}', "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ok": 1}
    posted = [r for r in recorder.requests if r[0] == "POST"]
    assert posted == [("POST", "/v1/runs", "Bearer remote-T")]


@pytest.mark.parametrize("token", ["-starts-with-a-dash", "--two-dashes", "-x"])
def test_a_token_that_starts_with_a_dash_is_taken_as_the_value(
    fake_api: tuple[str, Recorder], token: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tokens written before generated ones avoided a leading '-' (and operators' own) may start with
    one; argparse alone reads `--token -x` as a missing value. CI once drew such a token."""
    url, recorder = fake_api
    recorder.token = token
    assert (
        cli.main(["run", "echo", "--url", url, "--token", token, "--input", '{"ok": 1}', "--json", "-q"]) == 0
    )
    assert json.loads(capsys.readouterr().out) == {"ok": 1}
    assert [r for r in recorder.requests if r[0] == "POST"] == [("POST", "/v1/runs", f"Bearer {token}")]


def test_text_values_may_start_with_a_dash_but_a_missing_one_is_still_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.attach_dash_values(["blocks", "edit", "a", "b", "--append", "- a list item"]) == [
        "blocks",
        "edit",
        "a",
        "b",
        "--append=- a list item",
    ]
    assert cli.attach_dash_values(["run", "x", "--input", "-5"]) == ["run", "x", "--input=-5"]
    # a value that looks like one of our flags is a forgotten value, not text: argparse reports it
    assert cli.attach_dash_values(["blocks", "edit", "a", "b", "--text", "--file", "f"]) == [
        "blocks",
        "edit",
        "a",
        "b",
        "--text",
        "--file",
        "f",
    ]
    assert cli.attach_dash_values(["run", "x", "--", "--token", "-t"]) == ["run", "x", "--", "--token", "-t"]
    assert cli.attach_dash_values(["run", "x", "--token"]) == ["run", "x", "--token"]
    with pytest.raises(SystemExit):
        cli.main(["blocks", "edit", "a", "b", "--text", "--file", "f"])
    assert "argument --text: expected one argument" in capsys.readouterr().err


def test_a_refused_token_says_where_to_get_the_right_one(
    fake_api: tuple[str, Recorder], capsys: pytest.CaptureFixture[str]
) -> None:
    url, recorder = fake_api
    recorder.token = "remote-T"
    assert cli.main(["run", "echo", "--url", url, "--token", "wrong"]) == 2
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "--token" in err and "COLONY_API_TOKEN" in err and "the token given" in err
    assert cli.main(["run", "echo", "--url", url]) == 2
    assert "no token was given" in capsys.readouterr().err


@pytest.mark.parametrize(
    "url, message",
    [
        ("colony.example:8000", "give the API's address"),
        ("ftp://colony.example", "give the API's address"),
        ("http://user:pw@colony.example:8000", "no user, password"),
        ("http://colony.example:8000/?x=1", "no user, password"),
    ],
)
def test_bad_urls_are_refused_before_anything_is_sent(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "echo", "--url", url]) == 2
    assert message in capsys.readouterr().err


def test_plain_http_to_another_host_warns_that_the_token_travels_unencrypted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a reserved address nothing answers on: the command fails, after the warning
    code = cli.main(["status", "--url", "http://192.0.2.1:9", "--token", "T"])
    err = capsys.readouterr().err
    assert "plain http" in err and code == 2 and "no Colony API answers at http://192.0.2.1:9" in err


def test_an_address_that_is_not_a_colony_api_is_named(
    fake_api: tuple[str, Recorder], capsys: pytest.CaptureFixture[str]
) -> None:
    url, recorder = fake_api
    recorder.healthz = (200, b"<html>hello</html>")
    assert cli.main(["status", "--url", url]) == 2
    assert "does not answer like a Colony API" in capsys.readouterr().err
    recorder.healthz = (503, b'{"status": "degraded", "reason": "Redis unavailable"}')
    assert cli.main(["status", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["health"] == "degraded"


def test_server_text_reaches_the_terminal_without_control_characters(
    fake_api: tuple[str, Recorder], capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by review: `colony status` and every `colony: error:` line printed what a server said
    byte for byte, so it could set the terminal's title, clear lines and forge a report."""
    url, recorder = fake_api
    forged = "\x1b]0;pwned\x07\x1b[2K\r\x1b[32mColony at http://x: 4 replica(s)\x9b8m"
    recorder.healthz = (503, json.dumps({"status": "degraded", "reason": forged}).encode())
    assert cli.main(["status", "--url", url]) == 0
    shown = capsys.readouterr().out
    assert "Redis" not in shown and not any(c in shown for c in "\x1b\x07\r\x9b"), repr(shown)
    recorder.healthz = (200, b'{"status": "ok", "version": "0.1.0"}')
    recorder.token, recorder.refusal = "other", forged  # every call a 401 with a forged message
    cli.main(["run", "echo", "--url", url, "--token", "t"])
    err = capsys.readouterr().err
    assert "colony: error:" in err and "pwned" in err, err
    assert not any(c in err for c in "\x1b\x07\r\x9b"), repr(err)


def test_no_cluster_and_no_url_names_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "echo"]) == 2
    err = capsys.readouterr().err
    assert "colony up" in err and "--url" in err and "COLONY_URL" in err


def test_map_with_url_sends_the_clusters_absolute_path_and_refuses_a_relative_one(
    fake_api: tuple[str, Recorder], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _recorder = fake_api
    assert cli.main(["run", "analyze", "--url", url, "--token", "T", "--map", "src"]) == 2
    assert "absolute path as the cluster's pods see it" in capsys.readouterr().err


def test_the_python_client_sends_the_local_token_only_to_this_machine(
    fake_api: tuple[str, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    from colony.client import ColonyClient

    url, recorder = fake_api
    with ColonyClient(url) as client:  # 127.0.0.1: the token this machine's API reads (its token file)
        client.agents()
    with ColonyClient(url.replace("127.0.0.1", "localhost")) as client:
        client.agents()
    remote = ColonyClient("http://colony.example:8000")  # elsewhere: no token unless given
    assert "authorization" not in remote._api.http.headers
    monkeypatch.setenv("COLONY_API_TOKEN", "env-T")
    assert ColonyClient("https://colony.example")._api.http.headers["authorization"] == "Bearer env-T"
    assert [auth for _m, _p, auth in recorder.requests] == ["Bearer local-secret-token"] * 2


def test_localhost_names_the_local_cluster_recorded_as_127_0_0_1(
    fake_api: tuple[str, Recorder], no_local_cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--url http://localhost:PORT` for the cluster `colony up` recorded as http://127.0.0.1:PORT
    is the local one: its token goes with the request (it would not to any other address)."""
    import os
    import subprocess

    from colony.serve.cluster import DAEMON_ID_VARIABLE

    url, recorder = fake_api
    recorder.token = "local-T"
    # the recorded daemon: a process carrying the record's id, as the daemon's processes do
    daemon = subprocess.Popen(["sleep", "60"], env={**os.environ, DAEMON_ID_VARIABLE: "d-test"})
    state = {
        "pid": daemon.pid,
        "url": url,
        "token": "local-T",
        "redis_url": "",
        "started_at": 0,
        "replicas": 1,
        "daemon_id": "d-test",
    }
    try:
        (no_local_cluster / "cluster.json").write_text(json.dumps(state))
        assert cli.main(["status", "--url", url.replace("127.0.0.1", "localhost"), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["agents"] == 1
        assert ("GET", "/v1/agents", "Bearer local-T") in recorder.requests
        other_port = url.rsplit(":", 1)[0] + ":1"  # loopback, yet not the recorded listener
        assert cli.main(["status", "--url", other_port]) == 2
        assert not any(auth for _m, path, auth in recorder.requests if path == "/healthz")
        # a pid the OS gave another process since (no id of the record): no cluster of ours, no token
        (no_local_cluster / "cluster.json").write_text(json.dumps({**state, "pid": os.getpid()}))
        recorder.requests.clear()
        cli.main(["status", "--url", url.replace("127.0.0.1", "localhost")])
        assert not any(auth == "Bearer local-T" for _m, _path, auth in recorder.requests)
    finally:
        daemon.kill()
        daemon.wait()


def test_a_port_out_of_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--url", "http://colony.example:99999"]) == 2
    assert "not a TCP port" in capsys.readouterr().err


def test_up_warns_when_the_shell_holds_a_remote_clusters_url_and_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from colony.errors import ColonyError
    from colony.serve import cluster

    def refuse(*args: object, **kwargs: object) -> None:
        raise ColonyError("not starting anything in this test")

    monkeypatch.setattr(cluster, "up", refuse)
    monkeypatch.setenv("COLONY_URL", "https://colony.example")
    monkeypatch.setenv("COLONY_API_TOKEN", "remote-T")
    assert cli.main(["up"]) == 2
    err = capsys.readouterr().err
    assert "becomes the local cluster's API token" in err and "remote-T" not in err
    monkeypatch.delenv("COLONY_URL")
    assert cli.main(["up"]) == 2
    assert "becomes the local" not in capsys.readouterr().err
