"""What `colony doctor` reports: the kinds of violation, the violations found, what was read.

The models the checker (colony.system.doctor) fills, the CLI (doctor_command) prints and the chaos
suite reads; kept apart from the checker's Redis reads.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field, computed_field


class ViolationKind(StrEnum):
    HOSTED_TWICE = "hosted_twice"  # two live replicas' heartbeats list the agent
    REGISTRY_MISMATCH = "registry_mismatch"  # the registry and the live heartbeats disagree on where
    AGENT_ON_DEAD_REPLICA = "agent_on_dead_replica"  # hosted state, its replica has no heartbeat
    AGENT_LOST = "agent_lost"  # placed on a live replica that does not host it; nobody does
    PAGE_ON_DEAD_REPLICA = "page_on_dead_replica"  # page table lists a replica with no heartbeat
    SUSPENDED_NOT_INDEXED = "suspended_not_indexed"  # suspended, but the monitor will not find it
    SUSPENDED_UNRESUMABLE = "suspended_unresumable"  # the monitor finds it but cannot resume it
    RUN_STUCK = "run_stuck"  # no one will answer the run before its deadline
    RUN_LOST = "run_lost"  # a run the caller knows was accepted has no record
    RECORD_UNREADABLE = "record_unreadable"  # a value the loops read does not validate
    ORPHANED_AGENT_KEYS = "orphaned_agent_keys"  # keys of an agent id no record names (a cut-off write)


class Violation(BaseModel):
    kind: ViolationKind
    subject: str = Field(description="The agent, page, run or key the violation is about.")
    message: str = Field(description="What is wrong and what to do about it.")


class CheckedCounts(BaseModel):
    """What was read: a clean report over nothing is not a clean cluster."""

    agents: int = 0
    replicas: int = 0
    suspended: int = 0
    pages: int = 0
    open_claims: int = 0
    runs: int = 0


class DoctorReport(BaseModel):
    tenant_id: str
    colony_id: str
    checked_at: float = Field(description="Unix time of the check, by Redis' clock.")
    grace_seconds: float
    violations: list[Violation] = Field(default_factory=list)
    checked: CheckedCounts = Field(default_factory=CheckedCounts)
    truncated: bool = Field(False, description="Some listing stopped at max_entries: not all was checked.")
    truncated_listings: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list, description="Checks not made, and why.")
    orphans: dict[str, int] = Field(
        default_factory=dict,
        description="Agent ids whose keys no record names, with how many keys and blocks each holds "
        "(`colony doctor --prune-orphans` removes them).",
    )
    orphan_versions: dict[str, int] = Field(
        default_factory=dict,
        description="Each orphaned id's lifecycle version as the check saw it (0: none): "
        "--prune-orphans removes an id only while it is unchanged.",
    )
    retained: dict[str, int] = Field(
        default_factory=dict,
        description="Agent ids no record names that hold only an ended agent's memory (its state "
        "expired with runs.retention_seconds), with their key and block counts: kept on purpose, not "
        "a violation; --prune-orphans leaves them.",
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def clean(self) -> bool:
        return not self.violations

    def kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for violation in self.violations:
            counts[violation.kind.value] = counts.get(violation.kind.value, 0) + 1
        return counts
