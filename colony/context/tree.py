"""A session's conversation tree: messages linked to their parents, named branches each pointing at
a leaf, and one active branch whose path from the root is what the session agent's model sees.

Reverting moves the active branch's leaf back to an earlier message and forking starts a new branch
at one; neither deletes anything, so every reply ever written stays listed (`?all=true`) while the
prompt holds only the active path ("the tree never leaks" another branch's messages).

This module is pure (no I/O): `TreeHead` is the tree's shape (branches, the active one, each
message's parent) and the functions below change it or raise the typed error a user can act on.
The Redis store (colony.context.sessions) applies them under optimistic concurrency, so the API
process and the session agent can both change one tree.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import Literal

from pydantic import BaseModel, Field

from colony.errors import InvalidArgument, MessageNotFound, NoActiveBranch

MESSAGE_ID_PATTERN = r"^msg-[0-9a-f]{12}$"
BRANCH_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
MAIN_BRANCH = "main"
Role = Literal["user", "assistant", "system"]

_MESSAGE_ID = re.compile(MESSAGE_ID_PATTERN)
_BRANCH = re.compile(BRANCH_PATTERN)


def new_message_id() -> str:
    """A fresh message id (generated here, never taken from input: it becomes part of a key)."""
    return f"msg-{secrets.token_hex(6)}"


def message_id_for(idempotency_key: str) -> str:
    """The id of the message an action with this idempotency key adds: the same on every
    re-execution of the action (colony.agents.state.action_log), so a re-executed turn finds the message
    it stored the first time instead of adding it twice. A digest, so the key's text never reaches
    a Redis key."""
    return f"msg-{hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]}"


def is_message_id(text: str) -> bool:
    return bool(_MESSAGE_ID.match(text))


class TurnUsage(BaseModel):
    """The engine's token counts for the turn that wrote a reply, and why the reply ended."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    finish_reason: Literal["stop", "length", "loop"] = "stop"


class Message(BaseModel):
    """One message of the tree, stored under its own key; `parent_id` is the tree head's (the
    stored entry is written before it is linked, so the head is where the parent is decided)."""

    id: str = Field(pattern=MESSAGE_ID_PATTERN)
    parent_id: str | None = Field(None, pattern=MESSAGE_ID_PATTERN)
    role: Role
    content: str
    at: float = Field(default_factory=time.time)
    run_id: str | None = Field(
        None, max_length=128, description="The turn (session agent run) that added it."
    )
    usage: TurnUsage | None = Field(None, description="A reply's token counts (the engine's).")


class Branch(BaseModel):
    name: str = Field(pattern=BRANCH_PATTERN)
    leaf_id: str | None = Field(None, pattern=MESSAGE_ID_PATTERN)
    forked_from: str | None = Field(None, pattern=MESSAGE_ID_PATTERN)
    created_at: float = Field(default_factory=time.time)


class TreeHead(BaseModel):
    """The tree's shape: its branches, the active one, and each message's parent (in the order
    the messages were added), small enough to rewrite on every change."""

    branches: dict[str, Branch] = Field(default_factory=dict)
    active: str | None = None
    parents: dict[str, str | None] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)

    def active_branch(self) -> Branch:
        """The active branch; `NoActiveBranch` when there is none (a session with no message yet)."""
        if self.active is None or self.active not in self.branches:
            raise NoActiveBranch(
                "the session has no active branch yet (it has no messages): send a message first"
            )
        return self.branches[self.active]

    def active_leaf(self) -> str | None:
        return self.active_branch().leaf_id

    def require(self, message_id: str) -> str:
        """`message_id` if the tree holds it, else `MessageNotFound`."""
        if message_id not in self.parents:
            raise MessageNotFound(
                f"no message {message_id[:80]!r} in this session; "
                "GET its messages with ?all=true to list them"
            )
        return message_id


def add_message(
    head: TreeHead, message_id: str, *, parent_id: str | None = None, max_messages: int
) -> str | None:
    """Link a new message under `parent_id` and return its parent's id. The first message of an
    empty tree starts the `main` branch.

    Which branches move to it ("where a reply lands", docs/sessions.md):
    - no `parent_id` (the user's message, added at the end of the active branch): the active
      branch only, so a branch forked at that leaf keeps its own transcript;
    - `parent_id` P (a reply to the user message P): every branch whose leaf is P, the active one
      or not, so the reply lands on its own branch whatever the user switched to meanwhile, and a
      branch forked from the pending user message gets it too. A branch whose leaf is elsewhere
      (reverted past P) does not move; the message is kept in the tree all the same.
    """
    if len(head.parents) >= max_messages:
        raise InvalidArgument(
            f"the session holds its limit of {max_messages} messages (context.session_max_messages); "
            "start a new session"
        )
    if not head.parents and head.active is None:
        head.branches[MAIN_BRANCH] = Branch(name=MAIN_BRANCH)
        head.active = MAIN_BRANCH
    if parent_id is None:
        branch = head.active_branch()
        parent = branch.leaf_id
        head.parents[message_id] = parent
        branch.leaf_id = message_id
        return parent
    parent = head.require(parent_id)
    head.parents[message_id] = parent
    for branch in head.branches.values():
        if branch.leaf_id == parent:
            branch.leaf_id = message_id
    return parent


def create_branch(head: TreeHead, name: str, message_id: str, *, max_branches: int) -> Branch:
    """A new branch whose leaf is `message_id` (which stays where it is on every other branch)."""
    if not _BRANCH.match(name):
        raise InvalidArgument(
            f"branch name {name[:80]!r} must be 1-64 letters, digits, '_', '.' or '-' (starting alnum)"
        )
    if name in head.branches:
        raise InvalidArgument(f"the session already has a branch {name!r}; pick another name")
    if len(head.branches) >= max_branches:
        raise InvalidArgument(
            f"the session holds its limit of {max_branches} branches (context.session_max_branches)"
        )
    head.require(message_id)
    branch = Branch(name=name, leaf_id=message_id, forked_from=message_id)
    head.branches[name] = branch
    return branch


def switch_branch(head: TreeHead, name: str) -> Branch:
    """Make `name` the active branch."""
    if name not in head.branches:
        known = ", ".join(sorted(head.branches)[:20]) or "none yet"
        raise InvalidArgument(f"the session has no branch {name[:80]!r} (branches: {known})")
    head.active = name
    return head.branches[name]


def revert_to_message(head: TreeHead, message_id: str) -> str:
    """Move the active branch's leaf back to `message_id`, a message on its path (root to leaf),
    deleting nothing: the messages after it stay in the tree (listed with ?all=true) but leave the
    active path. Errors in this order: `NoActiveBranch` (as the seed does), `MessageNotFound` for
    a message the tree does not hold, then `MessageNotFound` for one that is not on the active
    branch (reverting to it would graft another branch's messages onto this one: switch to its
    branch first, or fork from it)."""
    branch = head.active_branch()
    head.require(message_id)
    if message_id not in linearize(head, branch.leaf_id):
        raise MessageNotFound(
            f"message {message_id!r} is not on the active branch {branch.name!r}: revert goes back "
            "along the active branch only; switch to the branch that holds it first, or fork from it"
        )
    branch.leaf_id = message_id
    return message_id


def fork(head: TreeHead, message_id: str, *, name: str | None = None, max_branches: int) -> Branch:
    """A new branch from `message_id`, made active: the next message continues from there while
    the branch it forked from keeps its own transcript."""
    head.require(message_id)
    if name is None:
        index = len(head.branches)
        while f"fork-{index}" in head.branches:
            index += 1
        name = f"fork-{index}"
    branch = create_branch(head, name, message_id, max_branches=max_branches)
    head.active = branch.name
    return branch


def path_lengths(head: TreeHead, leaf_ids: list[str | None]) -> list[int]:
    """How many messages the path to each of `leaf_ids` holds (0 for None): each message's depth
    is found once, so all of a tree's branches cost its messages, not branches x path (found by
    review: 256 branches of a 10,000-message tree held the event loop 0.4 s a view)."""
    depth: dict[str, int] = {}
    for leaf in leaf_ids:
        trail: list[str] = []
        walked: set[str] = set()
        current = leaf
        while current is not None and current not in depth:
            if current in walked:
                raise InvalidArgument("the session's conversation tree is corrupt (a cycle of parents)")
            walked.add(current)
            trail.append(current)
            current = head.parents.get(head.require(current))
        reached = 0 if current is None else depth[current]
        for node in reversed(trail):
            reached += 1
            depth[node] = reached
    return [0 if leaf is None else depth[leaf] for leaf in leaf_ids]


def linearize(head: TreeHead, leaf_id: str | None) -> list[str]:
    """The ids of the path from the root to `leaf_id`, oldest first (empty for None)."""
    path: list[str] = []
    current = leaf_id
    seen: set[str] = set()
    while current is not None:
        if current in seen:  # a stored head is validated input: a cycle must not hang a request
            raise InvalidArgument("the session's conversation tree is corrupt (a cycle of parents)")
        seen.add(current)
        path.append(current)
        current = head.parents.get(head.require(current))
    path.reverse()
    return path
