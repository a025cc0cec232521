"""Multi-key optimistic transactions within one scope.

Reads record the version they saw; writes and deletes are buffered. At commit one Lua script
checks every recorded version (and each write's own expected_version) and, only if all still
hold, applies every buffered operation and appends their events: all or nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from colony import metrics
from colony.blackboard.models import (
    EVENT_VALUE_BYTES,
    BlackboardEntry,
    encode_tags,
    encode_value,
    ttl_to_ms,
)
from colony.blackboard.protocol import validate_key
from colony.blackboard.script_calls import run_scripts
from colony.errors import BlackboardError, ConcurrentModificationError

if TYPE_CHECKING:
    from colony.blackboard.blackboard import Blackboard
    from colony.blackboard.script_calls import ScriptCall


class Transaction:
    """Use as `async with bb.transaction() as tx:`; commits on a clean exit, discards on an exception."""

    def __init__(self, bb: Blackboard) -> None:
        self._bb = bb
        self._reads: dict[str, int] = {}
        # (key, version, exact stored text or None): checked at commit beside the reads
        self._checks: list[tuple[str, int, str | None]] = []
        self._ops: list[list[Any]] = []
        self._done = False
        self._followers: list[ScriptCall] = []
        self.results: list[BlackboardEntry | None] = []
        self.follower_replies: list[Any] = []

    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None and not self._done:
            await self.commit()

    async def read(self, key: str) -> BlackboardEntry | None:
        """Read `key` now; commit fails if its version changes meanwhile. Buffered writes are not visible."""
        entry = await self._bb.read(key)
        self._reads.setdefault(key, entry.version if entry else 0)
        return entry

    def expect(self, key: str, version: int, text: str | None = None) -> None:
        """Commit only if `key` is still at `version` (and, with `text`, holds exactly that encoded
        value): the check a `read` puts in the read set, without the round trip, for a caller
        that knows what Redis should hold (the value it wrote last itself)."""
        self._check_open()
        validate_key(key)
        self._checks.append((key, version, text))

    def write(
        self,
        key: str,
        value: Any,
        *,
        tags: Iterable[str] = (),
        created_by: str | None = None,
        ttl_seconds: float | None = None,
        expected_version: int | None = None,
        value_in_event: bool = False,
        encoded: str | None = None,
    ) -> None:
        """Buffer a write; applied at commit. `value_in_event`: as `Blackboard.write`'s (its event
        carries the value when it is at most `EVENT_VALUE_BYTES` encoded). `encoded`: the value
        as `encode_value` encodes it, from a caller that needed that text already."""
        self._check_open()
        validate_key(key)
        if expected_version is not None:
            self._checks.append((key, expected_version, None))
        if encoded is None:
            encoded = encode_value(value)
        in_event = "1" if value_in_event and len(encoded) <= EVENT_VALUE_BYTES else ""
        self._ops.append(
            ["w", key, encoded, encode_tags(tags), created_by or "", ttl_to_ms(ttl_seconds), in_event]
        )

    def delete(self, key: str, *, expected_version: int | None = None, created_by: str | None = None) -> None:
        """Buffer a delete; applied at commit."""
        self._check_open()
        validate_key(key)
        if expected_version is not None:
            self._checks.append((key, expected_version, None))
        self._ops.append(["d", key, created_by or ""])

    def ring_push(self, name: str, items: Iterable[Any], cap: int) -> None:
        """Buffer appending `items` to the ring `name`, which keeps only its newest `cap` items.

        A ring grows by appends only, so state that accumulates (an agent's context) is written
        by what is new, never rewritten whole, and stays bounded.
        """
        self._check_open()
        self._bb.keyspace.ring_key(name)  # validates the name now, not at commit
        if cap < 1:
            raise BlackboardError(f"a ring holds at least one item; cap={cap}")
        encoded = [encode_value(item) for item in items]
        if encoded:
            self._ops.append(["r", name, cap, encoded])

    def ring_truncate(self, name: str, keep: int) -> None:
        """Buffer cutting the ring `name` down to its oldest `keep` items (0: emptied), applied at
        commit in order with the other operations: a ring cut back with the state it belongs to
        (a restored checkpoint, a run's log started afresh) is cut only if that state is written."""
        self._check_open()
        self._bb.keyspace.ring_key(name)
        if keep < 0:
            raise BlackboardError(f"a ring keeps at least 0 items; keep={keep}")
        self._ops.append(["k", name, int(keep)])

    def followed_by(self, calls: Iterable[ScriptCall]) -> None:
        """Script calls of this Redis sent right after the commit, in its round trip: Redis runs
        them whether the commit applies or not (on a conflict too), and a Redis error in any of them
        is raised as the commit's. Their replies are `follower_replies` once committed. They must be
        safe to apply twice (expiries that never extend): after Redis forgot the commit's script
        (a restart), they are run again once the commit has run, so they still follow it."""
        self._check_open()
        self._followers.extend(calls)

    async def commit(self) -> list[BlackboardEntry | None]:
        """Apply everything or raise `ConcurrentModificationError` naming the first changed key."""
        self._check_open()
        self._done = True
        checks = [*((k, v, None) for k, v in self._reads.items()), *self._checks]
        if not self._ops and not checks and not self._followers:
            return []
        ks = self._bb.keyspace
        payload = {
            "checks": [[ks.entry_key(k), v, *([t] if t is not None else [])] for k, v, t in checks],
            "ops": [self._encode_op(op) for op in self._ops],
            "tp": ks.tag_prefix,
            "ep": ks.entry_prefix,
            "ml": self._bb.settings.events_maxlen,
            "iv": "1" if self._bb.settings.include_values_in_events else "0",
        }
        keys, args = [ks.events_key, ks.expiry_key], [json.dumps(payload)]
        async with self._bb.guard("commit"):
            if self._followers:
                reply, *self.follower_replies = await run_scripts(
                    self._bb.redis, [(self._bb._commit, keys, args), *self._followers], idempotent_after=1
                )
            else:
                reply = await self._bb._commit(keys=keys, args=args)
        if not reply[0]:
            metrics.BLACKBOARD_CONFLICTS.inc()
            key, expected, _text = checks[int(reply[1]) - 1]
            found = int(reply[2])
            what = "another value at that version" if found == expected else f"version {found}"
            raise ConcurrentModificationError(
                key,
                expected,
                found,
                f"transaction aborted, nothing applied: {key!r} holds {what}, "
                f"the transaction expected version {expected} (0 means absent)",
            )
        _, now, outs = reply
        self.results = [self._entry(op, out, now) for op, out in zip(self._ops, outs, strict=True)]
        return self.results

    def _encode_op(self, op: list[Any]) -> list[Any]:
        ks = self._bb.keyspace
        if op[0] in ("r", "k"):
            return [op[0], ks.ring_key(op[1]), *op[2:]]
        return [op[0], ks.entry_key(op[1]), *op[1:]]

    @staticmethod
    def _entry(op: list[Any], out: list[Any], now: int) -> BlackboardEntry | None:
        if op[0] != "w":
            return None
        version, created_at, created_by, expires_at = out
        fields = {
            "v": op[2],
            "ver": version,
            "tags": op[3],
            "cb": created_by,
            "ub": op[4],
            "ca": created_at,
            "ua": now,
            "exp": expires_at,
        }
        return BlackboardEntry.from_hash(op[1], fields)

    def _check_open(self) -> None:
        if self._done:
            raise BlackboardError("this transaction was already committed; start a new one")
