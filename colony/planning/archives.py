"""Archived history: what compaction stores aside, by reference, and reads back.

An action output or event value longer than `context.mask_output_chars`, and every span of history
summarised away, is written under `AgentStateProtocol.archived_output_key(ref)` (`ref`: 16 hex of
its SHA-256) with the `runs.retention_seconds` expiry; the prompt, policy state and checkpoints keep
a preview and the reference, and the `recall_archived(ref)` action reads it back a page at a time.
Refs are validated by pattern before any lookup, and only the agent's own scope is read.
`ArchivedHistory` is the part of `colony.planning.compaction.Compactor` that does this.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from typing import TYPE_CHECKING, Any

from colony.agents.models import ActionResult
from colony.blackboard.protocol import AgentStateProtocol as Keys

if TYPE_CHECKING:
    from colony.config import ContextSettings
    from colony.planning.compaction import CompactionState
    from colony.planning.policies import EventDrivenActionPolicy

log = logging.getLogger(__name__)
RECALL = "recall_archived"
REF_PATTERN = r"^[0-9a-f]{16}$"
_REF = re.compile(REF_PATTERN)
RECALL_CHARS = 400  # most characters one recall returns (page on with `offset`); fits a call preview
PREVIEW_CHARS = 200  # what a masked output keeps in the prompt
MAX_ARCHIVES = 128  # archived outputs/spans an agent keeps (the oldest are deleted)


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)


def ref_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def agent_label(policy: EventDrivenActionPolicy) -> str:
    """The policy's agent's id, for log lines ("-" without an agent)."""
    agent = policy.agent
    return agent.agent_id if agent is not None else "-"


def masked_text(ref: str, text: str) -> str:
    """What stands in for an archived text: the reference first (a formatter that truncates keeps
    it), then the start of the text."""
    return (
        f"[{len(text)} characters archived as ref {ref}; {RECALL}(ref) reads them] {text[:PREVIEW_CHARS]}..."
    )


class ArchivedHistory:
    """Archives of one policy's history (mixed into `Compactor`, whose state lists them)."""

    state: CompactionState
    policy: EventDrivenActionPolicy
    pinned_keys: frozenset[str]
    _unsaved: dict[str, dict[str, Any]]
    _refreshed_at: float

    settings: ContextSettings  # Compactor's (a property there)

    def _remember(self, ref: str, record: dict[str, Any]) -> None:
        self._unsaved[ref] = record
        if ref in self.state.archives:
            self.state.archives.remove(ref)
        self.state.archives.append(ref)

    async def flush_archives(self) -> None:
        """Write the archives masked since the last flush, and delete those past the cap. A failed
        write loses only the original (the view already holds its preview)."""
        agent = self.policy.agent
        unsaved, self._unsaved = self._unsaved, {}
        # archives the policy still needs whole (a large last output that may become the run's
        # output) are the newest, never expired past MAX_ARCHIVES
        held = [r for r in self.policy.held_archive_refs() if r in self.state.archives]
        if held:
            self.state.archives = [r for r in self.state.archives if r not in held] + held
        expired = self.state.archives[:-MAX_ARCHIVES]
        del self.state.archives[:-MAX_ARCHIVES]
        if agent is None:
            return
        ttl = agent.retention_seconds
        for ref, record in unsaved.items():
            try:
                await agent.blackboard.write(
                    Keys.archived_output_key(ref), record, created_by=agent.agent_id, ttl_seconds=ttl
                )
            except Exception as exc:
                log.warning("agent %s: archive %s not written: %r", agent.agent_id, ref, exc)
        if time.monotonic() - self._refreshed_at > ttl / 4 and self.state.archives:
            # the view's archives live on while it lists them; one no view lists (written after a
            # checkpoint that was restored since) expires with its TTL
            try:
                keys = [Keys.archived_output_key(r) for r in self.state.archives]
                await agent.blackboard.refresh(keys, ttl)
                self._refreshed_at = time.monotonic()
            except Exception as exc:
                log.warning("agent %s: archive expiries not refreshed: %r", agent.agent_id, exc)
        for ref in expired:
            try:
                await agent.blackboard.delete(Keys.archived_output_key(ref))
            except Exception as exc:
                log.warning("agent %s: old archive %s not deleted: %r", agent.agent_id, ref, exc)

    def archived_value(self, value: Any) -> dict[str, Any] | None:
        """How a value longer than `mask_output_chars` is held in policy state instead of whole: its
        archive ref (the one `mask_call` archives it under), whether it was JSON, its size and a
        preview. None for a short value (kept as is)."""
        text = as_text(value)
        if len(text) <= self.settings.mask_output_chars:
            return None
        return {
            "ref": ref_of(text),
            "json": not isinstance(value, str),
            "chars": len(text),
            "preview": text[:PREVIEW_CHARS],
        }

    async def read_archived_value(self, held: dict[str, Any]) -> Any:
        """The value `archived_value` referenced, read back whole from its archive (JSON decoded
        when it was JSON); the masked preview, with a warning, when the archive is gone."""
        ref = held.get("ref")
        agent = self.policy.agent
        entry = None
        if isinstance(ref, str) and _REF.match(ref) and agent is not None:
            entry = await agent.blackboard.read(Keys.archived_output_key(ref))
        if entry is not None and isinstance(entry.value, dict) and isinstance(entry.value.get("text"), str):
            text = entry.value["text"]
            if not held.get("json"):
                return text
            try:
                return json.loads(text)
            except ValueError:
                return text
        log.warning(
            "agent %s: archived output %s is gone; the run's output is its preview",
            agent_label(self.policy),
            ref,
        )
        return masked_text(str(ref), str(held.get("preview", "")))

    def mask_call(self, call: dict[str, Any]) -> dict[str, Any]:
        """A call record whose output (or error) is longer than `mask_output_chars`, with the
        original set aside to archive and a preview plus its reference in its place."""
        limit = self.settings.mask_output_chars
        masked = dict(call)
        for field in ("output", "error"):
            value = call.get(field)
            if value is None:
                continue
            text = as_text(value)
            if len(text) <= limit:
                continue
            if field == "output":
                masked = self._masked_output(masked, text)
            else:
                ref = self._archive_text(text, "error", call.get("action_key"))
                masked["error"] = masked_text(ref, text)
        return masked

    def mask_event(self, contexts: dict[str, Any]) -> dict[str, Any]:
        """An event's contexts as the streams record them: a value longer than
        `mask_output_chars` (a 40,000-character chat message) is archived and a preview with its
        reference stands in (in a dict value, each long text field is, so a formatter still finds
        its `message`; a dict still long after that, or a long list, is archived whole). Values of
        pinned keys stay verbatim."""
        limit = self.settings.mask_output_chars
        masked: dict[str, Any] = {}
        for key, value in contexts.items():
            if key in self.pinned_keys or len(as_text(value)) <= limit:
                masked[key] = value
                continue
            if isinstance(value, dict):
                fields = {
                    name: self._mask_text(field, key)
                    if isinstance(field, str) and len(field) > limit
                    else field
                    for name, field in value.items()
                }
                if len(as_text(fields)) <= limit + (PREVIEW_CHARS + 100) * len(fields):
                    masked[key] = fields
                    continue
            masked[key] = self._mask_text(as_text(value), key)
        return masked

    def _mask_text(self, text: str, key: str) -> str:
        return (
            text
            if len(text) <= self.settings.mask_output_chars
            else masked_text(self._archive_text(text, "event", key), text)
        )

    def _archive_text(self, text: str, kind: str, action: Any) -> str:
        ref = ref_of(text)
        self._remember(ref, {"kind": kind, "action": str(action)[:200], "text": text, "at": time.time()})
        return ref

    def _masked_output(self, call: dict[str, Any], text: str) -> dict[str, Any]:
        """The call with its output archived: a preview and the reference stand in for it."""
        ref = self._archive_text(text, "output", call.get("action_key"))
        return {
            **call,
            "output": {"archived": ref, "chars": len(text), "preview": text[:PREVIEW_CHARS]},
            "output_preview": masked_text(ref, text),
        }

    async def recall(self, parameters: dict[str, Any]) -> ActionResult:
        """The `recall_archived` action: a page of an archived output or history span."""
        ref, offset = parameters.get("ref"), parameters.get("offset", 0)
        if not isinstance(ref, str) or not _REF.match(ref):
            return ActionResult(success=False, error=f"{RECALL}: ref must be 16 hex characters, as shown")
        if not isinstance(offset, int) or offset < 0:
            return ActionResult(success=False, error=f"{RECALL}: offset must be a whole number >= 0")
        agent = self.policy.agent
        entry = await agent.blackboard.read(Keys.archived_output_key(ref)) if agent is not None else None
        if entry is None or not isinstance(entry.value, dict):
            return ActionResult(success=False, error=f"{RECALL}: no archive {ref} (it may have been dropped)")
        text = str(entry.value.get("text", ""))
        size = min(RECALL_CHARS, self.settings.mask_output_chars)
        page = text[offset : offset + size]
        more = offset + size < len(text)
        tail = f" [{len(text) - offset - size} more characters: offset={offset + size}]" if more else ""
        return ActionResult(success=True, output=page + tail)
