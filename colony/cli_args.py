"""Command-line arguments before argparse reads them: values that start with '-'."""

from __future__ import annotations

import re
from collections.abc import Sequence

# Options whose value is the user's own text or a secret: argparse takes a value that starts with '-'
# for an option ("--token: expected one argument"), though a token or a sentence can start with one.
_FREE_TEXT_OPTIONS = frozenset(
    {"--token", "--input", "--text", "--append", "--content", "--description", "--message", "--data"}
)
_LOOKS_LIKE_A_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*")


def attach_dash_values(argv: Sequence[str]) -> list[str]:
    """`--token -x1` as `--token=-x1`, so argparse reads the value as one. A token is always taken as
    given (it may look like a flag); other text only where it does not look like one of our flags, so
    `--text --file F` still reports the missing text instead of storing "--file"."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if item == "--":
            out.extend(items[i:])
            break
        value = items[i + 1] if i + 1 < len(items) else None
        if (
            item in _FREE_TEXT_OPTIONS
            and value is not None
            and value.startswith("-")
            and (item == "--token" or not _LOOKS_LIKE_A_FLAG.fullmatch(value))
        ):
            out.append(f"{item}={value}")
            i += 2
            continue
        out.append(item)
        i += 1
    return out
