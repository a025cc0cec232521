"""One block's Loro document: its content, its edits as Loro commits, its history.

Every edit is one Loro commit whose message (JSON) names the edit id, author, channel, operation and
note, so history, authorship and selective undo come from the document itself. Edits check their
preconditions (unique match, line in range, append-only) before touching the document, so a
refused edit changes nothing. Versions are the document's commits in causal (Lamport) order,
numbered from 1 (the creation); a shallow snapshot folds the oldest ones away (`base_version`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loro import ID, ExportMode, Frontiers, LoroDoc, LoroList, LoroText, UndoManager, VersionVector

from colony.errors import BlockAccessDenied, BlockEditRejected, BlockNotFound
from colony.memory.blocks.types import BlockVersion

CONTENT = "content"
ENTRIES = "entries"
META = "meta"
REST_ORIGIN = "colony:rest"  # the undo replay's "other edits": not recorded by the UndoManager


@dataclass(frozen=True)
class EditMeta:
    """Who made an edit, how, and why (stored as the Loro commit message)."""

    author: str
    via: str
    op: str
    message: str = ""

    def encode(self, edit_id: str, delta: int) -> str:
        return json.dumps(
            {
                "e": edit_id,
                "by": self.author,
                "via": self.via,
                "op": self.op,
                "msg": self.message[:500],
                "t": round(time.time(), 6),
                "d": delta,
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
        return len(self.content())

    # -- edits --------------------------------------------------------------------------------

    def _commit(self, meta: EditMeta, apply: Callable[[], None], delta: int) -> bytes:
        before = self.doc.oplog_vv
        apply()
        edit_id = uuid.uuid4().hex[:16]
        self.doc.set_next_commit_message(meta.encode(edit_id, delta))
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
        return self._commit(meta, lambda: self.text.update(new), len(new) - len(current))

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

    def _groups(self) -> list[_Group]:
        spans = self.doc.oplog_vv.to_spans().inner
        spans = spans() if callable(spans) else spans
        shallow = self.doc.is_shallow()
        since = self.doc.shallow_since_vv if shallow else None
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
                    group.lamport = min(group.lamport, change.lamport)
                counter = last_counter + 1
        return sorted(groups.values(), key=lambda g: (g.lamport, g.peer))

    def versions(self, base_version: int = 0) -> list[BlockVersion]:
        out = []
        for number, group in enumerate(self._groups(), start=base_version + 1):
            meta = group.meta
            out.append(
                BlockVersion(
                    version=number,
                    edit_id=str(meta.get("e", "")),
                    author=str(meta.get("by", "unknown")),
                    via=str(meta.get("via", "")),
                    op=str(meta.get("op", "")),
                    message=str(meta.get("msg", "")),
                    timestamp=float(meta.get("t", 0) or 0),
                    chars_delta=int(meta.get("d", 0) or 0),
                )
            )
        return out

    def head_version(self, base_version: int = 0) -> int:
        """The head's version number: one Loro change per edit (merging is off and every commit
        message is unique), so the change count is the version count without walking history."""
        return base_version + self.doc.len_changes

    def _frontier(self, groups: list[_Group]) -> Frontiers:
        vv = VersionVector()
        if self.doc.is_shallow():
            vv.merge(self.doc.shallow_since_vv)
        for group in groups:
            for peer, _first, last in group.spans:
                vv.extend_to_include_last_id(ID(peer, last))
        return self.doc.vv_to_frontiers(vv)

    def frontier_of(self, version: int, base_version: int = 0) -> Frontiers:
        groups = self._groups()
        index = version - base_version
        if index < 1 or index > len(groups):
            raise BlockNotFound(
                f"version {version} is not in this block's history (viewable: {base_version + 1}.."
                f"{base_version + len(groups)})"
            )
        return self._frontier(groups[:index])

    def view(self, version: int, base_version: int = 0) -> tuple[str, list[dict[str, Any]]]:
        """Content and entries at `version` (the document returns to its head afterwards)."""
        frontier = self.frontier_of(version, base_version)
        self.doc.checkout(frontier)
        try:
            return self.content(), self.entries()
        finally:
            self.doc.checkout_to_latest()

    def rollback(self, version: int, meta: EditMeta, base_version: int = 0) -> bytes:
        """A new commit whose content is `version`'s (history kept: nothing is rewritten)."""
        frontier = self.frontier_of(version, base_version)
        old, _ = self.view(version, base_version)
        return self._commit(meta, lambda: self.doc.revert_to(frontier), len(old) - len(self.content()))

    def undo_last_of(self, author: str, meta: EditMeta) -> tuple[bytes, int]:
        """Undo `author`'s latest edit (not an undo itself already undone) and keep everything
        others did, before or after it: Loro's UndoManager inverts that edit transformed over the
        rest. Returns the update and the version number undone (relative to the first kept)."""
        groups = self._groups()
        undone = {str(g.meta.get("undoes")) for g in groups if g.meta.get("undoes")}
        target_index = None
        for index in range(len(groups) - 1, -1, -1):
            g = groups[index]
            if (
                g.meta.get("by") == author
                and str(g.meta.get("e")) not in undone
                and g.meta.get("op") not in ("create", "undo")
            ):
                target_index = index
                break
        if target_index is None:
            raise BlockEditRejected(f"{author} has no edit of this block left to undo")
        target = groups[target_index]
        before = self._frontier(groups[:target_index])
        after_vv = VersionVector()
        if self.doc.is_shallow():
            after_vv.merge(self.doc.shallow_since_vv)
        for g in groups[:target_index]:
            for peer, _f, last in g.spans:
                after_vv.extend_to_include_last_id(ID(peer, last))
        for peer, _f, last in target.spans:
            after_vv.extend_to_include_last_id(ID(peer, last))
        after = self.doc.vv_to_frontiers(after_vv)
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
        self.doc.apply_diff(inverse)
        message = json.loads(tagged.encode(uuid.uuid4().hex[:16], len(new_text) - len(self.content())))
        message["undoes"] = edit_id
        self.doc.set_next_commit_message(json.dumps(message, separators=(",", ":")))
        self.doc.set_next_commit_timestamp(int(time.time()))
        self.doc.commit()
        return self.doc.export(ExportMode.Updates(before_vv)), target_index

    # -- compaction -----------------------------------------------------------------------------

    def compacted(self, keep_versions: int) -> tuple[bytes, int]:
        """A snapshot to store, and how many versions it folded away: a full snapshot, or a
        shallow one starting `keep_versions` before the head when history is longer."""
        groups = self._groups()
        if len(groups) <= keep_versions:
            return self.snapshot(), 0
        root_index = len(groups) - keep_versions  # this group's state becomes the shallow root
        frontier = self._frontier(groups[: root_index + 1])
        return self.doc.export(ExportMode.ShallowSnapshot(frontier)), root_index
