"""The grounding check of an `analyze` summary: does it name only what the page holds, once?

A model's summary is untrusted text. It is rejected when it names an identifier, a file or a
library that is not in the page (its text and the facts extracted from it), or when it repeats
itself. What counts as a name is what no ordinary English sentence needs: backticked words,
snake_case and CamelCase tokens, dotted names and every part of them (`colony.vcm.pages`,
`PageTable.map_source()`), calls (`load()`), file names and every part of their path (`pages.py`,
`vcm/pages.py`), all-capital constants, words with digits (`sha256`), well-known library names, a
capitalised word inside a sentence that is not a common English word ("uses Werkzeug"), the word
before a kind of code ("the Scheduler class", "the Werkzeug app", "the requests library", "the
rebalance method"), the word after one ("class Ring", "function rebalance") and the word a
sentence "calls". Plain words ("page", "Eviction" at a sentence's start) are never checked: a
summary may describe, it may not invent. What the check cannot see is a wrong description in
plain words ("a web scraper"): docs/analyze.md says exactly what it catches.

The summary is NFKC-normalised first (fullwidth letters are plain ones) and cut to MAX_CHECKED
characters; every pattern is linear (no quantifiers that backtrack into one another), so a hostile
summary costs no more than a long one. The comparison ignores case (a model writing `pagetable`
for `PageTable` names the same thing) and is against whole tokens, so `page` in the page does not
vouch for `pager`, nor `ring.py` for `ing.py`.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

MAX_CHECKED = 4000  # characters of a summary checked (a section's is two sentences)
# Every pattern is possessive (`*+`, `++`) or unambiguous, and starts only at a word's start
# (the lookbehinds): no backtracking, so the time is linear in the summary.
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*+")
_PATH_PART = re.compile(r"[\w.-]++")  # the parts of the page's paths, split at `/` and spaces
_BACKTICKED = re.compile(r"`([^`\n]{1,120})`")
_FILE = re.compile(
    r"(?<![\w/.-])((?:[\w.-]*+/)*+[\w-]++(?:\.[\w-]++)*?\.(?:py|pyi|md|rst|txt|js|jsx|mjs|ts|tsx|"
    r"rs|go|c|h|cc|cpp|hpp|java|kt|rb|php|sh|toml|yaml|yml|json|cfg|ini|html|css|sql|lock))(?![\w])"
)
_DOTTED = re.compile(r"(?<![\w.])([A-Za-z_]\w*+(?:\.[A-Za-z_]\w*+)++)")
_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*+)\(\)")
_SNAKE = re.compile(
    r"(?<![\w.])(_*+[A-Za-z][A-Za-z0-9]*+(?:_++[A-Za-z0-9]++)++_*+|_++[A-Za-z0-9]++_*+)(?![\w])"
)
_CAMEL = re.compile(r"(?<![\w.])([A-Z][a-z0-9]++[A-Z][A-Za-z0-9]*+|[a-z]++[0-9]*+[A-Z][A-Za-z0-9]*+)(?![\w])")
_CAPS = re.compile(r"(?<![\w.])([A-Z]{2,}+[0-9]*+)(?![\w])")
_DIGITS = re.compile(r"(?<![\w.])([A-Za-z]++[0-9][A-Za-z0-9]*+)(?![\w])")
# kinds of code: the word before one ("the Scheduler class") or after ("class Ring") names it
_KINDS = (
    "class|classes|function|functions|method|methods|module|modules|library|libraries|package|"
    "packages|framework|frameworks|crate|crates|gem|gems|app|apps|application|server"
)
_BEFORE_KIND = re.compile(rf"(?<![\w.-])([A-Za-z][\w-]*+)\s++({_KINDS})\b", re.I)
_AFTER_KIND = re.compile(r"(?<![\w.-])(\w++\s++)?(class|function|method|def)\s++([A-Za-z_]\w*+)\b", re.I)
_CALLED = re.compile(
    r"\b(?:calls|call|calling|invokes|invoke|invoking)\s++([A-Za-z_]\w*+)(?!\.[A-Za-z_]|\()", re.I
)  # (a dotted name or a call after it is checked whole by _DOTTED/_CALL)
# a capitalised word: one inside a sentence is a proper name, which the page must hold
_CAPITALISED = re.compile(r"(?<=[\w,] )([A-Z][a-z]++)(?![\w-])")
_HYPHENATED = re.compile(r"(?<![A-Za-z-])[A-Za-z]++-[A-Za-z]++")
_LIBRARY_KINDS = ("librar", "framework", "package", "crate", "gem", "module")
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
# words that may stand before (or after) a kind of code ("a helper class") without naming one
GENERIC = _words(
    """
    a an the this that these those its their our your his her one two three each every any all
    some many several other another both either no main core standard small simple helper utility
    utilities internal external python third-party local whole new same separate support testing
    test tests client server web data own shared common base given mapped single static private
    public protected abstract async asynchronous synchronous sync blocking non-blocking nested
    inner outer instance class module function method package library app application top-level
    module-level class-level special magic dunder constructor factory wrapper callback custom
    generic pure recursive default parent child sub super corresponding related following above
    below first last next previous only entry init initialisation initialization mock fake dummy
    built-in builtin global named anonymous decorated overridden inherited bound unbound getter
    setter property convenience private-use lightweight full complete basic central key primary
    different various additional extra underlying original single-purpose reusable
    imported exported defined called used as of in on for to by with from into and or is are was
    be it which calls uses that also then
    defines define provides provide contains contain has have exports export implements implement
    includes include use call wraps wrap exposes expose offers offer holds keeps returns imports
    import gives registers declares creates builds runs adds add two-way its
    """
)
# common English words a model may capitalise inside a sentence without naming anything
# (a word of the page is accepted anyway: these are the ones a page may not hold)
ENGLISH = _words(
    """
    i a an the this that it its and or but of to in on for with by from as at is are be not no
    all any each every some one two three first last next new old main core base data file files
    page pages line lines class classes function functions method methods module modules package
    library object objects type types value values key keys item items list lists set sets map
    maps table tables queue queues stack cache caches buffer store storage index state status
    error errors exception exceptions event events message messages request requests response
    responses result results task tasks job jobs worker workers thread threads process processes
    time times date clock timer deadline server servers client clients service services handler
    handlers manager managers helper helpers utility utilities config configuration settings
    option options parameter parameters argument arguments input output reader writer parser
    builder factory wrapper interface model models view views controller node nodes tree graph
    path paths name names text string strings number numbers count size length order ring loop
    least most recently used first-in first-out lru fifo lifo read write get put add remove delete
    update create load save open close start stop run test tests example examples note notes
    module-level top-level english
    monday tuesday wednesday thursday friday saturday sunday january february march april may
    june july august september october november december
    """
)
# words a sentence may "call" a thing without naming code ("calls it", "calls back")
CALL_OBJECTS = _words(
    """
    a an the this that these those it its itself them themselves each every all any some one
    back into out up for on with to from when once twice again both another other its own
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
    """What a summary may name: the tokens and path parts (file names, folders) of `texts` (the
    page's text and its facts), compared without case and as whole tokens."""

    def __init__(self, *texts: str) -> None:
        joined = "\n".join(texts)
        self.tokens = {t.lower() for t in _TOKEN.findall(joined)}
        self.parts = {p.lower().strip(".-") for p in _PATH_PART.findall(joined)}

    def knows_token(self, token: str) -> bool:
        return token.lower() in self.tokens

    def knows_name(self, name: str) -> bool:
        """A dotted or plain name: all of its parts are tokens of the page."""
        parts = _TOKEN.findall(name)
        return bool(parts) and all(self.knows_token(p) for p in parts)

    def knows_file(self, name: str) -> bool:
        """A file name or path: each of its parts is written in the page as a whole path part
        (`ring.py` does not vouch for `ing.py`; `invented/ring.py` needs `invented` too)."""
        parts = [p.strip(".-") for p in name.lower().split("/")]
        parts = [p for p in parts if p]
        return (
            bool(parts)
            and all(p in self.parts or self.knows_name(p) for p in parts[:-1])
            and (parts[-1] in self.parts)
        )


def prepared(summary: str) -> str:
    """`summary` as the check reads it: NFKC-normalised (fullwidth and compatibility letters
    become plain ones), without format characters (zero-width, bidi) that would split a name,
    at most MAX_CHECKED characters, whitespace runs made one space."""
    text = unicodedata.normalize("NFKC", summary[: MAX_CHECKED * 2])
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return " ".join(text[:MAX_CHECKED].split())


_DETERMINERS = _words("a an the this that these those each every one its their any some which")
_NAMING = _words("defines define defining calls call named called of in uses via by def")


def names_in(summary: str) -> list[tuple[str, str]]:
    """The (kind, name) pairs of `summary` that must be in the page, in order, each once."""
    summary = prepared(summary)
    found: dict[str, str] = {}

    def add(kind: str, name: str) -> None:
        if name and name not in found:
            found[name] = kind

    def exempt(word: str) -> bool:
        return word.lower() in GENERIC or word.lower() in COMMON

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
    for pattern in (_DOTTED, _CALL, _SNAKE, _CAMEL, _CAPS, _DIGITS):
        for match in pattern.finditer(bare):
            name = match.group(1)
            if name.lower() in COMMON or (pattern is _DOTTED and max(map(len, name.split("."))) == 1):
                continue  # "JSON", "e.g"
            add("identifier", name)
    for token in _TOKEN.findall(bare) + _HYPHENATED.findall(bare):
        if token.lower() in LIBRARIES:
            add("library", token)
    for match in _BEFORE_KIND.finditer(bare):  # "the Scheduler class", "the requests library"
        word, kind = match.group(1), match.group(2).lower()
        if exempt(word):
            continue
        if word[0].isupper() or kind.startswith(_LIBRARY_KINDS):
            add("library" if kind.startswith(_LIBRARY_KINDS) else "identifier", word)
        elif word.lower() not in ENGLISH and not word.lower().endswith("ing"):
            add("identifier", word)  # "the rebalance method" (not "a sorting function")
    for match in _AFTER_KIND.finditer(bare):  # "class Ring", "defines function rebalance"
        before, word = (match.group(1) or "").strip().lower(), match.group(3)
        if exempt(word) or word.lower() in CALL_OBJECTS or before in _DETERMINERS:
            continue
        if (word[0].isupper() and word.lower() not in ENGLISH) or before in _NAMING:
            add("identifier", word)
    for match in _CALLED.finditer(bare):  # "it calls rebalance on every tick"
        word = match.group(1)
        if not (exempt(word) or word.lower() in CALL_OBJECTS or word.lower() in ENGLISH):
            add("identifier", word)
    for match in _CAPITALISED.finditer(bare):  # "stores pages in Cassandra"
        word = match.group(1)
        if not (exempt(word) or word.lower() in ENGLISH):
            add("name", word)
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
    return Verdict(unknown=unknown_names(summary, vocabulary), repeated=repetitions(prepared(summary)))


def whole_sentences(text: str) -> str:
    """The text up to its last full stop (a reply cut off by max_tokens ends mid-sentence)."""
    text = text.strip()
    end = text.rfind(". ") + 1 if not text.endswith(".") else len(text)
    return text[:end] if end > 0 else text


def first_sentences(text: str, count: int = 2) -> str:
    """At most `count` sentences of `text` (what a section's summary may be)."""
    return " ".join(sentences(text)[:count])
