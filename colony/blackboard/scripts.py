"""Lua scripts that make each blackboard mutation atomic.

The version check, the entry write, the tag-index update and the event append run inside
one script, so Redis applies all of them or none. Time comes from the server (`TIME`) so
timestamps of writers on different hosts are comparable.

Entry hash fields: v (JSON value), ver, tags (tags joined by \\x1f), cb/ub (created/updated by),
ca/ua (created/updated at, ms), exp (expiry, ms; only with a TTL).
Event fields: op, key, ver, tags, by, ts (ms), and v when values go into events.
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
local function apply_write(h, stream, lkey, value, tags, writer, ttl_ms, tagp, maxlen, incl, cur, now)
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
  if old_ver > 0 then retag(tagp, lkey, cur[2], tags) else retag(tagp, lkey, '', tags) end
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
local function apply_delete(h, stream, lkey, writer, tagp, maxlen, cur, now)
  local ver = tonumber(cur[1]) or 0
  if ver == 0 then return false end
  retag(tagp, lkey, cur[2], '')
  redis.call('DEL', h)
  return redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
    'op', 'delete', 'key', lkey, 'ver', ver, 'tags', cur[2] or '', 'by', writer, 'ts', now)
end
"""

# KEYS: entry hash, event stream
# ARGV: logical key, value, tags, writer, ttl_ms|'', expected_version|'', tag prefix, maxlen, include_value
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
  cur, now)
return {1, r[1], r[2], r[3], r[4], tostring(r[5]), now}
"""
)

# KEYS: event stream (entry hashes share its hash tag, hence its cluster slot)
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
    local r = apply_write(h, KEYS[1], w[1], w[2], w[3], w[4], w[5], ARGV[2], ARGV[3], ARGV[4], cur, now)
    out[#out + 1] = 1; out[#out + 1] = r[1]; out[#out + 1] = r[2]; out[#out + 1] = r[3]
    out[#out + 1] = tostring(r[5])
  end
end
return out
"""
)

# KEYS: entry hash, event stream
# ARGV: logical key, expected_version|'', writer, tag prefix, maxlen
# -> {1, deleted_version (0 = nothing there)} | {0, actual_version}
DELETE = (
    _LIBRARY
    + r"""
local cur = redis.call('HMGET', KEYS[1], 'ver', 'tags')
local actual = tonumber(cur[1]) or 0
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= actual then return {0, actual} end
local id = apply_delete(KEYS[1], KEYS[2], ARGV[1], ARGV[3], ARGV[4], ARGV[5], cur, now_ms())
if not id then return {1, 0} end
return {1, actual}
"""
)

# KEYS: event stream
# ARGV[1]: JSON {"checks": [[hash, version], ...],
#                "ops": [["w", hash, key, value, tags, writer, ttl_ms|''] | ["d", hash, key, writer], ...],
#                "tp": tag prefix, "ml": maxlen, "iv": "0"|"1"}
# -> {1, now, {per op: {version, created_at, created_by, expires_at} | {0, deleted version}}}
#    | {0, failed check index (1-based), actual version}
COMMIT = (
    _LIBRARY
    + r"""
local p = cjson.decode(ARGV[1])
for i, c in ipairs(p.checks) do
  local actual = tonumber(redis.call('HGET', c[1], 'ver')) or 0
  if actual ~= c[2] then return {0, i, actual} end
end
local now = now_ms()
local out = {}
for i, op in ipairs(p.ops) do
  if op[1] == 'w' then
    local cur = redis.call('HMGET', op[2], 'ver', 'tags', 'ca', 'cb', 'exp')
    local r = apply_write(op[2], KEYS[1], op[3], op[4], op[5], op[6], op[7], p.tp, p.ml, p.iv, cur, now)
    out[i] = {r[1], r[2], r[3], tostring(r[5])}
  else
    local cur = redis.call('HMGET', op[2], 'ver', 'tags')
    local actual = tonumber(cur[1]) or 0
    apply_delete(op[2], KEYS[1], op[3], op[4], p.tp, p.ml, cur, now)
    out[i] = {0, actual}
  end
end
return {1, now, out}
"""
)

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
