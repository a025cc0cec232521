"""`colony agent checkpoints|undo|restore|export|import` (docs/checkpoints.md, docs/transfer.md).

Every subcommand is a call to the HTTP API (colony.client), like `colony blocks`, so `--url`/`--token`
(or $COLONY_URL / $COLONY_API_TOKEN) reach a cluster started elsewhere. Output is for people unless
`--json`; `export` always prints the JSON document (to stdout, or `--output FILE`) so that
`colony agent export ID > agent.json` and `colony agent import agent.json` move an agent. Text from
the server is printed without control characters. An error the API answers (404, 409, 422) prints
its message and exits 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from colony.cli_target import call_api as _call
from colony.cli_target import server_text as _text
from colony.errors import ColonyError

MAX_IMPORT_FILE_BYTES = 1024**3  # the API refuses more than `context.max_export_bytes` anyway


def _when(at: Any) -> str:
    if not isinstance(at, int | float):
        return "?"
    return datetime.datetime.fromtimestamp(at, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def render_checkpoints(agent: str, checkpoints: Sequence[dict[str, Any]]) -> str:
    """One row per kept checkpoint, oldest first: step, run, the HTTP run it serves, time (UTC), run
    status, size, calls, effects."""
    if not checkpoints:
        return f"agent {_text(agent, 128)} keeps no checkpoints (one is taken after each step of a run)"
    rows = [("STEP", "RUN", "HTTP RUN", "AT (UTC)", "RUN STATUS", "BYTES", "CALLS", "EFFECTS")]
    for c in checkpoints:
        calls = c.get("calls")
        rows.append(
            (
                str(c.get("step")),
                _text(c.get("run_id"), 40),
                _text(c.get("request_id"), 40) or "-",
                _when(c.get("at")),
                _text(c.get("run_status"), 16),
                str(c.get("size")),
                "?" if calls is None else str(calls),
                _text(", ".join(str(e) for e in c.get("effects") or []), 60) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def render_report(agent: str, report: dict[str, Any]) -> str:
    """What an undo or restore did and what it could not undo."""
    lines = [
        f"agent {_text(agent, 128)} is back at step {report.get('step')} of run "
        f"{_text(report.get('run_id'), 64)} (mode {_text(report.get('mode'), 16)}; "
        f"now {_text(report.get('state'), 16)})"
    ]
    discarded = report.get("discarded") or []
    lines.append(f"discarded checkpoints: {', '.join(str(s) for s in discarded) or 'none'}")
    lines.append(f"kept checkpoints: {', '.join(str(s) for s in report.get('kept') or []) or 'none'}")
    not_undone = report.get("not_undone") or []
    if not_undone:
        lines.append("not undone (their effects stay):")
        for call in not_undone:
            effects = ", ".join(_text(e, 32) for e in call.get("effects") or [])
            action, key = _text(call.get("action"), 64), _text(call.get("key"), 96)
            lines.append(f"  step {call.get('step')}: {action} ({effects}) key {key}")
    reruns = report.get("reruns") or []
    when = _text(report.get("rerun_when"), 16)
    if reruns:
        lines.append(f"runs again ({when}): step(s) {', '.join(_text(s, 12) for s in reruns)}")
    if report.get("request_id"):
        lines.append(f"HTTP run: {_text(report.get('request_id'), 64)} (GET /v1/runs/{{id}})")
    for note in report.get("notes") or []:
        lines.append(f"note: {_text(note, 400)}")
    return "\n".join(lines)


def cmd_checkpoints(args: argparse.Namespace) -> int:
    def work(client: Any) -> str:
        listed = client.context.checkpoints(args.agent)
        return json.dumps(listed, indent=2) if args.json else render_checkpoints(args.agent, listed)

    return _call(args, work)


def cmd_undo(args: argparse.Namespace) -> int:
    def work(client: Any) -> str:
        report = client.context.undo(args.agent)
        return json.dumps(report, indent=2) if args.json else render_report(args.agent, report)

    return _call(args, work)


def cmd_restore(args: argparse.Namespace) -> int:
    def work(client: Any) -> str:
        mode = "replay" if args.replay else "reexecute"
        report = client.context.restore(args.agent, args.step, mode=mode, run_id=args.run)
        return json.dumps(report, indent=2) if args.json else render_report(args.agent, report)

    return _call(args, work)


def cmd_export(args: argparse.Namespace) -> int:
    def work(client: Any) -> str | None:
        document = client.transfer.export_agent(args.agent)
        text = json.dumps(document, separators=(",", ":")) + "\n"
        if args.output is None:
            return text
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote the export of agent {_text(args.agent, 128)} to {args.output}", file=sys.stderr)
        return None

    return _call(args, work)


def _read_document(source: str) -> dict[str, Any]:
    """The export document from a file ('-': standard input): one JSON object, bounded."""
    if source == "-":
        text = sys.stdin.read(MAX_IMPORT_FILE_BYTES + 1)
    else:
        path = Path(source)
        if not path.is_file():
            raise ColonyError(f"no file {source!r}; give the file `colony agent export ID > FILE` wrote")
        if path.stat().st_size > MAX_IMPORT_FILE_BYTES:
            raise ColonyError(f"{source} is larger than {MAX_IMPORT_FILE_BYTES} bytes; not an agent export")
        text = path.read_text(encoding="utf-8")
    if len(text) > MAX_IMPORT_FILE_BYTES:
        raise ColonyError(f"the document is larger than {MAX_IMPORT_FILE_BYTES} bytes; not an agent export")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ColonyError(
            f"{source} is not JSON ({exc}); give the file `colony agent export` wrote"
        ) from None
    if not isinstance(document, dict):
        raise ColonyError(f"{source} holds no JSON object; give the file `colony agent export` wrote")
    return document


def cmd_import(args: argparse.Namespace) -> int:
    document = _read_document(args.file)

    def work(client: Any) -> str:
        options: dict[str, Any] = {}
        if args.catalog is not None:
            options["catalog"] = args.catalog
        if args.replace:
            options["replace"] = True
        result = client.transfer.import_agent(document, **options)
        if args.json:
            return json.dumps(result, indent=2)
        agent = _text(result.get("agent_id"), 128)
        state = _text(result.get("state"), 32)
        return f"imported agent {agent} ({state}; the colony resumes it where it was)"

    return _call(args, work)


def add_agent_commands(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    """Add `agent checkpoints|undo|restore|export|import` to the `colony` command's subparsers.
    `parents`: the parsers holding `--url`/`--token` (cli.py's `remote`)."""
    from colony.cli_memory import remote_options as _remote_options

    agent = subparsers.add_parser("agent", help="an agent's checkpoints, undo, restore, export, import")
    actions = agent.add_subparsers(dest="agent_action", required=True)

    def leaf(name: str, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(
            name, help=help_text, description=help_text, parents=list(parents or [])
        )
        if parents is None:
            _remote_options(parser)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        return parser

    checkpoints = leaf("checkpoints", "the agent's kept checkpoints (one per step), oldest first")
    checkpoints.add_argument("agent", help="agent id")
    checkpoints.set_defaults(func=cmd_checkpoints)

    undo = leaf("undo", "back to the checkpoint before the newest; lists the effects not undone")
    undo.add_argument("agent", help="agent id")
    undo.set_defaults(func=cmd_undo)

    restore = leaf("restore", "back to checkpoint N (a step); lists the effects not undone")
    restore.add_argument("agent", help="agent id")
    restore.add_argument("step", type=int, metavar="N", help="the step of a kept checkpoint")
    restore.add_argument(
        "--replay",
        action="store_true",
        help="the later steps reuse their recorded results (no model calls); default: run them again",
    )
    restore.add_argument("--run", help="the run whose checkpoint N (default: the newest of that step)")
    restore.set_defaults(func=cmd_restore)

    export = leaf("export", "print the agent's export document (JSON) to stdout")
    export.add_argument("agent", help="agent id")
    export.add_argument("--output", "-o", help="write it to this file instead")
    export.set_defaults(func=cmd_export)

    imported = leaf("import", "import an agent from an export document (FILE, or '-' for stdin)")
    imported.add_argument("file", metavar="FILE", help="the document `colony agent export` wrote")
    imported.add_argument("--catalog", help="the catalog agent that builds its blueprint here")
    imported.add_argument("--replace", action="store_true", help="overwrite a suspended agent of that id")
    imported.set_defaults(func=cmd_import)
    return agent
