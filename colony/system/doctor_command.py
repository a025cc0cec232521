"""`colony doctor`: the invariant checker (`colony.system.doctor`) on the command line: connect
the way `colony bb` does, print the report (or its JSON), exit 0 clean, 1 violations, 2 no Redis,
3 incomplete (a listing truncated or a check skipped), 4 a key it could not read as Colony wrote
it (the check stopped there).

`--prune-orphans` is its one repair: it removes the orphaned agent keys the check found
(`colony.system.agent_purge`), each id only if the registry still has no record of it and its
lifecycle is still the one the check saw, then checks again and reports that second check. An
ended agent's retained memory (`retained`) is listed, never pruned."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence

import redis

from colony.blackboard import Blackboard, BlackboardScope, scope_id
from colony.config import ColonySettings
from colony.errors import BlackboardUnavailable, ColonyError, InvalidArgument, InvalidKey
from colony.system.agent_purge import purge_agent
from colony.system.doctor import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MAX_ENTRIES,
    DoctorReport,
    check_invariants,
)
from colony.system.import_write import LIFECYCLE, importing
from colony.system.registry import AgentRegistry

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_UNREACHABLE, EXIT_INCOMPLETE, EXIT_UNREADABLE = 0, 1, 2, 3, 4


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
    if report.orphans:
        lines.append(
            f"orphaned agent keys: {sum(report.orphans.values())} key(s) and block(s) of "
            f"{len(report.orphans)} agent id(s) no record names ({', '.join(sorted(report.orphans))}); "
            "`colony doctor --prune-orphans` removes them"
        )
    if report.retained:
        lines.append(
            f"retained memory of ended agents (kept on purpose, not pruned): {len(report.retained)} agent "
            f"id(s) ({', '.join(sorted(report.retained)[:20])})"
        )
    if report.clean:
        lines.append("clean: no invariant is violated")
        return "\n".join(map(_printable, lines))
    summary = ", ".join(f"{k} {n}" for k, n in sorted(report.kinds().items()))
    lines.append(f"{len(report.violations)} violation(s): {summary}")
    lines += [f"- [{v.kind.value}] {v.subject}: {v.message}" for v in report.violations]
    return "\n".join(map(_printable, lines))


def _printable(line: str) -> str:
    """A report line as a terminal shows it: what it quotes from Redis (a replica id, a state) may
    hold escape sequences or line breaks (found by review: a record's made `clean` appear)."""
    return "".join(c if c.isprintable() else " " for c in line)


async def prune_orphans(board: Blackboard, settings: ColonySettings, report: DoctorReport) -> list[str]:
    """Remove every key of the report's orphaned agent ids that are still as the check saw them
    (`board`: the colony's scope): the registry still does not name the id, and its lifecycle is
    at the version the check read (none stays none) and carries no import's live mark. The ids
    pruned, with how many keys and blocks went."""
    registry = AgentRegistry(board, settings=settings)
    pruned = []
    for agent_id in sorted(report.orphans):
        if await registry.get(agent_id) is not None:
            continue  # registered since the check: not an orphan after all
        where = {"tenant_id": settings.tenant_id, "colony_id": settings.colony_id}
        own = board.scoped(scope_id(BlackboardScope.AGENT, agent_id=agent_id, **where))
        lifecycle = await own.read(LIFECYCLE)
        version = lifecycle.version if lifecycle is not None else 0
        if version != report.orphan_versions.get(agent_id, 0) or (
            lifecycle is not None and importing(lifecycle.value, time.time())
        ):
            continue  # written since the check (an import, a spawn): judged again next time
        removed = await purge_agent(board, agent_id, settings=settings)
        pruned.append(f"{agent_id}: {len(removed.keys)} key(s), {len(removed.blocks)} block(s)")
    return pruned


async def _doctor(
    settings: ColonySettings,
    grace_seconds: float,
    max_entries: int,
    run_ids: Sequence[str],
    prune: bool = False,
) -> tuple[DoctorReport, list[str]]:
    board = Blackboard.connect(
        scope_id(BlackboardScope.COLONY, tenant_id=settings.tenant_id, colony_id=settings.colony_id), settings
    )

    async def check() -> DoctorReport:
        return await check_invariants(
            board,
            tenant_id=settings.tenant_id,
            colony_id=settings.colony_id,
            grace_seconds=grace_seconds,
            max_entries=max_entries,
            run_ids=run_ids,
        )

    try:
        report = await check()
        if not (prune and report.orphans):
            return report, []
        pruned = await prune_orphans(board, settings, report)
        return await check(), pruned
    finally:
        await board.close()


def doctor_command(
    settings: ColonySettings,
    *,
    as_json: bool,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    run_ids: Sequence[str] = (),
    prune_orphans: bool = False,
) -> int:
    """`colony doctor`: connects like `colony bb` (COLONY_REDIS_URL, else the running embedded
    server), prints the report, and returns 0 when clean, 1 with violations, 2 when Redis cannot
    be reached. `prune_orphans`: remove the orphaned agent keys found, then report a second check."""
    try:
        report, pruned = asyncio.run(_doctor(settings, grace_seconds, max_entries, run_ids, prune_orphans))
    except BlackboardUnavailable as exc:
        print(f"colony doctor: cannot reach Redis: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (InvalidArgument, InvalidKey):
        raise  # a bad argument (grace, a run id): the CLI's ColonyError handler says so
    except ColonyError as exc:  # e.g. no COLONY_REDIS_URL and no embedded server running
        print(f"colony doctor: cannot reach Redis: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (redis.ResponseError, ValueError) as exc:  # found by review: a traceback, and exit 1
        if isinstance(exc, redis.ResponseError) and "WRONGTYPE" not in str(exc):
            raise  # Redis refused (read-only, out of memory, ...): not a key of the wrong kind
        print(
            f"colony doctor: a key is not as Colony writes it ({type(exc).__name__}: {str(exc)[:300]}); "
            "the check stopped there. `colony bb` shows the colony's keys",
            file=sys.stderr,
        )
        return EXIT_UNREADABLE
    if as_json:
        print(json.dumps({**report.model_dump(mode="json"), "pruned": pruned}, indent=2, sort_keys=True))
    else:
        print("\n".join([*(f"pruned orphaned agent keys of {p}" for p in pruned), format_report(report)]))
    if not report.clean:
        return EXIT_VIOLATIONS
    # nothing found, but not everything was read (a listing hit max_entries, a check was skipped):
    # not "clean", which would claim what was not checked
    return EXIT_INCOMPLETE if report.truncated or report.skipped else EXIT_CLEAN
