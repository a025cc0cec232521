"""Issue 13 item 3 (and the CLI half of item 2): `colony run analyze` shows its progress on a
terminal as one line rewritten in place, `--quiet` prints only the report, `--json` only the
output's JSON, and a run that failed or succeeded `partial` exits non-zero naming the files that
were not analysed.

The rendering is tested as a pure class over recorded event lists. The command itself runs in a
subprocess, with its stderr on a pseudo-terminal, against a stub of the HTTP API (the routes
`colony run` calls, with the real SSE framing of `colony.api.app`): the events follow the analyze
job's contract (docs/api.md), and no Ray cluster or model is needed for what is tested here."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from colony.cli import RUN_FAILED, RUN_PARTIAL
from colony.errors import ApiError
from colony.run_display import AnalyzeProgress, RunDisplay, not_analysed_notice, with_ticks

CLEAR = "\r\x1b[K"
TOKEN = "stub-token-0123456789"
WORKERS = ["analyze-run00001-w0", "analyze-run00001-w1", "analyze-run00001-w2"]
PAGES = ["page-a", "page-b", "page-c"]
REPORT = "# Analysis of src\n\n3 files in 3 page(s), summarised by 3 page-bound worker(s).\n"


def _done(
    worker: int, *, ok: bool = True, faulted: int = 1, files: list[str] | None = None
) -> dict[str, Any]:
    data = {"worker": WORKERS[worker], "ok": ok, "pages": 1, "faulted": faulted}
    return {"event_type": "worker_done", "data": {**data, "files": files or [f"m{worker}.py"]}}


def _output(*, partial: bool = False, lost: list[str] | None = None) -> dict[str, Any]:
    not_analysed = (
        [{"worker": WORKERS[2], "pages": ["page-c"], "files": lost, "error": "PageNotResident: page-c"}]
        if lost
        else []
    )
    return {
        "report": REPORT,
        "files": ["m0.py", "m1.py", "m2.py"],
        "pages": 3,
        "workers": WORKERS,
        "partial": partial,
        "not_analysed": not_analysed,
        "sections": [],
        "stats": {},
    }


def _analyze_events(output: dict[str, Any], *, third_ok: bool = True, end: str = "completed") -> list[Any]:
    """A recorded analyze run: (seconds after the previous event, event) pairs."""
    third = _done(2, faulted=1) if third_ok else _done(2, ok=False, faulted=0, files=["m2.py"])
    return [
        (0.0, {"event_type": "started", "data": {}}),
        (0.1, {"event_type": "workers", "data": {"workers": WORKERS, "pages": 3}}),
        (0.1, _done(0, faulted=1)),
        (0.1, {"event_type": "step", "data": {"step": 1, "action": {"success": True}}}),
        (0.1, _done(1, faulted=1)),
        (0.1, third),
        (0.6, {"event_type": end, "data": {"output": output, "error": None}}),
    ]


def _render(display: AnalyzeProgress, events: list[Any]) -> str:
    out, now = "", 0.0
    for delay, event in events:
        now += delay
        out += display.feed(event, now)
    return out + display.end(now)


# --- the rendering, over recorded events (no I/O) ----------------------------------------------


def test_on_a_terminal_the_progress_is_one_line_rewritten_in_place() -> None:
    out = _render(AnalyzeProgress(live=True, started=0.0, active=True), _analyze_events(_output()))
    line, _, rest = out.partition("\n")
    assert rest == "  completed\n"  # the run's end, after the line's last state
    draws = line.split(CLEAR)
    assert draws[0] == ""  # every state of the line starts at its beginning and erases the rest
    assert draws[1:] == [
        "analyzing: 0/3 workers done, 0 pages faulted in, 0s",
        "analyzing: 1/3 workers done, 1 page faulted in, 0s",
        "analyzing: 2/3 workers done, 2 pages faulted in, 0s",
        "analyzing: 3/3 workers done, 3 pages faulted in, 0s",
        "analyzing: 3/3 workers done, 3 pages faulted in, 1s",  # left on screen at the end
    ]
    assert "step" not in out and "started" not in out


def test_the_elapsed_time_is_redrawn_without_events() -> None:
    display = AnalyzeProgress(live=True, started=100.0, active=True)
    assert display.tick(100.2) == CLEAR + "analyzing: starting page workers, 0s"
    assert display.tick(100.9) == ""  # the same second: nothing to redraw
    display.feed({"event_type": "workers", "data": {"workers": WORKERS, "pages": 3}}, 101.0)
    assert display.tick(101.5) == ""
    assert display.tick(102.0) == CLEAR + "analyzing: 0/3 workers done, 0 pages faulted in, 2s"
    assert display.tick(175.0) == CLEAR + "analyzing: 0/3 workers done, 0 pages faulted in, 1m15s"
    plain = AnalyzeProgress(live=False, started=100.0, active=True)
    assert plain.tick(105.0) == ""  # a log gets no redraws


def test_off_a_terminal_each_finished_worker_is_one_plain_line() -> None:
    events = _analyze_events(_output(partial=True, lost=["m2.py"]), third_ok=False)
    out = _render(AnalyzeProgress(live=False, started=0.0, active=True), events)
    assert "\r" not in out and "\x1b" not in out
    assert out.splitlines() == [
        "  3 page workers started for 3 pages",
        f"  worker {WORKERS[0]} done, 1 page(s), 1 faulted in; 1/3 workers done, 1 page faulted in, 0s",
        f"  worker {WORKERS[1]} done, 1 page(s), 1 faulted in; 2/3 workers done, 2 pages faulted in, 0s",
        f"  worker {WORKERS[2]} failed (m2.py); 3/3 workers done (1 failed), 2 pages faulted in, 0s",
        "  completed",
    ]


def test_a_worker_reported_twice_counts_once_and_a_new_dispatch_sets_the_total() -> None:
    display = AnalyzeProgress(live=True, started=0.0, active=True)
    display.feed({"event_type": "workers", "data": {"workers": WORKERS[:2], "pages": 3}}, 0.0)
    display.feed(_done(0, faulted=2), 0.0)
    display.feed(_done(0, faulted=2), 0.0)  # a redone step reports it again
    assert display.line(0.0) == "analyzing: 1/2 workers done, 2 pages faulted in, 0s"
    # a redo dispatches again: results of workers no longer in the job do not count
    display.feed({"event_type": "workers", "data": {"workers": WORKERS[1:], "pages": 3}}, 0.0)
    assert display.line(0.0) == "analyzing: 0/2 workers done, 0 pages faulted in, 0s"
    display.feed(_done(2, faulted=-5), 0.0)  # nonsense from the server counts as nothing
    assert display.line(0.0) == "analyzing: 1/2 workers done, 0 pages faulted in, 0s"
    display.feed(_done(1, ok=False, faulted=1), 0.0)
    assert display.line(0.0) == "analyzing: 2/2 workers done (1 failed), 1 page faulted in, 0s"
    # a retry of the failed worker, listed in its place (docs/analyze.md): the failure no longer counts
    retry = f"{WORKERS[1]}-r"
    again = {"workers": [retry, WORKERS[2]], "pages": 3, "retrying": [retry]}
    display.feed({"event_type": "workers", "data": again}, 0.0)
    assert display.line(0.0) == "analyzing: 1/2 workers done, 0 pages faulted in, 0s"
    display.feed({"event_type": "worker_done", "data": {"worker": retry, "ok": True, "faulted": 1}}, 0.0)
    assert display.line(0.0) == "analyzing: 2/2 workers done, 1 page faulted in, 0s"


def test_other_lines_go_above_the_progress_line() -> None:
    display = AnalyzeProgress(live=True, started=0.0, active=True)
    display.feed({"event_type": "workers", "data": {"workers": WORKERS, "pages": 3}}, 0.0)
    mapped = display.feed({"event_type": "mapped", "data": {"path": "/src", "pages": 3}}, 1.0)
    assert (
        mapped
        == CLEAR + "mapped /src: 3 pages\n" + CLEAR + "analyzing: 0/3 workers done, 0 pages faulted in, 1s"
    )
    restarted = display.feed(
        {"event_type": "restarted", "seq": 4, "data": {"attempt": 2, "reason": "replica died"}}, 2.0
    )
    assert restarted.startswith(CLEAR + "  run restarted (attempt 2): replica died")
    assert restarted.endswith("\n" + CLEAR + "analyzing: 0/3 workers done, 0 pages faulted in, 2s")


def test_runs_without_progress_events_look_as_they_did() -> None:
    """`colony run ask`: tokens, a restart, steps, exactly as RunDisplay renders them."""
    events = [
        {"event_type": "started", "seq": 1, "data": {}},
        {"event_type": "token", "seq": 2, "data": {"text": "Hello"}},
        {"event_type": "restarted", "seq": 3, "data": {"attempt": 2, "supersedes_after": 1}},
        {"event_type": "token", "seq": 4, "data": {"text": "Hello there"}},
        {"event_type": "step", "seq": 5, "data": {"step": 1, "action": {"success": True}}},
        {"event_type": "completed", "seq": 6, "data": {"output": "Hello there"}},
    ]
    display, reference = AnalyzeProgress(live=True, started=0.0), RunDisplay()
    for event in events:
        assert display.tick(5.0) == ""
        assert display.feed(event, 5.0) == reference.feed(event)
    assert display.end(9.0) == reference.end()
    assert display.shown == reference.shown == "Hello there"


def test_progress_after_streamed_text_starts_on_a_line_of_its_own() -> None:
    display = AnalyzeProgress(live=True, started=0.0)
    assert display.feed({"event_type": "token", "data": {"text": "thinking"}}, 0.0) == "thinking"
    out = display.feed({"event_type": "workers", "data": {"workers": WORKERS, "pages": 3}}, 0.0)
    assert out.startswith("\n" + CLEAR)  # `\r` does not wipe the text shown


def test_server_text_cannot_move_the_cursor_and_the_line_fits_the_terminal() -> None:
    display = AnalyzeProgress(live=True, started=0.0, width=30, active=True)
    display.feed({"event_type": "workers", "data": {"workers": ["w\x1b[2J\r"], "pages": 1}}, 0.0)
    out = display.feed(
        {"event_type": "mapped", "data": {"path": "/x\x1b[1A\r\n", "pages": 1}}, 0.0
    ) + display.feed({"event_type": "worker_done", "data": {"worker": "w\x1b[2J\r", "ok": True}}, 0.0)
    assert "\x1b" not in out.replace(CLEAR, "") and "\r" not in out.replace(CLEAR, "")
    assert out.endswith(CLEAR + "analyzing: 1/1 workers done, ")  # 29 columns: no wrap
    assert display.tick(0.9) == ""  # the cut line is on screen already: no redraw each tick
    plain = AnalyzeProgress(live=False, started=0.0, active=True)
    text = plain.feed(_done(1, ok=False, files=["a\x1b[31m.py", *[f"f{i}.py" for i in range(60)]]), 0.0)
    assert "\x1b" not in text and text.count("\n") == 1 and "and 11 more" in text


def test_the_notice_names_the_files_not_analysed() -> None:
    output = _output(partial=True, lost=["vcm/eviction.py", "vcm/pages.py"])
    assert not_analysed_notice(output) == (
        f"  not analysed: vcm/eviction.py, vcm/pages.py (worker {WORKERS[2]}: PageNotResident: page-c)\n"
    )
    assert not_analysed_notice({"not_analysed": "garbage"}) == ""
    assert not_analysed_notice("a plain answer") == ""


def test_ticks_come_between_slow_events_and_stream_errors_reach_the_reader() -> None:
    def slow() -> Iterator[dict[str, Any]]:
        yield {"event_type": "started"}
        time.sleep(0.35)
        yield {"event_type": "completed"}

    seen = list(with_ticks(slow(), 0.1))
    assert seen[0] == {"event_type": "started"} and seen[-1] == {"event_type": "completed"}
    assert seen[1:-1] and all(item is None for item in seen[1:-1])

    def broken() -> Iterator[dict[str, Any]]:
        yield {"event_type": "started"}
        raise ApiError(404, "not_found", "no run")

    ticks = with_ticks(broken(), 1.0)
    assert next(ticks) == {"event_type": "started"}
    with pytest.raises(ApiError, match="no run"):
        next(ticks)


# --- the command, against a stub of the API, with stderr on a pseudo-terminal --------------------


@dataclass
class StubRun:
    """What the stub answers for the run `colony run` submits."""

    events: list[Any]
    status: str = "succeeded"
    output: Any = None
    error: str | None = None
    submitted: list[dict[str, Any]] = field(default_factory=list)


class _Api(BaseHTTPRequestHandler):
    """The routes `colony run` calls, answered as `colony.api.app` answers them."""

    server: _StubServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"null")

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {TOKEN}":
            return True
        self._json(401, {"error": {"code": "unauthorized", "message": "bad token"}})
        return False

    def do_GET(self) -> None:
        run = self.server.run
        if self.path == "/healthz":
            self._json(200, {"status": "ok"})
        elif not self._authorized():
            return
        elif self.path == "/v1/runs/run-00000001/events":
            self._events(self.headers.get("Last-Event-ID"))
        elif self.path == "/v1/runs/run-00000001":
            view = {"run_id": "run-00000001", "agent": "analyze", "status": run.status}
            self._json(
                200, {**view, "output": run.output, "error": run.error, "created_at": 1.0, "updated_at": 2.0}
            )
        else:
            self._json(404, {"error": {"code": "not_found", "message": self.path}})

    def _events(self, after: str | None) -> None:
        """The run's events as server-sent events (GET .../events, or a submit with `stream: true`)."""
        run = self.server.run
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Colony-Run-Id", "run-00000001")
        self.end_headers()
        for seq, (delay, event) in enumerate(run.events, start=1):
            event_id = f"1700000000000-{seq}"
            if after is not None and seq <= int(after.rpartition("-")[2]):
                continue
            time.sleep(delay)
            body = {**event, "seq": seq, "request_id": "run-00000001"}
            frame = f"id: {event_id}\nevent: {event['event_type']}\ndata: {json.dumps(body)}\n\n"
            self.wfile.write(frame.encode())
            self.wfile.flush()

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = self._body()
        if self.path == "/v1/vcm/sources":
            self._json(
                200, {"source_id": "src-1", "path": body["path"], "pages": [{"page_id": p} for p in PAGES]}
            )
        elif self.path == "/v1/runs" and body.get("stream") is True:  # submitted and streamed
            self.server.run.submitted.append(body)
            self._events(None)
        elif self.path == "/v1/runs":
            self.server.run.submitted.append(body)
            self._json(
                200,
                {"run_id": "run-00000001", "status": "queued", "events_url": "/v1/runs/run-00000001/events"},
            )
        else:
            self._json(404, {"error": {"code": "not_found", "message": self.path}})


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True
    run: StubRun


@dataclass
class Stub:
    server: _StubServer
    env: dict[str, str]
    cwd: Path
    source: Path

    def serve(self, run: StubRun) -> StubRun:
        self.server.run = run
        return run


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[Stub]:
    """The stub API in a thread, and a data dir whose cluster.json points `colony run` at it (its
    pid a process carrying the record's daemon id, as `cluster.status` checks)."""
    import subprocess

    from colony.serve.cluster import DAEMON_ID_VARIABLE

    daemon = subprocess.Popen(["sleep", "600"], env={**os.environ, DAEMON_ID_VARIABLE: "d-stub"})
    server = _StubServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    data = tmp_path / "data"
    data.mkdir()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    state = {
        "pid": daemon.pid,
        "url": url,
        "token": TOKEN,
        "redis_url": "",
        "started_at": 0.0,
        "replicas": 1,
        "daemon_id": "d-stub",
    }
    (data / "cluster.json").write_text(json.dumps(state))
    source = tmp_path / "src"
    source.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_")}
    env.update({"COLONY_DATA_DIR": str(data), "COLONY_API_TOKEN": "not-the-one-used"})
    try:
        yield Stub(server, env, tmp_path, source)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        daemon.kill()
        daemon.wait()


def _colony_on_pty(stub: Stub, *args: str, timeout: float = 60) -> tuple[int, str, str]:
    """`colony ARGS` with stderr on a pseudo-terminal and stdout a pipe: (exit code, what the
    terminal received with its newlines as written, stdout)."""
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the command (the last holder of the terminal) exited
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "colony.cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            env=stub.env,
            cwd=stub.cwd,
        )
        os.close(slave)
        stdout, _ = proc.communicate(timeout=timeout)
        reader.join(timeout=10)
    finally:
        os.close(master)
    terminal = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")  # the tty's ONLCR
    return proc.returncode, terminal, stdout.decode()


def test_the_progress_line_appears_on_a_terminal(stub: Stub) -> None:
    events = _analyze_events(_output())
    events[3] = (2.6, events[3][1])  # a quiet spell after the first worker: only the clock moves
    run = stub.serve(StubRun(events, output=_output()))
    code, terminal, stdout = _colony_on_pty(stub, "run", "analyze", "--map", str(stub.source))
    assert code == 0, terminal
    assert stdout == REPORT + "\n"  # the report, on stdout only
    assert run.submitted[0]["input"]["pages"] == PAGES  # the mapped pages went to the run
    lines = terminal.split("\n")
    assert lines[0] == f"mapped {stub.source.resolve()}: 3 pages"
    assert lines[1] == "run run-00000001 on analyze"
    progress = lines[2].split(CLEAR)  # ONE line, redrawn in place
    assert progress[0] == "" and len(progress) > 4
    assert re.fullmatch(r"analyzing: 3/3 workers done, 3 pages faulted in, \d+s", progress[-1])
    # redrawn while no event came: the one-worker state shows at least two elapsed times
    waiting = {d for d in progress if d.startswith("analyzing: 1/3 workers done, 1 page faulted in")}
    assert len(waiting) >= 2, progress
    assert lines[3:] == ["  completed", ""]  # nothing else: no step lines, no `\r` left over


def test_quiet_prints_only_the_report(stub: Stub) -> None:
    stub.serve(StubRun(_analyze_events(_output()), output=_output()))
    code, terminal, stdout = _colony_on_pty(stub, "run", "analyze", "--map", str(stub.source), "--quiet")
    assert code == 0
    assert terminal == ""  # no mapping line, no progress, no event lines
    assert stdout == REPORT + "\n"


def test_json_prints_the_structured_output_and_nothing_else_on_stdout(stub: Stub) -> None:
    stub.serve(StubRun(_analyze_events(_output()), output=_output()))
    code, terminal, stdout = _colony_on_pty(stub, "run", "analyze", "--map", str(stub.source), "--json")
    assert code == 0
    assert json.loads(stdout) == _output()
    assert "analyzing: 3/3 workers done" in terminal  # the progress stays on the terminal


def test_a_partial_run_exits_3_and_names_the_files_not_analysed(stub: Stub) -> None:
    output = _output(partial=True, lost=["m2.py"])
    stub.serve(StubRun(_analyze_events(output, third_ok=False), output=output))
    result = subprocess.run(  # stderr a pipe, as in a log: plain lines, no control characters
        [sys.executable, "-m", "colony.cli", "run", "analyze", "--map", str(stub.source)],
        capture_output=True,
        text=True,
        env=stub.env,
        cwd=stub.cwd,
        timeout=60,
    )
    assert result.returncode == RUN_PARTIAL == 3
    assert result.stdout == REPORT + "\n"
    assert "\r" not in result.stderr and "\x1b" not in result.stderr
    assert f"  worker {WORKERS[2]} failed (m2.py); 3/3 workers done (1 failed)" in result.stderr
    assert result.stderr.endswith(
        "run run-00000001 succeeded, but partial: not every file was analysed (exit code 3)\n"
        f"  not analysed: m2.py (worker {WORKERS[2]}: PageNotResident: page-c)\n"
    )
    quiet = subprocess.run(
        [
            sys.executable,
            "-m",
            "colony.cli",
            "run",
            "analyze",
            "--map",
            str(stub.source),
            "--quiet",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=stub.env,
        cwd=stub.cwd,
        timeout=60,
    )
    assert quiet.returncode == 3 and json.loads(quiet.stdout) == output
    assert quiet.stderr.splitlines()[0].startswith("run run-00000001 succeeded, but partial")  # still said


def test_a_failed_run_exits_1_and_says_why_and_which_files(stub: Stub) -> None:
    output = _output(lost=["m2.py"])
    error = "1 of 3 page workers failed after retries"
    stub.serve(StubRun(_analyze_events(output, third_ok=False, end="failed"), "failed", output, error))
    code, terminal, stdout = _colony_on_pty(stub, "run", "analyze", "--map", str(stub.source))
    assert code == RUN_FAILED == 1
    assert stdout == REPORT + "\n"  # what was analysed is still printed
    assert terminal.endswith(
        f"  failed\nrun run-00000001 failed: {error}\n"
        f"  not analysed: m2.py (worker {WORKERS[2]}: PageNotResident: page-c)\n"
    )


def test_a_restart_forgets_the_results_of_the_dispatch_it_takes_back() -> None:
    display = AnalyzeProgress(live=True, started=0.0, active=True)
    first = {"workers": WORKERS[:2], "pages": 2}
    display.feed({"event_type": "workers", "seq": 3, "data": first}, 0.0)
    display.feed(_done(0, faulted=1), 0.0)
    display.feed(_done(1, ok=False, faulted=0), 0.0)
    assert display.line(0.0) == "analyzing: 2/2 workers done (1 failed), 1 page faulted in, 0s"
    # the coordinator's replica died mid-step: the step is redone and dispatches again
    restarted = {"attempt": 2, "supersedes_after": 1, "step": 1, "reason": "replica stopped"}
    out = display.feed({"event_type": "restarted", "seq": 4, "data": restarted}, 0.0)
    assert "run restarted (attempt 2)" in out
    assert display.line(0.0) == "analyzing: starting page workers, 0s"  # no stale "2/2 (1 failed)"
    display.feed(_done(1, ok=False, faulted=0), 0.0)  # late news from the abandoned dispatch
    again = [f"{w}-redo" for w in WORKERS[:2]]
    display.feed({"event_type": "workers", "seq": 5, "data": {"workers": again, "pages": 2}}, 0.0)
    assert display.line(0.0) == "analyzing: 0/2 workers done, 0 pages faulted in, 0s"
    display.feed({"event_type": "worker_done", "data": {"worker": again[0], "ok": True, "faulted": 1}}, 0.0)
    assert display.line(0.0) == "analyzing: 1/2 workers done, 1 page faulted in, 0s"
    # a restart that leaves the dispatch standing (a later step redone) keeps its results
    later = {"attempt": 3, "supersedes_after": 6, "step": 2}
    display.feed({"event_type": "restarted", "seq": 7, "data": later}, 0.0)
    assert display.line(0.0) == "analyzing: 1/2 workers done, 1 page faulted in, 0s"
