"""What `colony run` shows of a run's events: `RunDisplay` (tokens once, restarts, steps) and
`AnalyzeProgress` (the analyze job's live progress line), pure renderers over event dicts (no I/O:
recorded streams test them), and the helpers around them."""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Iterator
from queue import Empty, Queue
from typing import Any


def _printable(value: Any, limit: int = 300) -> str:
    """Text from the server for the terminal: control characters out, bounded."""
    text = value if isinstance(value, str) else ""
    return "".join(c if c.isprintable() else " " for c in text[:limit]).strip()


def _step_text(data: dict[str, Any]) -> str:
    """`  step 2: remember ok`, or for a failed action its error too (type and message, as the
    action's result carries it), so a user sees why without reading the server's log."""
    action = data.get("action") if isinstance(data.get("action"), dict) else None
    name = data.get("name")
    named = f"{_printable(str(name), 40)} " if isinstance(name, str) and name else ""
    ok = bool(action and action.get("success"))
    verdict = "" if named and action is None else ("ok" if ok else "failed")
    if ok and action is not None and action.get("blocked"):
        verdict = _printable(action.get("blocked_reason"), 120) or "waiting for other agents"
    line = f"  step {data.get('step')}: {named}{verdict}".rstrip()
    error = _printable(action.get("error"), 500) if action is not None and not ok else ""
    if isinstance(name, str) and error.startswith(f"{name} failed: "):
        error = error[len(name) + len(" failed: ") :]  # the dispatcher's prefix repeats the line's
    return f"{line}: {error}\n" if error else line + "\n"


def _children_text(kind: str, data: dict[str, Any]) -> str:
    """`  started 2 echo agent(s): a, b` / `  agent a failed; started again as a-r` (meta-actions)."""
    if kind == "child_restarted":
        failed, retry = _printable(data.get("agent"), 140), _printable(data.get("retry"), 140)
        return f"  agent {failed} failed; started again as {retry}\n"
    agents = data.get("agents")
    named = [a for a in agents if isinstance(a, str)] if isinstance(agents, list) else []
    shown = ", ".join(_printable(a, 140) for a in named[:8]) + (
        f" (+{len(named) - 8})" if len(named) > 8 else ""
    )
    kind_of = _printable(data.get("blueprint"), 64)
    return f"  started {len(named)} {kind_of + ' ' if kind_of else ''}agent(s): {shown}\n"


def _research_text(kind: str, data: dict[str, Any]) -> str:
    """The research job's progress: `  examining 2 files (...), 3 pages` / `  evidence from worker
    w (replica r, 1 page faulted): path:line name`."""
    if kind == "plan":
        files = [f for f in data.get("files") or [] if isinstance(f, str)][:6]
        chosen = [f for f in data.get("chosen_by_model") or [] if isinstance(f, str)]
        pages = data.get("pages") if isinstance(data.get("pages"), list) else []
        shown = ", ".join(_printable(f, 120) for f in files)
        by_model = f"{len(chosen)} chosen by the model"
        return f"  examining {len(files)} file(s): {shown} ({by_model}), {len(pages)} page(s)\n"
    found = [f for f in data.get("found") or [] if isinstance(f, dict)]
    best = found[0] if found else None
    faulted = _int_or_none(data.get("faulted")) or 0
    where = f"replica {_printable(data.get('replica_id'), 60)}, {faulted} page(s) faulted"
    cited = "nothing on its page"
    if best is not None:
        cited = f"{_printable(best.get('path'), 160)}:{_int_or_none(best.get('line'))}"
        cited += f" {_printable(best.get('name'), 80)}"
    return f"  evidence from {_printable(data.get('worker'), 140)} ({where}): {cited}\n"


def _prompt_text(data: dict[str, Any]) -> str:
    """A `prompt` event (`colony run --show-prompt`): the planner's whole prompt for one step,
    indented under a header line; control characters dropped, newlines and tabs kept."""
    text = data.get("text") if isinstance(data.get("text"), str) else ""
    step = _int_or_none(data.get("step"))
    lines = ["".join(c if c.isprintable() or c == "\t" else " " for c in line) for line in text.splitlines()]
    header = f"  prompt of step {step}" if step is not None else "  prompt"
    tokens, budget = _count_or_none(data.get("tokens")), _count_or_none(data.get("budget"))
    if tokens is not None:
        header += f" ({tokens} tokens" + (f" of {budget}" if budget is not None else "") + ")"
    header += ":"
    return "\n".join([header, *(f"    {line}" for line in lines)]) + "\n"


def _compaction_text(data: dict[str, Any]) -> str:
    """A `compaction` event: the agent's history was compacted under its token budget."""
    step, stage = _int_or_none(data.get("step")), _printable(str(data.get("stage")), 20)
    before, after = _count_or_none(data.get("tokens_before")), _count_or_none(data.get("tokens_after"))
    return f"  compacted at step {step}: {stage}, {before} -> {after} tokens\n"


def _usage_text(data: dict[str, Any]) -> str:
    """A `usage` event: what one model call of the run cost, in tokens."""
    prompt, completion = (
        _count_or_none(data.get("prompt_tokens")),
        _count_or_none(data.get("completion_tokens")),
    )
    if prompt is None or completion is None:
        return "  model call\n"
    return f"  model call: {prompt:,} prompt tokens, {completion:,} generated\n"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count_or_none(value: Any) -> int | None:
    """A count as an event may carry one (0 to 10^12); anything else, as from a forged event: None."""
    number = _int_or_none(value)
    return number if number is not None and 0 <= number < 10**12 else None


class RunDisplay:
    """What `colony run` writes to stderr for a run's events: `feed(event)` returns the text for one
    event, `end()` the text after the last one; no I/O, so recorded streams test it.

    Each token's text is shown once. A `restarted` event (a step redone after its replica died)
    says so on a line of its own; the new attempt's text is then not shown while it re-traces what
    is already on screen, and once it goes past that, only the rest is shown (the same text, not
    repeated). If it departs from what is on screen, it is shown from its start under a line saying
    so: the abandoned attempt's words are never passed off as the answer. `shown` is the visible
    token text (the last block), compared with the run's output to decide whether to print it."""

    def __init__(self) -> None:
        self.shown = ""  # token text of the visible block
        self.text = ""  # the current attempt's token text (what stands of earlier attempts included)
        self.attempt = 1
        self._marks: list[tuple[int, int]] = [(0, 0)]  # (seq, len(text)) from the attempt's start
        self._seq = 0
        self._line_open = False  # token text was written without a newline after it

    def feed(self, event: dict[str, Any]) -> str:
        kind = event.get("event_type")
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        seq = _int_or_none(event.get("seq"))
        if seq is not None and seq > self._seq:
            self._seq = seq
        if kind == "token":
            return self._token(terminal_text(str(data.get("text", ""))))  # as every server text
        out = self.close_line()
        if kind == "restarted":
            return out + self._restarted(data)
        if kind == "step":
            return out + _step_text(data)
        if kind == "prompt":
            return out + _prompt_text(data)
        if kind == "compaction":
            return out + _compaction_text(data)
        if kind == "usage":
            return out + _usage_text(data)
        if kind == "workers":
            return out + f"  {len(data.get('workers', []))} page workers started\n"
        if kind in ("children", "child_restarted"):
            return out + _children_text(kind, data)
        if kind in ("plan", "evidence"):
            return out + _research_text(kind, data)
        if kind != "started":
            return out + f"  {_printable(str(kind), 40)}\n"
        return out

    def end(self) -> str:
        out = self.close_line()
        if self.shown != self.text:  # a redo ended inside the text shown before it
            out += "  the text above is partly an abandoned attempt's; the run's output is printed in full\n"
        return out

    def close_line(self) -> str:
        """A newline if token text was left without one (else "")."""
        if not self._line_open:
            return ""
        self._line_open = False
        return "\n"

    def _token(self, piece: str) -> str:
        self.text += piece
        self._marks.append((self._seq, len(self.text)))
        if self.shown.startswith(self.text):
            return ""  # a redo re-tracing what is on screen
        if self.text.startswith(self.shown):
            new, self.shown = self.text[len(self.shown) :], self.text
            self._line_open = True
            return new
        out = self.close_line()
        out += "  the new attempt's text differs from the text above; here it is from its start:\n"
        self.shown, self._line_open = self.text, True
        return out + self.text

    def _restarted(self, data: dict[str, Any]) -> str:
        attempt = _int_or_none(data.get("attempt"))
        self.attempt = attempt if attempt is not None and attempt > self.attempt else self.attempt + 1
        after = _int_or_none(data.get("supersedes_after"))
        standing = [n for seq, n in self._marks if after is not None and seq <= after]
        keep = max(standing, default=self._marks[0][1])  # the text of events up to `after` stands
        self.text = self.text[:keep]
        self._marks = [(self._seq, keep)]
        reason = _printable(data.get("reason"))
        return (
            f"  run restarted (attempt {self.attempt}){': ' + reason if reason else ''}; "
            "text already shown is not shown again, only what the new attempt adds to it\n"
        )


PROGRESS_EVENTS = frozenset({"mapped", "workers", "worker_done"})  # an analyze job's (docs/api.md)
PROGRESS_TICK_SECONDS = 0.5  # the live line's elapsed seconds are redrawn at least this often
_CLEAR_LINE = "\r\x1b[K"  # back to the line's start, erase to its end


class AnalyzeProgress:
    """What `colony run` writes to stderr for a job that reports page workers (`analyze`):
    `feed(event, now)` returns the text for one event, `tick(now)` the redrawn line when only time
    passed, `end(now)` the text after the last event; no I/O and no clock of its own, so recorded
    event lists test it.

    On a terminal (`live`) the job's progress is ONE line, rewritten in place (`\\r` + erase to end
    of line): workers done / total, pages faulted in, elapsed seconds. Anything else worth a line
    (a restart, a gap, a mapping) is written above it and the line redrawn below. Elsewhere (a log
    file, a pipe) no control characters: one plain line per finished worker. Until the first
    progress event (and for runs that send none), events go to a `RunDisplay` unchanged, so other
    agents look as they always did; `active` starts in progress mode (`colony run analyze`).

    Worker results are kept by worker id, so a worker reported twice (a redone step) counts once,
    with its last result. A `workers` event sets the total afresh; sent again when failed workers
    are retried, it lists each retry in place of the worker it retries (docs/analyze.md), so the
    results of workers it no longer lists are dropped. A `restarted` event takes back the `workers`
    events after its `supersedes_after`: the results of the workers only those events listed are
    set aside (a late one from them too), and the last `workers` list that stands counts again.
    The redone step dispatches (or retries) again under the same ids (they derive from the
    action's idempotency key, docs/effects.md), and each worker reports once: a `workers` event
    that lists a set-aside worker again brings its result back."""

    def __init__(self, *, live: bool, started: float, width: int = 0, active: bool = False) -> None:
        self.live, self.started, self.width, self.active = live, started, width, active
        self.display = RunDisplay()  # the events of runs (or their parts) without progress
        self.total: int | None = None  # workers dispatched, once a `workers` event said so
        self.done: dict[str, dict[str, Any]] = {}  # worker id -> {"ok", "pages", "faulted", "files"}
        self._lists: list[tuple[int | None, list[str]]] = []  # (seq, ids) of each `workers` event
        self._forgotten: set[str] = set()  # workers of dispatches a restart took back
        self._aside: dict[str, dict[str, Any]] = {}  # their results, back if they are listed again
        self._drawn = ""  # the progress line now on screen ("" = none)

    @property
    def shown(self) -> str:
        """The token text on screen (see `RunDisplay.shown`)."""
        return self.display.shown

    def feed(self, event: dict[str, Any], now: float) -> str:
        from colony.wire.run_events import TERMINAL_EVENTS  # not at import: `colony version` stays quick

        kind = event.get("event_type")
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        if kind in PROGRESS_EVENTS:
            opened = "" if self.active else self.display.close_line()  # no token text under `\r`
            self.active = True
            return opened + self._progress(str(kind), data, now, _int_or_none(event.get("seq")))
        if kind == "restarted":
            self._take_back(_int_or_none(data.get("supersedes_after")))
        if not self.active:
            return self.display.feed(event)
        if kind in ("started", "step", "token"):
            return ""  # the progress line says more than a step of the coordinator does
        text = self.display.feed(event)  # restarted, gap, truncated, the terminal event...
        if kind in TERMINAL_EVENTS:
            return self._finish(now) + text
        return self._above(text, now)

    def tick(self, now: float) -> str:
        """The line again when its elapsed seconds changed (live only)."""
        if not (self.live and self.active):
            return ""
        line = self._fit(self.line(now))
        return "" if line == self._drawn else self._draw(line)

    def end(self, now: float) -> str:
        return self._finish(now) + self.display.end()

    def line(self, now: float) -> str:
        """`analyzing: 3/6 workers done (1 failed), 4 pages faulted in, 12s`."""
        elapsed = _elapsed(now - self.started)
        if self.total is None and not self.done:
            return f"analyzing: starting page workers, {elapsed}"
        total = max(self.total or 0, len(self.done))
        failed = sum(1 for result in self.done.values() if not result["ok"])
        faulted = sum(result["faulted"] for result in self.done.values())
        return (
            f"analyzing: {len(self.done)}/{total} workers done{f' ({failed} failed)' if failed else ''}, "
            f"{faulted} page{'' if faulted == 1 else 's'} faulted in, {elapsed}"
        )

    def _take_back(self, after: int | None) -> None:
        """A restart supersedes the events after seq `after` (all numbered ones when None):
        `workers` lists among them are void, and so are the results of the workers only they
        listed. A list without a seq (not from a server) is kept: nothing says it was taken back."""
        standing = [
            (seq, ids) for seq, ids in self._lists if seq is None or (after is not None and seq <= after)
        ]
        void = {w for entry in self._lists if entry not in standing for w in entry[1]}
        kept = set(standing[-1][1]) if standing else set()
        self._forgotten |= void - kept
        self._lists = standing
        self._aside.update({w: result for w, result in self.done.items() if w in self._forgotten})
        self.done = {w: result for w, result in self.done.items() if w not in self._forgotten}
        self.total = len(kept) if standing else None

    def _progress(self, kind: str, data: dict[str, Any], now: float, seq: int | None = None) -> str:
        if kind == "mapped":
            pages = _int_or_none(data.get("pages"))
            path = _printable(data.get("path")) or "a folder"
            return self._above(f"mapped {path}: {'?' if pages is None else pages} pages\n", now)
        if kind == "workers":
            workers = data.get("workers") if isinstance(data.get("workers"), list) else []
            ids = {_printable(w, 120) for w in workers}
            self._lists.append((seq, sorted(ids)))
            self._forgotten -= ids
            self.done.update({w: self._aside.pop(w) for w in ids & set(self._aside)})
            self.total = len(ids)
            # a retry lists its worker in place of the failed one, whose result no longer counts
            self.done = {w: result for w, result in self.done.items() if w in ids}
            if self.live:
                return self._draw(self.line(now))
            pages = _int_or_none(data.get("pages"))
            return f"  {self.total} page workers started{'' if pages is None else f' for {pages} pages'}\n"
        worker = _printable(data.get("worker"), 120) or "?"
        files = data.get("files") if isinstance(data.get("files"), list) else []
        result = {
            "ok": data.get("ok") is True,
            "pages": _int_or_none(data.get("pages")) or 0,
            "faulted": max(0, _int_or_none(data.get("faulted")) or 0),
            "files": [_printable(f) for f in files[:MAX_LISTED_FILES]],
        }
        if worker in self._forgotten:  # a worker of a dispatch a restart took back (for now)
            if len(self._aside) < MAX_ASIDE:
                self._aside[worker] = result
            return ""
        self.done[worker] = result
        if self.live:
            return self._draw(self.line(now))
        what = (
            f"done, {result['pages']} page(s), {result['faulted']} faulted in"
            if result["ok"]
            else f"failed ({_listing(result['files'], len(files)) or 'its pages'})"
        )
        return f"  worker {worker} {what}; {self.line(now).removeprefix('analyzing: ')}\n"

    def _fit(self, line: str) -> str:
        """Cut to the terminal's width: a wrapped line could not be rewritten in place."""
        return line[: self.width - 1] if self.width > 1 else line

    def _draw(self, line: str) -> str:
        self._drawn = self._fit(line)
        return _CLEAR_LINE + self._drawn

    def _above(self, text: str, now: float) -> str:
        """`text` (whole lines) above the live line, which is drawn again below it."""
        if not (self.live and text):
            return text
        return _CLEAR_LINE + text + self._draw(self.line(now))

    def _finish(self, now: float) -> str:
        """The live line's last state, left on screen (the cursor on the next line)."""
        if not self._drawn:
            return ""
        out, self._drawn = self._draw(self.line(now)) + "\n", ""
        return out


MAX_LISTED_FILES = 50  # files named per failed worker (and workers per not-analysed notice)
MAX_ASIDE = 1000  # results of taken-back workers kept in case they are listed again


def _listing(files: list[str], count: int) -> str:
    more = count - len(files)
    return ", ".join(files) + (f" and {more} more" if more > 0 else "")


def _elapsed(seconds: float) -> str:
    whole = max(0, int(seconds))
    return f"{whole}s" if whole < 60 else f"{whole // 60}m{whole % 60:02d}s"


def not_analysed_notice(output: Any) -> str:
    """Lines naming what a run's output lists under `not_analysed` (the files of each worker that
    failed, with its error); "" when it lists nothing. Server data: bounded, control characters out."""
    entries = output.get("not_analysed") if isinstance(output, dict) else None
    lines = []
    for entry in entries[:MAX_LISTED_FILES] if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        files = entry.get("files") if isinstance(entry.get("files"), list) else []
        named = _listing([_printable(f) for f in files[:MAX_LISTED_FILES]], len(files))
        error = _printable(entry.get("error"))
        worker = _printable(entry.get("worker"), 120)
        why = ": ".join(part for part in (f"worker {worker}" if worker else "", error) if part)
        lines.append(f"  not analysed: {named or 'its pages'}{f' ({why})' if why else ''}\n")
    return "".join(lines)


def with_ticks(events: Iterator[dict[str, Any]], every: float) -> Iterator[dict[str, Any] | None]:
    """`events`, with None whenever `every` seconds pass without one (to redraw the elapsed time).
    The stream is read by a daemon thread; its errors are raised here, in the caller's thread."""
    queue: Queue[tuple[str, Any]] = Queue()

    def pump() -> None:
        try:
            for event in events:
                queue.put(("event", event))
        except BaseException as exc:  # handed to the reader, raised there
            queue.put(("error", exc))
        else:
            queue.put(("end", None))

    threading.Thread(target=pump, name="colony-run-events", daemon=True).start()
    while True:
        try:
            kind, item = queue.get(timeout=every)
        except Empty:
            yield None
            continue
        if kind == "end":
            return
        if kind == "error":
            raise item
        yield item


def answer_already_shown(output: Any, streamed: str, *, same_terminal: bool) -> bool:
    """Whether printing the run's output would repeat what the token stream (on stderr) showed:
    only when both go to one terminal and the output is exactly the streamed text. Redirected
    stdout (`colony run ask ... > answer.txt`) still gets the answer."""
    return (
        same_terminal
        and isinstance(output, str)
        and bool(output.strip())
        and output.strip() == streamed.strip()
    )


def cited_answer_text(output: dict[str, Any]) -> str:
    """A research answer as text: the answer on one line, then each citation as `path:line  text`
    (one line each: a line break in a path or a text is shown escaped, so server text never forges
    a citation line), then the workers that could not finish."""
    lines = [one_line(str(output["answer"]))]
    citations = output.get("citations") if isinstance(output.get("citations"), list) else []
    for cited in citations[:20]:
        if isinstance(cited, dict):
            where = f"{one_line(str(cited.get('path')))}:{one_line(str(cited.get('line')))}"
            lines.append(f"  {where}  {one_line(str(cited.get('text', '')).strip())}")
    unfinished = output.get("not_finished") if isinstance(output.get("not_finished"), list) else []
    for entry in unfinished[:20]:
        if isinstance(entry, dict):
            lines.append(
                f"  not finished: {one_line(str(entry.get('agent')))}: {one_line(str(entry.get('error')))}"[
                    :600
                ]
            )
    return "\n".join(lines)


def one_line(text: str) -> str:
    """Server text on one terminal line: line breaks and tabs escaped (`\\n`), other control and
    invisible format characters dropped (terminal_text)."""
    return terminal_text(
        text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    )


def terminal_text(text: str) -> str:
    """Text from the server (a report built from the files it read, a model's answer, an error) as
    it may reach a terminal: control characters (escape sequences included) and invisible format
    characters (bidi overrides, zero-width) are dropped; newlines and tabs stay."""
    return "".join(c for c in text if c in "\n\t" or (unicodedata.category(c) not in ("Cc", "Cf", "Cs")))
