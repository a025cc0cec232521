"""Key formats of the blackboard, one class per protocol.

Nothing outside this module (and `scopes`) spells a key format: callers build keys, glob
patterns and parse keys through these classes, which reject wildcards and empty segments so
a key built from user input can never match more than intended.
"""

from __future__ import annotations

import hashlib
import re
from typing import ClassVar

from colony.errors import InvalidKey

MAX_KEY_LENGTH = 1024
MAX_TAG_LENGTH = 256
# Glob metacharacters (Redis MATCH syntax), hash-tag braces, whitespace and control characters.
_FORBIDDEN_IN_KEY = re.compile(r"[*?\[\]\\{}\s\x00-\x1f\x7f]")
_FORBIDDEN_IN_SEGMENT = re.compile(r"[:*?\[\]\\{}\s\x00-\x1f\x7f]")
_FORBIDDEN_IN_PATTERN = re.compile(r"[{}\s\x00-\x1f\x7f]")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def validate_segment(value: object, what: str = "segment") -> str:
    """A single key segment: non-empty, no ':' and no wildcard."""
    if not isinstance(value, str) or not value:
        raise InvalidKey(f"{what} must be a non-empty string, got {value!r}")
    if _FORBIDDEN_IN_SEGMENT.search(value):
        raise InvalidKey(
            f"{what} {value!r} contains a forbidden character (':', wildcards *?[]\\, braces, whitespace)"
        )
    return value


def validate_key(key: object, what: str = "key") -> str:
    """A full logical key: ':'-separated non-empty segments with no wildcard."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"{what} must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"{what} is {len(key)} characters long; the limit is {MAX_KEY_LENGTH}")
    if _FORBIDDEN_IN_KEY.search(key):
        raise InvalidKey(
            f"{what} {key!r} contains a forbidden character (wildcards *?[]\\, braces, whitespace)"
        )
    if "" in key.split(":"):
        raise InvalidKey(f"{what} {key!r} has an empty segment (leading, trailing or doubled ':')")
    return key


def validate_pattern(pattern: object) -> str:
    """A glob pattern over logical keys (Redis MATCH syntax)."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidKey(f"pattern must be a non-empty string, got {pattern!r}")
    if len(pattern) > MAX_KEY_LENGTH or _FORBIDDEN_IN_PATTERN.search(pattern):
        raise InvalidKey(
            f"pattern {pattern!r} is too long or contains braces, whitespace or control characters"
        )
    return pattern


def validate_tag(tag: object) -> str:
    """A tag: non-empty, short, no wildcard or control character."""
    if not isinstance(tag, str) or not tag:
        raise InvalidKey(f"tag must be a non-empty string, got {tag!r}")
    if len(tag) > MAX_TAG_LENGTH or _FORBIDDEN_IN_KEY.search(tag):
        raise InvalidKey(
            f"tag {tag!r} is too long or contains wildcards, braces, whitespace or control chars"
        )
    return tag


class BlackboardKeyspace:
    """Where one scope's entries, tag index and event stream live in Redis.

    Every Redis key of a scope carries the scope id as a hash tag (`{...}`) so they all map to
    one cluster slot, which is what lets one Lua script touch them atomically.
    """

    ROOT = "colony:bb"

    def __init__(self, scope_id: str) -> None:
        self.scope_id = validate_key(scope_id, "scope_id")
        base = f"{self.ROOT}:{{{self.scope_id}}}"
        self.entry_prefix = f"{base}:e:"
        self.tag_prefix = f"{base}:t:"
        self.events_key = f"{base}:events"
        self.expiry_key = f"{base}:x"  # sorted set: tagged entries with a TTL, by expiry (see scripts)
        self.ring_prefix = f"{base}:r:"
        self.receipt_prefix = f"{base}:k:"
        self.lock_prefix = f"{base}:l:"

    def ring_key(self, name: str) -> str:
        """A capped list (ring) of this scope, e.g. an agent's context; see `Transaction.ring_push`."""
        return self.ring_prefix + validate_key(name, "ring name")

    def receipt_key(self, token: str) -> str:
        """A short-lived receipt of a script call that must not apply twice (a pick-up the client
        sends again after a lost reply), named by the caller's random token."""
        return self.receipt_prefix + validate_segment(token, "receipt token")

    def lock_key(self, name: str) -> str:
        """A lock of this scope (a token with a TTL, held by one writer; no entry, no event)."""
        return self.lock_prefix + validate_segment(name, "lock name")

    def entry_key(self, key: str) -> str:
        return self.entry_prefix + key

    def tag_key(self, tag: str) -> str:
        return self.tag_prefix + tag

    def entry_match(self, pattern: str) -> str:
        """SCAN MATCH pattern for logical-key `pattern` (the prefix holds no glob characters)."""
        return self.entry_prefix + pattern

    def family_match(self) -> str:
        """SCAN MATCH pattern for every Redis key of this scope and of the scopes namespaced inside it
        (`<scope>:namespace:...`): entries, tag sets, rings, receipts, event stream, expiry index.
        What removing all of one agent id's state deletes (colony.system.agent_purge)."""
        return f"{self.ROOT}:{{{self.scope_id}[}}:]*"

    def nested_scope(self, redis_key: str) -> str | None:
        """The id of this scope, or of the scope nested in it, that `redis_key` (one `family_match`
        matched) belongs to; None for a key of neither."""
        head = f"{self.ROOT}:{{"
        end = redis_key.find("}", len(head))
        scope = redis_key[len(head) : end] if redis_key.startswith(head) and end > 0 else ""
        return scope if scope == self.scope_id or scope.startswith(self.scope_id + ":") else None

    def logical_key(self, redis_key: str) -> str:
        if not redis_key.startswith(self.entry_prefix):
            raise InvalidKey(f"{redis_key!r} is not an entry of scope {self.scope_id!r}")
        return redis_key[len(self.entry_prefix) :]


class EventReaderKeys:
    """Keys of the shared event reader (colony/blackboard/event_reader.py): each lane's private wake
    stream, named by a random lane id (no input ever reaches it), with a short expiry."""

    PREFIX = "colony:reader:"

    @classmethod
    def wake_key(cls, lane_id: str) -> str:
        return f"{cls.PREFIX}{validate_segment(lane_id, 'lane_id')}:wake"


class BlackboardProtocol:
    """Base of key protocols: subclasses declare `templates`, e.g. `{"request": "request:run:{request_id}"}`.

    `build` fills a template (every segment validated), `pattern` makes a glob with `*` for the
    segments left out, `parse` recovers the segments from a key.
    """

    templates: ClassVar[dict[str, str]] = {}

    @classmethod
    def build(cls, template: str, **segments: str) -> str:
        fmt = cls._template(template)
        names = _PLACEHOLDER.findall(fmt)
        missing = [n for n in names if n not in segments]
        extra = [n for n in segments if n not in names]
        if missing or extra:
            raise InvalidKey(
                f"{cls.__name__}.{template} needs segments {names}; missing {missing}, unexpected {extra}"
            )
        return fmt.format(**{n: validate_segment(segments[n], n) for n in names})

    @classmethod
    def pattern(cls, template: str, **segments: str | None) -> str:
        fmt = cls._template(template)
        names = _PLACEHOLDER.findall(fmt)
        unknown = [n for n in segments if n not in names]
        if unknown:
            raise InvalidKey(f"{cls.__name__}.{template} has no segments {unknown}")
        values = {n: "*" if segments.get(n) is None else validate_segment(segments[n], n) for n in names}
        return fmt.format(**values)

    @classmethod
    def parse(cls, template: str, key: str) -> dict[str, str]:
        match = cls._regex(template).fullmatch(key)
        if match is None:
            raise InvalidKey(f"{key!r} is not a {cls.__name__}.{template} key ({cls._template(template)})")
        return match.groupdict()

    @classmethod
    def identify(cls, key: str) -> tuple[str, dict[str, str]] | None:
        """Which of this protocol's templates `key` follows, with its segments; None if none."""
        for name in cls.templates:
            match = cls._regex(name).fullmatch(key)
            if match is not None:
                return name, match.groupdict()
        return None

    @staticmethod
    def namespaced_scope(scope_id: str, namespace: str) -> str:
        """The scope id of one namespace (one capability's partition) inside `scope_id`."""
        return f"{validate_key(scope_id, 'scope_id')}:namespace:{validate_segment(namespace, 'namespace')}"

    @classmethod
    def _template(cls, template: str) -> str:
        try:
            return cls.templates[template]
        except KeyError:
            raise InvalidKey(
                f"{cls.__name__} has no key template {template!r}; known: {sorted(cls.templates)}"
            ) from None

    @classmethod
    def _regex(cls, template: str) -> re.Pattern[str]:
        cache = cls.__dict__.get("_regex_cache")
        if cache is None:
            cache = {}
            cls._regex_cache = cache  # type: ignore[attr-defined]
        if template not in cache:
            parts = re.split(r"(\{\w+\})", cls._template(template))
            regex = "".join(
                f"(?P<{p[1:-1]}>[^:*?\\[\\]{{}}\\s]+)" if _PLACEHOLDER.fullmatch(p) else re.escape(p)
                for p in parts
            )
            cache[template] = re.compile(regex)
        return cache[template]


class RequestResultProtocol(BlackboardProtocol):
    """Request → result exchange with streamed intermediate events, named by `kind`."""

    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            validate_segment(cls.kind, "protocol kind")
            cls.templates = {
                "request": f"request:{cls.kind}:{{request_id}}",
                "result": f"result:{cls.kind}:{{request_id}}",
                "event": f"event:{cls.kind}:{{request_id}}:{{event_name}}",
                "claim": f"claim:{cls.kind}:{{request_id}}",
                "children": f"children:{cls.kind}:{{request_id}}",  # requests made while serving it
            }

    @classmethod
    def request_key(cls, request_id: str) -> str:
        return cls.build("request", request_id=request_id)

    @classmethod
    def result_key(cls, request_id: str) -> str:
        return cls.build("result", request_id=request_id)

    @classmethod
    def event_key(cls, request_id: str, event_name: str) -> str:
        return cls.build("event", request_id=request_id, event_name=event_name)

    @classmethod
    def child_event_key(cls, request_id: str, child_id: str, event_type: str) -> str:
        """A progress event a child agent writes into its parent's request stream (e.g. an `analyze`
        page worker's `worker_done`): `event:{kind}:{request_id}:child.{child_id}.{event_type}`.
        Its name has no `{seq}.` prefix, so it is streamed with the request's events but never
        counted in (nor numbered by) the parent's own sequence; one key per child and type, so a
        child's event written twice (a redo, a backfill by the parent) is stored once."""
        child = validate_segment(child_id, "child_id")
        kind = validate_segment(event_type, "event_type")
        return cls.event_key(request_id, f"child.{child}.{kind}")

    @classmethod
    def children_key(cls, request_id: str) -> str:
        return cls.build("children", request_id=request_id)

    @classmethod
    def claim_key(cls, request_id: str) -> str:
        """Written create-only (expected_version=0) by whoever takes the request, so it runs once."""
        return cls.build("claim", request_id=request_id)

    @classmethod
    def request_tag(cls, request_id: str) -> str:
        """The tag of every entry one request leaves (request, claim, events, result): its index set
        lists them, so finishing the request can expire them all without a keyspace scan."""
        return f"{cls.kind}:{validate_segment(request_id, 'request_id')}"

    @classmethod
    def open_claims_tag(cls) -> str:
        """The tag of claims whose request is not answered yet (what a restarted server picks up)."""
        return f"open:{cls.kind}"

    @classmethod
    def request_pattern(cls) -> str:
        return cls.pattern("request")

    @classmethod
    def result_pattern(cls, request_id: str | None = None) -> str:
        return cls.pattern("result", request_id=request_id)

    @classmethod
    def event_pattern(cls, request_id: str | None = None) -> str:
        return cls.pattern("event", request_id=request_id)

    @classmethod
    def parse_request_key(cls, key: str) -> str:
        return cls.parse("request", key)["request_id"]

    @classmethod
    def parse_result_key(cls, key: str) -> str:
        return cls.parse("result", key)["request_id"]

    @classmethod
    def parse_event_key(cls, key: str) -> tuple[str, str]:
        parts = cls.parse("event", key)
        return parts["request_id"], parts["event_name"]


class AgentRunProtocol(RequestResultProtocol):
    """`AgentHandle.run` keys: `request:run:{id}`, `result:run:{id}`, `event:run:{id}:{event_name}`."""

    kind = "run"


class WorkAssignmentProtocol(RequestResultProtocol):
    """Coordinator → worker-pool work units on a shared (usually COLONY) scope. A worker claims a
    unit (`claim:work:{request_id}`, create-only) before doing it, so one worker does each unit."""

    kind = "work"


class AgentStateProtocol(BlackboardProtocol):
    """Where an agent keeps its state inside its own AGENT scope (see `colony.agents.base.Agent`)."""

    templates = {
        "blueprint": "agent:blueprint",
        "metadata": "agent:metadata",
        "lifecycle": "agent:lifecycle",
        "current_run": "agent:current_run",
        "run": "agent:run:{run_id}",
        "policy_state": "agent:policy_state",
        "capability_state": "agent:capability:{name}",
        "context": "agent:context",
        "suspension": "agent:suspension",
        # colony.context: the checkpoint ring, the write-ahead action log of the current run, and
        # action outputs kept aside by compaction (by digest)
        "checkpoints": "agent:checkpoints",
        "action_log": "agent:action_log",
        "archived_output": "agent:archived:{digest}",
        "compaction": "agent:compaction",  # the last compaction's report (tokens before and after)
    }

    @classmethod
    def key(cls, name: str) -> str:
        return cls.build(name)

    @classmethod
    def run_key(cls, run_id: str) -> str:
        return cls.build("run", run_id=run_id)

    @classmethod
    def capability_state_key(cls, name: str) -> str:
        return cls.build("capability_state", name=name)

    @classmethod
    def archived_output_key(cls, digest: str) -> str:
        return cls.build("archived_output", digest=digest)


class SessionProtocol(BlackboardProtocol):
    """A session's conversation tree, inside the session agent's own AGENT scope: one entry per
    message (ids are generated, never taken from input), the tree head (branches, active one) and
    the summaries of paths (`summary_key(id)`: the path from the first message to `id`)."""

    templates = {
        "tree": "session:tree",
        "message": "session:message:{message_id}",
        "summary": "session:summary:{message_id}",
    }

    @classmethod
    def tree_key(cls) -> str:
        return cls.build("tree")

    @classmethod
    def message_key(cls, message_id: str) -> str:
        return cls.build("message", message_id=message_id)

    @classmethod
    def summary_key(cls, message_id: str) -> str:
        return cls.build("summary", message_id=message_id)


class AgentRegistryProtocol(BlackboardProtocol):
    """The colony's agent registry (COLONY scope): one entry per agent, tagged `state:{state}` and
    `replica:{replica}`, so the tag index gives the agents of a state or of a replica.

    Every entry also carries the tag of its kind (`index:agent`, `index:replica`, `index:process`):
    listing a kind reads that one index set, never a SCAN of the keyspace."""

    templates = {
        "agent": "registry:agent:{agent_id}",
        "replica": "registry:replica:{replica_id}",
        "process": "registry:process:{process_id}",
    }

    @classmethod
    def agent_key(cls, agent_id: str) -> str:
        return cls.build("agent", agent_id=agent_id)

    @classmethod
    def replica_key(cls, replica_id: str) -> str:
        """A replica's heartbeat and engine stats (written with a TTL: dead replicas drop out)."""
        return cls.build("replica", replica_id=replica_id)

    @classmethod
    def process_key(cls, process_id: str) -> str:
        """The control-plane counters one process publishes (with a TTL), summed by the API."""
        return cls.build("process", process_id=process_id)

    @staticmethod
    def index_tag(template: str) -> str:
        """The tag every entry of one template carries (its index set lists them all)."""
        if template not in AgentRegistryProtocol.templates:
            raise InvalidKey(f"AgentRegistryProtocol has no template {template!r}")
        return f"index:{template}"

    @staticmethod
    def state_tag(state: str) -> str:
        return f"state:{validate_segment(state, 'state')}"

    @staticmethod
    def replica_tag(replica: str) -> str:
        return f"replica:{validate_segment(replica, 'replica')}"

    @staticmethod
    def resumable_tag() -> str:  # suspended, not to make room: what the resource monitor reads
        return "waits:condition"


class ApiRunProtocol(BlackboardProtocol):
    """Runs submitted over HTTP (COLONY scope, `api` namespace): `run:{run_id}` maps a run to its
    agent, namespace, deadline and where its events start. The run id is the AgentRunProtocol
    request id, so whoever retires the run's keys can retire this record too."""

    namespace: ClassVar[str] = "api"
    templates = {"run": "run:{run_id}", "known": "known:{run_id}"}

    @classmethod
    def run_key(cls, run_id: str) -> str:
        return cls.build("run", run_id=run_id)

    @classmethod
    def agent_tag(cls, agent: str) -> str:
        """The tag of the run records of one agent (`GET /v1/runs?agent=`: its runs, newest first)."""
        return f"agent-runs:{agent}"

    @classmethod
    def known_key(cls, run_id: str) -> str:
        """That the run was submitted (its agent and time): outlives the record by
        `runs.known_ids_seconds`, so an id whose record was retired answers 410, not 404."""
        return cls.build("known", run_id=run_id)

    @classmethod
    def scope(cls, tenant_id: str, colony_id: str) -> str:
        """The scope id of a colony's run records (its COLONY scope, this namespace)."""
        from colony.blackboard.scopes import BlackboardScope, scope_id  # (scopes builds on this module)

        return scope_id(
            BlackboardScope.COLONY, tenant_id=tenant_id, colony_id=colony_id, namespace=cls.namespace
        )


class VcmProtocol(BlackboardProtocol):
    """The virtual context memory (COLONY scope, `vcm` namespace): page records, their text, and
    which replica holds which pages (tags `replica:{id}` / `swapped:{id}` on the page records)."""

    templates = {
        "page": "page:{page_id}",
        "content": "content:{page_id}",
        "source": "source:{source_id}",
    }

    @classmethod
    def page_key(cls, page_id: str) -> str:
        return cls.build("page", page_id=page_id)

    @classmethod
    def content_key(cls, page_id: str) -> str:
        return cls.build("content", page_id=page_id)

    @classmethod
    def source_key(cls, source_id: str) -> str:
        return cls.build("source", source_id=source_id)

    @staticmethod
    def index_tag(template: str) -> str:
        """The tag every page record (`page`) or source record (`source`) carries: its index set
        lists them all, so listing them never SCANs the keyspace."""
        if template not in ("page", "source"):
            raise InvalidKey(f"VcmProtocol indexes 'page' and 'source' records, not {template!r}")
        return f"index:{template}"

    @staticmethod
    def resident_tag(replica_id: str) -> str:
        return f"replica:{validate_segment(replica_id, 'replica')}"

    @staticmethod
    def swapped_tag(replica_id: str) -> str:
        return f"swapped:{validate_segment(replica_id, 'replica')}"


class MemoryProtocol(BlackboardProtocol):
    """Keys of one memory scope (a namespace of an agent's or the colony's scope, see
    `colony.memory.scopes.MemoryScope`): entries, the exact-dedup index by content hash, the
    scope's stored configuration, ingestion positions per subscription (one per source scope,
    named by a hash of the source's scope id), a shared scope's access rules. Every entry carries
    the `index:memory` tag: counting and listing a scope reads that index set, never a SCAN."""

    templates = {
        "entry": "mem:entry:{entry_id}",
        "hash": "mem:hash:{digest}",
        "config": "mem:config",
        "position": "mem:position:{source}",
        "index_position": "mem:indexed",
        "scopes": "mem:scopes",  # an agent's (colony's) own scope: its (shared) memory scopes
        "access": "mem:access",  # a shared scope's SharedAccess (colony.memory.shared)
    }
    INDEX_TAG = "index:memory"
    ENTRY_PATTERN = "mem:entry:*"

    @classmethod
    def entry_key(cls, entry_id: str) -> str:
        return cls.build("entry", entry_id=entry_id)

    @classmethod
    def parse_entry_key(cls, key: str) -> str:
        return cls.parse("entry", key)["entry_id"]

    @classmethod
    def hash_key(cls, digest: str) -> str:
        return cls.build("hash", digest=digest)

    @classmethod
    def config_key(cls) -> str:
        return cls.build("config")

    @classmethod
    def position_key(cls, source_scope_id: str) -> str:
        digest = hashlib.sha256(validate_key(source_scope_id, "source scope").encode()).hexdigest()[:24]
        return cls.build("position", source=digest)

    @classmethod
    def index_position_key(cls) -> str:
        return cls.build("index_position")

    @classmethod
    def scopes_key(cls) -> str:
        return cls.build("scopes")

    @classmethod
    def access_key(cls) -> str:
        return cls.build("access")


class NeededSoonKeys(BlackboardProtocol):
    """Where the resource monitor leaves each replica the pages its suspended page-bound agents will
    need there (one entry a replica, COLONY scope, with a TTL): the replica's heartbeat reads its
    one entry instead of listing every suspended agent of the colony."""

    templates: ClassVar[dict[str, str]] = {"soon": "registry:soon:{replica_id}"}

    @classmethod
    def soon_key(cls, replica_id: str) -> str:
        return cls.build("soon", replica_id=replica_id)


# memory blocks' keys live in their own module (this one is long); imported here, where keys are looked up
from colony.blackboard.block_protocol import BlockProtocol  # noqa: E402, F401
