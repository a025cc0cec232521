"""What the user told an agent stays out of the blocks other agents see.

A block is seen by others when it is another agent's block shared with this one, a colony-wide
block, or a block of the agent's own that it shared (its own `user_blocks` block shared by the
operator is the operator's call). A line quotes the user when it starts "User said:" (as
core_memory_save_message writes it) or is four or more of the user's words in a row, as they said
them. The check is lexical: a paraphrase passes. Used by the edit tools (colony.memory.blocks.tools)
and by `block_share` (colony.memory.blocks.manage).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence

from colony.errors import BlockNotFound
from colony.memory.blocks.store import BlockStore
from colony.memory.grounding import USER_SAID, Heard, words

MIN_QUOTED_WORDS = 4  # of the user's words in a row that make a line a quote


async def seen_by_others(store: BlockStore, me: str, label: str, user_blocks: Collection[str]) -> bool:
    """Whether agents other than `me` see the block `label` names in `me`'s view."""
    try:
        info, _ = await store.resolve(me, label)
    except BlockNotFound:
        return False
    if info.owner != me:
        return True
    return label not in user_blocks and bool(await store.shares_of(me, label))


async def quotes_user(lines: Sequence[str], user_words: Callable[[str], Awaitable[list[str]]]) -> bool:
    """Whether one of `lines` quotes the user (`user_words(text)`: what they said, for `text`)."""
    lines = [line for line in lines if line.strip()]
    if any(line.lstrip().startswith(USER_SAID) for line in lines):
        return True
    if not lines:
        return False
    said = Heard(await user_words("\n".join(lines)))
    return any(len(words(line)) >= MIN_QUOTED_WORDS and said.verbatim(words(line)) for line in lines)


def not_for_others(label: str) -> str:
    """The refusal of the user's words in a block others see: why, and where they go instead."""
    return (
        f"block {label!r} is seen by other agents; what the user told you stays with you: keep it "
        "in your `human` block (core_memory_save_message) and write your own words here"
    )
