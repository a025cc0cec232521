"""What the user told an agent about themselves, and whether a text retells it.

Shared memory must not carry what a user told one agent to the others (colony.memory.shared). What
counts is the user's *statements* about themselves (first person, not a question or a request:
colony.memory.session.user_statements, less "I need ..." / "I want ..." requests), from the run's
message and from the entries tagged `user` in the agent's own memory. A question's names, numbers
and paths are not private: a research agent shares findings about what it was asked.

A text retells the user when it quotes them ("User said: ...", "the user told me ..."), names a name
from a statement (a capitalised word that does not start its sentence: "Dana", "Oslo"), gives a
number of three or more digits from one (however it is written: "7291", "72-91", "7 2 9 1"), repeats
four of their words in a row (two of them content words), or is backed by their words (grounding:
its names, numbers and most words are theirs). The check is lexical: a paraphrase that shares none
of these passes, and what the agent's memory no longer holds is not known.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from colony.blackboard import TagFilter
from colony.blackboard.protocol import MemoryProtocol
from colony.memory.grounding import STOP_WORDS, Heard, check_grounded, content_words, words
from colony.memory.session import user_statements
from colony.memory.store import MemoryStore

USER_TAG = "user"
MAX_MESSAGES = 500  # user messages read per check (a batch of ingestion reads them once)
MAX_STATEMENTS = 50  # statements taken from one message
MIN_QUOTED_WORDS = 4
MIN_NUMBER_DIGITS = 3
USER_QUOTE = re.compile(
    r"^\s*user\s*:|\buser\s+(said|says|told|tells|mentioned|wrote|shared|gave)\b",
    re.IGNORECASE | re.MULTILINE,
)
_REQUEST = re.compile(
    r"^(i|we)\s*('?d| would)?\s*(need|want|like|am looking|'m looking|are looking|am trying|'m trying|"
    r"have a question|wonder)\b",
    re.IGNORECASE,
)
_PREFIX = re.compile(r"^\s*(user|human)\s*:\s*", re.IGNORECASE)
_WORD = re.compile(r"[^\W\d_][\w'-]*")
_NUMBER = re.compile(r"\d(?:[\d\s,.\-/]*\d)?")


class UserWords:
    """The statements in `messages` and what the checks need of them, read once for many texts."""

    def __init__(self, messages: Iterable[str]) -> None:
        statements: list[str] = []
        for message in messages:
            for sentence in user_statements(_PREFIX.sub("", message), limit=MAX_STATEMENTS):
                if not _REQUEST.match(sentence) and sentence not in statements:
                    statements.append(sentence)
        self.statements = statements
        self.heard = Heard(statements)
        self.names = {name for s in statements for name in _names(s)}
        self.numbers = {n for s in statements for n in _numbers(s)}

    def retold_by(self, text: str) -> str | None:
        """Why `text` retells what the user said (None when it does not)."""
        if USER_QUOTE.search(text):
            return "it quotes the user"
        if not self.statements:
            return None
        digits = re.sub(r"\D", "", text)
        if any(number in digits for number in self.numbers):
            return "it gives a number the user gave"
        said = {w.casefold() for w in _WORD.findall(text)}
        if self.names & said:
            return f"it names {sorted(self.names & said)[0]!r}, from what the user said"
        tokens = words(text)
        for n in range(len(tokens) - MIN_QUOTED_WORDS + 1):
            window = tokens[n : n + MIN_QUOTED_WORDS]
            if len(content_words(window)) >= 2 and self.heard.verbatim(window):
                return f'it repeats "{" ".join(window)}" as the user said it'
        if len(tokens) >= MIN_QUOTED_WORDS and check_grounded(text, self.heard).grounded:
            return "what the user said backs it"
        return None


def _names(sentence: str) -> set[str]:
    """Capitalised words that do not start the sentence (names: "Dana", "Oslo"), less stop words."""
    found = _WORD.findall(sentence)
    return {
        w.casefold() for w in found[1:] if w[0].isupper() and w.casefold() not in STOP_WORDS and len(w) > 1
    }


def _numbers(sentence: str) -> set[str]:
    """The digits of each number of MIN_NUMBER_DIGITS or more, separators dropped ("72-91" -> 7291)."""
    runs = (re.sub(r"\D", "", m.group(0)) for m in _NUMBER.finditer(sentence))
    return {digits for digits in runs if len(digits) >= MIN_NUMBER_DIGITS}


async def user_messages(store: MemoryStore, scope_ids: Sequence[str], limit: int = MAX_MESSAGES) -> list[str]:
    """The text of entries tagged `user` in `scope_ids` (the agent's own levels; one text once),
    at most `limit`: read by their tag index, not by scanning the scopes."""
    tags = TagFilter(all_of=frozenset({MemoryProtocol.INDEX_TAG, USER_TAG}))
    out: dict[str, None] = {}
    for scope in scope_ids:
        async for stored in store.board(scope).iter_query(
            MemoryProtocol.ENTRY_PATTERN, tags=tags, page_size=200
        ):
            content = stored.value.get("content") if isinstance(stored.value, dict) else None
            if isinstance(content, str):
                out[content] = None
                if len(out) >= limit:
                    return list(out)
    return list(out)
