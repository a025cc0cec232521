"""The files of a mapped folder, read back from its pages: list, a window of lines, search, definitions.

A mapped folder's text lives in Redis as pages (colony.vcm.page_table), so any replica can read it
whether or not it sees the folder on disk, and nothing outside what mapping admitted
(`vcm.allowed_roots`, the caps, text files only) can be read this way. A page is the pieces of
one or more files, each `### path (lines a-b)` then those lines, in the order of the page's
`files` spans: the files are put back together from the spans, never by guessing at headers.

Every answer cites a path (relative to the mapped folder) and a line number, and is bounded: lines
shown, characters per line, results. A search pattern is literal unless asked otherwise; a regular
expression is checked before it runs (at most 200 characters, no backreferences, no repeat or
alternation inside a repeat, at most two repeats of variable length, bounded or not, and four
repeats and optional parts in all, a group of k alternatives counting as log2(k) optional parts)
and runs over lines cut to MAX_REGEX_LINE_CHARS, so one line
costs at most about 30 ms (`re` holds the GIL while it matches, so a line is the unit a budget
can stop at); the time budget is checked at every line.
"""

from __future__ import annotations

import fnmatch
import math
import re
import time
from dataclasses import dataclass, field
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from colony.errors import InvalidArgument, PageNotResident
from colony.vcm.page_table import PageTable, SourceRecord

MAX_LINE_CHARS = 400  # of a line shown
MAX_SEARCH_LINE_CHARS = 1000  # of a line searched for a literal
MAX_REGEX_LINE_CHARS = 200  # ... for a regular expression (the worst allowed shape: ~30 ms a line)
MAX_WINDOW = 200
MAX_RESULTS = 100
MAX_PATTERN = 200
MAX_VARIABLE = 2  # repeats of variable length in one pattern (*, +, {m,n} with n > m + 1)
MAX_CHOICES = 4  # ... and optional parts (?, {m,m+1}, alternatives) with them: each multiplies the ways
SEARCH_SECONDS = 2.0
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_REPEATS = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, getattr(sre_parse, "POSSESSIVE_REPEAT", None)}


@dataclass
class MappedFiles:
    """The text files of one mapped source: path -> its lines (put back together from the pages)."""

    source: SourceRecord
    files: dict[str, list[str]] = field(default_factory=dict)
    missing_pages: list[str] = field(default_factory=list)

    @classmethod
    async def load(cls, table: PageTable, source_id: str, *, paths: set[str] | None = None) -> MappedFiles:
        """The source's files, from its pages in Redis (pages gone, expired by retention, are listed
        in `missing_pages`; their lines are absent); `paths`: only the pages holding these files."""
        record = await table.source(source_id)
        if record is None:
            raise InvalidArgument(
                f"no mapped source {source_id!r} (map a folder first: `colony run analyze --map`)"
            )
        out = cls(record)
        for page_id in record.page_ids:
            info = await table.page(page_id)
            if paths is not None and info is not None and not any(f.path in paths for f in info.files):
                continue
            try:
                text = (await table.content(page_id)).text
            except PageNotResident:
                text = None
            if info is None or text is None:
                out.missing_pages.append(page_id)
                continue
            if not out._add_page(info.files, text):
                out.missing_pages.append(page_id)
        return out

    def _add_page(self, spans: list[Any], text: str) -> bool:
        """Put the page's pieces in their files; False when a piece is not where its span says
        (a page some writer of Redis changed): what came before it is kept."""
        lines = text.split("\n")
        at = 0
        for span in spans:
            # a path may hold a line break: its header is then several lines
            header = f"### {span.path} (lines {span.start_line}-{span.end_line})".split("\n")
            while at < len(lines) and lines[at : at + len(header)] != header:  # the blank line between
                at += 1
            if at >= len(lines):
                return False
            at += len(header) - 1
            count = span.end_line - span.start_line + 1
            body = lines[at + 1 : at + 1 + count]
            held = self.files.setdefault(span.path, [])
            if len(held) < span.start_line - 1:  # a piece on a page that is gone: keep numbering
                held += [""] * (span.start_line - 1 - len(held))
            held[span.start_line - 1 : span.start_line - 1 + len(body)] = body
            at += 1 + count
        return True

    def chars(self) -> int:
        """How much text the files hold (what keeping them costs)."""
        return sum(len(line) + 1 for lines in self.files.values() for line in lines)

    def paths(self, pattern: str | None = None) -> list[str]:
        """File paths in order, those matching the glob `pattern` (e.g. `*.py`, `email/*`) if given."""
        names = sorted(self.files)
        if pattern:
            names = [
                n
                for n in names
                if fnmatch.fnmatch(n, pattern) or fnmatch.fnmatch(n.rsplit("/", 1)[-1], pattern)
            ]
        return names

    def lines(self, path: str) -> list[str]:
        held = self.files.get(path)
        if held is None:
            near = [p for p in self.files if p.endswith("/" + path) or p.rsplit("/", 1)[-1] == path][:5]
            hint = f"; did you mean {', '.join(near)}?" if near else "; list_files shows the paths"
            raise InvalidArgument(f"no file {path[:200]!r} in the mapped folder{hint}")
        return held

    def window(self, path: str, start: int, count: int) -> dict[str, Any]:
        """Lines `start` .. `start + count - 1` (1-based) of a file, each cited with its number."""
        held = self.lines(path)
        first = max(1, start)
        if first > len(held) and held:  # found by review: an empty window, without a word of why
            raise InvalidArgument(
                f"{path[:200]!r} has {len(held)} lines; start at line {len(held)} or before"
            )
        last = min(len(held), first + max(1, min(count, MAX_WINDOW)) - 1)
        shown = [{"line": n, "text": _cut(held[n - 1])} for n in range(first, last + 1)]
        return {"path": path, "start": first, "end": last, "total_lines": len(held), "lines": shown}

    def search(
        self, pattern: str, *, regex: bool = False, path_glob: str | None = None, max_results: int = 50
    ) -> dict[str, Any]:
        """Lines holding `pattern` (literal, case-insensitive; or a checked regular expression), each
        with its path and line number; `truncated` when results or the time budget ran out."""
        matcher = compile_pattern(pattern, regex=regex)
        width = MAX_REGEX_LINE_CHARS if regex else MAX_SEARCH_LINE_CHARS
        limit = max(1, min(max_results, MAX_RESULTS))
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + SEARCH_SECONDS
        for path in self.paths(path_glob):
            for number, line in enumerate(self.files[path], 1):
                if matcher(line[:width]):
                    found.append({"path": path, "line": number, "text": _cut(line)})
                    if len(found) >= limit:
                        return {"results": found, "truncated": True}
                if time.monotonic() > deadline:
                    return {"results": found, "truncated": True}
        return {"results": found, "truncated": False}

    def definitions(self, name: str, *, max_results: int = 20) -> list[dict[str, Any]]:
        """Where `name` (an identifier; `Class.method` looks for `method`) is defined: Python `def`/
        `class`/assignment at the start of a line, and the usual forms of JavaScript, TypeScript,
        Go, Rust, Java and C-like code; the file path and line of each (those found within
        SEARCH_SECONDS: the pattern is linear in a line, but a folder can be large)."""
        wanted = name.rsplit(".", 1)[-1]
        if not IDENTIFIER.fullmatch(wanted):
            raise InvalidArgument(f"{name[:130]!r} is not an identifier (letters, digits, '_')")
        word = re.escape(wanted)
        forms = re.compile(
            rf"^\ufeff?\s*(?:(?:async\s+)?def|class|(?:export\s+)?(?:default\s+)?(?:async\s+)?function\*?"
            rf"|(?:export\s+)?(?:const|let|var|interface|type|enum)|(?:pub(?:\([^)]*\))?\s+)?"
            rf"(?:fn|struct|trait|enum|type|mod)|func(?:\s*\([^)]*\))?|(?:(?:public|private|protected|static"
            rf"|final|abstract)\s+)*(?:class|interface|record|enum))\s+{word}\b"
            rf"|^\ufeff?{word}\s*(?::[^=]*)?=(?!=)"
        )
        found = []
        deadline = time.monotonic() + SEARCH_SECONDS  # what was found by then (a search's budget)
        for path in self.paths():
            for number, line in enumerate(self.files[path], 1):
                if forms.search(line[:MAX_SEARCH_LINE_CHARS]):
                    found.append({"path": path, "line": number, "text": _cut(line)})
                    if len(found) >= max(1, min(max_results, MAX_RESULTS)):
                        return found
                if time.monotonic() > deadline:
                    return found
        return found


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..."


def compile_pattern(pattern: str, *, regex: bool) -> Any:
    """A line predicate for `pattern`: a case-insensitive substring test, or a checked regular
    expression's `search` (InvalidArgument naming what is refused)."""
    if not pattern or len(pattern) > MAX_PATTERN:
        raise InvalidArgument(f"a search pattern is 1-{MAX_PATTERN} characters")
    if not regex:
        folded = pattern.casefold()
        return lambda line: folded in line.casefold()
    try:
        parsed = sre_parse.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InvalidArgument(f"not a regular expression: {exc}") from None
    counts = {"variable": 0, "optional": 0, "fixed": 0}
    _check(parsed, counts, inside_repeat=False)
    if counts["variable"] > MAX_VARIABLE or counts["variable"] + counts["optional"] > MAX_CHOICES:
        raise InvalidArgument(
            f"the pattern has {counts['variable']} repeats of variable length (*, +, {{m,n}}) and "
            f"{counts['optional']} optional parts (?, and a|b: log2 of the alternatives); at most "
            f"{MAX_VARIABLE} repeats and {MAX_CHOICES} "
            "of both, so a search cannot backtrack for long: search for a literal part instead"
        )
    return compiled.search


def _check(parsed: Any, counts: dict[str, int], *, inside_repeat: bool) -> None:
    """Refuse backreferences and a repeat or alternation inside a repeat (the shapes that backtrack
    exponentially); count the variable repeats (`*`, `+`, `{m,n}` with n > m + 1) and the
    optional ones (`?`, `{m,m+1}`, and log2(k) for k alternatives) into `counts`."""
    for op, value in parsed:
        if op in (sre_parse.GROUPREF, sre_parse.GROUPREF_EXISTS):
            raise InvalidArgument("backreferences are not allowed in a search pattern")
        if op in _REPEATS:
            low, high, sub = value
            if inside_repeat:
                raise InvalidArgument(
                    "a repeat inside a repeat (like (a+)+ or (x*y)*) can backtrack without end; "
                    "write the pattern without nesting them"
                )
            span = high - low
            counts["variable" if span > 1 else "optional" if span == 1 else "fixed"] += 1
            _check(sub, counts, inside_repeat=True)
        elif op is sre_parse.SUBPATTERN:
            _check(value[-1], counts, inside_repeat=inside_repeat)
        elif op is sre_parse.BRANCH:
            if inside_repeat:
                raise InvalidArgument(
                    "alternatives inside a repeat (like (a|ab)+) can backtrack without end; "
                    "search for each alternative instead"
                )
            # k alternatives multiply the ways to match by k, as log2(k) optional parts would (found
            # by review: a chain of (?:a|.) groups, never counted, ran for seconds a line)
            counts["optional"] += max(1, math.ceil(math.log2(len(value[1]))))
            for branch in value[1]:
                _check(branch, counts, inside_repeat=inside_repeat)
        elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            _check(value[1], counts, inside_repeat=inside_repeat)
        elif op is getattr(sre_parse, "ATOMIC_GROUP", None):
            _check(value, counts, inside_repeat=inside_repeat)
