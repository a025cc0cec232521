"""The grounding check of an `analyze` summary: does it name only what the page holds, once?

A model's summary is untrusted text. It is rejected when it names an identifier, a file or a
library that is not in the page (its text and the facts extracted from it), or when it repeats
itself. What counts as a name is what no ordinary English sentence needs: backticked words,
snake_case and CamelCase tokens, dotted names (`colony.vcm.pages`, `PageTable.map_source`), calls
(`load()`), file names (`pages.py`), all-capital constants, words with digits (`sha256`), well-known
library names, and the word before "library"/"framework"/"package". Plain words ("page", "Eviction"
at a sentence's start) are never checked: a summary may describe, it may not invent.

The comparison ignores case (a model writing `pagetable` for `PageTable` names the same thing) and
is against whole tokens, so `page` in the page does not vouch for `pager`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BACKTICKED = re.compile(r"`([^`\n]{1,120})`")
_FILE = re.compile(
    r"(?<![\w/.-])([\w./-]*\w\.(?:py|pyi|md|rst|txt|js|jsx|mjs|ts|tsx|rs|go|c|h|cc|cpp|hpp|java|kt|rb|"
    r"php|sh|toml|yaml|yml|json|cfg|ini|html|css|sql|lock))(?![\w])"
)
_DOTTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w(])")
_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\(\)")
_SNAKE = re.compile(r"(?<![\w.])(_*[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z0-9]+)+_*|_+[A-Za-z0-9]+_*)(?![\w])")
_CAMEL = re.compile(r"(?<![\w.])([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+|[a-z]+[0-9]*[A-Z][A-Za-z0-9]*)(?![\w])")
_CAPS = re.compile(r"(?<![\w.])([A-Z]{2,}[0-9]*)(?![\w])")
_DIGITS = re.compile(r"(?<![\w.])([A-Za-z]+[0-9]+[A-Za-z0-9]*)(?![\w])")
_BEFORE_KIND = re.compile(
    r"(?<![\w.])([A-Za-z][\w-]*)\s+(?:library|libraries|framework|package|crate|gem)\b", re.I
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# names of well-known libraries and frameworks: naming one the page does not use is inventing it
LIBRARIES = _words(
    """
    numpy pandas scipy matplotlib seaborn sklearn scikit-learn tensorflow pytorch torch keras jax
    flask django fastapi starlette aiohttp httpx urllib3 sqlalchemy pydantic celery boto3 botocore
    selenium beautifulsoup bs4 scrapy lxml pillow opencv cv2 nltk spacy transformers huggingface
    langchain openai anthropic llamaindex pytest unittest nose tox asyncio trio twisted tornado
    gevent redis postgres postgresql mysql mongodb sqlite sqlite3 kafka rabbitmq grpc protobuf
    graphql docker kubernetes terraform ansible tkinter pygame qt pyqt react angular vue svelte
    jquery lodash express nextjs webpack babel tokio serde actix hyper rocket diesel spring hibernate
    rails sinatra laravel symfony dplyr ggplot2 tidyverse streamlit gradio dash plotly bokeh
    """
)
# words a summary may use though the page does not: languages, formats, generic acronyms
COMMON = _words(
    """
    python javascript typescript java kotlin rust golang ruby php perl bash shell markdown yaml json
    toml html css sql xml csv utf utf8 utf-8 ascii api apis http https url urls uri cli gui ui io os
    id ids cpu gpu ram llm ai ml kv ok oop rest crud sdk ide todo faq pdf
    """
)
# words that may stand before "library"/"package"/"framework" without naming one
GENERIC = _words(
    """
    a an the this that its their our your one main core standard small simple helper utility
    utilities internal external python third-party local whole new same separate support testing
    test client server web data its own shared common base given mapped
    """
)
REPEAT_NGRAM = 6  # a run of this many words said twice is repetition
# a word (or two) said again at once: "manage and manage", "the page the page"
_STUTTER = re.compile(r"\b(\w{4,}(?: \w+)?)(?:,? (?:and|or))? \1\b", re.I)
SIMILAR = 0.8  # two sentences sharing this share of their words say the same thing


@dataclass
class Verdict:
    """The check's answer: `unknown` names not in the page, `repeated` the repeated parts."""

    unknown: list[str] = field(default_factory=list)
    repeated: list[str] = field(default_factory=list)
    empty: bool = False

    @property
    def ok(self) -> bool:
        return not (self.unknown or self.repeated or self.empty)

    def problems(self) -> str:
        """The reasons, for the regeneration prompt and the logs."""
        out = []
        if self.empty:
            out.append("the summary was empty")
        if self.unknown:
            out.append("these names are not in the code: " + ", ".join(self.unknown[:12]))
        if self.repeated:
            out.append("it repeated itself: " + "; ".join(r[:80] for r in self.repeated[:3]))
        return "; ".join(out)


class Vocabulary:
    """What a summary may name: the tokens, dotted names and file names of `texts` (the page's
    text and its facts), compared without case."""

    def __init__(self, *texts: str) -> None:
        joined = "\n".join(texts)
        self.text = joined.lower()
        self.tokens = {t.lower() for t in _TOKEN.findall(joined)}

    def knows_token(self, token: str) -> bool:
        return token.lower() in self.tokens

    def knows_name(self, name: str) -> bool:
        """A dotted or plain name: all of its parts are tokens of the page."""
        parts = _TOKEN.findall(name)
        return bool(parts) and all(self.knows_token(p) for p in parts)

    def knows_file(self, name: str) -> bool:
        """A file name: it (or, for a path, its last part) is written in the page."""
        lowered = name.lower().strip("./")
        return lowered in self.text or lowered.rsplit("/", 1)[-1] in self.text


def names_in(summary: str) -> list[tuple[str, str]]:
    """The (kind, name) pairs of `summary` that must be in the page, in order, each once."""
    found: dict[str, str] = {}

    def add(kind: str, name: str) -> None:
        if name and name not in found:
            found[name] = kind

    for match in _BACKTICKED.finditer(summary):
        inner = match.group(1).strip()
        if _FILE.fullmatch(inner):
            add("file", inner)
        else:
            for token in _TOKEN.findall(inner):
                add("identifier", token)
    files = [m.group(1) for m in _FILE.finditer(summary)]
    for name in files:
        add("file", name)
    bare = _FILE.sub(" ", _BACKTICKED.sub(" ", summary))
    for pattern, kind in (
        (_DOTTED, "identifier"),
        (_CALL, "identifier"),
        (_SNAKE, "identifier"),
        (_CAMEL, "identifier"),
        (_CAPS, "identifier"),
        (_DIGITS, "identifier"),
    ):
        for match in pattern.finditer(bare):
            name = match.group(1)
            if name.lower() not in COMMON:
                add(kind, name)
    for token in _TOKEN.findall(bare) + re.findall(r"[A-Za-z]+-[A-Za-z]+", bare):
        if token.lower() in LIBRARIES:
            add("library", token)
    for match in _BEFORE_KIND.finditer(bare):
        word = match.group(1)
        if word.lower() not in GENERIC and word.lower() not in COMMON:
            add("library", word)
    return [(kind, name) for name, kind in found.items()]


def unknown_names(summary: str, vocabulary: Vocabulary) -> list[str]:
    """The names `summary` uses that the page does not hold."""
    unknown = []
    for kind, name in names_in(summary):
        known = vocabulary.knows_file(name) if kind == "file" else vocabulary.knows_name(name)
        if not known:
            unknown.append(name)
    return unknown


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def repetitions(text: str) -> list[str]:
    """Sentences said twice (or nearly: most words shared) and word runs of REPEAT_NGRAM said twice."""
    found: list[str] = []
    seen: list[tuple[str, set[str]]] = []
    for sentence in sentences(text):
        words = set(re.findall(r"\w+", sentence.lower()))
        for earlier, earlier_words in seen:
            union = words | earlier_words
            similar = words == earlier_words or len(words & earlier_words) / len(union) >= SIMILAR
            if words and similar and (len(words) >= 3 or sentence.lower() == earlier.lower()):
                found.append(sentence)
                break
        seen.append((sentence, words))
    found.extend(m.group(0) for m in _STUTTER.finditer(text))
    words = re.findall(r"\w+", text.lower())
    runs: set[tuple[str, ...]] = set()
    for i in range(len(words) - REPEAT_NGRAM + 1):
        run = tuple(words[i : i + REPEAT_NGRAM])
        if run in runs:
            phrase = " ".join(run)
            if not any(phrase in f.lower() for f in found):
                found.append(phrase)
            break
        runs.add(run)
    return found


def check_summary(summary: str, vocabulary: Vocabulary) -> Verdict:
    """Whether `summary` names only what `vocabulary` holds, without repeating itself."""
    if not summary.strip():
        return Verdict(empty=True)
    return Verdict(unknown=unknown_names(summary, vocabulary), repeated=repetitions(summary))


def whole_sentences(text: str) -> str:
    """The text up to its last full stop (a reply cut off by max_tokens ends mid-sentence)."""
    text = text.strip()
    end = text.rfind(". ") + 1 if not text.endswith(".") else len(text)
    return text[:end] if end > 0 else text


def first_sentences(text: str, count: int = 2) -> str:
    """At most `count` sentences of `text` (what a section's summary may be)."""
    return " ".join(sentences(text)[:count])
