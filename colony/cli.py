"""The `colony` command: version, the embedded Redis, and blackboard inspection."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from colony import __version__, security
from colony.cli_access import add_access_commands
from colony.cli_agent import add_agent_commands
from colony.cli_args import attach_dash_values
from colony.cli_bb import add_bb_command
from colony.cli_blocks import add_block_commands
from colony.cli_chat import add_chat_command
from colony.cli_mcp import add_mcp_command
from colony.cli_memory import add_memory_commands
from colony.cli_runs import add_runs_commands
from colony.cli_target import TOKEN_ENV, URL_ENV, ApiTarget, api_error, api_target, remote_health, server_text
from colony.config import ColonySettings, load_settings
from colony.errors import ColonyError
from colony.run_display import (
    PROGRESS_TICK_SECONDS,
    AnalyzeProgress,
    answer_already_shown,
    cited_answer_text,
    not_analysed_notice,
    terminal_text,
    with_ticks,
)


def _settings(args: argparse.Namespace) -> ColonySettings:
    """The command's settings; this process is their entry point, so they also key its signatures."""
    settings = load_settings(args.config)
    security.use_settings(settings)
    return settings


def cmd_version(args: argparse.Namespace) -> int:
    print(f"colony {__version__}")
    return 0


def cmd_redis(args: argparse.Namespace) -> int:
    from colony.blackboard.redis_server import EmbeddedRedis, mask_url

    settings = _settings(args)
    if settings.redis_url and args.action != "status":
        print(
            f"COLONY_REDIS_URL is set ({mask_url(settings.redis_url)}); the embedded server is not used.",
            file=sys.stderr,
        )
    server = EmbeddedRedis(settings.data_dir, settings.embedded_redis)
    if args.action == "start":
        info = server.start()
        print(
            f"redis-server running: pid {info.pid}, {info.masked_url} (data in {info.data_dir}, "
            f"password in {info.password_file})"
        )
    elif args.action == "stop":
        print("redis-server stopped" if server.stop() else "no embedded redis-server was running")
    else:
        status = server.status()
        if status is None:
            print(f"no embedded redis-server running under {settings.data_dir}")
            return 1
        print(
            f"redis-server running: pid {status.pid}, {status.masked_url} (binary {status.binary}, "
            f"password in {status.password_file}); {_restarts_text(_redis_report(settings))}"
        )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from colony.blackboard.demo import run_demo
    from colony.blackboard.redis_server import EmbeddedRedis

    settings = _settings(args)
    if not settings.redis_url:
        info = EmbeddedRedis(settings.data_dir, settings.embedded_redis).start()
        print(f"using embedded redis-server at {info.masked_url}")
    asyncio.run(run_demo(settings))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from colony.serve import cluster

    settings = _settings(args)
    if os.environ.get(URL_ENV) and os.environ.get(TOKEN_ENV):
        print(
            f"colony: warning: ${URL_ENV} points this shell at a cluster elsewhere, and ${TOKEN_ENV} "
            "(its token?) becomes the local cluster's API token too (`colony status` prints it); unset "
            f"{TOKEN_ENV} before `colony up` to have a local token generated",
            file=sys.stderr,
        )
    print(
        "starting Colony (local Ray, Redis, Chroma, Serve app on the embedded engine)...",
        file=sys.stderr,
        flush=True,
    )
    info = cluster.up(settings, args.config)
    print(f"Colony is up at {info.url}")
    print(f"token: {info.token}")
    print(f"console: {info.url}/ui/ (log in with the token)")
    print('try: colony run ask --input \'{"question": "What is a blackboard system?"}\'')
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from colony.serve import cluster

    stopped = cluster.down(_settings(args))
    print(
        "Colony stopped"
        if stopped
        else "no Colony cluster was running (embedded Redis and Chroma stopped if they ran)"
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import httpx

    from colony.client import ColonyClient
    from colony.serve import cluster

    settings = _settings(args)
    target = ApiTarget.of(args, settings)
    info = target.local if target is not None else None
    if target is None:
        report: dict[str, Any] = {"running": False}
    else:
        agents: list[dict[str, Any]] = []
        replicas: list[Any] = []
        problem = None
        with ColonyClient(target.url, target.token) as client:
            health = remote_health(client, target) if target.remote else None
            try:  # the API answers /healthz, yet a call may fail while Redis is away: say so, still report
                agents = client.agents()
                replicas = client.replicas()
            except ColonyError as exc:
                problem = str(api_error(target, exc)) or type(exc).__name__
            except httpx.HTTPError as exc:
                problem = str(exc) or type(exc).__name__
        by_state: dict[str, int] = {}
        for agent in agents:  # (what a server answers is shown through server_text)
            state = server_text(agent.get("state") if isinstance(agent, dict) else None, 40) or "?"
            by_state[state] = by_state.get(state, 0) + 1
        report = {
            "running": True,
            "url": target.url,
            "pid": info.pid if info is not None else None,
            "replicas": len(replicas),
            "agents": len(agents),
            "agents_by_state": by_state,
        }
        if problem:
            report["problem"] = problem
        if info is not None:
            report["token"] = info.token  # the local cluster's own token (a remote one is not echoed)
            state = cluster.health(info) or {"status": "unknown"}
        else:
            state = health or {"status": "unknown"}
        report["health"] = state.get("status")
        if state.get("reason"):
            report["health_reason"] = state["reason"]
    if target is None or not target.remote:
        report["redis"] = _redis_report(settings)  # the local Redis says nothing of a remote cluster
        report["chroma"] = _chroma_report(settings)
    if args.json:
        print(json.dumps(report, indent=2))
    elif not report["running"]:
        print("Colony is not running (start it with `colony up`)")
    else:
        states = ", ".join(f"{k} {v}" for k, v in sorted(report["agents_by_state"].items()))
        where = f"Colony at {server_text(report['url'])}"
        if report.get("health") not in (None, "ok"):
            reason = server_text(report.get("health_reason")) or "no reason given"
            where += f" ({server_text(report['health'], 40)}: {reason})"
        if "problem" in report:
            failed = server_text(report["problem"], 600)
            print(f"{where}: answers, but listing agents and replicas failed: {failed}")
        else:
            print(f"{where}: {report['replicas']} replica(s), {report['agents']} agent(s) ({states})")
    if not args.json and "redis" in report and (report["running"] or report["redis"].get("restarts")):
        print(_redis_line(report["redis"]))
    if not args.json and report["running"] and "chroma" in report:
        print(_chroma_line(report["chroma"]))
    return 0 if report["running"] else 1


def _chroma_report(settings: ColonySettings) -> dict[str, Any]:
    """The Chroma server memory uses: external (`memory.chroma_url`), the embedded one `up` started,
    or none (`memory.chroma.enabled` false: an in-process index per replica)."""
    from colony.memory.chroma_server import EmbeddedChroma

    if settings.memory.chroma_url:
        return {"kind": "external", "url": settings.memory.chroma_url}
    running = EmbeddedChroma(settings.data_dir, settings.memory.chroma).status()
    if running is None and not settings.memory.chroma.enabled:
        return {"kind": "disabled", "running": False}
    return {
        "kind": "embedded",
        "running": running is not None,
        "pid": running.pid if running else None,
        "url": running.url if running else None,
        "path": running.path if running else None,
    }


def _chroma_line(chroma: dict[str, Any]) -> str:
    if chroma["kind"] == "external":
        return f"Chroma: external, {chroma['url']}"
    if chroma["kind"] == "disabled":
        return "Chroma: none (memory.chroma.enabled is false; in-process index)"
    state = f"pid {chroma['pid']}, {chroma['url']}" if chroma["running"] else "not running"
    return f"Chroma: embedded, {state}"


def _redis_report(settings: ColonySettings) -> dict[str, Any]:
    """The Redis the cluster uses: external, or the embedded one with the supervisor's restarts
    (read from a file of their own, so this answers while Redis is down)."""
    from colony.blackboard.redis_server import EmbeddedRedis, RedisRestarts, mask_url

    if settings.redis_url:
        return {"kind": "external", "url": mask_url(settings.redis_url)}
    server = EmbeddedRedis(settings.data_dir, settings.embedded_redis)
    try:
        running = server.status()
    except ColonyError as exc:
        running, problem = None, str(exc)
    else:
        problem = None
    restarts = RedisRestarts.read(server)
    report: dict[str, Any] = {
        "kind": "embedded",
        "running": running is not None,
        "pid": running.pid if running else None,
        "url": running.masked_url if running else None,
        "appendfsync": settings.embedded_redis.appendfsync,
        "restarts": restarts.restarts,
        "last_restart_at": restarts.last_restart_at,
        "last_restart_error": restarts.last_error,
    }
    if problem:
        report["problem"] = problem
    return report


def _redis_line(redis: dict[str, Any]) -> str:
    if redis.get("kind") == "external":
        return f"Redis: external, {redis['url']}"
    state = f"pid {redis['pid']}, {redis['url']}" if redis.get("running") else "not running"
    return f"Redis: embedded, {state}; {_restarts_text(redis)}"


def _restarts_text(redis: dict[str, Any]) -> str:
    """`restarted N time(s) by the supervisor[, last at ...][; last failed restart: ...]`."""
    text = f"restarted {redis.get('restarts', 0)} time(s) by the supervisor"
    if redis.get("last_restart_at"):
        text += f", last at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(redis['last_restart_at']))}"
    if redis.get("last_restart_error"):
        text += f"; last failed restart: {redis['last_restart_error'].splitlines()[0]}"
    return text


def cmd_doctor(args: argparse.Namespace) -> int:
    from colony.system.doctor_command import doctor_command

    return doctor_command(
        _settings(args),
        as_json=args.json,
        grace_seconds=args.grace,
        run_ids=args.run,
        prune_orphans=args.prune_orphans,
    )


RUN_FAILED = 1  # the run failed or was cancelled (2: the command itself could not run it)
RUN_PARTIAL = 3  # the run succeeded, yet its output says `partial`: some files were not analysed


def cmd_run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    try:
        input_data = json.loads(args.input) if args.input is not None else None
    except json.JSONDecodeError as exc:
        raise ColonyError(f"--input is not valid JSON: {exc}") from None
    target = api_target(args, settings)
    try:
        return _run(args, target, input_data)
    except ColonyError as exc:
        raise api_error(target, exc) from None


def _run(args: argparse.Namespace, target: ApiTarget, input_data: Any) -> int:
    from colony.client import ColonyClient

    note = _silent if args.quiet else _to_stderr
    with ColonyClient(target.url, target.token) as client:
        if args.map is not None:
            input_data = _mapped_input(client, args, input_data, note, remote=target.remote)
        if args.show_prompt:
            input_data = with_prompt_events(input_data)
        # submitted and streamed in one request; its id is known from the answer's head on
        events = client.stream(args.agent, input_data, timeout_s=args.timeout)
        named = False
        live = not args.quiet and _stderr_terminal()
        display = AnalyzeProgress(
            live=live, started=time.monotonic(), width=_stderr_width(), active=args.agent == "analyze"
        )
        try:
            for event in with_ticks(iter(events), PROGRESS_TICK_SECONDS) if live else events:
                if not named and events.run_id is not None:
                    named = True
                    note(f"run {events.run_id} on {args.agent}\n")
                now = time.monotonic()
                note(display.tick(now) if event is None else display.feed(event, now))
        except ColonyError:
            if not named and events.run_id is not None:  # the error's run, before the error says why
                print(f"run {events.run_id} on {args.agent}", file=sys.stderr)
            raise
        note(display.end(time.monotonic()))
        run_id = events.run_id
        assert run_id is not None  # (the stream ended with the run's terminal event)
        view = client.get(run_id)
    output = view.get("output")
    failed = view["status"] != "succeeded"
    partial = not failed and isinstance(output, dict) and output.get("partial") is True
    _print_output(args, output, failed=failed, streamed=display.shown)
    # after the report: the last thing on the terminal says what is missing from it
    if failed:
        print(f"run {run_id} {view['status']}: {terminal_text(str(view.get('error')))}", file=sys.stderr)
    elif partial:
        print(
            f"run {run_id} succeeded, but partial: not every file was analysed (exit code {RUN_PARTIAL})",
            file=sys.stderr,
        )
    notice = not_analysed_notice(output) if failed or partial else ""
    if partial and not notice:
        notice = "  the output names no files (it has no `not_analysed` entries)\n"
    print(notice, end="", file=sys.stderr, flush=True)
    return RUN_FAILED if failed else RUN_PARTIAL if partial else 0


def with_prompt_events(input_data: Any) -> Any:
    """The run's input asking its planner for a `prompt` event per step (`--show-prompt`): an
    object gets `"emit_prompt": true`; any other input becomes the task of one (`{"task": input}`),
    the field planning agents read their task from."""
    if isinstance(input_data, dict):
        return {**input_data, "emit_prompt": True}
    task = input_data if isinstance(input_data, str) else json.dumps(input_data)
    return {"task": task, "emit_prompt": True}


def _print_output(args: argparse.Namespace, output: Any, *, failed: bool, streamed: str) -> None:
    """The run's output on stdout: its JSON (`--json`), a report's text, else as it is, and nothing
    when the run failed without one, or when the token stream already showed it on this terminal."""
    if args.json:
        if output is not None or not failed:
            print(json.dumps(output, indent=2))
    elif output is None and failed:
        pass  # nothing to print: the error goes to stderr
    elif not failed and answer_already_shown(output, streamed, same_terminal=_same_terminal()):
        pass  # the streamed tokens were the answer, on the terminal stdout goes to
    elif isinstance(output, dict) and isinstance(output.get("report"), str):
        print(terminal_text(output["report"]))  # a report (analyze): the text, not its JSON
    elif isinstance(output, dict) and isinstance(output.get("answer"), str) and "citations" in output:
        print(cited_answer_text(output))  # a research answer: the text and its citations
    else:
        print(terminal_text(output) if isinstance(output, str) else json.dumps(output, indent=2))
    sys.stdout.flush()


def _silent(text: str) -> None:
    """`--quiet`: progress and event lines are dropped (errors still reach stderr)."""


def _to_stderr(text: str) -> None:
    if text:
        print(text, end="", file=sys.stderr, flush=True)


def _stderr_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (OSError, ValueError):
        return False


def _stderr_width() -> int:
    """Columns of the terminal stderr is on (0: unknown, nothing is cut)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        return 0


def _same_terminal() -> bool:
    """Whether stdout and stderr are one terminal (what a user at a shell prompt has)."""
    try:
        return (
            sys.stdout.isatty()
            and sys.stderr.isatty()
            and (os.ttyname(sys.stdout.fileno()) == os.ttyname(sys.stderr.fileno()))
        )
    except (OSError, ValueError):
        return False


def _mapped_input(
    client: Any, args: argparse.Namespace, input_data: Any, note: Callable[[str], None], *, remote: bool
) -> dict[str, Any]:
    """`--map PATH`: cut the folder into pages first; the run gets their ids (and the path). The
    replicas read the folder: on a cluster started elsewhere PATH is a folder on its side (a volume
    of its pods), so it is sent as given (absolute), not looked up here."""
    if remote:
        if not args.map.startswith("/"):
            raise ColonyError(
                f"--map {args.map}: with --url give the folder's absolute path as the cluster's pods see it"
            )
        path = args.map
    else:
        path = str(Path(args.map).expanduser().resolve())
        if not Path(path).is_dir():
            raise ColonyError(f"--map {args.map}: not a folder")
    source = client.map_source(path, args.page_tokens)
    pages = [page["page_id"] for page in source["pages"]]
    note(f"mapped {path}: {len(pages)} pages\n")
    base = input_data if isinstance(input_data, dict) else {}
    return {**base, "path": path, "pages": pages}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="colony", description="Colony multi-agent cluster.")
    parser.add_argument(
        "--config", help="YAML config file (default: $COLONY_CONFIG, else configs/local.yaml)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_local_commands(sub)
    remote = _remote_parent()
    _add_cluster_commands(sub, remote)
    _add_run_command(sub, remote)
    add_memory_commands(sub, [remote])
    add_block_commands(sub, [remote])
    add_agent_commands(sub, [remote])
    add_chat_command(sub, [remote])
    add_runs_commands(sub, [remote])
    add_access_commands(sub, [remote])
    add_mcp_command(sub, [remote])
    return parser


def _add_local_commands(sub: Any) -> None:
    """`version`, `redis`, `bb` and `demo`: this machine's version, embedded Redis and blackboard."""
    sub.add_parser("version", help="print the version").set_defaults(func=cmd_version)

    redis_p = sub.add_parser("redis", help="manage the embedded redis-server")
    redis_p.add_argument("action", choices=["start", "stop", "status"])
    redis_p.set_defaults(func=cmd_redis)

    add_bb_command(sub)

    demo = sub.add_parser("demo", help="start the embedded Redis if needed and walk through the blackboard")
    demo.set_defaults(func=cmd_demo)


def _remote_parent() -> argparse.ArgumentParser:
    """The `--url`/`--token` options of the commands that call the API (a parent parser)."""
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument(
        "--url",
        help=f"the API of a cluster started elsewhere (default: ${URL_ENV}, else the local cluster)",
    )
    remote.add_argument(
        "--token",
        help=f"that API's token (with --url: default ${TOKEN_ENV}, which keeps it off the process list; "
        "without: the local cluster's own)",
    )
    return remote


def _add_cluster_commands(sub: Any, remote: argparse.ArgumentParser) -> None:
    """`up`, `down`, `status` and `doctor`: the cluster's life and health."""
    sub.add_parser(
        "up", help="start the local cluster (Ray, Redis, Serve app); reuse a running one"
    ).set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop everything `colony up` started").set_defaults(func=cmd_down)
    status = sub.add_parser(
        "status", parents=[remote], help="where the cluster answers, its replicas and agents"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)
    doctor = sub.add_parser(
        "doctor", help="check the colony's invariants (exit 0 clean, 1 violations, 2 no Redis)"
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument(
        "--grace", type=float, default=10.0, help="seconds a state must last to be reported (default 10)"
    )
    doctor.add_argument("--run", action="append", default=[], help="also check this run id (repeatable)")
    doctor.add_argument(
        "--prune-orphans",
        action="store_true",
        help="remove the orphaned agent keys found (keys of agent ids no record names), then check again",
    )
    doctor.set_defaults(func=cmd_doctor)


def _add_run_command(sub: Any, remote: argparse.ArgumentParser) -> None:
    run = sub.add_parser(
        "run",
        parents=[remote],
        help="submit a run over HTTP, stream its events, print its output "
        "(exit 0 succeeded, 1 failed or cancelled, 3 succeeded but partial)",
    )
    run.add_argument("agent", help="agent name, e.g. echo or ask")
    run.add_argument("--input", help="JSON input of the run")
    run.add_argument("--timeout", type=float, default=None, help="seconds before the run fails")
    run.add_argument(
        "--map",
        metavar="PATH",
        help="map this folder as pages first; the run gets their ids (with --url: a folder the cluster sees)",
    )
    run.add_argument(
        "--page-tokens", type=int, default=1024, help="page size for --map (tokens, estimated; default 1024)"
    )
    run.add_argument(
        "-q", "--quiet", action="store_true", help="no progress or event lines: only the output (the report)"
    )
    run.add_argument(
        "--json", action="store_true", help="print the run's output as JSON on stdout (nothing else there)"
    )
    run.add_argument(
        "--show-prompt",
        action="store_true",
        help="print each step's whole planning prompt to stderr (planning agents: ask, session, yours)",
    )
    run.set_defaults(func=cmd_run)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(attach_dash_values(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except ColonyError as exc:  # (an error may quote the server: shown without control characters)
        print(f"colony: error: {terminal_text(str(exc))}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:  # the API went away for longer than the client waits for it
        print(
            f"colony: error: lost the connection to the API ({type(exc).__name__}: "
            f"{terminal_text(str(exc))}); the run may still finish: `colony status`, "
            "then GET /v1/runs/{id}",
            file=sys.stderr,
        )
        return 2
    except OSError as exc:  # e.g. a data folder that is a file or cannot be written (was a traceback)
        print(f"colony: error: {terminal_text(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
