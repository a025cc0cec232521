"""Is a text the model wants to store as a fact about the user something the user said?

A small model, asked to keep what it was told, also writes what it was not told: a name it made up
("I'm Emily."), a description of its own prompt ("This is a list of your memories..."), or one
sentence sixteen times. Stored as a fact, that text is later recalled as if the user had said it.
`check_grounded` accepts a candidate only when

- it is the user's words verbatim (its words, ignoring case and punctuation, run in that order in
  one thing the user said; a leading "User said:" is allowed), or
- it is an extract: it does not repeat itself (`repetition`), every name, number and gendered
  pronoun in it (a word with a digit, a word written with a capital wherever it stands, he/she/...)
  is a word the user used, and at least MIN_COVERAGE of its content words (words less stop words
  and profile labels, compared by a crude stem: "likes" = "like") are.

A line framed as a quote ("User said: ...") must be verbatim. What a block already holds is not a
source of words for a new line (else a word one allowance let in would ground the next write); a
block edit checks only the lines it makes (colony.memory.blocks.tools), so a line kept unchanged
passes as it is.

Why 0.8: an extract of what the user said rewords a little ("I live in Oslo and like green tea"
-> "Lives in Oslo, enjoys green tea": a verb changed, another form of one); one content word in
five of its own allows that, while a short extract (three or four content words) gets no new word
and a text with half its content words new states something the user did not say. Names and
numbers get no allowance: they are what a wrong fact most often gets wrong. The allowance is also
the rule's known gap: one invented common noun in five ("likes coffee" among four words the user
used) passes, and so does a name written in lower case. The rule is lexical and explainable, not
a judge of meaning: a negation the user did not make ("does not like tea") passes it, as does one the
user made and the candidate drops ("like tea" is words of "I do not like tea"), words of one message
recombined ("Tom lives in Berlin" from "Tom lives in Oslo and my sister in Berlin"), a number from
another context ("Age: 34" from "flat 34"), a comparison flipped ("more"/"than" are stop words), a
stem collision ("hates" = "hat"), look-alike letters from other scripts (a loop of lines each with
one Cyrillic letter is not seen as a loop), and words written without spaces between them (Chinese,
Japanese) are grounded only verbatim.

The work is bounded: a candidate longer than MAX_CANDIDATE_CHARS is refused unread, and only the
first MAX_SAID_CHARS of what the user said are read (the caller passes the newest first).
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from colony.blackboard import TagFilter
from colony.errors import InvalidArgument
from colony.memory.service import MemoryService
from colony.memory.types import MAX_QUERY_CHARS, MemoryQuery

log = logging.getLogger(__name__)

MIN_COVERAGE = 0.8
MAX_CANDIDATE_CHARS = 20_000
MAX_SAID_CHARS = 200_000
REPEATED_SENTENCE = 3  # a sentence said this many times in one candidate is a loop, not a fact
NGRAM = 4
MIN_NGRAMS = 6  # fewer 4-word sequences than this: too short to call repetitive by ratio
MIN_DISTINCT_RATIO = 0.5  # prose has nearly all its 4-word sequences distinct; a loop has few
SHOWN = 5  # missing words named in a refusal
SAID_ENTRIES = 20  # earlier user messages a check reads: those most like the candidate
USER_TAG = "user"  # the tag of what the user said in memory (the conversation producer's)
USER_SAID = "User said:"  # how a block's line quoting the user starts (blocks, a session's `human`)

_WORD = re.compile(r"[^\W_]+")
_SENTENCE = re.compile(r"[.!?;\n]+")
_PART = re.compile(r"[.!?;:\n]+")  # where a capital starts a sentence or a value, not a name
# what an extract about the user may add without the user having said it: function words, and
# the words that frame a fact about someone (the user, their name, what they said, the labels of
# a profile: "Age: 34" states the number, which must be the user's)
_STOP_TEXT = """
    a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing don down during each few for from further
    had has have having here how i if in into is it its itself
    just let me more most my myself no nor not now of off on once only or other our ours ourselves
    out over own same should so some such than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours yourself yourselves also am im ive id ill
    youre hi hello hey please thanks thank ok okay yes yeah well really remember note
    user users human person people name names named called call said say says saying told tell
    tells mentioned mention stated states state shared share
    age pronouns preference preferences context detail details info information fact facts
"""
STOP_WORDS = frozenset(_STOP_TEXT.split())
# words that state who someone is: held to what the user said like names (no allowance)
GENDERED = frozenset(["he", "him", "his", "himself", "she", "her", "hers", "herself"])
# leading words a stored line may carry before the quote (longest first)
_FRAME = tuple(
    f"{the}user{verb}"
    for verb in (" told me", " said", " says", " wrote", " stated", " mentioned", "")
    for the in ("the ", "")
)
# a line framed as the user's own words, which must then be their words verbatim (found by review:
# only "User said" was held to it, so "User says:", "The user said" and "User:" lines passed as
# extracts the user never said in those words)
QUOTE_FRAME = re.compile(
    r"^\W*(?:the\s+)?user(?:\s*:|\s+(?:told\s+me|said|says|wrote|stated|mentioned)\b)", re.IGNORECASE
)


@dataclass(frozen=True)
class Grounding:
    """The verdict on one candidate: `grounded`, and why (`reason`, for the model to read)."""

    grounded: bool
    reason: str
    coverage: float = 0.0
    missing: tuple[str, ...] = ()
    verbatim: bool = False


def _normal(text: str) -> str:
    """`text` NFKC-normalised, invisible format characters (zero-width, soft hyphen) dropped: what
    every comparison here sees, so a spliced name reads as the one it displays."""
    text = "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf")
    return unicodedata.normalize("NFKC", text)


def words(text: str) -> list[str]:
    """`text` as lower-case words: `_normal`, case-folded, split at everything that is not a
    letter or digit ("Dana's" -> dana, s)."""
    return _WORD.findall(_normal(text).casefold())


def stem(word: str) -> str:
    """A crude English stem, the same on both sides of a comparison: plural, -ing, -ed and a final
    e go ("likes", "liked", "liking", "like" -> "lik")."""
    if word.isdigit() or len(word) <= 3:
        return word
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)] + keep
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def content_words(tokens: Iterable[str]) -> list[str]:
    """The words that carry content: not stop words, not single letters (digits stay)."""
    return [t for t in tokens if t not in STOP_WORDS and (len(t) > 1 or t.isdigit())]


def repetition(text: str) -> str | None:
    """Why `text` repeats itself (a sentence REPEATED_SENTENCE or more times, or fewer than
    MIN_DISTINCT_RATIO of its 4-word sequences distinct), or None when it does not."""
    sentences = Counter(" ".join(words(s)) for s in _SENTENCE.split(text[:MAX_CANDIDATE_CHARS]))
    sentences.pop("", None)
    if sentences:
        sentence, times = sentences.most_common(1)[0]
        if times >= REPEATED_SENTENCE:
            return f'it repeats "{sentence[:80]}" {times} times'
    tokens = words(text[:MAX_CANDIDATE_CHARS])
    grams = [tuple(tokens[i : i + NGRAM]) for i in range(len(tokens) - NGRAM + 1)]
    if len(grams) >= MIN_NGRAMS:
        distinct = len(set(grams)) / len(grams)
        if distinct <= MIN_DISTINCT_RATIO:
            return f"it repeats itself (only {distinct:.0%} of its {NGRAM}-word sequences differ)"
    return None


def _unframed(tokens: list[str]) -> list[str]:
    for frame in _FRAME:
        lead = frame.split()
        if tokens[: len(lead)] == lead and len(tokens) > len(lead):
            return tokens[len(lead) :]
    return tokens


def _salient(text: str, pronouns: bool = True) -> set[str]:
    """Names, numbers and who someone is: words with a digit, words written with a capital
    wherever they stand (a name starts a sentence, or is a label's value: "Name: Emily"), and
    gendered pronouns; less stop words ("I", "User", "Name"). Normalised as `words` does, so both
    sides split a word the same way."""
    found = set()
    for raw in _WORD.findall(_normal(text)):
        if any(c.isdigit() for c in raw) or raw[0].isupper():
            found.update(w for w in _WORD.findall(raw.casefold()) if w not in STOP_WORDS and len(w) > 1)
    if pronouns:
        found.update(w for w in words(text) if w in GENDERED)
    else:  # a summary refers to the people of its sources ("She moved ..."): not a name
        found -= GENDERED
    return found


def _bounded(said: Sequence[str]) -> list[str]:
    out, left = [], MAX_SAID_CHARS
    for text in said:
        if left <= 0:
            break
        out.append(text[:left])
        left -= len(out[-1])
    return out


class Heard:
    """What the user said, read once for many checks: each message as one string of its words (for
    verbatim matches) and the stems of every word (for extracts)."""

    def __init__(self, said: Sequence[str]) -> None:
        sources = [words(text) for text in _bounded(said)]
        self.joined = [" " + " ".join(source) + " " for source in sources]
        self.stems = {stem(w) for source in sources for w in source}

    def verbatim(self, tokens: list[str]) -> bool:
        quoted = " " + " ".join(tokens) + " "
        return any(quoted in source for source in self.joined)


def check_grounded(
    candidate: str,
    said: Sequence[str] | Heard,
    *,
    min_coverage: float = MIN_COVERAGE,
    pronouns: bool = True,
) -> Grounding:
    """Whether `candidate` may be stored as what the user said, given `said` (the user's own
    messages, newest first): see the module for the rule. A candidate framed as a quote ("User
    said: ...") must be verbatim: a quote that changes a word is not what the user said.
    `pronouns=False` lets gendered pronouns pass as words, not as names (a summary of memories
    refers to the people in them: their names must still be the sources')."""
    if len(candidate) > MAX_CANDIDATE_CHARS:
        return Grounding(False, f"it is longer than {MAX_CANDIDATE_CHARS} characters; store less")
    raw_tokens = words(candidate)
    tokens = _unframed(raw_tokens)
    if not tokens:
        return Grounding(False, "it has no words")
    heard_from = said if isinstance(said, Heard) else Heard(said)
    if heard_from.verbatim(tokens):
        return Grounding(True, "the user's words verbatim", coverage=1.0, verbatim=True)
    if QUOTE_FRAME.match(candidate):
        return Grounding(False, "it quotes the user, but the user did not say it in these words")
    looped = repetition(candidate)
    if looped is not None:
        return Grounding(False, looped)
    heard = heard_from.stems
    wanted = content_words(tokens)
    if not pronouns:
        wanted = [w for w in wanted if w not in GENDERED]
    if not wanted:
        return Grounding(False, "it states nothing the user said (no content words of theirs)")
    missing = list(dict.fromkeys(w for w in wanted if stem(w) not in heard))
    coverage = 1 - sum(1 for w in wanted if stem(w) not in heard) / len(wanted)
    names = sorted(w for w in _salient(candidate, pronouns) if stem(w) not in heard)
    if names:
        return Grounding(
            False,
            f"the user never said {', '.join(names[:SHOWN])}",
            coverage=coverage,
            missing=tuple(names),
        )
    if coverage < min_coverage:
        return Grounding(
            False,
            f"only {coverage:.0%} of its content words are the user's (needs {min_coverage:.0%}); "
            f"the user never said {', '.join(missing[:SHOWN])}",
            coverage=coverage,
            missing=tuple(missing),
        )
    extract = f"an extract of what the user said ({coverage:.0%} of its content words)"
    return Grounding(True, extract, coverage)


def check_lines(candidate: str, said: Sequence[str], *, min_coverage: float = MIN_COVERAGE) -> Grounding:
    """`check_grounded` line by line (a block's new content: every line must hold on its own, so
    one invented line among others is found); the first refusal, naming its line. Lines that
    repeat one another are refused as a whole. What the user said is read once."""
    if len(candidate) > MAX_CANDIDATE_CHARS:
        return Grounding(False, f"it is longer than {MAX_CANDIDATE_CHARS} characters; store less")
    heard = Heard(said)
    lines = [line for line in candidate.splitlines() if words(line)]
    if not lines:
        return check_grounded(candidate, heard, min_coverage=min_coverage)
    whole = check_grounded("\n".join(lines), heard, min_coverage=min_coverage)
    if whole.verbatim or len(lines) == 1:
        return whole
    looped = repetition("\n".join(lines))
    if looped is not None:
        return Grounding(False, looped)
    worst = 1.0
    for line in lines:
        verdict = check_grounded(line, heard, min_coverage=min_coverage)
        if not verdict.grounded:
            where = f'line "{line.strip()[:80]}": {verdict.reason}'
            return Grounding(False, where, verdict.coverage, verdict.missing)
        worst = min(worst, verdict.coverage)
    return Grounding(True, "every line is the user's words or an extract of them", worst)


def refuse_user_tag(tags: Iterable[str]) -> None:
    """InvalidArgument when a tool's tags name USER_TAG: it marks what the user said (the
    conversation producer's), which grounds later writes; model output may not claim it."""
    if USER_TAG in tags:
        raise InvalidArgument(
            f"the tag {USER_TAG!r} is kept for what the user said (the conversation's own records); "
            "tag the entry otherwise"
        )


def refusal(what: str, verdict: Grounding, verbatim: str = "core_memory_save_message") -> str:
    """The message of a refused write: what was refused, why, and what to do instead (`verbatim`:
    the tool that stores the user's message as said)."""
    return (
        f"{what} holds only what the user said; not stored: {verdict.reason}. Store the user's own "
        f"words ({verbatim}), or only what they said, in their words"
    )


async def said_by_user(
    service: MemoryService, scope_ids: Sequence[str], text: str, message: str
) -> list[str]:
    """What the user said, newest first: `message` (the current run's), then the SAID_ENTRIES
    earlier user messages in `scope_ids` (entries tagged `user`) most like `text`. If memory
    cannot be read, the message alone (a check then refuses more, never less)."""
    said = [message] if message.strip() else []
    if not scope_ids:
        return said
    query = MemoryQuery(
        query=text[:MAX_QUERY_CHARS] or None,
        tag_filter=TagFilter(all_of=frozenset({USER_TAG})),
        max_results=SAID_ENTRIES,
    )
    try:
        found = await service.recall(query, list(scope_ids))
    except Exception as exc:
        log.warning("earlier user messages not read for a grounding check: %r", exc)
        return said
    return [*said, *(item.entry.content for item in found)]
