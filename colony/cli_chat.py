"""`colony chat`: an interactive terminal chat with a session agent (docs/sessions.md).

Each line typed is a turn: the reply's tokens print as the model writes them (its newlines kept).
A line starting with `//` sends the rest after one `/` (`//etc` sends `/etc`). Other lines starting
with `/` are commands: `/history` (the active branch, numbered), `/revert N` (go back to message N of
`/history`, or a message id; later messages stay in the tree), `/fork N [NAME]` (a new branch from
message N, made active), `/branches`, `/switch NAME`, `/quit` (or end of input). Works with piped
stdin (no prompt is printed then), so scripts and tests drive it like a user. With `--show-prompt`
each turn first says what entered the prompt beside the newest messages: how many messages left it,
the summary of them (and how many it covers), the messages recalled from memory. Every call is to the
HTTP API (colony.client), so `--url`/`--token` reach a cluster started elsewhere; text from the
server is printed without control characters.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from colony.cli_target import api_error, api_target
from colony.config import load_settings
from colony.errors import ApiError, ColonyError

HELP = "commands: /history, /revert N, /fork N [NAME], /branches, /switch NAME, /quit; //TEXT sends /TEXT"


def _clean(text: Any, keep_newlines: bool = False) -> str:
    """`text` safe for a terminal: control characters (escape sequences) become spaces; with
    `keep_newlines`, a reply's line breaks stay."""
    value = text if isinstance(text, str) else "" if text is None else str(text)
    return "".join(c if c.isprintable() or (keep_newlines and c == "\n") else " " for c in value)


class Chat:
    """One chat through `sessions` (`ColonyClient.sessions`) in session `session_id`, writing to `out`."""

    def __init__(self, sessions: Any, session_id: str, out: TextIO, *, show_prompt: bool = False) -> None:
        self.sessions, self.session_id, self.out = sessions, session_id, out
        self.show_prompt = show_prompt

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def transcript(self) -> list[dict[str, Any]]:
        """The active branch's messages, every page of them."""
        return list(self.sessions.all_messages(self.session_id))

    def message_id(self, ref: str) -> str:
        """A message by its number in `/history` (1 = the first) or by its id."""
        if ref.isdigit():
            index = int(ref)
            page = self.sessions.messages(self.session_id, offset=max(index - 1, 0), limit=1)
            if index < 1 or not page["messages"]:
                raise ColonyError(f"no message {index}: the active branch has {page['total']} (see /history)")
            return str(page["messages"][0]["id"])
        return ref

    def turn(self, text: str) -> None:
        """Send one message; print the reply's tokens as they come."""
        streamed = False
        for event in self.sessions.send(self.session_id, text):
            kind, data = event.get("event_type"), event.get("data") or {}
            if kind == "token":
                self.out.write(_clean(data.get("text"), keep_newlines=True))
                self.out.flush()
                streamed = True
            elif kind == "prompt_context":
                if self.show_prompt:
                    self.prompt_context(data)
            elif kind == "restarted":  # the replica died mid-reply: the reply starts again
                self.out.write("\n[restarted]\n")
                streamed = False
            elif kind == "message":
                if not streamed:
                    self.out.write(_clean((data.get("message") or {}).get("content"), keep_newlines=True))
                self.say("")
            elif kind == "error":
                self.say(f"\n[error] {_clean(data.get('error'))}")

    def prompt_context(self, data: dict[str, Any]) -> None:
        """What entered the turn's prompt beside its newest messages (`--show-prompt`)."""
        left = data.get("left_out") or 0
        summary = data.get("summary") if isinstance(data.get("summary"), dict) else None
        recalled = data.get("recalled") if isinstance(data.get("recalled"), list) else []
        if not left and not summary and not recalled:
            self.say("[prompt: the whole conversation]")
            return
        self.say(f"[prompt: {left} earlier messages left it]")
        if summary:
            pending = summary.get("pending") or 0
            later = f", {pending} later ones not yet in it" if pending else ""
            self.say(f"[summary of {summary.get('messages')} messages{later}] {_clean(summary.get('text'))}")
        for item in recalled:
            if isinstance(item, dict):
                self.say(f"[recalled] {_clean(item.get('text'))[:300]}")

    def command(self, line: str) -> bool:
        """Run a `/` command; False when the chat should end."""
        name, *rest = line[1:].split() or ["help"]
        if name in ("quit", "exit", "q"):
            return False
        if name == "history":
            for i, message in enumerate(self.transcript(), 1):
                self.say(f"[{i}] {message['role']}: {_clean(message['content'])[:200]}")
        elif name == "branches":
            view = self.sessions.get(self.session_id)
            for branch in view["branches"]:
                mark = "*" if branch["name"] == view["active"] else " "
                self.say(f"{mark} {_clean(branch['name'])} ({branch['length']} messages)")
        elif name == "revert" and len(rest) == 1:
            target = self.message_id(rest[0])
            self.sessions.revert(self.session_id, target)
            self.say(f"reverted to {target}; the next message continues from it")
        elif name == "fork" and len(rest) in (1, 2):
            view = self.sessions.fork(self.session_id, self.message_id(rest[0]), *rest[1:])
            self.say(f"on branch {_clean(view['active'])}")
        elif name == "switch" and len(rest) == 1:
            view = self.sessions.switch(self.session_id, rest[0])
            self.say(f"on branch {_clean(view['active'])}")
        else:
            self.say(HELP)
        return True

    def loop(self, lines: TextIO, interactive: bool) -> None:
        while True:
            if interactive:
                self.out.write("> ")
                self.out.flush()
            line = lines.readline()
            if not line:
                return
            line = line.strip()
            if not line:
                continue
            try:
                if line.startswith("//"):
                    self.turn(line[1:])
                elif line.startswith("/"):
                    if not self.command(line):
                        return
                else:
                    self.turn(line)
            except ApiError as exc:
                if exc.status == 401:
                    raise
                self.say(f"[error] {_clean(str(exc))}")
            except ColonyError as exc:
                self.say(f"[error] {_clean(str(exc))}")


def cmd_chat(args: argparse.Namespace) -> int:
    target = api_target(args, load_settings(args.config))
    from colony.client import ColonyClient

    try:
        with ColonyClient(target.url, target.token) as client:
            if args.delete:
                client.sessions.delete(args.delete)
                print(f"session {_clean(args.delete)} deleted")
                return 0
            if args.session and args.page:
                print("colony: error: --page starts a new session; leave out --session", file=sys.stderr)
                return 2
            session_id = args.session or client.sessions.start(pages=args.page)["session_id"]
            if args.session:
                client.sessions.get(session_id)  # 404 now rather than at the first message
            chat = Chat(client.sessions, session_id, sys.stdout, show_prompt=args.show_prompt)
            chat.say(f"session {session_id} ({HELP})")
            chat.loop(sys.stdin, sys.stdin.isatty())
    except ApiError as exc:
        if exc.status == 401:
            raise api_error(target, exc) from None
        print(f"colony: error: {exc}", file=sys.stderr)
        return 1
    return 0


def add_chat_command(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    """Add `chat` to the `colony` command's subparsers."""
    chat = subparsers.add_parser(
        "chat",
        help="chat with a session agent",
        description="Chat with a session agent: each line is a message, the reply streams back. " + HELP,
        parents=list(parents or []),
    )
    what = chat.add_mutually_exclusive_group()
    what.add_argument("--session", help="continue this session (its id) instead of starting one")
    what.add_argument(
        "--delete", metavar="ID", help="delete this session for good (its agent, messages and state) and exit"
    )
    chat.add_argument(
        "--page",
        action="append",
        metavar="PAGE_ID",
        help="a new session about this page of a mapped folder (repeat for more; ids from POST "
        "/v1/vcm/sources): every turn's prompt starts with the pages, their KV cache reused",
    )
    chat.add_argument(
        "--show-prompt",
        action="store_true",
        help="before each reply, show what entered the prompt besides the newest messages: a summary "
        "of the earlier ones, messages recalled from the session's memory",
    )
    chat.set_defaults(func=cmd_chat)
    return chat
