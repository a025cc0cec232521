"""The invariant checker (`colony doctor`): is what Redis says about agents, replicas, pages and runs
consistent, so that no agent runs twice and nothing is forgotten?

After a fault (a Redis restart, a replica killed, the control plane restarted) the loops that keep
the blackboard consistent (replica heartbeats, the resource monitor, the agents' request feeds)
heal it within a few periods. This module checks that they did. `check_invariants` only reads;
it never repairs, so running it is always safe, and the chaos suite runs it after each fault until
it comes back clean.

Everything is read through the index sets the rest of the code reads, but for one check: orphaned
agent keys (colony.system.doctor_orphans) have no index, and are found by a bounded keyspace SCAN.
Each listing stops after `max_entries` entries (the report then says `truncated`). Values read
from Redis are validated; one that does not validate is itself reported (the code that reads it
would fail on it too).

Time: entries carry Redis' clock, so "now" is Redis' clock too (`TIME`), unless the caller passes
`now`. A state younger than `grace_seconds` (by the timestamp of the entry that shows it) is not
reported: right after a fault, the healing loops have not had their turn yet. A state that a
heartbeat contradicts is reported only when that heartbeat is newer than the entry: a heartbeat
older than the registry's last write may simply predate a move.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ValidationError

from colony.agents.models import AgentMetadata, SuspensionRequest
from colony.blackboard import Blackboard, BlackboardEntry, BlackboardScope, TagFilter, scope_id
from colony.blackboard.protocol import (
    AgentRegistryProtocol,
    AgentRunProtocol,
    AgentStateProtocol,
    ApiRunProtocol,
    VcmProtocol,
)
from colony.errors import InvalidArgument, InvalidKey
from colony.system.builtin import RUNS_NAMESPACE
from colony.system.doctor_orphans import find_orphans
from colony.system.doctor_report import DoctorReport, Violation, ViolationKind
from colony.system.registry import DONE_STATES, NOT_HOSTED, AgentRecord
from colony.system.runs import RunRecord
from colony.vcm.page_table import PageRecord

DEFAULT_GRACE_SECONDS = 10.0
DEFAULT_MAX_ENTRIES = 10_000
PAGE_SIZE = 500
MAX_QUERY_PAGES = 10_000  # a listing's pages at most (each query page is bounded work already)
MAX_AGENT_IDS_IN_HEARTBEAT = 100_000
MESSAGE_LIMIT = 600


def _short(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def _ago(now: float, then: float) -> str:
    return f"{max(0.0, now - then):.1f}s ago"


class _Heartbeat(BaseModel):
    replica_id: str
    agent_ids: frozenset[str]
    at: float  # the heartbeat entry's last write, by Redis' clock


class _Checker:
    def __init__(
        self,
        root: Blackboard,
        *,
        tenant_id: str,
        colony_id: str,
        grace_seconds: float,
        max_entries: int,
        now: float,
    ) -> None:
        self.root = root
        self.tenant_id, self.colony_id = tenant_id, colony_id
        self.grace, self.max_entries, self.now = grace_seconds, max_entries, now
        self.colony = root.scoped(scope_id(BlackboardScope.COLONY, tenant_id=tenant_id, colony_id=colony_id))
        self.report = DoctorReport(
            tenant_id=tenant_id, colony_id=colony_id, checked_at=now, grace_seconds=grace_seconds
        )
        self.heartbeats: dict[str, _Heartbeat] = {}
        self.liveness_known = True
        self.hosts_of: dict[str, list[str]] = {}
        self.records: dict[str, tuple[BlackboardEntry, AgentRecord]] = {}
        self.lost: list[tuple[str, BlackboardEntry, AgentRecord]] = []  # see `check_lost`

    # -- reading --------------------------------------------------------------------------------

    def flag(self, kind: ViolationKind, subject: str, message: str) -> None:
        self.report.violations.append(Violation(kind=kind, subject=subject, message=_short(message)))

    def old(self, at: float) -> bool:
        """Whether a state shown by an entry written at `at` has lasted past the grace period."""
        return self.now - at > self.grace

    async def listing(
        self, board: Blackboard, pattern: str, tag: str, name: str, limit: int | None = None
    ) -> list[BlackboardEntry]:
        """Entries of `pattern` carrying `tag`, read through the tag's index set, at most `limit`
        (default `max_entries`); a listing cut short is recorded as truncated."""
        limit = self.max_entries if limit is None else limit
        out: list[BlackboardEntry] = []
        cursor: str | None = None
        tags = TagFilter(all_of=frozenset({tag}))
        for _ in range(MAX_QUERY_PAGES):
            if len(out) >= limit:
                break
            page = await board.query(
                pattern, tags=tags, limit=min(PAGE_SIZE, limit - len(out)), cursor=cursor
            )
            out.extend(page.entries)
            cursor = page.cursor
            if cursor is None:
                return out
        if name not in self.report.truncated_listings:
            self.report.truncated_listings.append(name)
        self.report.truncated = True
        return out[:limit]

    def agent_board(self, agent_id: str, namespace: str | None = None) -> Blackboard:
        return self.root.scoped(
            scope_id(
                BlackboardScope.AGENT,
                tenant_id=self.tenant_id,
                colony_id=self.colony_id,
                agent_id=agent_id,
                namespace=namespace,
            )
        )

    # -- replicas and agents --------------------------------------------------------------------

    async def read_heartbeats(self) -> None:
        entries = await self.listing(
            self.colony,
            AgentRegistryProtocol.pattern("replica"),
            AgentRegistryProtocol.index_tag("replica"),
            "replicas",
        )
        if "replicas" in self.report.truncated_listings:
            self.liveness_known = False
            self.report.skipped.append(
                "dead-replica checks: more live replicas than max_entries, so which are alive is unknown"
            )
        for entry in entries:
            replica_id = AgentRegistryProtocol.parse("replica", entry.key)["replica_id"]
            value = entry.value if isinstance(entry.value, dict) else {}
            raw_ids = value.get("agent_ids")
            ids = raw_ids if isinstance(raw_ids, list) else []
            agent_ids = frozenset(a for a in ids[:MAX_AGENT_IDS_IN_HEARTBEAT] if isinstance(a, str))
            self.heartbeats[replica_id] = _Heartbeat(
                replica_id=replica_id, agent_ids=agent_ids, at=entry.updated_at
            )
            for agent_id in agent_ids:
                self.hosts_of.setdefault(agent_id, []).append(replica_id)
        self.report.checked.replicas = len(self.heartbeats)

    def alive(self, replica_id: str) -> bool:
        return replica_id in self.heartbeats

    async def read_agents(self) -> None:
        entries = await self.listing(
            self.colony,
            AgentRegistryProtocol.pattern("agent"),
            AgentRegistryProtocol.index_tag("agent"),
            "agents",
        )
        for entry in entries:
            try:
                record = entry.value_as(AgentRecord)
            except ValidationError as exc:
                self.flag(
                    ViolationKind.RECORD_UNREADABLE,
                    entry.key,
                    f"registry entry {entry.key} is not an agent record ({exc.error_count()} errors): every "
                    "registry listing (the resource monitor's included) fails on it. Delete it "
                    f"(`colony bb --scope {self.colony.scope_id} read {entry.key}` shows it) and let the "
                    "agent's replica write it again.",
                )
                continue
            self.records[record.agent_id] = (entry, record)
        self.report.checked.agents = len(self.records)

    def check_hosting(self) -> None:
        """Invariant 1: no agent hosted twice; the registry agrees with the live heartbeats."""
        for agent_id, hosts in sorted(self.hosts_of.items()):
            if len(hosts) > 1:
                listed = ", ".join(
                    f"{r} (heartbeat {_ago(self.now, self.heartbeats[r].at)})" for r in sorted(hosts)
                )
                self.flag(
                    ViolationKind.HOSTED_TWICE,
                    agent_id,
                    f"agent {agent_id} is hosted by {len(hosts)} live replicas at once: {listed}; it may "
                    "run twice. A move in flight shows so for one heartbeat period: check again; if it "
                    "stays, restart all but one of those replicas.",
                )
        if not self.liveness_known:
            return
        for agent_id, (entry, record) in sorted(self.records.items()):
            hosts = sorted(self.hosts_of.get(agent_id, []))
            newer = [r for r in hosts if self.heartbeats[r].at > entry.updated_at]
            if record.state in NOT_HOSTED:
                if newer and self.old(entry.updated_at):
                    self.flag(
                        ViolationKind.REGISTRY_MISMATCH,
                        agent_id,
                        f"the registry says agent {agent_id} is {record.state} (written "
                        f"{_ago(self.now, entry.updated_at)}), yet live replica(s) {', '.join(newer)} host "
                        "it (heartbeats newer than that): the monitor may resume a second copy. The hosting "
                        "replica rewrites the record each heartbeat; if this stays, restart that replica.",
                    )
                continue
            if not record.replica or len(hosts) > 1:
                continue  # not placed yet, or reported above
            if not self.alive(record.replica):
                if not self.old(entry.updated_at):
                    continue
                if hosts and newer:
                    self.registry_elsewhere(agent_id, entry, record, hosts)
                elif not hosts:
                    self.flag(
                        ViolationKind.AGENT_ON_DEAD_REPLICA,
                        agent_id,
                        f"agent {agent_id} is {record.state} on replica {record.replica}, which has no "
                        f"heartbeat (registry written {_ago(self.now, entry.updated_at)}); the resource "
                        "monitor re-places such agents each round: if this stays, check that the control "
                        "plane (AgentSystem) runs and that a live replica has room.",
                    )
                continue
            beat = self.heartbeats[record.replica]
            if agent_id in beat.agent_ids or beat.at <= entry.updated_at or not self.old(entry.updated_at):
                continue
            if hosts:
                if newer:
                    self.registry_elsewhere(agent_id, entry, record, hosts)
                continue
            self.lost.append((agent_id, entry, record))

    def registry_elsewhere(
        self, agent_id: str, entry: BlackboardEntry, record: AgentRecord, hosts: list[str]
    ) -> None:
        self.flag(
            ViolationKind.REGISTRY_MISMATCH,
            agent_id,
            f"the registry places agent {agent_id} on replica {record.replica} (written "
            f"{_ago(self.now, entry.updated_at)}) but live replica {hosts[0]} hosts it and "
            f"{record.replica} does not: its runs and placement decisions go to the wrong replica. The "
            f"hosting replica rewrites the record each heartbeat; if this stays, restart {hosts[0]}.",
        )

    async def check_lost(self) -> None:
        """Agents placed on a live replica that does not host them, and no other does: a suspended
        one (by its lifecycle) is one the monitor will never find; any other is simply gone."""
        for agent_id, entry, record in self.lost:
            lifecycle = await self.agent_board(agent_id).read(AgentStateProtocol.key("lifecycle"))
            state = lifecycle.value.get("state") if lifecycle and isinstance(lifecycle.value, dict) else None
            beat = self.heartbeats[str(record.replica)]
            where = (
                f"the registry says agent {agent_id} is {record.state} on live replica {record.replica} "
                f"(written {_ago(self.now, entry.updated_at)}), but that replica's heartbeat "
                f"({_ago(self.now, beat.at)}) does not list it and no other replica hosts it"
            )
            if state == "suspended":
                self.flag(
                    ViolationKind.SUSPENDED_NOT_INDEXED,
                    agent_id,
                    f"{where}; its lifecycle says suspended, so the resource monitor (which reads the "
                    "registry's suspended agents) will never resume it. That replica's heartbeat heals such "
                    "records; if this stays, restart replica " + str(record.replica) + " (its agents are "
                    "then re-placed).",
                )
            else:
                self.flag(
                    ViolationKind.AGENT_LOST,
                    agent_id,
                    f"{where} (lifecycle: {state or 'missing'}): no loop re-places it and its runs are not "
                    "served. Restart replica " + str(record.replica) + " or re-create the agent.",
                )

    # -- suspended agents (what the resource monitor reads) ---------------------------------------

    async def check_suspended(self) -> None:
        """Invariant 3: every suspended agent is in the index the monitor reads (`state:suspended`),
        and what the monitor reads of it (metadata, suspension request, lifecycle) is readable."""
        monitored = await self.listing(
            self.colony,
            AgentRegistryProtocol.pattern("agent"),
            AgentRegistryProtocol.state_tag("suspended"),
            "suspended",
        )
        seen = {AgentRegistryProtocol.parse("agent", e.key)["agent_id"] for e in monitored}
        self.report.checked.suspended = len(seen)
        for agent_id, (_entry, record) in sorted(self.records.items()):
            if (
                record.state == "suspended"
                and agent_id not in seen
                and "suspended" not in self.report.truncated_listings
            ):
                self.flag(
                    ViolationKind.SUSPENDED_NOT_INDEXED,
                    agent_id,
                    f"agent {agent_id} is suspended in the registry but missing from its suspended index "
                    f"(tag {AgentRegistryProtocol.state_tag('suspended')}), which is where the resource "
                    "monitor looks: it will never be resumed. Rewrite the record with its tags to "
                    f"re-index it: `colony bb write {AgentRegistryProtocol.agent_key(agent_id)} "
                    "'<its value>' "
                    f"--tag {AgentRegistryProtocol.index_tag('agent')} "
                    f"--tag {AgentRegistryProtocol.state_tag('suspended')}`.",
                )
        for agent_id in sorted(seen):
            await self.check_resumable(agent_id)

    async def check_resumable(self, agent_id: str) -> None:
        board = self.agent_board(agent_id)
        metadata_e, suspension_e, lifecycle_e = await board.read_many(
            [
                AgentStateProtocol.key("metadata"),
                AgentStateProtocol.key("suspension"),
                AgentStateProtocol.key("lifecycle"),
            ]
        )
        problems = []
        for what, entry, model in (
            ("metadata", metadata_e, AgentMetadata),
            ("suspension", suspension_e, SuspensionRequest),
        ):
            if entry is None:
                continue  # the monitor reads a missing one as defaults (CUSTOM: waits for a resume)
            try:
                model.model_validate(entry.value)
            except ValidationError as exc:
                problems.append(f"its {what} does not validate ({exc.error_count()} errors)")
        state = (
            lifecycle_e.value.get("state") if lifecycle_e and isinstance(lifecycle_e.value, dict) else None
        )
        if state is None:
            problems.append("its lifecycle state is missing")
        elif state in DONE_STATES:
            problems.append(f"its lifecycle says {state} (ended agents are never resumed)")
        if problems:
            self.flag(
                ViolationKind.SUSPENDED_UNRESUMABLE,
                agent_id,
                f"suspended agent {agent_id}: {'; '.join(problems)}. The resource monitor "
                "cannot resume it (it takes an unreadable suspension for a wait for an explicit "
                "resume, and a resume fails on unreadable metadata or lifecycle). Repair its state "
                f"in scope {board.scope_id} (`colony bb --scope {board.scope_id} read agent:suspension`), "
                "or mark it ended: write its registry record with state failed.",
            )

    # -- pages ----------------------------------------------------------------------------------

    async def check_pages(self) -> None:
        """Invariant 2: no page listed (resident or swapped) on a replica that is not alive."""
        vcm = self.colony.scoped(
            scope_id(
                BlackboardScope.COLONY, tenant_id=self.tenant_id, colony_id=self.colony_id, namespace="vcm"
            )
        )
        entries = await self.listing(vcm, VcmProtocol.pattern("page"), VcmProtocol.index_tag("page"), "pages")
        self.report.checked.pages = len(entries)
        if not self.liveness_known:
            return
        for entry in entries:
            try:
                page = entry.value_as(PageRecord)
            except ValidationError as exc:
                self.flag(
                    ViolationKind.RECORD_UNREADABLE,
                    entry.key,
                    f"page table entry {entry.key} is not a page record ({exc.error_count()} errors): page "
                    f"lookups of it fail. Map its source again (POST /v1/vcm/sources) or delete it in "
                    f"scope {vcm.scope_id}.",
                )
                continue
            if not self.old(entry.updated_at):
                continue
            for where, replicas in (("resident", page.resident_on), ("swapped", page.swapped_on)):
                for replica_id in sorted(set(replicas)):
                    if not self.alive(replica_id):
                        self.flag(
                            ViolationKind.PAGE_ON_DEAD_REPLICA,
                            page.page_id,
                            f"page {page.page_id} is listed {where} on replica {replica_id}, which has no "
                            f"heartbeat (page record written {_ago(self.now, entry.updated_at)}): requests "
                            "for it are routed to a replica that is gone. The resource monitor forgets a "
                            "dead replica's pages when it re-places that replica's agents; a replica that "
                            "hosted none keeps them listed (PageTable.drop_replica clears them).",
                        )

    async def check_orphans(self) -> None:
        """Keys of agent ids that no registry record names and no replica hosts (a multi-key write
        cut off half way): colony.system.doctor_orphans."""
        if "agents" in self.report.truncated_listings:
            self.report.skipped.append("orphaned agent keys: the registry listing was cut short")
            return
        orphans, truncated = await find_orphans(
            self.root,
            tenant_id=self.tenant_id,
            colony_id=self.colony_id,
            known={*self.records, *self.hosts_of},
            now=self.now,
            grace_seconds=self.grace,
            max_ids=self.max_entries,
        )
        if truncated:
            self.report.truncated = True
            self.report.truncated_listings.append("agent_keys")
        for orphan in orphans:
            if orphan.retained:  # an ended agent's memory: listed apart, never pruned
                self.report.retained[orphan.agent_id] = orphan.keys + orphan.blocks
                continue
            self.report.orphans[orphan.agent_id] = orphan.keys + orphan.blocks
            self.report.orphan_versions[orphan.agent_id] = orphan.version
            at = orphan.written_at
            when = f"last written {_ago(self.now, at)}" if at is not None else "no lifecycle"
            self.flag(
                ViolationKind.ORPHANED_AGENT_KEYS,
                orphan.agent_id,
                f"agent id {orphan.agent_id} holds {orphan.keys} Redis key(s) and {orphan.blocks} block(s) "
                f"({when}) that do not expire, but no registry record names it and no replica hosts it: "
                "left by a write cut off half way (an import, a spawn). Nothing reads or removes them, and "
                "an import of that id is refused while they are there. Remove them with `colony doctor "
                "--prune-orphans`.",
            )

    # -- runs -----------------------------------------------------------------------------------

    def ended_or_unknown(self, agent_id: str) -> str | None:
        """Why nobody will serve `agent_id`'s runs (not registered, or ended); None if someone may."""
        known = self.records.get(agent_id)
        if known is None:
            return f"agent {agent_id} is not in the registry"
        if known[1].state in DONE_STATES:
            return f"agent {agent_id} is {known[1].state}"
        return None

    async def check_open_claims(self) -> set[str]:
        """Invariant 4, runs already claimed: a run claimed by an agent that has ended (or left the
        registry) and not answered will only end at its deadline. Returns the run ids checked."""
        checked: set[str] = set()
        budget = self.max_entries
        for agent_id in sorted(self.records):
            if budget <= 0:
                self.report.truncated = True
                if "open_claims" not in self.report.truncated_listings:
                    self.report.truncated_listings.append("open_claims")
                break
            board = self.agent_board(agent_id, RUNS_NAMESPACE)
            claims = await self.listing(
                board,
                AgentRunProtocol.pattern("claim"),
                AgentRunProtocol.open_claims_tag(),
                "open_claims",
                budget,
            )
            budget -= len(claims)
            run_ids = [AgentRunProtocol.parse("claim", c.key)["request_id"] for c in claims]
            results = await board.read_many([AgentRunProtocol.result_key(r) for r in run_ids])
            for run_id, claim, result in zip(run_ids, claims, results, strict=True):
                checked.add(run_id)
                why = self.ended_or_unknown(agent_id)
                if result is None and why and self.old(claim.updated_at):
                    self.stuck(run_id, f"it was claimed {_ago(self.now, claim.created_at)} and {why}")
        self.report.checked.open_claims = len(checked)
        return checked

    def stuck(self, run_id: str, why: str) -> None:
        self.flag(
            ViolationKind.RUN_STUCK,
            run_id,
            f"run {run_id} has no result and no one will answer it: {why}. It ends failed only at its "
            f"deadline; cancel it now (POST /v1/runs/{run_id}/cancel) and submit it again.",
        )

    async def check_runs(self, run_ids: Iterable[str], already: set[str]) -> None:
        """Invariant 4 for runs the caller names (e.g. every run the chaos suite had accepted): each
        has its record, and is answered, claimed by a live agent, or waiting for one that will come."""
        api = self.colony.scoped(ApiRunProtocol.scope(self.tenant_id, self.colony_id))
        wanted = list(dict.fromkeys(run_ids))
        if len(wanted) > self.max_entries:
            wanted = wanted[: self.max_entries]
            self.report.truncated = True
            self.report.truncated_listings.append("runs")
        self.report.checked.runs = len(wanted)
        keys = []
        for run_id in wanted:
            try:
                keys.append(ApiRunProtocol.run_key(run_id))
            except InvalidKey as exc:
                raise InvalidKey(f"run id {run_id!r} cannot be checked: {exc}") from None
        for start in range(0, len(keys), PAGE_SIZE):
            entries = await api.read_many(keys[start : start + PAGE_SIZE])
            for run_id, entry in zip(wanted[start : start + PAGE_SIZE], entries, strict=True):
                await self.check_run(api, run_id, entry, already)

    async def check_run(
        self, api: Blackboard, run_id: str, entry: BlackboardEntry | None, already: set[str]
    ) -> None:
        if entry is None:
            self.flag(
                ViolationKind.RUN_LOST,
                run_id,
                f"run {run_id} has no record in scope {api.scope_id}: it was lost (e.g. written after "
                "Redis' last fsync before a crash) or its record expired after runs.retention_seconds. "
                "A client reading it gets 404; submit it again.",
            )
            return
        try:
            record = entry.value_as(RunRecord)
        except ValidationError as exc:
            self.flag(
                ViolationKind.RECORD_UNREADABLE,
                run_id,
                f"run record {entry.key} does not validate ({exc.error_count()} errors): reading the run "
                f"fails. Delete it in scope {api.scope_id} and submit the run again.",
            )
            return
        if run_id in already:
            return
        board = self.root.scoped(
            AgentRunProtocol.namespaced_scope(self.agent_board(record.agent).scope_id, record.namespace)
        )
        result, claim = await board.read_many(
            [AgentRunProtocol.result_key(run_id), AgentRunProtocol.claim_key(run_id)]
        )
        if result is not None:
            return
        if record.deadline is not None and self.now > record.deadline:
            return  # reading it ends it failed (timed out): not stuck
        why = self.ended_or_unknown(record.agent)
        if claim is not None:
            if why and self.old(claim.updated_at):
                self.stuck(run_id, f"it was claimed {_ago(self.now, claim.created_at)} and {why}")
            return
        if not self.old(entry.created_at):
            return
        if why:
            self.stuck(
                run_id, f"it was accepted {_ago(self.now, entry.created_at)}, never claimed, and {why}"
            )
            return
        host = self.records[record.agent][1].replica
        beat = self.heartbeats.get(host or "")
        if beat is not None and record.agent in beat.agent_ids and beat.at > entry.created_at:
            self.stuck(
                run_id,
                f"it was accepted {_ago(self.now, entry.created_at)} and never claimed, though agent "
                f"{record.agent} is hosted on live replica {host}: its request feed missed the request",
            )


async def check_invariants(
    blackboard: Blackboard,
    *,
    tenant_id: str = "default",
    colony_id: str = "default",
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    run_ids: Sequence[str] = (),
    now: float | None = None,
) -> DoctorReport:
    """Check the colony's invariants (read-only). `blackboard`: any scope on the cluster's Redis;
    `run_ids`: runs known to have been accepted (each must still be there and not stuck);
    `now`: the time to judge ages by (default: Redis' clock)."""
    if not grace_seconds >= 0 or max_entries < 1:  # (NaN too: it made every age "within the grace")
        raise InvalidArgument(
            f"grace_seconds must be >= 0 and max_entries >= 1, got {grace_seconds}, {max_entries}"
        )
    if now is None:
        async with blackboard.guard("doctor"):
            seconds, micros = await blackboard.redis.time()
        now = float(seconds) + float(micros) / 1e6
    checker = _Checker(
        blackboard,
        tenant_id=tenant_id,
        colony_id=colony_id,
        grace_seconds=grace_seconds,
        max_entries=max_entries,
        now=now,
    )
    await checker.read_heartbeats()
    await checker.read_agents()
    checker.check_hosting()
    await checker.check_lost()
    await checker.check_suspended()
    await checker.check_pages()
    claimed = await checker.check_open_claims()
    await checker.check_runs(run_ids, claimed)
    await checker.check_orphans()
    return checker.report
