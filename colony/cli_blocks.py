"""`colony blocks ls|show|edit|history|rollback|undo|share|unshare|create`: memory blocks from the
command line.

Every subcommand is a call to the HTTP API (colony.client), like `colony memory`, so `--url`/`--token`
(or $COLONY_URL / $COLONY_API_TOKEN) reach a cluster started elsewhere. Under an AGENT the command
acts as that agent, with exactly its access (the API's rule); `--colony` instead of AGENT works on
the colony-wide blocks as the operator. Output is for people unless `--json`; text from the server
(content, descriptions, messages) is printed without control characters, so a block cannot drive
the terminal. An error the API answers (403, 404, 409, 422) prints its message and exits 1.

`edit` without --text/--file/--append opens $VISUAL or $EDITOR on the content, like `git commit`,
and writes the result back only if the block did not change meanwhile (base_version: else 409).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from colony.cli_target import call_api as _call
from colony.cli_target import server_text as _text
from colony.errors import ColonyError

ACCESS = ("read_only", "append_only", "read_write")
PROVISION_HELP = (
    "for an agent the colony does not know yet (pre-provisioning: an agent started later under that "
    "id has it); without it such an agent is refused"
)
MAX_DESCRIPTION_SHOWN = 60


def _content(value: Any) -> str:
    """A block's content for the terminal: its lines kept, other control characters dropped."""
    text = value if isinstance(value, str) else ""
    return "".join(c if c.isprintable() or c in "\n\t" else " " for c in text)


def _names(args: argparse.Namespace, *shape: str) -> list[Any]:
    """The positional NAMES of a subcommand as [agent (None with --colony), *shape]: AGENT LABEL ...,
    or LABEL ... with --colony."""
    expected = list(shape) if args.colony else ["AGENT", *shape]
    if len(args.names) != len(expected):
        raise ColonyError(f"colony blocks {args.blocks_action}: give {' '.join(expected)}")
    values: list[Any] = list(args.names)
    for i, name in enumerate(expected):
        if name == "VERSION":
            try:
                values[i] = int(values[i])
            except ValueError:
                raise ColonyError(f"VERSION must be a number, not {values[i]!r}") from None
    return [None, *values] if args.colony else values


def _emit(args: argparse.Namespace, value: Any, text: Callable[[Any], str]) -> str:
    return json.dumps(value, indent=2) if args.json else text(value)


def render_list(blocks: Sequence[dict[str, Any]], who: str) -> str:
    """One row per block: label, owner, type, chars/limit, access, flags, description."""
    if not blocks:
        return f"{who} sees no memory blocks"
    rows = [("LABEL", "OWNER", "TYPE", "CHARS/LIMIT", "ACCESS", "FLAGS", "DESCRIPTION")]
    for block in blocks:
        flags = [
            name
            for name, on in (
                ("colony", block.get("colony")),
                ("read-only", block.get("read_only")),
                ("swapped-out", block.get("swapped_out")),
            )
            if on
        ]
        rows.append(
            (
                _text(block.get("label"), 64),
                _text(block.get("owner"), 128),
                _text(block.get("block_type"), 16),
                f"{block.get('chars', 0)}/{block.get('char_limit', 0)}",
                _text(block.get("access"), 16),
                ",".join(flags) or "-",
                _text(block.get("description"), MAX_DESCRIPTION_SHOWN) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:6])) + "  " + row[6] for row in rows
    )


def render_view(view: dict[str, Any]) -> str:
    """`label (owner, type) chars/limit vN`, then the content."""
    info = view.get("info") or {}
    label, owner, kind = (
        _text(info.get("label"), 64),
        _text(info.get("owner"), 128),
        _text(info.get("block_type"), 16),
    )
    header = (
        f"{label} ({owner}, {kind}) {view.get('chars', 0)}/{info.get('char_limit', 0)} v{view.get('version')}"
    )
    if view.get("head") is False:
        header += " (a past version)"
    return header + "\n" + _content(view.get("content"))


def render_history(history: dict[str, Any]) -> str:
    label, owner = _text(history.get("label"), 64), _text(history.get("owner"), 128)
    lines = [
        f"{label} ({owner}): head v{history.get('head')}, viewable from v{history.get('oldest_viewable')}"
    ]
    for version in history.get("versions") or []:
        stamp = version.get("timestamp")
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stamp)) if isinstance(stamp, int | float) else "-"
        )
        message = _text(version.get("message"), 120)
        delta = version.get("chars_delta", 0)
        lines.append(
            f"v{version.get('version')}  {when}  {_text(version.get('author'), 128)}  "
            f"{_text(version.get('via'), 16)}  {_text(version.get('op'), 16)}  "
            f"{delta:+d}" + (f"  {message}" if message else "")
        )
    return "\n".join(lines)


def _outcome(outcome: dict[str, Any]) -> str:
    label, owner, op = (
        _text(outcome.get("label"), 64),
        _text(outcome.get("owner"), 128),
        _text(outcome.get("op"), 16),
    )
    size = f"{outcome.get('chars')}/{outcome.get('char_limit')}"
    return f"{label} ({owner}): {op} -> v{outcome.get('version')}, {size} characters"


def cmd_ls(args: argparse.Namespace) -> int:
    if args.colony == (args.agent is not None):
        raise ColonyError("colony blocks ls: give AGENT, or --colony for the colony-wide blocks")
    who = args.agent if args.agent is not None else "the colony"
    return _call(
        args, lambda c: _emit(args, c.blocks.list(args.agent), lambda b: render_list(b, _text(who, 128)))
    )


def cmd_show(args: argparse.Namespace) -> int:
    agent, label = _names(args, "LABEL")
    return _call(
        args,
        lambda c: _emit(
            args, c.blocks.read(agent, label, owner=args.owner, version=args.version), render_view
        ),
    )


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def _edited(content: str) -> str | None:
    """The content after $VISUAL/$EDITOR edited it in a private temporary file; None: unchanged."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
    if not editor or not _interactive():
        raise ColonyError(
            "colony blocks edit: give --text, --file or --append, or run it in a terminal with $EDITOR "
            "set to edit the content there"
        )
    with tempfile.TemporaryDirectory(prefix="colony-block-") as folder:
        path = Path(folder) / "block.txt"
        path.write_text(content, encoding="utf-8")
        done = subprocess.run([*shlex.split(editor), str(path)], check=False)
        if done.returncode != 0:
            raise ColonyError(f"the editor exited with status {done.returncode}; nothing was changed")
        new = path.read_text(encoding="utf-8")
    return None if new == content else new


def _read_file(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ColonyError(f"--file {name}: cannot be read as UTF-8 text ({exc})") from None


def cmd_edit(args: argparse.Namespace) -> int:
    agent, label = _names(args, "LABEL")

    def work(client: Any) -> str | None:
        common = {"owner": args.owner, "message": args.message, "base_version": args.base_version}
        if args.append is not None:
            outcome = client.blocks.append(agent, label, args.append, **common)
        else:
            if args.text is not None:
                content = args.text
            elif args.file is not None:
                content = _read_file(args.file)
            else:
                view = client.blocks.read(agent, label, owner=args.owner)
                edited = _edited(view.get("content") or "")
                if edited is None:
                    return f"{_text(label, 64)}: no change"
                common["base_version"] = args.base_version or view.get("version")
                content = edited
            outcome = client.blocks.write(agent, label, content, **common)
        return _emit(args, outcome, _outcome)

    return _call(args, work)


def cmd_history(args: argparse.Namespace) -> int:
    agent, label = _names(args, "LABEL")
    return _call(
        args,
        lambda c: _emit(
            args, c.blocks.history(agent, label, owner=args.owner, limit=args.limit), render_history
        ),
    )


def cmd_rollback(args: argparse.Namespace) -> int:
    agent, label, version = _names(args, "LABEL", "VERSION")
    return _call(
        args,
        lambda c: _emit(
            args, c.blocks.rollback(agent, label, version, owner=args.owner, message=args.message), _outcome
        ),
    )


def cmd_undo(args: argparse.Namespace) -> int:
    return _call(
        args, lambda c: _emit(args, c.blocks.undo(args.agent, args.label, owner=args.owner), _outcome)
    )


def cmd_share(args: argparse.Namespace) -> int:
    def text(share: dict[str, Any]) -> str:
        return (
            f"shared {_text(share.get('owner'), 128)}'s block {_text(share.get('label'), 64)} with "
            f"{_text(share.get('agent_id'), 128)} ({_text(share.get('access'), 16)})"
        )

    def work(client: Any) -> str:
        blocks = client.blocks
        shared = blocks.share(args.owner, args.label, args.agent, args.access, provision=args.provision)
        return _emit(args, shared, text)

    return _call(args, work)


def cmd_unshare(args: argparse.Namespace) -> int:
    def work(client: Any) -> str:
        removed = client.blocks.unshare(args.owner, args.label, args.agent)
        if args.json:
            return json.dumps({"removed": removed})
        what = f"{_text(args.owner, 128)}'s block {_text(args.label, 64)}"
        return (
            f"{_text(args.agent, 128)} no longer sees {what}"
            if removed
            else f"{args.agent} had no access to {what}"
        )

    return _call(args, work)


def _fields(pairs: Sequence[str]) -> dict[str, Any]:
    """`--field NAME=VALUE` pairs of a template: a JSON list, number or boolean where VALUE parses
    as one, else the text."""
    fields: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise ColonyError(f"--field {pair!r}: give NAME=VALUE, e.g. --field name=Ada")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        fields[name] = value if isinstance(value, list | int | float | bool) else raw
    return fields


def cmd_create(args: argparse.Namespace) -> int:
    agent, label = _names(args, "LABEL")
    fields: dict[str, Any] = {
        "block_type": args.type,
        "description": args.description,
        "char_limit": args.limit,
        "content": args.content,
        "read_only": True if args.read_only else None,
        "template": args.template,
        "fields": _fields(args.field) if args.field else None,
    }
    if args.colony:
        fields["access"] = args.access
        if args.provision:
            raise ColonyError("--provision is for an agent's block; a colony block needs no agent")
    elif args.access is not None:
        raise ColonyError("--access is for colony blocks (--colony); share an agent's block with `share`")
    elif args.provision:
        fields["provision"] = True

    def text(info: dict[str, Any]) -> str:
        return (
            f"created {_text(info.get('label'), 64)} ({_text(info.get('owner'), 128)}, "
            f"{_text(info.get('block_type'), 16)}), limit {info.get('char_limit')} characters"
        )

    return _call(args, lambda c: _emit(args, c.blocks.create(agent, label, **fields), text))


class _Subcommands:
    """Makes the parsers of `colony blocks` subcommands: each takes `--json`, and `--url`/`--token`
    (from `parents`, else added here)."""

    def __init__(self, actions: Any, parents: Sequence[argparse.ArgumentParser] | None) -> None:
        self.actions, self.parents = actions, parents

    def leaf(self, name: str, help_text: str, usage_names: str | None = None) -> argparse.ArgumentParser:
        from colony.cli_memory import remote_options as _remote_options

        parser: argparse.ArgumentParser = self.actions.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=list(self.parents or []),
            usage=f"colony blocks {name} [options] {usage_names}" if usage_names else None,
        )
        if self.parents is None:
            _remote_options(parser)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        return parser

    def named(self, name: str, help_text: str, *shape: str) -> argparse.ArgumentParser:
        """A subcommand on AGENT LABEL ... (or --colony LABEL ...)."""
        tail = " ".join(shape)
        parser = self.leaf(name, help_text, f"(AGENT {tail} | --colony {tail})")
        parser.add_argument("names", nargs="+", metavar="NAME", help=f"AGENT {tail}, or {tail} with --colony")
        parser.add_argument("--colony", action="store_true", help="a colony-wide block (as the operator)")
        return parser


def _owner_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--owner", help="another agent's block shared with AGENT (default: AGENT's view)")


def add_block_commands(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    """Add `blocks ls|show|edit|history|rollback|undo|share|unshare|create` to the `colony`
    command's subparsers. `parents`: the parsers holding `--url`/`--token` (cli.py's `remote`)."""
    blocks = subparsers.add_parser(
        "blocks", help="memory blocks: list, show, edit, history, rollback, undo, share, create"
    )
    made = _Subcommands(blocks.add_subparsers(dest="blocks_action", required=True), parents)
    _add_viewing(made)
    _add_versioning(made)
    _add_sharing(made)
    _add_create(made)
    return blocks


def _add_viewing(made: _Subcommands) -> None:
    """`ls` and `show`."""
    ls = made.leaf("ls", "the blocks an agent sees (own, shared, colony) with size and access")
    ls.add_argument("agent", nargs="?", help="agent name (or --colony)")
    ls.add_argument("--colony", action="store_true", help="the colony-wide blocks")
    ls.set_defaults(func=cmd_ls)

    show = made.named("show", "a block's content as the agent sees it", "LABEL")
    _owner_option(show)
    show.add_argument("--version", type=int, help="a past version (a view: nothing changes)")
    show.set_defaults(func=cmd_show)


def _add_versioning(made: _Subcommands) -> None:
    """`edit`, `history`, `rollback` and `undo`: a block's versions."""
    edit = made.named("edit", "change a block as the agent (no --text/--file/--append: $EDITOR)", "LABEL")
    _owner_option(edit)
    how = edit.add_mutually_exclusive_group()
    how.add_argument("--text", help="the whole new content")
    how.add_argument("--file", help="the new content from this file ('-': standard input)")
    how.add_argument("--append", metavar="TEXT", help="add this text at the end")
    edit.add_argument("--base-version", type=int, help="only if the block is still at this version")
    edit.add_argument("--message", help="kept in the block's history")
    edit.set_defaults(func=cmd_edit)

    history = made.named("history", "a block's versions with their authors", "LABEL")
    _owner_option(history)
    history.add_argument("--limit", type=int, help="the newest this many versions (default 100)")
    history.set_defaults(func=cmd_history)

    rollback = made.named(
        "rollback", "a new version holding VERSION's content (history kept)", "LABEL", "VERSION"
    )
    _owner_option(rollback)
    rollback.add_argument("--message", help="kept in the block's history")
    rollback.set_defaults(func=cmd_rollback)

    undo = made.leaf("undo", "undo the agent's own latest edit of a block, keeping others' edits")
    undo.add_argument("agent", help="agent name")
    undo.add_argument("label", help="block label")
    _owner_option(undo)
    undo.set_defaults(func=cmd_undo)


def _add_sharing(made: _Subcommands) -> None:
    """`share` and `unshare`."""
    share = made.leaf("share", "give AGENT access to OWNER's block")
    share.add_argument("owner", help="the agent owning the block")
    share.add_argument("label", help="block label")
    share.add_argument("agent", help="the agent to share it with")
    share.add_argument("--access", choices=ACCESS, required=True, help="what AGENT may do with it")
    share.add_argument("--provision", action="store_true", help=PROVISION_HELP)
    share.set_defaults(func=cmd_share)

    unshare = made.leaf("unshare", "take AGENT's access to OWNER's block away")
    unshare.add_argument("owner", help="the agent owning the block")
    unshare.add_argument("label", help="block label")
    unshare.add_argument("agent", help="the agent to take it from")
    unshare.set_defaults(func=cmd_unshare)


def _add_create(made: _Subcommands) -> None:
    create = made.named("create", "create a block owned by AGENT (or a colony block)", "LABEL")
    create.add_argument("--type", choices=("core", "working", "log"), help="default working")
    create.add_argument("--description", help="what the block is for (the model reads it)")
    create.add_argument("--limit", type=int, help="character limit (default blocks.default_char_limit)")
    create.add_argument("--content", help="initial content")
    create.add_argument("--read-only", action="store_true", help="only the system or the operator changes it")
    create.add_argument("--template", help="a block template: persona, human, scratchpad, organization")
    create.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a field of the template (repeatable; VALUE as JSON when it is a list, number or boolean)",
    )
    create.add_argument("--access", choices=ACCESS, help="--colony: what every agent may do with it")
    create.add_argument("--provision", action="store_true", help=PROVISION_HELP)
    create.set_defaults(func=cmd_create)
