"""One block's Loro document: its content, its edits as Loro commits, its history.

Every edit is one Loro commit whose message (JSON) names the edit id, author, channel, operation and
note, so history, authorship and selective undo come from the document itself. Edits check their
preconditions (unique match, line in range, append-only) before touching the document, so a
refused edit changes nothing. Version numbers come from the block's edit ids in log order (kept in
Redis, see `groups`); a shallow snapshot folds the oldest versions away.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loro import ID, ExportMode, Frontiers, LoroDoc, LoroList, LoroText, UndoManager

from colony.errors import BlockAccessDenied, BlockEditRejected, BlockNotFound
from colony.memory.blocks.types import BlockVersion

CONTENT = "content"
ENTRIES = "entries"
META = "meta"
REWRITE_DIFF_MS = 50  # longest character diff of a rewrite before falling back to lines
REST_ORIGIN = "colony:rest"  # the undo replay's "other edits": not recorded by the UndoManager


@dataclass(frozen=True)
class EditMeta:
    """Who made an edit, how, and why (stored as the Loro commit message). `edit_id`: the id the
    edit gets (derived from an action's idempotency key, so a redone action finds it); empty: a
    fresh random one."""

    author: str
    via: str
    op: str
    message: str = ""
    edit_id: str = ""

    def encode(self, edit_id: str, delta: int, chars: int) -> str:
        return json.dumps(
            {
                "e": edit_id,
                "by": self.author,
                "via": self.via,
                "op": self.op,
                "msg": self.message[:500],
                "t": round(time.time(), 6),
                "d": delta,
                "c": chars,
            },
            separators=(",", ":"),
        )


@dataclass
class _Group:
    """The Loro changes of one edit."""

    meta: dict[str, Any]
    lamport: int
    peer: int
    spans: list[tuple[int, int, int]]  # (peer, first counter, last counter)


def new_document() -> LoroDoc:
    doc = LoroDoc()
    doc.set_change_merge_interval(0)  # one edit, one change: never merged with the next commit
    return doc


def _decode(message: str | None) -> dict[str, Any]:
    if not message:
        return {}
    try:
        value = json.loads(message)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def as_lines(text: str) -> str:
    """Block text as lines: non-empty content ends with a line break, so a line appended later
    never joins the last one, and undoing one agent's line never joins two others'."""
    return text if not text or text.endswith("\n") else text + "\n"


def is_subsequence(old: str, new: str) -> bool:
    """Whether `new` keeps every character of `old` in order (an edit that only inserts)."""
    it = iter(new)
    return all(ch in it for ch in old)


def insertions(old: str, new: str) -> list[tuple[int, str]]:
    """(position in the growing text, text) insertions that turn `old` into `new` (which must
    keep `old` as a subsequence): greedy left-to-right matching."""
    out: list[tuple[int, str]] = []
    i = 0
    pending = ""
    pos = 0
    for ch in new:
        if i < len(old) and ch == old[i]:
            if pending:
                out.append((pos - len(pending), pending))
                pending = ""
            i += 1
        else:
            pending += ch
        pos += 1
    if pending:
        out.append((pos - len(pending), pending))
    return out


class BlockDocument:
    """The Loro document of one block (text content, or a list of entries for a LOG block)."""

    def __init__(self, doc: LoroDoc | None = None) -> None:
        self.doc = doc or new_document()
        self.last_edit_id = ""  # the edit id of the latest local commit

    @classmethod
    def load(cls, snapshot: bytes | None, updates: list[bytes]) -> BlockDocument:
        doc = new_document()
        if snapshot:
            doc.import_(snapshot)
        document = cls(doc)
        document.import_updates(updates)
        return document

    def import_updates(self, blobs: list[bytes]) -> None:
        if blobs:
            self.doc.import_batch(blobs)

    # -- reading ------------------------------------------------------------------------------

    @property
    def text(self) -> LoroText:
        return self.doc.get_text(CONTENT)

    @property
    def entries_list(self) -> LoroList:
        return self.doc.get_list(ENTRIES)

    def content(self) -> str:
        return self.text.to_string()

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.entries_list.get_deep_value() or []:
            value = _decode(raw) if isinstance(raw, str) else {}
            if value:
                out.append(value)
        return out

    def snapshot(self) -> bytes:
        return self.doc.export(ExportMode.Snapshot())

    def size(self) -> int:
        """Characters counted against the limit: the content without its final line break (which
        Colony adds itself; a block of exactly `char_limit` characters fits)."""
        return len(self.content().removesuffix("\n"))

    def line_count(self) -> int:
        content = self.content()
        return content.count("\n") + (0 if not content or content.endswith("\n") else 1)

    # -- edits --------------------------------------------------------------------------------

    def _commit(self, meta: EditMeta, apply: Callable[[], None], delta: int) -> bytes:
        before = self.doc.oplog_vv
        apply()
        edit_id = self.last_edit_id = meta.edit_id or uuid.uuid4().hex[:16]
        self.doc.set_next_commit_message(meta.encode(edit_id, delta, self.size()))
        self.doc.set_next_commit_timestamp(int(time.time()))
        self.doc.commit()
        return self.doc.export(ExportMode.Updates(before))

    def create(self, content: str, meta: EditMeta) -> bytes:
        """Version 1 (a commit even when empty: the document records when it was created)."""

        content = as_lines(content)

        def apply() -> None:
            self.doc.get_map(META).insert("created", time.time())
            if content:
                self.text.insert(0, content)

        return self._commit(meta, apply, len(content))

    def append(self, text: str, meta: EditMeta) -> bytes:
        """Add `text` as a line at the end. Appended lines end with a line break, so appends made
        concurrently (even to an empty block) never run into one another."""
        current = self.content()
        glue = "\n" if current and not current.endswith("\n") else ""
        addition = glue + text + ("" if text.endswith("\n") else "\n")
        return self._commit(meta, lambda: self.text.insert(self.text.len_unicode, addition), len(addition))

    def replace(self, old: str, new: str, meta: EditMeta) -> bytes:
        current = self.content()
        if not old:
            raise BlockEditRejected("old_content is empty; give the exact text to replace")
        count = current.count(old)
        if count == 0:
            raise BlockEditRejected(
                "old_content does not occur in the block; copy the exact text (including spaces and "
                "line breaks) from the block as shown, or use memory_rethink to rewrite it"
            )
        if count > 1:
            raise BlockEditRejected(
                f"old_content occurs {count} times in the block; include more surrounding text so it "
                "matches exactly once"
            )
        at = current.index(old)
        result = current[:at] + new + current[at + len(old) :]
        if result and not result.endswith("\n"):  # the match ended the block: keep its final break
            new += "\n"

        def apply() -> None:
            self.text.delete(at, len(old))
            if new:
                self.text.insert(at, new)

        return self._commit(meta, apply, len(new) - len(old))

    def insert_line(self, text: str, line: int, meta: EditMeta) -> bytes:
        """Insert `text` as a line before line `line` (0 = top; -1 or the line count = the end)."""
        current = self.content()
        lines = current.split("\n") if current else []
        if lines and lines[-1] == "":  # the break after the last line starts no line
            lines.pop()
        if line == -1 or line == len(lines):
            return self.append(text, meta)
        if not 0 <= line < len(lines):
            raise BlockEditRejected(
                f"line {line} is outside the block (it has {len(lines)} lines: 0..{len(lines) - 1}, or -1 "
                "for the end)"
            )
        at = sum(len(x) + 1 for x in lines[:line])
        addition = text + ("" if text.endswith("\n") else "\n")
        return self._commit(meta, lambda: self.text.insert(at, addition), len(addition))

    def set_content(self, new: str, meta: EditMeta, *, inserts_only: bool = False) -> bytes:
        """Rewrite the whole content (a minimal diff: unchanged text keeps its identity, so edits
        made concurrently elsewhere in the block survive). `inserts_only` refuses any deletion."""
        new = as_lines(new)
        current = self.content()
        if inserts_only:
            if not is_subsequence(current, new):
                raise BlockAccessDenied(
                    "this edit deletes or changes existing text, and your access is append-only; "
                    "only add text (core_memory_append / memory_insert)"
                )

            def apply() -> None:
                for pos, piece in insertions(current, new):
                    self.text.insert(pos, piece)

            return self._commit(meta, apply, len(new) - len(current))
        return self._commit(meta, lambda: self._rewrite(new), len(new) - len(current))

    def _rewrite(self, new: str) -> None:
        """A minimal character diff when it is quick, else a line diff (Myers' diff of two large,
        unrelated texts took tens of seconds on the event loop)."""
        try:
            self.text.update(new, timeout_ms=REWRITE_DIFF_MS)
        except ValueError as exc:  # Loro's "Timeout": nothing was applied
            if "timeout" not in str(exc).lower():
                raise
            self.text.update_by_line(new)

    def log_append(self, entry: dict[str, Any], max_entries: int, meta: EditMeta) -> bytes:
        raw = json.dumps(entry, separators=(",", ":"), default=str)

        def apply() -> None:
            entries = self.entries_list
            entries.push(raw)
            excess = len(entries) - max_entries
            if excess > 0:
                entries.delete(0, excess)

        return self._commit(meta, apply, len(raw))

    # -- history --------------------------------------------------------------------------------
    #
    # Version numbers come from Redis, not from the document: the block's `ver` list holds edit ids
    # in the order their updates were appended to the log (version = base + position + 1). An
    # update is appended only by a process whose document held every update before it, so that
    # order is causal, and every replica numbers every edit the same, forever.

    def groups(self) -> dict[str, _Group]:
        """The document's edits by edit id (those folded into a shallow root are gone)."""
        spans = self.doc.oplog_vv.to_spans().inner
        spans = spans() if callable(spans) else spans
        since = self.doc.shallow_since_vv if self.doc.is_shallow() else None
        groups: dict[str, _Group] = {}
        for peer, (start, end) in spans.items():
            counter = start
            if since is not None:
                last = since.get_last(peer)
                counter = max(start, last if last is not None else start)
            misses = 0
            while counter < end:
                change = self.doc.get_change(ID(peer, counter))
                if change is None:  # folded into the shallow root: look a little further
                    counter += 1
                    misses += 1
                    if misses > 4:
                        break
                    continue
                first = change.id.counter
                last_counter = first + change.len - 1
                meta = _decode(change.message)
                key = str(meta.get("e") or f"{peer}:{first}")
                group = groups.get(key)
                if group is None:
                    groups[key] = _Group(meta, change.lamport, peer, [(peer, first, last_counter)])
                else:
                    group.spans.append((peer, first, last_counter))
                counter = last_counter + 1
        return groups

    def chars_after(self, edit_id: str) -> int | None:
        """The block's characters right after edit `edit_id` (recorded in its commit message);
        None when the document does not hold that edit or it predates the record."""
        group = self.groups().get(edit_id)
        chars = group.meta.get("c") if group is not None else None
        return chars if isinstance(chars, int) else None

    def versions(self, order: list[str], base: int) -> list[BlockVersion]:
        """The versions of `order` (edit ids in log order, the first numbered base + 1)."""
        groups = self.groups()
        out = []
        for number, edit_id in enumerate(order, start=base + 1):
            group = groups.get(edit_id)
            if group is None:
                continue
            meta = group.meta
            out.append(
                BlockVersion(
                    version=number,
                    edit_id=edit_id,
                    author=str(meta.get("by", "unknown")),
                    via=str(meta.get("via", "")),
                    op=str(meta.get("op", "")),
                    message=str(meta.get("msg", "")),
                    timestamp=float(meta.get("t", 0) or 0),
                    chars_delta=int(meta.get("d", 0) or 0),
                )
            )
        return out

    def _without(self, later: list[str], groups: dict[str, _Group]) -> Frontiers:
        """The document's head without the edits `later` (and what depends on them: nothing,
        as they come last in causal order)."""
        vv = self.doc.oplog_vv
        ends: dict[int, int] = {}
        for edit_id in later:
            group = groups.get(edit_id)
            for peer, first, _last in group.spans if group else []:
                ends[peer] = min(first, ends.get(peer, first))
        for peer, end in ends.items():
            vv.set_end(ID(peer, end))
        return self.doc.vv_to_frontiers(vv)

    def frontier_of(self, version: int, order: list[str], base: int) -> Frontiers:
        index = version - base
        if index < 1 or index > len(order):
            raise BlockNotFound(
                f"version {version} is not in this block's history (viewable: {base + 1}.."
                f"{base + len(order)})"
            )
        return self._without(order[index:], self.groups())

    def view(self, version: int, order: list[str], base: int) -> tuple[str, list[dict[str, Any]]]:
        """Content and entries at `version` (the document returns to its head afterwards)."""
        frontier = self.frontier_of(version, order, base)
        self.doc.checkout(frontier)
        try:
            return self.content(), self.entries()
        finally:
            self.doc.checkout_to_latest()

    def rollback(self, version: int, meta: EditMeta, order: list[str], base: int) -> bytes:
        """A new commit whose content is `version`'s (history kept: nothing is rewritten)."""
        frontier = self.frontier_of(version, order, base)
        old, _ = self.view(version, order, base)
        return self._commit(meta, lambda: self.doc.revert_to(frontier), len(old) - len(self.content()))

    def undo_last_of(self, author: str, meta: EditMeta, order: list[str]) -> bytes:
        """Undo `author`'s latest edit (not the creation, not an undo, not undone already) and keep
        everything others did, before or after it: Loro's UndoManager inverts that edit
        transformed over the rest. `order`: the block's edit ids in log order."""
        groups = self.groups()
        undone = {str(g.meta.get("undoes")) for g in groups.values() if g.meta.get("undoes")}
        target_index = None
        for index in range(len(order) - 1, -1, -1):
            g = groups.get(order[index])
            if (
                g is not None
                and g.meta.get("by") == author
                and order[index] not in undone
                and g.meta.get("op") not in ("create", "undo")
            ):
                target_index = index
                break
        if target_index is None:
            raise BlockEditRejected(
                f"{author} has no edit of this block left to undo in its kept history (versions older than "
                "the oldest viewable one were folded away; use rollback to an older kept version instead)"
            )
        target = groups[order[target_index]]
        before = self._without(order[target_index:], groups)
        after = self._without(order[target_index + 1 :], groups)
        head = self.doc.oplog_frontiers
        # replay: the state before the edit, the edit as a local (undoable) change, the rest as
        # excluded-origin changes; undo then yields head minus that edit
        self.doc.checkout(before)
        try:
            base_text = self.content()
            base_entries = list(self.entries_list.get_deep_value() or [])
        finally:
            self.doc.checkout_to_latest()
        replay = new_document()
        if base_text:
            replay.get_text(CONTENT).insert(0, base_text)
        for raw in base_entries:
            replay.get_list(ENTRIES).push(raw)
        replay.commit()
        manager = UndoManager(replay)
        manager.add_exclude_origin_prefix(REST_ORIGIN)
        replay.apply_diff(self.doc.diff(before, after))
        replay.commit()
        replay.apply_diff(self.doc.diff(after, head))
        replay.commit_with(origin=REST_ORIGIN)
        if replay.get_text(CONTENT).to_string() != self.content():
            raise BlockEditRejected("the block's history could not be replayed for undo; use rollback")
        replay_head = replay.oplog_frontiers
        if not manager.undo():
            raise BlockEditRejected("that edit has nothing left to undo (later edits replaced it)")
        replay.commit()
        inverse = replay.diff(replay_head, replay.oplog_frontiers)
        edit_id = str(target.meta.get("e"))
        tagged = EditMeta(meta.author, meta.via, "undo", meta.message or f"undo {edit_id}")
        new_text = replay.get_text(CONTENT).to_string()
        before_vv = self.doc.oplog_vv
        delta = len(new_text) - len(self.content())
        self.doc.apply_diff(inverse)
        message = json.loads(tagged.encode(meta.edit_id or uuid.uuid4().hex[:16], delta, self.size()))
        message["undoes"] = edit_id
        self.doc.set_next_commit_message(json.dumps(message, separators=(",", ":")))
        self.doc.set_next_commit_timestamp(int(time.time()))
        self.doc.commit()
        self.last_edit_id = str(message["e"])
        return self.doc.export(ExportMode.Updates(before_vv))

    # -- compaction -----------------------------------------------------------------------------

    def compacted(self, order: list[str], keep_versions: int) -> tuple[bytes, int]:
        """A snapshot to store and how many versions of `order` it folds away: a full snapshot,
        or a shallow one whose root is the oldest version kept when `order` is longer than
        `keep_versions` (only over edits this document holds)."""
        groups = self.groups()
        known = 0
        while known < len(order) and order[known] in groups:
            known += 1
        drop = min(len(order) - keep_versions, known - 1)
        if drop <= 0:
            return self.snapshot(), 0
        root = self._without(order[drop + 1 :], groups)  # the state of the oldest version kept
        return self.doc.export(ExportMode.ShallowSnapshot(root)), drop


def raised_by_loro(exc: BaseException) -> bool:
    """Whether `exc` is an error Loro raised (its Python binding raises plain BaseException and
    pyo3 panics), as opposed to cancellation or exit, which must pass through untouched."""
    return not isinstance(
        exc, Exception | asyncio.CancelledError | KeyboardInterrupt | SystemExit | GeneratorExit
    )
