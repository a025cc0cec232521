"""Lua scripts that make each blackboard mutation atomic.

The version check, the entry write, the tag-index update and the event append run inside
one script, so Redis applies all of them or none. Time comes from the server (`TIME`) so
timestamps of writers on different hosts are comparable.

Entry hash fields: v (JSON value), ver, tags (tags joined by \\x1f), cb/ub (created/updated by),
ca/ua (created/updated at, ms), exp (expiry, ms; only with a TTL).
Event fields: op, key, ver, tags, by, ts (ms), and v when values go into events.

Expiry index: an entry with both a TTL and tags is a member `key \x1e tags` of the scope's sorted
set `x`, scored by its expiry (ms). Redis drops an expired hash on its own but cannot drop its
tag-index memberships; every mutating script sweeps a few due members of `x` and removes those
memberships, so the tag sets of expiring entries (heartbeats, finished runs) do not grow forever
even when nobody reads them.
"""

from __future__ import annotations

TAG_SEPARATOR = "\x1f"

_LIBRARY = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function split_tags(s)
  local out = {}
  if s and s ~= '' then
    for tag in string.gmatch(s, '[^\31]+') do out[#out + 1] = tag end
  end
  return out
end

-- expiry index member of an entry with tags and a TTL
local function xmember(lkey, tags) return lkey .. '\30' .. (tags or '') end

local function xindex(xkey, lkey, old_tags, old_exp, new_tags, new_exp)
  if old_exp then redis.call('ZREM', xkey, xmember(lkey, old_tags)) end
  if new_exp ~= '' and new_tags and new_tags ~= '' then
    redis.call('ZADD', xkey, new_exp, xmember(lkey, new_tags))
  end
end

-- drop the tag-index memberships of up to `limit` entries whose expiry has passed
local function sweep(xkey, eprefix, tagp, now, limit)
  local due = redis.call('ZRANGEBYSCORE', xkey, '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(due) do
    local sep = string.find(m, '\30', 1, true)
    if sep then
      local lkey = string.sub(m, 1, sep - 1)
      local live = {}
      for _, t in ipairs(split_tags(redis.call('HGET', eprefix .. lkey, 'tags'))) do live[t] = true end
      for _, t in ipairs(split_tags(string.sub(m, sep + 1))) do
        if not live[t] then redis.call('SREM', tagp .. t, lkey) end
      end
    end
    redis.call('ZREM', xkey, m)
  end
end

local function retag(tagp, lkey, old_s, new_s)
  if old_s == new_s then return end
  local new = split_tags(new_s)
  local keep = {}
  for _, t in ipairs(new) do keep[t] = true end
  for _, t in ipairs(split_tags(old_s)) do
    if not keep[t] then redis.call('SREM', tagp .. t, lkey) end
  end
  for _, t in ipairs(new) do redis.call('SADD', tagp .. t, lkey) end
end

-- cur = HMGET h ver tags ca cb exp ; returns version, created_at, created_by, stream id
local function apply_write(h, stream, lkey, value, tags, writer, ttl_ms, tagp, maxlen, incl, cur, now, xkey)
  local old_ver = tonumber(cur[1]) or 0
  local ver = old_ver + 1
  local ca = now
  local cb = writer
  if old_ver > 0 then
    ca = tonumber(cur[3]) or now
    cb = cur[4] or ''
  end
  local exp = ''
  if ttl_ms ~= '' then exp = now + tonumber(ttl_ms) end
  if old_ver > 0 then
    redis.call('HSET', h, 'v', value, 'ver', ver, 'tags', tags, 'ub', writer, 'ua', now)
  else
    redis.call('HSET', h, 'v', value, 'ver', ver, 'tags', tags, 'ub', writer, 'ua', now, 'ca', ca, 'cb', cb)
  end
  if ttl_ms ~= '' then
    redis.call('HSET', h, 'exp', exp)
    redis.call('PEXPIRE', h, ttl_ms)
  elseif cur[5] then
    redis.call('HDEL', h, 'exp')
    redis.call('PERSIST', h)
  end
  if old_ver > 0 then
    retag(tagp, lkey, cur[2], tags)
    xindex(xkey, lkey, cur[2], cur[5], tags, exp)
  else
    retag(tagp, lkey, '', tags)
    xindex(xkey, lkey, '', false, tags, exp)
  end
  local id
  if incl == '1' then
    id = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
      'op', 'write', 'key', lkey, 'ver', ver, 'tags', tags, 'by', writer, 'ts', now, 'v', value)
  else
    id = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
      'op', 'write', 'key', lkey, 'ver', ver, 'tags', tags, 'by', writer, 'ts', now)
  end
  return {ver, ca, cb, id, exp}
end

-- cur = HMGET h ver tags ; returns stream id or false when nothing was deleted
local function apply_delete(h, stream, lkey, writer, tagp, maxlen, cur, now, xkey)
  local ver = tonumber(cur[1]) or 0
  if ver == 0 then return false end
  retag(tagp, lkey, cur[2], '')
  xindex(xkey, lkey, cur[2], cur[3], '', '')
  redis.call('DEL', h)
  return redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
    'op', 'delete', 'key', lkey, 'ver', ver, 'tags', cur[2] or '', 'by', writer, 'ts', now)
end
"""

# Each mutating script sweeps at most 16 due expiry-index members (bounded work per call).

# KEYS: entry hash, event stream, expiry index
# ARGV: logical key, value, tags, writer, ttl_ms|'', expected_version|'', tag prefix, maxlen, include_value,
#       entry prefix
# -> {1, version, created_at, created_by, stream id, expires_at, updated_at} | {0, actual_version}
WRITE = (
    _LIBRARY
    + r"""
local cur = redis.call('HMGET', KEYS[1], 'ver', 'tags', 'ca', 'cb', 'exp')
local actual = tonumber(cur[1]) or 0
if ARGV[6] ~= '' and tonumber(ARGV[6]) ~= actual then return {0, actual} end
local now = now_ms()
local r = apply_write(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
  ARGV[7], ARGV[8], ARGV[9],
  cur, now, KEYS[3])
sweep(KEYS[3], ARGV[10], ARGV[7], now, 16)
return {1, r[1], r[2], r[3], r[4], tostring(r[5]), now}
"""
)

# KEYS: event stream, expiry index (entry hashes share their hash tag, hence their cluster slot)
# ARGV: entry prefix, tag prefix, maxlen, include_value,
#       JSON list of writes [logical key, value, tags, writer, ttl_ms|'', expected_version|'']
# Each write is checked and applied on its own; one call runs the whole chunk atomically.
# -> {now, then per write 5 values: status (1 ok / 0 conflict), version (actual one on conflict),
#     created_at, created_by, expires_at}
WRITE_BATCH = (
    _LIBRARY
    + r"""
local now = now_ms()
local out = {now}
for _, w in ipairs(cjson.decode(ARGV[5])) do
  local h = ARGV[1] .. w[1]
  local cur = redis.call('HMGET', h, 'ver', 'tags', 'ca', 'cb', 'exp')
  local actual = tonumber(cur[1]) or 0
  if w[6] ~= '' and tonumber(w[6]) ~= actual then
    out[#out + 1] = 0; out[#out + 1] = actual; out[#out + 1] = 0; out[#out + 1] = ''; out[#out + 1] = ''
  else
    local r = apply_write(h, KEYS[1], w[1], w[2], w[3], w[4], w[5], ARGV[2], ARGV[3], ARGV[4], cur, now,
      KEYS[2])
    out[#out + 1] = 1; out[#out + 1] = r[1]; out[#out + 1] = r[2]; out[#out + 1] = r[3]
    out[#out + 1] = tostring(r[5])
  end
end
sweep(KEYS[2], ARGV[1], ARGV[2], now, 16)
return out
"""
)

# KEYS: entry hash, event stream, expiry index
# ARGV: logical key, expected_version|'', writer, tag prefix, maxlen, entry prefix
# -> {1, deleted_version (0 = nothing there)} | {0, actual_version}
DELETE = (
    _LIBRARY
    + r"""
local cur = redis.call('HMGET', KEYS[1], 'ver', 'tags', 'exp')
local actual = tonumber(cur[1]) or 0
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= actual then return {0, actual} end
local now = now_ms()
local id = apply_delete(KEYS[1], KEYS[2], ARGV[1], ARGV[3], ARGV[4], ARGV[5], cur, now, KEYS[3])
sweep(KEYS[3], ARGV[6], ARGV[4], now, 16)
if not id then return {1, 0} end
return {1, actual}
"""
)

# KEYS: event stream, expiry index
# ARGV[1]: JSON {"checks": [[hash, version] | [hash, version, exact stored value text], ...],
#                "ops": [["w", hash, key, value, tags, writer, ttl_ms|'', in_event '1'|'']
#                        | ["d", hash, key, writer] | ["r", list key, cap, [JSON item, ...]]
#                        | ["k", list key, keep], ...],
#                "tp": tag prefix, "ep": entry prefix, "ml": maxlen, "iv": "0"|"1"}
# A "r" op appends to a capped list (a ring: the oldest items beyond `cap` are dropped); a "k" op
# cuts a ring down to its oldest `keep` items (0: deleted).
# -> {1, now, {per op: {version, created_at, created_by, expires_at} | {0, deleted version}
#                      | {0, ring length}}}
#    | {0, failed check index (1-based), actual version}
COMMIT = (
    _LIBRARY
    + r"""
local p = cjson.decode(ARGV[1])
for i, c in ipairs(p.checks) do
  local actual = tonumber(redis.call('HGET', c[1], 'ver')) or 0
  if actual ~= c[2] then return {0, i, actual} end
  if c[3] ~= nil and redis.call('HGET', c[1], 'v') ~= c[3] then return {0, i, actual} end
end
local now = now_ms()
local out = {}
for i, op in ipairs(p.ops) do
  if op[1] == 'w' then
    local cur = redis.call('HMGET', op[2], 'ver', 'tags', 'ca', 'cb', 'exp')
    local iv = p.iv
    if op[8] == '1' then iv = '1' end
    local r = apply_write(op[2], KEYS[1], op[3], op[4], op[5], op[6], op[7], p.tp, p.ml, iv, cur, now,
      KEYS[2])
    out[i] = {r[1], r[2], r[3], tostring(r[5])}
  elseif op[1] == 'r' then
    local n = 0
    for _, item in ipairs(op[4]) do n = redis.call('RPUSH', op[2], item) end
    if n > tonumber(op[3]) then redis.call('LTRIM', op[2], -tonumber(op[3]), -1) end
    out[i] = {0, math.min(n, tonumber(op[3]))}
  elseif op[1] == 'k' then
    local keep = tonumber(op[3])
    if keep <= 0 then redis.call('DEL', op[2]) else redis.call('LTRIM', op[2], 0, keep - 1) end
    out[i] = {0, math.min(redis.call('LLEN', op[2]), math.max(keep, 0))}
  else
    local cur = redis.call('HMGET', op[2], 'ver', 'tags', 'exp')
    local actual = tonumber(cur[1]) or 0
    apply_delete(op[2], KEYS[1], op[3], op[4], p.tp, p.ml, cur, now, KEYS[2])
    out[i] = {0, actual}
  end
end
sweep(KEYS[2], p.ep, p.tp, now, 16)
return {1, now, out}
"""
)

# KEYS: expiry index, event stream [, the group tag's index set] ; ARGV: entry prefix, tag prefix,
#       ttl_ms, group tag|'', trim '1'|'0', extend '1'|'0', whole-group bound, logical keys...
# Gives each listed entry an expiry `ttl_ms` from now, unless it already expires sooner (calling it
# again never extends; with extend '1' it does: a refresh). The group tag (whose index set expires
# with its members) is left out of the expiry index of the listed entries. The caller pages a tag's
# members through SSCAN and calls this per chunk, so each call does bounded work. Given the tag's
# index set (KEYS[3]) and it has at most `whole-group bound` members, its members are done in this
# call too and the set expires after them (a small group, e.g. one run's keys: one round trip);
# a larger set: -1 and nothing is done (the caller pages it).
# With trim, stream events older than ttl_ms are trimmed (exact XTRIM MINID): the retention of the
# events of entries that expire after it.
# -> number of entries whose expiry was set, or -1
EXPIRE = (
    _LIBRARY
    + r"""
local lkeys = {}
for i = 8, #ARGV do lkeys[#lkeys + 1] = ARGV[i] end
if KEYS[3] then
  if redis.call('SCARD', KEYS[3]) > tonumber(ARGV[7]) then return -1 end
  for _, m in ipairs(redis.call('SMEMBERS', KEYS[3])) do lkeys[#lkeys + 1] = m end
end
local now = now_ms()
local ttl = tonumber(ARGV[3])
local exp = now + ttl
local extend = ARGV[6] == '1'
if ARGV[5] == '1' and now > ttl then
  redis.call('XTRIM', KEYS[2], 'MINID', tostring(now - ttl))
end
local n = 0
for _, lkey in ipairs(lkeys) do
  local h = ARGV[1] .. lkey
  local cur = redis.call('HMGET', h, 'ver', 'tags', 'exp')
  if cur[1] and (extend or not cur[3] or tonumber(cur[3]) > exp) then
    redis.call('HSET', h, 'exp', exp)
    redis.call('PEXPIRE', h, ttl)
    -- the group's own tag set expires with its members: only the other tags need the index
    local rest = {}
    for _, t in ipairs(split_tags(cur[2])) do
      if t ~= ARGV[4] then rest[#rest + 1] = t end
    end
    xindex(KEYS[1], lkey, cur[2], cur[3], table.concat(rest, '\31'), exp)
    n = n + 1
  end
end
if KEYS[3] then
  local left = redis.call('PTTL', KEYS[3])
  if left == -1 or left > ttl then redis.call('PEXPIRE', KEYS[3], ttl) end
end
sweep(KEYS[1], ARGV[1], ARGV[2], now, 16)
return n
"""
)

# KEYS: any key (a ring, an event stream) ; ARGV: ttl_ms — expire it unless it expires sooner
EXPIRE_KEY = r"""
local left = redis.call('PTTL', KEYS[1])
if left == -2 then return 0 end
if left == -1 or left > tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return 1
"""

# KEYS: any key (an index set that must outlive its members) ; ARGV: ttl_ms — expire it no sooner
# than that (a key without an expiry gets this one; a longer one stands)
EXTEND_KEY = r"""
local left = redis.call('PTTL', KEYS[1])
if left == -2 then return 0 end
if left == -1 or left < tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return 1
"""

# KEYS: a tag-index set ; ARGV: entry-key prefix, the tag, logical keys that looked stale
# Removes only members whose entry is still absent or still lacks the tag (checked here,
# atomically: one may have been re-created with the tag meanwhile).
PRUNE_TAG_INDEX = (
    _LIBRARY
    + r"""
local removed = 0
for i = 3, #ARGV do
  local carries = false
  for _, t in ipairs(split_tags(redis.call('HGET', ARGV[1] .. ARGV[i], 'tags'))) do
    if t == ARGV[2] then carries = true end
  end
  if not carries then
    removed = removed + redis.call('SREM', KEYS[1], ARGV[i])
  end
end
return removed
"""
)


# KEYS: event stream, expiry index, a queue's tag-index set (its markers: `{marker prefix}{id}`),
#       the call's receipt (a key named by the caller's random token)
# ARGV: entry prefix, tag prefix, maxlen, include_value, writer, sample bound, the queue's tag,
#       marker prefix, then (prefix, suffix) pairs around an item id: the entry an item needs
#       written, its claim, the item's own tag, the pattern of its tagged keys to list; the claim's
#       value, the claim's other tag, the tagged listing's SSCAN count, then the entries to read:
#       a count of (prefix, suffix) pairs, the pairs, the receipt's expiry (ms), then logical keys
#       read as they are
# Claims the oldest item (marker creation time, then marker key) whose needed entry exists and
# whose claim does not: its claim is created (tagged with the item's tag and the other tag) and its
# marker deleted, as one transaction's write and delete would; a marker whose item is claimed
# already is deleted on the way; markers whose entry is gone or no longer carries the queue's tag
# leave the set. Then reads what serving the item needs, in the same call. An id of anything but
# ASCII letters, digits, '_', '.' and '-' (every id Colony makes is so) is left to the caller,
# which validates it: {-1}, as for a large set, with nothing done. The receipt records the item
# claimed: the same call run again (the client sends it again when the reply was lost) claims
# nothing more and answers that item.
# -> {0} nothing claimable | {-1} more markers than the sample bound, or an id left to the caller:
#    nothing done (the caller samples the set)
#    | {1, item id, {HGETALL of each entry to read}, {SSCAN cursor, members}}
CLAIM_OLDEST = (
    _LIBRARY
    + r"""
local ep, tp, ml, iv, writer = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local pairs_n = tonumber(ARGV[20])
local function around(i, id) return ARGV[i] .. id .. ARGV[i + 1] end
local picked = redis.call('GET', KEYS[4])
if not picked then
  local size = redis.call('SCARD', KEYS[3])
  if size == 0 then return {0} end
  if size > tonumber(ARGV[6]) then return {-1} end
  local qtag, mprefix = ARGV[7], ARGV[8]
  local candidates, stale = {}, {}
  for _, m in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    local cur = redis.call('HMGET', ep .. m, 'ca', 'tags')
    local carries = false
    for _, t in ipairs(split_tags(cur[2])) do
      if t == qtag then carries = true end
    end
    if not cur[1] or not carries then
      stale[#stale + 1] = m
    elseif string.sub(m, 1, #mprefix) == mprefix then
      local id = string.sub(m, #mprefix + 1)
      if not string.find(id, '^[A-Za-z0-9_.%-]+$') then
        return {-1}
      end
      if redis.call('EXISTS', ep .. around(9, id)) == 1 then
        candidates[#candidates + 1] = {tonumber(cur[1]), m, id}
      end
    end
  end
  for _, m in ipairs(stale) do redis.call('SREM', KEYS[3], m) end
  table.sort(candidates, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  local now = now_ms()
  for _, c in ipairs(candidates) do
    local id, marker = c[3], ep .. c[2]
    local claim = around(11, id)
    local mcur = redis.call('HMGET', marker, 'ver', 'tags', 'exp')
    if redis.call('EXISTS', ep .. claim) == 0 then
      local tags = {ARGV[18], around(13, id)}
      table.sort(tags)
      local cur = redis.call('HMGET', ep .. claim, 'ver', 'tags', 'ca', 'cb', 'exp')
      apply_write(ep .. claim, KEYS[1], claim, ARGV[17], table.concat(tags, '\31'), writer, '', tp, ml,
        iv, cur, now, KEYS[2])
      apply_delete(marker, KEYS[1], c[2], writer, tp, ml, mcur, now, KEYS[2])
      picked = id
      break
    end
    apply_delete(marker, KEYS[1], c[2], writer, tp, ml, mcur, now, KEYS[2])
  end
  sweep(KEYS[2], ep, tp, now, 16)
  if not picked then return {0} end
  redis.call('SET', KEYS[4], picked, 'PX', ARGV[21 + 2 * pairs_n])
end
local reads = {}
for i = 1, pairs_n do
  reads[i] = redis.call('HGETALL', ep .. around(19 + 2 * i, picked))
end
for i = 22 + 2 * pairs_n, #ARGV do
  reads[#reads + 1] = redis.call('HGETALL', ep .. ARGV[i])
end
local tagged = redis.call('SSCAN', tp .. around(13, picked), 0, 'MATCH', around(15, picked),
  'COUNT', ARGV[19])
return {1, picked, reads, tagged}
"""
)
