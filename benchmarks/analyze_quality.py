"""Quality of the `analyze` report (issue 13): grounding and coverage of its sections, measured
independently of the job's own check, over this repository's own packages.

For each package: `colony run analyze --map <package> --json` on a `colony up` cluster of its own
(the README's main job), then, per section of the report:

- grounding: the share of the identifiers and file names the summary names that occur in the
  section's own files (the lines of its spans), goal 100%;
- coverage: whether the summary names at least one of the section's definitions or a term of its
  docstrings (six letters or more, not a common word), goal >= 80% of sections;
- how the summary was produced: accepted at once, regenerated once, or replaced by the extractive
  summary (the job's own `stats`).

It prints a table per package, the totals, the wall time of each `colony run analyze`, and the
baseline it is compared with: the issue's goals, and the first model attempt before the check (the
share of sections whose first summary was rejected). Identifiers are taken here with a simple
rule of its own (backticked words, snake_case, CamelCase, dotted names, file names), not the job's
checker, so the job is not graded by its own code.

    python benchmarks/analyze_quality.py                       # colony/blackboard, agents, vcm, planning
    python benchmarks/analyze_quality.py --packages colony/vcm --keep-cluster
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PACKAGES = ["colony/blackboard", "colony/agents", "colony/vcm", "colony/planning"]

_BACKTICKED = re.compile(r"`([^`\s]{2,80})`")
_FILE = re.compile(r"\b[\w./-]+\.(?:py|md|toml|yaml|yml|json|txt|sh|rs|go|js|ts)\b")
_DOTTED = re.compile(r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\b")
_SNAKE = re.compile(r"\b[a-z]\w*_\w+\b")
_CAMEL = re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b")
_DEFINITION = re.compile(r"^\s*(?:async\s+def|def|class)\s+([A-Za-z_]\w*)", re.M)
_DOCSTRING = re.compile(r'"""(.*?)"""', re.S)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")


def identifiers(summary: str) -> set[str]:
    """What a summary names that must be in the code: backticked words, file names, dotted names,
    snake_case and CamelCase words (ordinary English words are not identifiers)."""
    text = summary
    found = set(_BACKTICKED.findall(text)) | set(_FILE.findall(text))
    text = _FILE.sub(" ", text)
    found |= {d for d in _DOTTED.findall(text) if not re.fullmatch(r"[A-Za-z]\.[A-Za-z]\.?", d)}
    found |= set(_SNAKE.findall(text)) | set(_CAMEL.findall(text))
    return {f.strip(".,;:()") for f in found if f.strip(".,;:()")}


def span_text(spans: list[str], root: Path) -> str:
    """The lines of `path:first-last` spans (paths relative to the mapped folder `root`), read from
    the files themselves."""
    parts = []
    for span in spans:
        path, _, lines = span.rpartition(":")
        first, _, last = lines.partition("-")
        try:
            text = (root / path).read_text(errors="replace")
            rows = text.splitlines()[max(0, int(first) - 1) : int(last)]
        except (OSError, ValueError):
            continue
        parts.append("\n".join(rows))
    return "\n".join(parts)


def grounded(name: str, page: str, files: list[str]) -> bool:
    """`name` occurs in the page's text (any case), is one of its files (by path or base name), or
    is a file the page imports (`pages.py` for `from .pages import ...`)."""
    lowered, low = page.lower(), name.lower()
    bases = {Path(f).name.lower() for f in files} | {f.lower() for f in files}
    bases |= {Path(f).stem.lower() for f in files}  # the module a file is (`redis_server`)
    if low in bases or low in lowered:
        return True
    stem, dot, suffix = low.rpartition(".")
    if (
        dot
        and suffix in {"py", "js", "ts", "rs", "go", "md"}
        and re.search(rf"\b{re.escape(stem)}\b", lowered)
    ):
        return True
    parts = low.split(".")  # `module.function`: every part in the page
    return len(parts) > 1 and all(p in lowered for p in parts if p)


# words too common to show that a summary is about its page's docstrings
COMMON = frozenset(
    [
        "about",
        "above",
        "after",
        "again",
        "against",
        "because",
        "before",
        "being",
        "below",
        "between",
        "both",
        "could",
        "does",
        "doing",
        "during",
        "each",
        "every",
        "first",
        "from",
        "further",
        "have",
        "having",
        "into",
        "itself",
        "more",
        "most",
        "once",
        "only",
        "other",
        "should",
        "some",
        "such",
        "than",
        "that",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "under",
        "until",
        "very",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "with",
        "would",
        "your",
        "returns",
        "return",
        "value",
        "values",
        "given",
        "using",
        "used",
        "uses",
        "none",
        "true",
        "false",
        "object",
        "objects",
        "class",
        "function",
        "method",
        "module",
        "default",
    ]
)


def covers(summary: str, page: str) -> bool:
    """The summary names one of the page's definitions, or a term of its docstrings (a word of
    six letters or more that is not a common word)."""
    names = set(_DEFINITION.findall(page))
    terms = {
        w.lower()
        for d in _DOCSTRING.findall(page)
        for w in _WORD.findall(d)
        if len(w) >= 6 and w.lower() not in COMMON
    }
    said = set(_WORD.findall(summary))
    return bool(names & said) or bool({w.lower() for w in said} & terms)


@dataclass
class PackageResult:
    package: str
    seconds: float
    exit_code: int
    sections: int = 0
    names: int = 0
    grounded_names: int = 0
    covered: int = 0
    accepted: int = 0
    regenerated: int = 0
    extractive: int = 0
    partial: bool = False
    ungrounded: list[str] = field(default_factory=list)

    def grounding(self) -> float:
        return self.grounded_names / self.names if self.names else 1.0

    def coverage(self) -> float:
        return self.covered / self.sections if self.sections else 0.0


def measure(package: str, output: dict[str, Any], seconds: float, code: int) -> PackageResult:
    result = PackageResult(package, seconds, code, partial=bool(output.get("partial")))
    root = Path(str(output.get("path") or REPO / package))  # spans are relative to the mapped folder
    stats = output.get("stats") or {}
    result.accepted = int(stats.get("accepted", 0))
    result.regenerated = int(stats.get("regenerated", 0))
    result.extractive = int(stats.get("extractive", 0))
    for section in output.get("sections") or []:
        summary = str(section.get("summary") or "")
        files = [str(f) for f in section.get("files") or []]
        page = span_text([str(s) for s in section.get("spans") or []], root)
        result.sections += 1
        for name in sorted(identifiers(summary)):
            result.names += 1
            if grounded(name, page, files):
                result.grounded_names += 1
            else:
                result.ungrounded.append(f"{','.join(files)[:60]}: {name}")
        result.covered += covers(summary, page)
    return result


def colony(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colony.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


COUNTS = ("sections", "names", "grounded_names", "covered", "accepted", "regenerated", "extractive")


def table(results: list[PackageResult]) -> str:
    lines = [
        "| package | sections | grounding | coverage | accepted | regenerated | extractive | partial "
        "| seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.package} | {r.sections} | {r.grounding():.0%} ({r.grounded_names}/{r.names}) "
            f"| {r.coverage():.0%} | {r.accepted} | {r.regenerated} | {r.extractive} | {r.partial} "
            f"| {r.seconds:.0f} |"
        )
    total = PackageResult("all", sum(r.seconds for r in results), 0)
    for r in results:
        for name in (
            "sections",
            "names",
            "grounded_names",
            "covered",
            "accepted",
            "regenerated",
            "extractive",
        ):
            setattr(total, name, getattr(total, name) + getattr(r, name))
    lines.append(
        f"| **all** | {total.sections} | {total.grounding():.0%} ({total.grounded_names}/{total.names}) "
        f"| {total.coverage():.0%} | {total.accepted} | {total.regenerated} | {total.extractive} | "
        f"| {total.seconds:.0f} |"
    )
    first_rejected = (total.regenerated + total.extractive) / total.sections if total.sections else 0.0
    lines += [
        "",
        f"baseline: goals grounding 100%, coverage >= 80%; the model's first attempt was rejected for "
        f"{first_rejected:.0%} of sections (regenerated or extractive), which the check caught",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--packages", default=",".join(DEFAULT_PACKAGES), help="comma-separated folders")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/colony-analyze-quality"))
    parser.add_argument("--port", type=int, default=18431)
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_")}
    env.update(
        {
            "COLONY_DATA_DIR": str(args.data_dir),
            "COLONY_SERVE__PORT": str(args.port),
            "RAY_USAGE_STATS_ENABLED": "0",
            "OMP_NUM_THREADS": "1",
        }
    )
    started = time.monotonic()
    up = colony("up", env=env)
    if up.returncode != 0:
        print(up.stderr[-3000:], file=sys.stderr)
        return 2
    print(f"colony up: {time.monotonic() - started:.0f}s", flush=True)
    results = []
    try:
        for package in [p.strip() for p in args.packages.split(",") if p.strip()]:
            began = time.monotonic()
            ran = colony("run", "analyze", "--map", package, "--json", env=env)
            seconds = time.monotonic() - began
            try:
                output = json.loads(ran.stdout)
            except ValueError:
                print(
                    f"{package}: no JSON output (exit {ran.returncode}): {ran.stderr[-1500:]}",
                    file=sys.stderr,
                )
                results.append(PackageResult(package, seconds, ran.returncode))
                continue
            result = measure(package, output, seconds, ran.returncode)
            results.append(result)
            for missing in output.get("not_analysed") or []:  # why a partial report is partial
                why = str(missing.get("error"))[:300]
                print(f"  not analysed: {missing.get('files')}: {why}", flush=True)
            print(table([result]).splitlines()[2], flush=True)
    finally:
        if not args.keep_cluster:
            colony("down", env=env)
    print()
    print(table(results))
    ungrounded = [u for r in results for u in r.ungrounded]
    if ungrounded:
        print("\nnames not found in their section's code:\n  " + "\n  ".join(ungrounded[:40]))
    return 0 if all(r.exit_code == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
