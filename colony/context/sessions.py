"""Sessions: the conversation tree of one session agent, stored in that agent's own AGENT scope.

One entry per message (`SessionProtocol.message_key(id)`, written once, never changed) and one tree
head (`SessionProtocol.tree_key()`: branches, the active one, each message's parent). Both the API
process (revert, fork, switch) and the session agent (the user's message and the reply) change the
head, so every change is a compare-and-set on its version (`Blackboard.update`) that re-applies
the change to the newest head when it loses a race. Keys are built only from ids this module
generates (`new_message_id`, `new_session_id`), digests of an action's idempotency key
(`message_id_for`: a turn action re-executed after a crash finds its message stored, not a second
one), or ids that match their pattern.

Bounds (settings.context): messages per session, characters per message, branches per session.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from colony import metrics
from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.blackboard.protocol import SessionProtocol
from colony.config import ContextSettings
from colony.context.tree import (
    Branch,
    Message,
    Role,
    TreeHead,
    TurnUsage,
    add_message,
    fork,
    is_message_id,
    linearize,
    new_message_id,
    revert_to_message,
    switch_branch,
)
from colony.errors import ConcurrentModificationError, InvalidArgument, MessageNotFound

# another tenant's sessions carry its prefix (colony.wire.tenants): `t.<tenant>.session-<16 hex>`
SESSION_ID_PATTERN = r"^(?:t\.[a-z0-9][a-z0-9-]{0,31}\.)?session-[0-9a-f]{16}$"
SESSION_ROLE = "session"  # the role of every per-session agent (the catalog's `session` spawns them)
WRITER = "session"
READ_CHUNK = 500  # messages read per round trip when listing a whole tree

_SESSION_ID = re.compile(SESSION_ID_PATTERN)
T = TypeVar("T")


def new_session_id() -> str:
    return f"session-{secrets.token_hex(8)}"


def is_session_id(text: str) -> bool:
    return bool(_SESSION_ID.match(text))


def session_scope(session_id: str, *, tenant_id: str, colony_id: str) -> str:
    """The AGENT scope of the session's agent (the session id is its agent id)."""
    if not is_session_id(session_id):
        raise InvalidArgument(
            f"{session_id[:80]!r} is not a session id (session-<16 hex digits>, with its tenant's prefix)"
        )
    return scope_id(BlackboardScope.AGENT, tenant_id=tenant_id, colony_id=colony_id, agent_id=session_id)


class SessionStore:
    """One session's conversation tree over the blackboard scope of its agent."""

    def __init__(self, board: Blackboard, settings: ContextSettings | None = None) -> None:
        self.board = board
        self.settings = settings or ContextSettings()

    @classmethod
    def of(
        cls,
        root: Blackboard,
        session_id: str,
        *,
        tenant_id: str,
        colony_id: str,
        settings: ContextSettings | None = None,
    ) -> SessionStore:
        return cls(root.scoped(session_scope(session_id, tenant_id=tenant_id, colony_id=colony_id)), settings)

    async def head(self) -> TreeHead:
        """The tree head; an empty tree (no branch, no message) when none was written yet."""
        entry = await self.board.read(SessionProtocol.tree_key())
        return TreeHead() if entry is None else entry.value_as(TreeHead)

    async def create(self) -> TreeHead:
        """Write the empty tree of a new session (create-only: an existing tree is kept)."""
        entry = await self.board.read(SessionProtocol.tree_key())
        if entry is not None:
            return entry.value_as(TreeHead)
        head = TreeHead()
        try:
            await self.board.write(
                SessionProtocol.tree_key(),
                head.model_dump(mode="json"),
                created_by=WRITER,
                expected_version=0,
            )
        except ConcurrentModificationError:
            return await self.head()  # written by a concurrent create: that one stands
        return head

    async def _change(self, change: Callable[[TreeHead], T]) -> tuple[TreeHead, T]:
        """Apply `change` to the newest head and store it, redone on the head a concurrent writer
        left when it loses the race; the head written and what `change` returned."""
        box: dict[str, Any] = {}

        def apply(value: Any) -> Any:
            head = TreeHead() if value is None else TreeHead.model_validate(value)
            box["result"] = change(head)
            box["head"] = head
            return head.model_dump(mode="json")

        await self.board.update(SessionProtocol.tree_key(), apply, created_by=WRITER)
        return box["head"], box["result"]

    async def add(
        self,
        role: Role,
        content: str,
        *,
        parent_id: str | None = None,
        run_id: str | None = None,
        message_id: str | None = None,
        usage: TurnUsage | None = None,
    ) -> Message:
        """Store a message under `parent_id` (default: the active leaf) and link it into the tree
        (see `tree.add_message` for which branches move to it).

        `message_id` (one derived from an action's idempotency key, `tree.message_id_for`) makes
        the add idempotent: the entry is written create-only, and when an earlier attempt already
        stored it (an action re-executed after a crash) that stored message is returned, linked
        once (linked now if the earlier attempt was cut off between storing and linking)."""
        limit = self.settings.session_max_message_chars
        if not content.strip():
            raise InvalidArgument("a message needs some text")
        if len(content) > limit:
            raise InvalidArgument(
                f"the message has {len(content)} characters; at most {limit} "
                "(context.session_max_message_chars)"
            )
        if message_id is None:
            message_id = new_message_id()
        elif not is_message_id(message_id):
            raise InvalidArgument(f"{message_id[:80]!r} is not a message id (msg-<12 hex digits>)")
        message = Message(id=message_id, role=role, content=content, run_id=run_id, usage=usage)
        key = SessionProtocol.message_key(message_id)
        # stored first, linked second: whatever the head lists is readable. A link the tree refuses
        # (its message limit, an unknown parent) takes the stored message back out; any other
        # failure leaves it (found by review: a timeout after Redis saved the head left the head
        # naming a message taken out, and the session broken; a stored message no head names is
        # harmless, and the same id sent again links it).
        try:
            await self.board.write(
                key,
                message.model_dump(mode="json", exclude={"parent_id"}),
                created_by=WRITER,
                expected_version=0,
            )
            created = True
        except ConcurrentModificationError:
            message = await self._stored(message_id, role, run_id)
            created = False
        box: dict[str, bool] = {}

        def link(head: TreeHead) -> str | None:
            box["linked"] = message_id not in head.parents
            if not box["linked"]:
                return head.parents[message_id]  # an earlier attempt linked it: once is enough
            try:
                return add_message(
                    head, message_id, parent_id=parent_id, max_messages=self.settings.session_max_messages
                )
            except Exception:
                box["refused"] = True
                raise

        try:
            _, parent = await self._change(link)
        except BaseException:
            if created and box.get("refused"):
                with contextlib.suppress(Exception):
                    await self.board.delete(key)
            raise
        if box.get("linked"):
            metrics.SESSION_MESSAGES.labels(role).inc()
        return message.model_copy(update={"parent_id": parent})

    async def _stored(self, message_id: str, role: Role, run_id: str | None) -> Message:
        """The message an earlier attempt stored under `message_id`, checked to be that attempt's
        (same role and turn): anything else is a corrupt tree, refused rather than reused."""
        entry = await self.board.read(SessionProtocol.message_key(message_id))
        if entry is None:  # taken back out by an attempt whose link was refused, just now
            raise InvalidArgument(
                f"message {message_id!r} was being stored by another attempt; send the message again"
            )
        message = Message.model_validate({**entry.value, "parent_id": None})
        if message.role != role or message.run_id != run_id:
            raise InvalidArgument(
                f"message {message_id!r} is already stored for another turn ({message.role}, "
                f"run {message.run_id}); the session's tree is inconsistent"
            )
        return message

    async def stored(self, message_id: str) -> Message | None:
        """The message stored under `message_id` (linked in the tree or not yet), else None."""
        entry = await self.board.read(SessionProtocol.message_key(message_id))
        if entry is None:
            return None
        head = await self.head()
        return Message.model_validate({**entry.value, "parent_id": head.parents.get(message_id)})

    async def latest_summary(self, ids: Sequence[str]) -> tuple[int, dict[str, Any]] | None:
        """The stored summary of the longest path among those ending at `ids` (a path's messages,
        oldest first; colony.context.chat_summary): its index in `ids` and its record. Read from the
        newest back, READ_CHUNK at a time, so a long path costs one round trip when it is summarised."""
        for end in range(len(ids), 0, -READ_CHUNK):
            start = max(end - READ_CHUNK, 0)
            chunk = list(ids[start:end])
            keys = [SessionProtocol.summary_key(i) for i in chunk if is_message_id(i)]
            entries = iter(await self.board.read_many(keys))
            held = [next(entries) if is_message_id(i) else None for i in chunk]
            for offset in range(len(chunk) - 1, -1, -1):
                entry = held[offset]
                if entry is not None and isinstance(entry.value, dict):
                    return start + offset, entry.value
        return None

    async def keep_summary(self, message_id: str, record: dict[str, Any]) -> None:
        """Store the summary of the path ending at `message_id` (a stored message's id)."""
        if not is_message_id(message_id):
            raise InvalidArgument(f"{message_id[:40]!r} is not a message id")
        await self.board.write(SessionProtocol.summary_key(message_id), record, created_by=WRITER)

    async def revert(self, message_id: str) -> TreeHead:
        head, _ = await self._change(lambda h: revert_to_message(h, message_id))
        return head

    async def fork(self, message_id: str, name: str | None = None) -> tuple[TreeHead, Branch]:
        return await self._change(
            lambda h: fork(h, message_id, name=name, max_branches=self.settings.session_max_branches)
        )

    async def switch(self, name: str) -> TreeHead:
        head, _ = await self._change(lambda h: switch_branch(h, name))
        return head

    async def messages(self, head: TreeHead, ids: Sequence[str]) -> list[Message]:
        """The messages of `ids` (linked in `head`), in order, each with its parent from `head`."""
        found: list[Message] = []
        for start in range(0, len(ids), READ_CHUNK):
            chunk = list(ids[start : start + READ_CHUNK])
            entries = await self.board.read_many([SessionProtocol.message_key(i) for i in chunk])
            for message_id, entry in zip(chunk, entries, strict=True):
                if entry is None:
                    raise MessageNotFound(
                        f"message {message_id!r} is linked in the session's tree but not stored"
                    )
                message = Message.model_validate({**entry.value, "parent_id": head.parents.get(message_id)})
                found.append(message)
        return found

    async def added_by(self, run_id: str, role: Role, *, newest: int = 50) -> Message | None:
        """The newest message of `role` that run `run_id` added, among the `newest` messages."""
        head = await self.head()
        recent = list(head.parents)[-newest:]
        for message in reversed(await self.messages(head, recent)):
            if message.run_id == run_id and message.role == role:
                return message
        return None

    async def path(self, leaf_id: str | None) -> list[Message]:
        """The messages from the root to `leaf_id`, oldest first."""
        head = await self.head()
        return await self.messages(head, linearize(head, leaf_id))

    async def transcript(self) -> tuple[TreeHead, list[Message]]:
        """The active branch's messages (what the session agent's model sees); empty without one."""
        head = await self.head()
        if head.active is None:
            return head, []
        return head, await self.messages(head, linearize(head, head.active_leaf()))

    async def listing(
        self, *, all: bool = False, offset: int = 0, limit: int | None = None
    ) -> tuple[TreeHead, int, list[Message]]:
        """One page of a listing: the active branch's path (oldest first) or, with `all`, every
        message in the order added; `offset` messages skipped, at most `limit` returned. Returns
        the head, the listing's whole length, and the page (only the page's entries are read)."""
        head = await self.head()
        if all:
            ids = list(head.parents)
        else:
            ids = [] if head.active is None else linearize(head, head.active_leaf())
        end = None if limit is None else offset + limit
        return head, len(ids), await self.messages(head, ids[offset:end])

    async def all_messages(self) -> tuple[TreeHead, list[Message]]:
        """Every message of the tree, in the order they were added (reverted ones included)."""
        head = await self.head()
        return head, await self.messages(head, list(head.parents))
