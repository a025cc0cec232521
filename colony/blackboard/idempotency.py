"""Where the answers to idempotent HTTP writes are kept (colony.api.idempotency decides what to keep;
this module only claims, renews, settles and reads, each in one atomic round trip).

Two keys per request key (IdempotencyKeys): `answer`, a JSON record that is first the claim
(`{"state": "in_flight", "owner", "fingerprint"}`) and then the answer (`"state": "done"`), living
`ttl_ms` from the claim, from each renewal and again from the answer; and `lease`, the claimant's
id, living a few seconds and renewed while its request runs. A claim without a lease is a request
whose process stopped before it answered: the record stays, so nothing ever runs that request a
second time. A claim script re-sent by the Redis client after its reply was lost finds its own
claim (the same owner): it is still claimed, not another's.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from colony.errors import InvalidKey


class IdempotencyKeys:
    """The key format (kept here, not in protocol.py, which is at its size limit): `answer` (the
    claim, then the answer) and `lease` (the claimant still runs), named by a digest of colony,
    method, path and key (never the header's text), which is their hash tag: one script claims both."""

    ROOT = "colony:idem"

    @staticmethod
    def digest(tenant_id: str, colony_id: str, method: str, path: str, key: str) -> str:
        text = "\x00".join((tenant_id, colony_id, method, path, key))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    @classmethod
    def key(cls, digest: str, part: str) -> str:
        if part not in ("answer", "lease") or not re.fullmatch(r"[0-9a-f]{32}", digest):
            raise InvalidKey(f"not an idempotency key: {digest!r} {part!r}")
        return f"{cls.ROOT}:{{{digest}}}:{part}"


# KEYS: answer, lease; ARGV: claim record, ttl ms, owner, lease ms, fingerprint, '1' when the
# route is effect-keyed. Nothing kept: claim (answer + lease), nil. This owner's own claim (the
# script re-sent after its reply was lost): its lease renewed, nil. The claim of a request whose
# process stopped (no lease), with this fingerprint, on an effect-keyed route: taken over, nil
# (its redo finds whatever the stopped one made). Else the record and the lease's remaining ms
# (-2: none).
_CLAIM = """
local got = redis.call('GET', KEYS[1])
if got then
  local record = cjson.decode(got)
  local orphan = record['state'] == 'in_flight' and ARGV[6] == '1'
    and record['fingerprint'] == ARGV[5] and redis.call('EXISTS', KEYS[2]) == 0
  if not orphan and (record['owner'] ~= ARGV[3] or record['state'] ~= 'in_flight') then
    return {got, redis.call('PTTL', KEYS[2])}
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return false
"""
# KEYS: answer, lease; ARGV: owner, ttl ms, lease ms. While this owner's claim is the record: the
# record lives ttl ms again (a request longer than the TTL keeps its claim) and the lease is renewed.
_RENEW = """
local got = redis.call('GET', KEYS[1])
if not got or cjson.decode(got)['owner'] ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
return 1
"""
# KEYS: answer, lease; ARGV: owner, the answer record ('' : forget the claim), ttl ms.
# Only the claimant settles its claim; its lease goes either way.
_SETTLE = """
local got = redis.call('GET', KEYS[1])
if got and cjson.decode(got)['owner'] == ARGV[1] then
  if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
end
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
"""


@dataclass(frozen=True)
class Kept:
    """What a key already has: its record, and how long its claimant's lease still runs (ms; <= 0:
    the claimant is gone)."""

    record: dict[str, Any]
    lease_ms: int

    @property
    def done(self) -> bool:
        return self.record.get("state") == "done"


class IdempotencyStore:
    """One request key's records in Redis (`redis`: a decode_responses client)."""

    def __init__(self, redis: Any, digest: str, owner: str) -> None:
        self.redis = redis
        self.owner = owner
        self.keys = (IdempotencyKeys.key(digest, "answer"), IdempotencyKeys.key(digest, "lease"))
        self.fingerprint = ""
        self.ttl_ms = 0

    async def claim(
        self, fingerprint: str, ttl_ms: int, lease_ms: int, *, take_orphan: bool = False
    ) -> Kept | None:
        """None: claimed (the request is this caller's to run); else what is kept. `take_orphan`
        (an effect-keyed route, whose redo finds its effect made): the claim of the same request
        whose process stopped is taken over instead of answered "outcome unknown"."""
        self.fingerprint, self.ttl_ms = fingerprint, ttl_ms
        record = json.dumps({"state": "in_flight", "owner": self.owner, "fingerprint": fingerprint})
        orphan = "1" if take_orphan else "0"
        got = await self.redis.eval(
            _CLAIM, 2, *self.keys, record, ttl_ms, self.owner, lease_ms, fingerprint, orphan
        )
        if got is None:
            return None
        return Kept(json.loads(got[0]), int(got[1]))

    async def renew(self, lease_ms: int) -> bool:
        """While the claim is this caller's: renew its lease, and its record's TTL (the TTL given to
        `claim`), so that a request running longer than the TTL is never claimed by a retry.
        False: the claim is not (or no longer) this caller's."""
        got = await self.redis.eval(_RENEW, 2, *self.keys, self.owner, max(self.ttl_ms, lease_ms), lease_ms)
        return bool(int(got))

    async def settle(self, answer: dict[str, Any] | None, ttl_ms: int) -> None:
        """Keep `answer` in place of the claim, or (None) forget the claim so a retry runs again."""
        kept = {**(answer or {}), "state": "done", "owner": self.owner, "fingerprint": self.fingerprint}
        text = "" if answer is None else json.dumps(kept)
        await self.redis.eval(_SETTLE, 2, *self.keys, self.owner, text, ttl_ms)
