"""A reply that has started to loop: a small model, once it repeats itself, tends to go on doing so
to the end of its token budget ("I'm a wonderful person with a loving family..." thirteen times in
a row was seen on the embedded model). Streaming the rest costs the engine's time, fills the
user's screen and, stored as the conversation's reply, memory. `LoopWatch` sees the text as it
streams and says when its tail is one passage said LOOP_REPEATS times in a row; the caller stops
generating there (colony.agents.reply_stream).

A passage is LOOP_MIN_CHARS to LOOP_MAX_CHARS characters holding at least LOOP_MIN_WORDS distinct
words, so repeated symbols (a table's `|---|---|` rule, "ha ha ha") and short refrains are not
loops; exact repetition only (a model in a loop repeats itself exactly). The work per piece is
bounded: only the last LOOP_MAX_CHARS x LOOP_REPEATS characters are kept and compared.
"""

from __future__ import annotations

import re

LOOP_REPEATS = 3
LOOP_MIN_CHARS = 16
LOOP_MAX_CHARS = 240
LOOP_MIN_WORDS = 4
_WORD = re.compile(r"[^\W\d_]{2,}")


class LoopWatch:
    """Feed it a reply's pieces in order; `feed` is True once the reply ends in a loop."""

    def __init__(self) -> None:
        self._tail = ""

    def feed(self, text: str) -> bool:
        self._tail = (self._tail + text)[-LOOP_MAX_CHARS * LOOP_REPEATS :]
        return looping(self._tail)


def looping(text: str) -> bool:
    """Whether `text` ends with one passage (see the module) said LOOP_REPEATS times in a row."""
    n = len(text)
    if n < LOOP_MIN_CHARS * LOOP_REPEATS:
        return False
    last, longest = text[-1], min(LOOP_MAX_CHARS, n // LOOP_REPEATS)
    # only periods whose rounds end on the same character can repeat (a cheap first pass)
    for length in range(LOOP_MIN_CHARS, longest + 1):
        if text[n - 1 - length] != last or text[n - 1 - 2 * length] != last:
            continue
        unit = text[n - length :]
        if all(text[n - (k + 1) * length : n - k * length] == unit for k in range(1, LOOP_REPEATS)):
            # the shortest round decides: a longer one holds the same words again
            return len(set(_WORD.findall(unit.casefold()))) >= LOOP_MIN_WORDS
    return False
