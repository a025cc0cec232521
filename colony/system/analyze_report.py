"""The `analyze` report: the workers' answers (untrusted, read back from Redis) turned into the
report, its overview and the run's output (docs/analyze.md).

Kept apart from the coordinator (colony/system/analyze.py), which only decides *which* worker's
answer counts for which pages (a failed worker is replaced by its retry); everything here is a
function of the job's record, those answers and, for the overview's one optional sentence, an
engine. `build_report` is the entry point; `compose_report` is pure, so the header's counts can
be checked without a model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from colony.inference import ChatMessage, InferenceRequest
from colony.inference.engine import InferenceEngine
from colony.system.analyze_check import (
    Verdict,
    Vocabulary,
    check_summary,
    first_sentences,
    whole_sentences,
)
from colony.system.analyze_facts import overview_paragraph

log = logging.getLogger(__name__)

# prompts shared with the page workers' section summaries (colony/system/analyze.py)
SUMMARY_SYSTEM = "You summarise source code for an engineer. Be brief, concrete and accurate."
RETRY_ASK = (
    "\n\nYour previous summary was rejected ({problems}). Do not use those words and do not repeat yourself."
)
OVERVIEW_ASK = (
    "{digest}\n\nIn one sentence, what is this code base for? Name only files and definitions above."
)
NO_SUMMARY = "no summary for these pages"  # a worker answered, but not for these pages
UNCOVERED = "no worker's answer covers these mapped files (their pages' records may be gone)"
GROUNDINGS = ("accepted", "regenerated", "extractive")

FilesOfPages = Callable[[list[str]], Awaitable[list[str]]]


def run_failed(run: Any) -> bool:
    """A worker's run that gave no usable answer (missing, failed, or an output not a dict)."""
    return run is None or bool(run.error) or not isinstance(run.output, dict)


class Section(BaseModel):
    """One page's section as a worker answered it (read back from Redis: validated, untrusted)."""

    page_id: str
    files: list[str] = Field(default_factory=list)
    spans: list[str] = Field(default_factory=list)
    defines: list[str] = Field(default_factory=list)
    summary: str = ""
    grounding: Literal["accepted", "regenerated", "extractive"] = "extractive"
    # whether a model was asked at all: a piece with no facts (a split file's last lines) is
    # extractive without one, so "the model named things not in the code" is not said of it
    asked: bool = True
    facts: list[dict[str, Any]] = Field(default_factory=list)


async def build_report(
    job: Mapping[str, Any],
    results: Mapping[str, Any],
    *,
    files_of_pages: FilesOfPages,
    engine: InferenceEngine | None,
    overview_tokens: int,
) -> dict[str, Any]:
    """The run's output. `job`: the coordinator's record (`path`, `groups` {worker: page ids},
    `retries` {failed worker: its retry}); `results`: each worker's run (None: none);
    `files_of_pages`: the files of page ids (for pages not analysed); `engine` and
    `overview_tokens`: the overview's model sentence (None or 0: facts only). A mapped file (the
    job's `files`) that neither a section nor a failure names is listed as not analysed (the run
    is `partial`), and a section's files outside the mapped ones are dropped."""
    sections, workers, not_analysed = await collect_sections(job, results, files_of_pages)
    mapped = _mapped_files(job)
    if mapped:  # every mapped file is in a section or named as not analysed (untrusted answers)
        sections = [s.model_copy(update={"files": [f for f in s.files if f in mapped]}) for s in sections]
        covered = {f for s in sections for f in s.files} | {f for n in not_analysed for f in n["files"]}
        missing = [f for f in mapped if f not in covered]
        if missing:
            log.warning("analyze: no answer covers %d mapped file(s): %s", len(missing), missing[:10])
            not_analysed.append(
                {
                    "worker": "",
                    "pages": [],
                    "files": missing,
                    "error": UNCOVERED,
                    "retried": False,
                }
            )
    overview = await build_overview(sections, engine, overview_tokens) if sections else ""
    retried = sorted(job.get("retries") or {})
    return compose_report(
        job.get("path"), sections, workers, not_analysed, retried, overview, mapped_files=mapped
    )


def _mapped_files(job: Mapping[str, Any]) -> list[str]:
    """The job's mapped files (what the dispatch read from the page records), validated."""
    files = job.get("files")
    if not isinstance(files, list):
        return []
    return sorted({f for f in files if isinstance(f, str) and f})


async def collect_sections(
    job: Mapping[str, Any], results: Mapping[str, Any], files_of_pages: FilesOfPages
) -> tuple[list[Section], list[str], list[dict[str, Any]]]:
    """(the valid sections, in page-group order; the workers whose answers count; the pages not
    analysed, by worker). For each group the retry's answer counts where there is one; a section
    for a page outside the worker's group, or a second one for a page (in any group), is ignored."""
    sections: list[Section] = []
    done: list[str] = []
    not_analysed: list[dict[str, Any]] = []
    retries: Mapping[str, str] = job.get("retries") or {}
    groups: Mapping[str, list[str]] = job.get("groups") or {}
    # dispatch order (the groups' insertion order, kept in the job's stored state), which is page
    # order: sorted ids would put `-w10` before `-w2`
    answered: set[str] = set()  # across groups: a page in two groups is one section
    for worker in [w for w in groups if w not in retries.values()]:
        final = retries.get(worker, worker)
        run = results.get(final)
        group = list(groups[worker])
        if not run_failed(run):
            for raw in run.output.get("pages") or []:
                try:
                    section = Section.model_validate(raw)
                except ValueError:
                    continue
                if section.page_id in group and section.page_id not in answered:
                    answered.add(section.page_id)
                    sections.append(section)
            done.append(final)
        lost = [p for p in group if p not in answered]
        if lost:
            error = str(run.error or "no output") if run_failed(run) else NO_SUMMARY
            not_analysed.append(
                {
                    "worker": final,
                    "pages": lost,
                    "files": await files_of_pages(lost),
                    "error": error[:2000],
                    "retried": final != worker,
                }
            )
    return sections, done, not_analysed


def compose_report(
    path: str | None,
    sections: list[Section],
    workers: list[str],
    not_analysed: list[dict[str, Any]],
    retried: list[str],
    overview: str,
    *,
    mapped_files: list[str] | None = None,
) -> dict[str, Any]:
    """The output: the report's Markdown (header, overview, a section per page, "Not analysed")
    and the structured fields its header counts come from. Each mapped file is counted once: in
    full (all its pages have a section), in part (a split file with a page lost) or not at all."""
    files = sorted({f for s in sections for f in s.files})
    lost_files = {f for n in not_analysed for f in n["files"]}
    every = sorted(set(mapped_files or []) | set(files) | lost_files)
    partly = [f for f in files if f in lost_files]
    failed = [n for n in not_analysed if n["error"] not in (NO_SUMMARY, UNCOVERED)]
    stats = {kind: sum(1 for s in sections if s.grounding == kind) for kind in GROUNDINGS}
    head = (
        f"{len(files)} files in {len(sections)} page(s), summarised by {len(workers)} page-bound worker(s)."
    )
    if retried:
        head += f" {len(retried)} worker(s) failed and were retried."
    if not_analysed:
        head += _coverage_sentences(not_analysed, failed, files, partly, every)
    head += _summaries_sentence(sections, stats)
    title = f"# Analysis of {path or 'the mapped pages'}"
    return {
        "report": _markdown(title, head, overview, sections, not_analysed),
        "path": path,
        "files": files,
        "mapped_files": len(every),
        "partly_analysed": partly,
        "pages": len(sections),
        "workers": sorted(workers),
        "failed_workers": len(failed),
        "retried": retried,
        "partial": bool(not_analysed),
        "not_analysed": not_analysed,
        "sections": [
            {
                "files": s.files,
                "spans": s.spans,
                "summary": s.summary,
                "grounding": s.grounding,
                "defines": s.defines,
            }
            for s in sections
        ],
        "stats": stats,
    }


def _coverage_sentences(
    not_analysed: list[dict[str, Any]],
    failed: list[dict[str, Any]],
    files: list[str],
    partly: list[str],
    every: list[str],
) -> str:
    """The header's count of the mapped files analysed in full, in part and not at all, and why
    pages were not analysed."""
    text = f" {len(files) - len(partly)} of {len(every)} mapped file(s) analysed in full"
    if partly:
        text += f", {len(partly)} in part ({', '.join(partly[:10])}{', ...' if len(partly) > 10 else ''})"
    text += f", {len(every) - len(files)} not at all."
    why = _counted(
        (sum(1 for n in failed if n["retried"]), "worker(s) failed after a retry"),
        (sum(1 for n in failed if not n["retried"]), "worker(s) failed and could not be retried"),
        (sum(1 for n in not_analysed if n["error"] == NO_SUMMARY), "answer(s) left pages out"),
        (sum(1 for n in not_analysed if n["error"] == UNCOVERED), "set of files no answer covers"),
    )
    pages_lost = len({p for n in not_analysed for p in n["pages"]})
    return text + f" Not analysed: {pages_lost} page(s) ({why}); see the end."


def _summaries_sentence(sections: list[Section], stats: dict[str, int]) -> str:
    """The header's count of the summaries by grounding (why extractive ones are)."""
    rejected = sum(1 for s in sections if s.grounding == "extractive" and s.asked)
    why_extractive = _counted(
        (rejected, "after the model's summary was rejected twice"),
        (stats["extractive"] - rejected, "with nothing a model could summarise"),
    )
    return (
        f" Summaries: {stats['accepted']} accepted, {stats['regenerated']} regenerated, "
        f"{stats['extractive']} extractive{f' ({why_extractive})' if why_extractive else ''}."
    )


def _markdown(
    title: str, head: str, overview: str, sections: list[Section], not_analysed: list[dict[str, Any]]
) -> str:
    """The report's Markdown: title, header, overview, a section per page, "Not analysed"."""
    parts = [title, "", head, ""]
    if overview:
        parts += ["## Overview", "", overview, ""]
    parts += [_section_text(section) for section in sections]
    if not_analysed:
        parts += ["## Not analysed", ""]
        parts += [
            f"- {', '.join(n['files']) or ', '.join(n['pages'])}: "
            f"{n['worker'] + ': ' if n['worker'] else ''}{n['error']}"
            for n in not_analysed
        ]
        parts.append("")
    return "\n".join(parts)


def _counted(*counts: tuple[int, str]) -> str:
    """`2 x, 1 y` of the (count, what) pairs whose count is not 0."""
    return ", ".join(f"{count} {what}" for count, what in counts if count)


def _section_text(section: Section) -> str:
    heading = ", ".join(section.spans or section.files)
    mark = " (extractive)" if section.grounding == "extractive" else ""
    defines = f"\n\nDefines: {', '.join(section.defines)}." if section.defines else ""
    imports = sorted({i for f in section.facts for i in f.get("imports") or [] if isinstance(i, str)})
    imported = f"\n\nImports: {', '.join(imports)}." if imports else ""
    return f"## {heading}\n\n{section.summary or '(no summary)'}{mark}{defines}{imported}\n"


async def build_overview(sections: list[Section], engine: InferenceEngine | None, max_tokens: int) -> str:
    """The files' roles and import graph (from the facts), then at most one model sentence
    over that and the accepted summaries, kept only if it passes the grounding check."""
    facts = [f for s in sections for f in s.facts]
    paragraph = overview_paragraph(facts)
    if engine is None or max_tokens <= 0:
        return paragraph
    grounded = [s.summary for s in sections if s.grounding != "extractive"]
    digest = "\n".join([paragraph, *grounded])[:4000]
    vocabulary = Vocabulary(digest, *(json.dumps(f) for f in facts))
    rejected: Verdict | None = None
    for _ in range(2):
        ask = OVERVIEW_ASK.format(digest=digest)
        if rejected is not None:
            ask += RETRY_ASK.format(problems=rejected.problems())
        request = InferenceRequest(
            messages=[
                ChatMessage(role="system", content=SUMMARY_SYSTEM),
                ChatMessage(role="user", content=ask),
            ],
            max_tokens=max_tokens,
        )
        try:
            said = first_sentences(whole_sentences((await engine.generate(request)).text), 1)
        except Exception as exc:  # the overview's model sentence is optional
            log.warning("analyze: overview sentence not generated: %r", exc)
            return paragraph
        rejected = check_summary(said, vocabulary)
        if rejected.ok:
            return f"{said}\n\n{paragraph}" if paragraph else said
    return paragraph
