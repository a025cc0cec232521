"""Does `research` cite the line that answers? Questions with known answers (file and definition)
over folders of real code the project did not write: the standard library's `email`, `logging` and
`http` packages (benchmarks/research_questions/test.json, written by another author than the index,
apart from it, never tuned on). `--set dev` runs the development set: json, urllib and concurrent
(what the index's weights and the model's vote were set on), and unittest, xml and importlib (45
questions added later by another author; `--folders unittest,xml,importlib` asks those alone).

Variants, side by side on the same questions and the same model (the embedded SmolLM2-135M):

  research - `research` on a `colony up` cluster (the README's main job): the coordinator plans with
             the model, page-bound workers judge their pages' definitions, the model writes the
             answer. Knows the question and the mapped folder only.
  window   - the single-agent baseline: one model call that reads the folder through one window
             (the files in path order, numbered lines, as much as the engine's slot holds beside
             the question) and answers {"path", "line"} (schema-constrained to the files it saw).
  index    - the code index alone (colony.context.code_index with the packaged embedder, as
             research builds it; its best definition): what the model and the agents add is
             `research` minus this.

A citation is right when its path is the question's file and its line lies within the answer's
definition (from its decorators to its last line; `exact`: its first line). The first citation is
scored. Reported: the share right, with exact, per folder and in all; seconds per question (p50,
p90); agents spawned and pages faulted per question (research).

    python benchmarks/research_quality.py                  # test set, every variant
    python benchmarks/research_quality.py --set dev --variants index
    python benchmarks/research_quality.py --limit 5 --json
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from analyze_quality import colony  # (`colony ...` in a subprocess, as a user runs it)

REPO = Path(__file__).resolve().parents[1]
SETS = REPO / "benchmarks" / "research_questions"
WINDOW_ANSWER_TOKENS = 48
WINDOW_ASK = "Cite the file and line that answer it."


def load_questions(name: str, folders: list[str] | None, limit: int | None) -> list[dict[str, Any]]:
    questions = json.loads((SETS / f"{name}.json").read_text())["questions"]
    if folders:
        questions = [q for q in questions if q["folder"] in folders]
    if limit:  # the first `limit` of each folder
        kept: dict[str, int] = {}
        questions = [q for q in questions if kept.setdefault(q["folder"], 0) < limit and not _take(kept, q)]
    return questions


def _take(kept: dict[str, int], question: dict[str, Any]) -> bool:
    kept[question["folder"]] += 1
    return False


def copy_packages(folders: list[str], into: Path) -> dict[str, Path]:
    """Each stdlib package copied (its .py files) to `into/<name>`: the folders the cluster maps."""
    out = {}
    for name in folders:
        source = Path(importlib.import_module(name).__path__[0])
        target = into / name
        if target.exists():
            shutil.rmtree(target)
        for path in sorted(source.rglob("*.py")):
            if "__pycache__" in path.parts or "test" in path.relative_to(source).parts[:1]:
                continue
            dest = target / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
        out[name] = target
    return out


def definition_span(root: Path, path: str, identifier: str) -> tuple[int, int, int]:
    """(first line with decorators, last line, the `def`/`class` line) of `identifier`
    (`Class.method` too) in root/path, found with `ast` here (not with the index under test);
    anywhere in the module's blocks."""
    tree = ast.parse((root / path).read_text())
    parts = identifier.split(".")

    def find(body: list[ast.stmt], name: str) -> ast.AST | None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
                return node
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                return node
            for block in ("body", "orelse", "finalbody"):
                inner = getattr(node, block, None)
                if isinstance(node, ast.If | ast.Try | ast.With) and inner:
                    found = find(inner, name)
                    if found is not None:
                        return found
            for handler in getattr(node, "handlers", None) or []:
                found = find(handler.body, name)
                if found is not None:
                    return found
        return None

    scope: list[ast.stmt] = tree.body
    node: Any = None
    for part in parts:
        node = find(scope, part)
        if node is None:
            raise LookupError(f"{identifier} not in {path}")
        scope = getattr(node, "body", [])
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return first, node.end_lineno or node.lineno, node.lineno


def judge(
    question: dict[str, Any], span: tuple[int, int, int], cited: dict[str, Any] | None
) -> tuple[bool, bool]:
    """(right: the citation's line is within the definition, exact: it is its first or `def` line)."""
    if not cited or cited.get("path") != question["path"] or not isinstance(cited.get("line"), int):
        return False, False
    line = cited["line"]
    return span[0] <= line <= span[1], line in (span[0], span[2])


# -- variants ------------------------------------------------------------------------------------------


def run_index(questions: list[dict[str, Any]], roots: dict[str, Path]) -> list[dict[str, Any]]:
    from colony.context.code_index import CodeIndex
    from colony.system.research_worker import definition_embedder

    embed = definition_embedder(None)  # the packaged MiniLM, as research's index uses it
    indexes: dict[str, Any] = {}
    out = []
    for q in questions:
        began = time.monotonic()
        if q["folder"] not in indexes:
            root = roots[q["folder"]]
            files = {
                str(p.relative_to(root)): p.read_text(errors="replace").split("\n")
                for p in sorted(root.rglob("*.py"))
            }
            indexes[q["folder"]] = CodeIndex(files, embed=embed)
        hits = indexes[q["folder"]].search(q["question"], limit=1)
        cited = hits[0].definition.cite() if hits else None
        out.append({"id": q["id"], "cited": cited, "seconds": time.monotonic() - began})
    return out


def window_text(root: Path, budget_chars: int) -> tuple[str, list[str]]:
    """The folder's files in path order with numbered lines, cut at `budget_chars`; the files shown."""
    parts, shown, used = [], [], 0
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        lines = path.read_text(errors="replace").split("\n")
        block = f"### {rel}\n" + "\n".join(f"{n}: {line}" for n, line in enumerate(lines, 1))
        if used + len(block) > budget_chars:
            block = block[: max(0, budget_chars - used)]
        if not block:
            break
        parts.append(block)
        shown.append(rel)
        used += len(block)
        if used >= budget_chars:
            break
    return "\n\n".join(parts), shown


async def run_window(questions: list[dict[str, Any]], roots: dict[str, Path]) -> list[dict[str, Any]]:
    from colony.config import ColonySettings
    from colony.inference import ChatMessage, InferenceRequest
    from colony.inference.embedded import EmbeddedEngine
    from colony.inference.tokens import TokenCounter

    settings = ColonySettings()
    engine = EmbeddedEngine(settings.engine)
    await engine.start()
    counter = TokenCounter(engine)
    room = settings.engine.slot_context_tokens - WINDOW_ANSWER_TOKENS - 200
    out = []
    try:
        for q in questions:
            began = time.monotonic()
            chars = room * 3  # then cut down to the window by counting tokens
            while True:
                text, shown = window_text(roots[q["folder"]], chars)
                if await counter.count(text) <= room or chars < 500:
                    break
                chars = int(chars * 0.85)
            schema = {
                "type": "object",
                "properties": {"path": {"enum": shown}, "line": {"type": "integer", "minimum": 1}},
                "required": ["path", "line"],
                "additionalProperties": False,
            }
            request = InferenceRequest(
                messages=[
                    ChatMessage(
                        role="system", content="You read code and cite where a question is answered."
                    ),
                    ChatMessage(
                        role="user",
                        content=f"{text}\n\nQuestion: {q['question']}\n{WINDOW_ASK}",
                    ),
                ],
                response_format=schema,
                max_tokens=WINDOW_ANSWER_TOKENS,
                temperature=0.0,
            )
            try:
                response = await engine.generate(request)
                cited = response.parsed if isinstance(response.parsed, dict) else None
            except Exception as exc:  # a reply cut off: no citation
                print(f"  {q['id']}: window baseline: {type(exc).__name__}: {exc}", file=sys.stderr)
                cited = None
            out.append(
                {"id": q["id"], "cited": cited, "seconds": time.monotonic() - began, "files_seen": len(shown)}
            )
            print(f"  window {q['id']}: {cited} ({time.monotonic() - began:.0f}s)", flush=True)
    finally:
        await engine.close()
    return out


def run_research(
    questions: list[dict[str, Any]], roots: dict[str, Path], env: dict[str, str]
) -> list[dict[str, Any]]:
    from colony.client import ColonyClient
    from colony.config import ColonySettings
    from colony.serve import cluster

    os.environ.update(env)
    info = cluster.status(ColonySettings())
    assert info is not None, "colony up did not leave a cluster running"
    out = []
    with ColonyClient(info.url, info.token, timeout=120) as client:
        mapped = {}
        for name, root in roots.items():
            source = client.map_source(str(root))
            mapped[name] = [p["page_id"] for p in source["pages"]]
            print(f"  mapped {name}: {len(mapped[name])} pages", flush=True)
        for q in questions:
            began = time.monotonic()
            body = {"question": q["question"], "path": str(roots[q["folder"]]), "pages": mapped[q["folder"]]}
            view = client.run("research", body, timeout_s=600)
            seconds = time.monotonic() - began
            output = view.get("output") if isinstance(view.get("output"), dict) else {}
            citations = output.get("citations") or []
            out.append(
                {
                    "id": q["id"],
                    "cited": citations[0] if citations else None,
                    "seconds": seconds,
                    "status": view.get("status"),
                    "error": view.get("error"),
                    "agents": len(output.get("agents") or []) + len(output.get("not_finished") or []),
                    "faulted": (output.get("stats") or {}).get("faulted", 0),
                    "evidence": output.get("evidence") or [],
                    "answer": output.get("answer"),
                }
            )
            print(
                f"  research {q['id']}: {out[-1]['cited']} ({seconds:.0f}s, {view.get('status')})", flush=True
            )
    return out


# -- report --------------------------------------------------------------------------------------------


def score(
    questions: list[dict[str, Any]], spans: dict[str, tuple[int, int, int]], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    by_id = {q["id"]: q for q in questions}
    folders: dict[str, list[int]] = {}
    right = exact = 0
    for row in rows:
        q = by_id[row["id"]]
        ok, first = judge(q, spans[q["id"]], row.get("cited"))
        row["right"], row["exact"] = ok, first
        right += ok
        exact += first
        folders.setdefault(q["folder"], [0, 0])
        folders[q["folder"]][0] += ok
        folders[q["folder"]][1] += 1
    seconds = sorted(r["seconds"] for r in rows)
    return {
        "questions": len(rows),
        "right": right / len(rows) if rows else 0.0,
        "exact": exact / len(rows) if rows else 0.0,
        "by_folder": {f: f"{a}/{b}" for f, (a, b) in sorted(folders.items())},
        "p50_seconds": statistics.median(seconds) if seconds else 0.0,
        "p90_seconds": seconds[int(0.9 * (len(seconds) - 1))] if seconds else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--set", default="test", choices=["test", "dev"])
    parser.add_argument("--folders", default=None, help="comma-separated packages (default: the set's)")
    parser.add_argument("--limit", type=int, default=None, help="questions per folder")
    parser.add_argument("--variants", default="index,research,window")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/colony-research-quality"))
    parser.add_argument("--port", type=int, default=18433)
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument("--json", action="store_true", help="print every row as JSON at the end")
    args = parser.parse_args(argv)
    folders = args.folders.split(",") if args.folders else None
    questions = load_questions(args.set, folders, args.limit)
    names = sorted({q["folder"] for q in questions})
    roots = copy_packages(names, args.data_dir / "code")
    spans = {q["id"]: definition_span(roots[q["folder"]], q["path"], q["identifier"]) for q in questions}
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    print(f"{len(questions)} questions of the {args.set} set over {', '.join(names)}", flush=True)
    results: dict[str, list[dict[str, Any]]] = {}
    if "index" in variants:
        results["index"] = run_index(questions, roots)
    if "research" in variants:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_")}
        env.update(
            {
                "COLONY_DATA_DIR": str(args.data_dir / "colony"),
                "COLONY_SERVE__PORT": str(args.port),
                "COLONY_VCM__ALLOWED_ROOTS": json.dumps([str(args.data_dir / "code")]),
                "RAY_USAGE_STATS_ENABLED": "0",
            }
        )
        started = time.monotonic()
        up = colony("up", env=env)
        if up.returncode != 0:
            print(up.stderr[-3000:], file=sys.stderr)
            return 2
        print(f"colony up: {time.monotonic() - started:.0f}s", flush=True)
        try:
            results["research"] = run_research(questions, roots, env)
        finally:
            if not args.keep_cluster:
                colony("down", env=env)
    if "window" in variants:
        results["window"] = asyncio.run(run_window(questions, roots))
    print()
    print(
        "| variant | right citation | exact line | by folder | p50 s | p90 s | agents/q | pages faulted/q |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        s = score(questions, spans, rows)
        agents = statistics.mean(r.get("agents", 0) for r in rows) if name == "research" and rows else None
        faults = statistics.mean(r.get("faulted", 0) for r in rows) if name == "research" and rows else None
        by = ", ".join(f"{f} {v}" for f, v in s["by_folder"].items())
        print(
            f"| {name} | {s['right']:.0%} | {s['exact']:.0%} | {by} "
            f"| {s['p50_seconds']:.1f} | {s['p90_seconds']:.1f} "
            f"| {'' if agents is None else f'{agents:.1f}'} | {'' if faults is None else f'{faults:.1f}'} |"
        )
    print(
        "\nbaseline: the single-agent window (same model) and the index alone; goal: research >= 80% right, "
        "above the window baseline, p50 <= 90 s"
    )
    if args.json:
        print(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
