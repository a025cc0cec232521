"""Question sets for benchmarks/memory_recall.py written independently of memory_facts.py's
templates (issue 36): loaded from benchmarks/recall_sets/*.jsonl and validated on load, so a broken
or hostile file is refused with the line at fault instead of skewing the figures.

A set file is JSON Lines. The first line is the header:
    {"kind": "header", "name": "notes", "split": "test" | "dev", "description": "...", ...}
then entries (the memories) and questions, each question naming the entry that answers it:
    {"kind": "entry", "id": "notes-001", "text": "...", "group": "maya"?, "source": "..."?}
    {"kind": "question", "id": "notes-q001", "text": "...", "answer": "notes-001", "group": "maya"?}
A `group` (a simulated user in `conversations`) is a memory scope of its own: its questions are
asked of its entries only. Either every entry of a set has a group or none has; a question's group
is its answer's. Sets labelled "test" are never tuned on; "dev" is the development set for tuning.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colony.memory.keyword import tokenize

SETS_DIR = Path(__file__).resolve().parent / "recall_sets"
TEST_SETS = ("notes", "conversations", "prose")
DEV_SETS = ("dev", "dev_long")
SET_NAMES = (*TEST_SETS, *DEV_SETS)
SPLITS = {"test": "test (never tuned on)", "dev": "development (tuning allowed)"}
MAX_FILE_BYTES = 2_000_000
MAX_ENTRIES = 5_000
MAX_QUESTIONS = 5_000
MAX_GROUPS = 100
MAX_TEXT_CHARS = 4_000
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


class RecallSetError(ValueError):
    """A set file that cannot be used; the message names the file, the line and what to fix."""


@dataclass(frozen=True)
class Entry:
    id: str
    text: str
    group: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    answer: str
    group: str | None = None


@dataclass(frozen=True)
class RecallSet:
    name: str
    split: str  # "test" | "dev"
    description: str
    entries: list[Entry]
    questions: list[Question]
    header: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return SPLITS[self.split]

    def groups(self) -> dict[str | None, tuple[list[Entry], list[Question]]]:
        """Entries and questions per memory scope (one `None` group for an ungrouped set)."""
        out: dict[str | None, tuple[list[Entry], list[Question]]] = {}
        for e in self.entries:
            out.setdefault(e.group, ([], []))[0].append(e)
        for q in self.questions:
            out[q.group][1].append(q)
        return {g: v for g, v in out.items() if v[1]}


def _text(
    record: dict, key: str, where: str, *, required: bool = True, limit: int = MAX_TEXT_CHARS
) -> str | None:
    value = record.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RecallSetError(f"{where}: {key!r} must be a non-empty string")
    if len(value) > limit:
        raise RecallSetError(f"{where}: {key!r} is {len(value)} characters; at most {limit}")
    return value


def _ident(record: dict, key: str, where: str, *, required: bool = True) -> str | None:
    value = _text(record, key, where, required=required, limit=80)
    if value is not None and not _ID.match(value):
        raise RecallSetError(f"{where}: {key!r} {value!r} must match {_ID.pattern}")
    return value


def _records(path: Path) -> Iterable[tuple[str, dict]]:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise RecallSetError(f"{path}: cannot read the set file ({exc})") from exc
    if size > MAX_FILE_BYTES:
        raise RecallSetError(f"{path}: {size} bytes; a set file holds at most {MAX_FILE_BYTES}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise RecallSetError(f"{path}: not UTF-8 text ({exc})") from exc
    for number, line in enumerate(lines, 1):
        where = f"{path.name} line {number}"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecallSetError(f"{where}: not a JSON object ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise RecallSetError(f"{where}: not a JSON object")
        yield where, record


def _header(where: str, record: dict) -> dict:
    if record.get("kind") != "header":
        raise RecallSetError(f"{where}: the first line must be the header ({{'kind': 'header', ...}})")
    name = _text(record, "name", where, limit=40)
    if not _NAME.match(name or ""):
        raise RecallSetError(f"{where}: set name {name!r} must match {_NAME.pattern}")
    if record.get("split") not in SPLITS:
        raise RecallSetError(f"{where}: 'split' must be one of {sorted(SPLITS)}, not {record.get('split')!r}")
    _text(record, "description", where)
    return record


def parse(path: Path) -> RecallSet:
    """Load and validate one set file; RecallSetError names the first problem found."""
    header: dict | None = None
    entries: dict[str, Entry] = {}
    questions: dict[str, Question] = {}
    for where, record in _records(path):
        if header is None:
            header = _header(where, record)
            continue
        kind = record.get("kind")
        if kind not in ("entry", "question"):
            raise RecallSetError(f"{where}: 'kind' must be 'entry' or 'question', not {kind!r}")
        ident = _ident(record, "id", where)
        assert ident is not None
        if ident in entries or ident in questions:
            raise RecallSetError(f"{where}: id {ident!r} is used twice")
        group = _ident(record, "group", where, required=False)
        text = _text(record, "text", where)
        assert text is not None
        if kind == "entry":
            source = _text(record, "source", where, required=False, limit=300)
            entries[ident] = Entry(ident, text, group, source)
            if len(entries) > MAX_ENTRIES:
                raise RecallSetError(f"{where}: more than {MAX_ENTRIES} entries")
        else:
            answer = _ident(record, "answer", where)
            assert answer is not None
            questions[ident] = Question(ident, text, answer, group)
            if len(questions) > MAX_QUESTIONS:
                raise RecallSetError(f"{where}: more than {MAX_QUESTIONS} questions")
    if header is None:
        raise RecallSetError(f"{path}: empty; a set file starts with its header line")
    _check_links(path, entries, questions)
    return RecallSet(
        name=header["name"],
        split=header["split"],
        description=header["description"],
        entries=list(entries.values()),
        questions=list(questions.values()),
        header=header,
    )


def _check_links(path: Path, entries: dict[str, Entry], questions: dict[str, Question]) -> None:
    """Every question answered by an entry of its own group; groups all or nothing, bounded."""
    if not entries or not questions:
        raise RecallSetError(f"{path.name}: a set needs at least one entry and one question")
    grouped = {e.group is not None for e in entries.values()}
    if len(grouped) > 1:
        raise RecallSetError(f"{path.name}: either every entry has a 'group' or none has")
    groups = {e.group for e in entries.values()}
    if len(groups) > MAX_GROUPS:
        raise RecallSetError(f"{path.name}: {len(groups)} groups; at most {MAX_GROUPS}")
    for q in questions.values():
        entry = entries.get(q.answer)
        if entry is None:
            raise RecallSetError(
                f"{path.name}: question {q.id!r} names answer {q.answer!r}, which is no entry"
            )
        if entry.group != q.group:
            raise RecallSetError(
                f"{path.name}: question {q.id!r} is in group {q.group!r} but its answer "
                f"{q.answer!r} is in group {entry.group!r}; a question is asked within its answer's group"
            )


def load(name_or_path: str | Path) -> RecallSet:
    """A shipped set by name (benchmarks/recall_sets/<name>.jsonl) or a set file by path."""
    path = Path(name_or_path)
    if path.suffix != ".jsonl":
        if str(name_or_path) not in SET_NAMES:
            raise RecallSetError(f"unknown set {name_or_path!r}; the sets are {', '.join(SET_NAMES)}")
        path = SETS_DIR / f"{name_or_path}.jsonl"
    loaded = parse(path)
    if path.parent == SETS_DIR and loaded.name != path.stem:
        raise RecallSetError(f"{path.name}: its header names the set {loaded.name!r}, not {path.stem!r}")
    return loaded


def lexical_overlap(recall_set: RecallSet) -> dict[str, float]:
    """How keyword-friendly a set is, in the keyword index's own tokens (colony.memory.keyword:
    stopwords dropped, lightly stemmed): the mean share of a question's tokens found in its answer
    entry, and the share of questions with at least one such token."""
    texts = {e.id: set(tokenize(e.text)) for e in recall_set.entries}
    shares: list[float] = []
    for q in recall_set.questions:
        words = set(tokenize(q.text))
        shares.append(len(words & texts[q.answer]) / len(words) if words else 0.0)
    n = max(1, len(shares))
    return {
        "mean_token_share": sum(shares) / n,
        "questions_sharing_a_token": sum(s > 0 for s in shares) / n,
    }


def describe(recall_set: RecallSet) -> dict[str, Any]:
    """What a report says of a set: its split, sizes, lexical overlap and sources."""
    info: dict[str, Any] = {
        "split": recall_set.split,
        "label": recall_set.label,
        "entries": len(recall_set.entries),
        "questions": len(recall_set.questions),
        "groups": len(recall_set.groups()),
        "description": recall_set.description,
        "lexical_overlap": lexical_overlap(recall_set),
    }
    if "sources" in recall_set.header:
        info["sources"] = recall_set.header["sources"]
    return info
