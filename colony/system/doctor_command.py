"""`colony doctor`: the invariant checker (`colony.system.doctor`) on the command line: connect
the way `colony bb` does, print the report (or its JSON), exit 0 clean, 1 violations, 2 no Redis,
3 incomplete (a listing truncated or a check skipped)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence

from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.config import ColonySettings
from colony.errors import BlackboardUnavailable, ColonyError, InvalidArgument, InvalidKey
from colony.system.doctor import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MAX_ENTRIES,
    DoctorReport,
    check_invariants,
)

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_UNREACHABLE, EXIT_INCOMPLETE = 0, 1, 2, 3


def format_report(report: DoctorReport) -> str:
    """The human report: one line per violation, then what was checked."""
    c = report.checked
    lines = [
        f"colony doctor: tenant {report.tenant_id}, colony {report.colony_id} "
        f"(grace {report.grace_seconds:g}s)",
        f"checked {c.agents} agent(s), {c.replicas} live replica(s), {c.suspended} suspended agent(s), "
        f"{c.pages} page(s), {c.open_claims} open run claim(s), {c.runs} named run(s)",
    ]
    if report.truncated:
        lines.append(
            f"TRUNCATED: {', '.join(report.truncated_listings)} stopped at the entry limit; what was "
            "not read was not checked"
        )
    lines += [f"skipped {s}" for s in report.skipped]
    if report.clean:
        lines.append("clean: no invariant is violated")
        return "\n".join(lines)
    summary = ", ".join(f"{k} {n}" for k, n in sorted(report.kinds().items()))
    lines.append(f"{len(report.violations)} violation(s): {summary}")
    lines += [f"- [{v.kind.value}] {v.subject}: {v.message}" for v in report.violations]
    return "\n".join(lines)


async def _doctor(
    settings: ColonySettings, grace_seconds: float, max_entries: int, run_ids: Sequence[str]
) -> DoctorReport:
    board = Blackboard.connect(
        scope_id(BlackboardScope.COLONY, tenant_id=settings.tenant_id, colony_id=settings.colony_id), settings
    )
    try:
        return await check_invariants(
            board,
            tenant_id=settings.tenant_id,
            colony_id=settings.colony_id,
            grace_seconds=grace_seconds,
            max_entries=max_entries,
            run_ids=run_ids,
        )
    finally:
        await board.close()


def doctor_command(
    settings: ColonySettings,
    *,
    as_json: bool,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    run_ids: Sequence[str] = (),
) -> int:
    """`colony doctor`: connects like `colony bb` (COLONY_REDIS_URL, else the running embedded
    server), prints the report, and returns 0 when clean, 1 with violations, 2 when Redis cannot
    be reached."""
    try:
        report = asyncio.run(_doctor(settings, grace_seconds, max_entries, run_ids))
    except BlackboardUnavailable as exc:
        print(f"colony doctor: cannot reach Redis: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (InvalidArgument, InvalidKey):
        raise  # a bad argument (grace, a run id): the CLI's ColonyError handler says so
    except ColonyError as exc:  # e.g. no COLONY_REDIS_URL and no embedded server running
        print(f"colony doctor: cannot reach Redis: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if as_json:
        print(json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True))
    else:
        print(format_report(report))
    if not report.clean:
        return EXIT_VIOLATIONS
    # nothing found, but not everything was read (a listing hit max_entries, a check was skipped):
    # not "clean", which would claim what was not checked
    return EXIT_INCOMPLETE if report.truncated or report.skipped else EXIT_CLEAN
