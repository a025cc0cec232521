"""Workloads for benchmarks/affinity_e2e.py: trace files in its format, and the workloads it
generates when it is given none.

A trace is JSON lines, one request each: `{"at": seconds from the start, "agent": id, "page": path
relative to the mapped folder, "question": text}`. One agent keeps one page; a request is submitted
at `at`, or when that agent's previous request ended, whichever is later.

Generated workloads (seeded; the files are those of the mapped folder, their order shuffled by the
seed, so no workload is tuned to one folder):

- `sessions`: multi-turn chats about files, the workload users run. Sessions open over time
  (Poisson arrivals), each about one file chosen with Zipf popularity (several users ask about the
  same popular file), each asks `turns` questions in a row with a think time between them.
- `zipf`: single questions by many agents, the file of each drawn with Zipf popularity; an agent is
  one of the file's agents, so agents come back to their file (a chat of one turn at a time).
- `team`: a team of agents, each on its own file, taking turns in a fixed order for several
  rounds (a pipeline or a group discussion), one turn every `think` seconds: the files come back
  in a cycle, the case where a cache that looks only at the past loses what is about to be used.

Questions are written from the file itself (a name it defines, a line of it), in several wordings.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

WORKLOADS = ("sessions", "zipf", "team")
NAME = re.compile(
    r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_][A-Za-z0-9_]*)|^([A-Za-z_][A-Za-z0-9_]*)\s*=", re.M
)
WORDINGS = (
    "What does {name} in {file} do?",
    "Explain the purpose of {name} ({file}) in one sentence.",
    "Which other names does {name} in {file} rely on?",
    "Is there anything surprising about how {file} defines {name}?",
    "Summarise {file} in one sentence.",
    "What is line {line} of {file} for: `{text}`?",
)
FOLLOW_UPS = (
    "Can you say more about that?",
    "Why would someone write it that way?",
    "What could go wrong there?",
    "Give a one-line example of using it.",
)


@dataclass(frozen=True)
class TraceLine:
    at: float
    agent: str
    page: str
    question: str


def read_trace(path: Path) -> list[TraceLine]:
    """A trace file's requests, checked (a line that is not an object with the four fields, a
    negative `at`, an agent switching pages: ValueError naming the line)."""
    lines: list[TraceLine] = []
    pages: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
            line = TraceLine(float(item["at"]), str(item["agent"]), str(item["page"]), str(item["question"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}:{number}: not a trace line ({exc}); see benchmarks/affinity_traces.py"
            ) from None
        if line.at < 0 or not line.question or Path(line.page).is_absolute() or ".." in Path(line.page).parts:
            raise ValueError(
                f"{path}:{number}: `at` must be >= 0, `question` set, `page` a relative path in the folder"
            )
        if pages.setdefault(line.agent, line.page) != line.page:
            raise ValueError(f"{path}:{number}: agent {line.agent!r} keeps one page ({pages[line.agent]!r})")
        lines.append(line)
    if not lines:
        raise ValueError(f"{path}: no requests")
    return lines


def write_trace(path: Path, lines: Iterable[TraceLine]) -> None:
    path.write_text("".join(json.dumps(asdict(line)) + "\n" for line in lines))


def _questions(root: Path, file: str, rng: random.Random) -> list[str]:
    """Questions about one file, from what it holds (names it defines, its lines), shuffled."""
    text = (root / file).read_text(errors="replace")
    names = [m.group(1) or m.group(2) for m in NAME.finditer(text)][:40] or [Path(file).stem]
    numbered = [(n, t.strip()) for n, t in enumerate(text.splitlines(), 1) if len(t.strip()) > 12][:200]
    questions = []
    for wording in WORDINGS:
        line, snippet = rng.choice(numbered) if numbered else (1, Path(file).name)
        questions.append(wording.format(name=rng.choice(names), file=file, line=line, text=snippet[:60]))
    rng.shuffle(questions)
    return questions


def _zipf_order(files: list[str], rng: random.Random, exponent: float) -> tuple[list[str], list[float]]:
    order = list(files)
    rng.shuffle(order)
    return order, [1.0 / (rank + 1) ** exponent for rank in range(len(order))]


def generate(
    workload: str,
    root: Path,
    files: list[str],
    *,
    seed: int,
    requests: int = 48,
    agents: int = 16,
    turns: int = 4,
    zipf: float = 1.0,
    rate: float = 0.5,
    think: float = 2.0,
) -> list[TraceLine]:
    """`requests` requests of `workload` over `files` (paths relative to `root`), seeded."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {WORKLOADS}")
    if not files:
        raise ValueError(f"no text files to ask about under {root}")
    rng = random.Random(f"{workload}-{seed}")
    order, weights = _zipf_order(sorted(files), rng, zipf)
    lines: list[TraceLine] = []
    if workload == "sessions":
        at = 0.0
        session = 0
        while len(lines) < requests:
            file = rng.choices(order, weights=weights)[0]
            asked = _questions(root, file, rng)
            agent = f"session-{session}"
            for turn in range(min(turns, requests - len(lines))):
                question = asked[0] if turn == 0 else rng.choice(FOLLOW_UPS + tuple(asked[1:]))
                lines.append(TraceLine(round(at + turn * think, 3), agent, file, question))
            session += 1
            at += rng.expovariate(rate)
    elif workload == "zipf":
        bound = {
            file: [f"agent-{i}" for i in range(agents) if i % len(order) == n] for n, file in enumerate(order)
        }
        at = 0.0
        for _ in range(requests):
            file = rng.choices(order, weights=weights)[0]
            agent = rng.choice(bound[file] or [f"agent-{file}"])
            lines.append(TraceLine(round(at, 3), agent, file, rng.choice(_questions(root, file, rng))))
            at += rng.expovariate(rate)
    else:  # team: members on distinct files, in turn, round after round
        members = order[: max(2, min(agents, len(order)))]
        for n in range(requests):
            file = members[n % len(members)]
            lines.append(
                TraceLine(
                    round(n * think, 3),  # one member speaks every `think` seconds
                    f"member-{n % len(members)}",
                    file,
                    rng.choice(_questions(root, file, rng)),
                )
            )
    return lines


def text_files(root: Path, limit: int = 2000) -> list[str]:
    """The text files under `root` a page source would map (relative paths), small ones first out."""
    found = []
    for path in sorted(root.rglob("*")):
        if len(found) >= limit:
            break
        if not path.is_file() or any(
            part.startswith(".") or part == "__pycache__" for part in path.relative_to(root).parts
        ):
            continue
        if (
            path.suffix in {".py", ".md", ".txt", ".rst", ".toml", ".cfg", ".yaml", ".yml", ".json"}
            and 400 < path.stat().st_size < 200_000
        ):
            found.append(str(path.relative_to(root)))
    return found
