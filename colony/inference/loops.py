"""A reply that has started to loop: a small model, once it repeats itself, tends to go on doing so
to the end of its token budget ("I'm a wonderful person with a loving family..." thirteen times in
a row was seen on the embedded model). Streaming the rest costs the engine's time, fills the
user's screen and, stored as the conversation's reply, memory. `LoopWatch` sees the text as it
streams and says when its tail is one passage said LOOP_REPEATS times in a row; the caller stops
generating there (colony.agents.reply_stream).

What counts as a looping passage, chosen so that legitimate repetition streams on:

- LOOP_MIN_CHARS to LOOP_MAX_CHARS characters, said exactly LOOP_REPEATS (5) times in a row: a
  user may ask for a line three or four times; a model in a loop repeats itself exactly, and
  far more often;
- prose: at least LOOP_MIN_WORDS distinct words (or, in scripts written without spaces, twice as
  many distinct characters) and the end of a sentence, so repeated symbols (a table's `|---|`
  rule), refrains without a full stop, rows of a CSV or a JSON array, and repeated code lines are
  not loops;
- never inside an open code fence (```): code repeats lines on purpose.

The work per piece is bounded: only the last LOOP_MAX_CHARS x LOOP_REPEATS characters are kept and
compared, and a cheap first pass skips the periods whose rounds do not end on the same character.
"""

from __future__ import annotations

import re

LOOP_REPEATS = 5
LOOP_MIN_CHARS = 16
LOOP_MAX_CHARS = 400
LOOP_MIN_WORDS = 4
_WORD = re.compile(r"[^\W\d_]{2,}")
_SENTENCE_END = re.compile(r"[.!?][\s\"')\]]|[.!?]$|[\u3002\uff01\uff1f]")
_FENCE = "```"


def _spaceless(char: str) -> bool:
    """A character of a script written without spaces between words (CJK ideographs, kana)."""
    return "\u3040" <= char <= "\u9fff" or "\uf900" <= char <= "\ufaff"


def _prose(unit: str) -> bool:
    """Whether a repeated passage is prose (enough distinct words, a sentence's end)."""
    if not _SENTENCE_END.search(unit):
        return False
    if len(set(_WORD.findall(unit.casefold()))) >= LOOP_MIN_WORDS:
        return True
    return len({c for c in unit if _spaceless(c)}) >= 2 * LOOP_MIN_WORDS


class LoopWatch:
    """Feed it a reply's pieces in order; `feed` is True once the reply ends in a loop."""

    def __init__(self) -> None:
        self._tail = ""
        self._fences = 0  # code fences (runs of 3 backticks) so far: odd while inside one
        self._ticks = 0  # backticks ending the text so far (a fence may be split across pieces)

    def feed(self, text: str) -> bool:
        if "`" in text or self._ticks:
            for char in text:
                if char == "`":
                    self._ticks += 1
                else:
                    self._fences += self._ticks // len(_FENCE)
                    self._ticks = 0
        self._tail = (self._tail + text)[-LOOP_MAX_CHARS * LOOP_REPEATS :]
        inside = (self._fences + self._ticks // len(_FENCE)) % 2 == 1
        return not inside and looping(self._tail)


def looping(text: str) -> bool:
    """Whether `text` ends with one passage (see the module) said LOOP_REPEATS times in a row."""
    n = len(text)
    if n < LOOP_MIN_CHARS * LOOP_REPEATS:
        return False
    last, longest = text[-1], min(LOOP_MAX_CHARS, n // LOOP_REPEATS)
    for length in range(LOOP_MIN_CHARS, longest + 1):
        # only periods whose rounds end on the same character can repeat (a cheap first pass)
        if text[n - 1 - length] != last or text[n - 1 - 2 * length] != last:
            continue
        unit = text[n - length :]
        if all(text[n - (k + 1) * length : n - k * length] == unit for k in range(1, LOOP_REPEATS)):
            return _prose(unit)  # the shortest round decides: a longer one holds the same again
    return False
