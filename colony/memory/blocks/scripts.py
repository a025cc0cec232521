"""Lua scripts of the block store: each touches one block's keys (one hash slot) atomically, or
one colony's directories (owner and shared indexes, the owners set: one hash slot, the namespace's).

Blobs (Loro snapshots and updates) are base64 text: the shared Redis client decodes replies as
UTF-8. Metadata hash fields are listed in `colony.memory.blocks.store`. The `ver` list holds the
edit id of every update in the order it entered the log (the creation first); `vbase` in the
metadata counts the versions trimmed from its front, so version = vbase + position + 1. `chars` in
the metadata is the content's length after the latest edit (the one the character limit counts).
"""

from __future__ import annotations

# KEYS: meta, snap, log, ver. ARGV: snapshot, creation edit id, then field/value pairs.
# 1 = created (or created already by this very call: a re-sent script whose first reply was lost
# finds its own creation id first in `ver`), 0 = exists.
CREATE = r"""
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('LINDEX', KEYS[4], 0) == ARGV[2] then return 1 end
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4])
redis.call('RPUSH', KEYS[4], ARGV[2])
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
return 1
"""

# KEYS: meta, snap, log, ver. ARGV: cached generation, first update index wanted, '1' for the
# edit ids, an edit id to look for ('' for none). Returns {gen, vbase, version count, position of
# that edit id in `ver` (0-based; -1: not there), #meta, meta..., snapshot or '', #ids, ids...,
# updates...}, or nil when the block is gone.
READ = r"""
local meta = redis.call('HGETALL', KEYS[1])
if #meta == 0 then return nil end
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
local found = -1
if ARGV[4] ~= '' then found = redis.call('LPOS', KEYS[4], ARGV[4]) or -1 end
local out = {gen, redis.call('HGET', KEYS[1], 'vbase') or '0', redis.call('LLEN', KEYS[4]), found, #meta}
for i = 1, #meta do out[#out + 1] = meta[i] end
local from = tonumber(ARGV[2])
if gen ~= ARGV[1] then
  out[#out + 1] = redis.call('GET', KEYS[2]) or ''
  from = 0
else
  out[#out + 1] = ''
end
if ARGV[3] == '1' then
  local ids = redis.call('LRANGE', KEYS[4], 0, -1)
  out[#out + 1] = #ids
  for i = 1, #ids do out[#out + 1] = ids[i] end
else
  out[#out + 1] = 0
end
local updates = redis.call('LRANGE', KEYS[3], from, -1)
for i = 1, #updates do out[#out + 1] = updates[i] end
return out
"""

# KEYS: meta, log, ver. ARGV: update, updated_at, edit id, the generation the editor loaded, the
# log length it loaded ('' for a LOG block: its entries merge, it has no character limit), the
# block's characters after the edit, and before it as the editor saw them.
# Returns {log length, version}, or {-1} when the block is gone, {-2} when it was compacted
# meanwhile (the editor reloads and redoes the edit: its update could depend on folded history),
# {-3} when another update was appended meanwhile (compare-and-set: the editor reloads, redoes
# the edit on the new content and checks the limit again, so merged edits never pass it), {-4,
# char_limit, chars} when the edit would grow the block past the limit in its metadata.
# An edit id already among the last 64 versions is this edit's own update, stored by an
# earlier send of this script whose reply was lost (the client re-sends after a timeout): its
# {log length, version} is returned and nothing is appended again.
APPEND = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local seen = redis.call('LPOS', KEYS[3], ARGV[3], 'RANK', -1, 'MAXLEN', 64)
if seen then
  return {redis.call('LLEN', KEYS[2]), tonumber(redis.call('HGET', KEYS[1], 'vbase') or '0') + seen + 1}
end
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[4] then return {-2} end
if ARGV[5] ~= '' then
  if redis.call('LLEN', KEYS[2]) ~= tonumber(ARGV[5]) then return {-3} end
  local limit = tonumber(redis.call('HGET', KEYS[1], 'char_limit') or '')
  local chars = tonumber(ARGV[6])
  local before = tonumber(redis.call('HGET', KEYS[1], 'chars') or ARGV[7])
  if limit ~= nil and chars > limit and chars > before then return {-4, limit, before} end
end
local n = redis.call('RPUSH', KEYS[2], ARGV[1])
local v = redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[1], 'updated_at', ARGV[2], 'chars', ARGV[6])
return {n, tonumber(redis.call('HGET', KEYS[1], 'vbase') or '0') + v}
"""

# KEYS: meta, snap, log, ver. ARGV: expected generation, updates folded in, snapshot, new
# generation, versions dropped from the front of `ver`. 1 = compacted; 0 = someone else compacted
# first, or an update arrived after the compactor read the log (its base may predate the new
# shallow root): the next edit tries again.
COMPACT = r"""
local gen = redis.call('HGET', KEYS[1], 'gen')
if gen == false or gen ~= ARGV[1] then return 0 end
if redis.call('LLEN', KEYS[3]) ~= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[3], tonumber(ARGV[2]), -1)
local drop = tonumber(ARGV[5])
if drop > 0 then
  redis.call('LTRIM', KEYS[4], drop, -1)
  redis.call('HINCRBY', KEYS[1], 'vbase', drop)
end
redis.call('HSET', KEYS[1], 'gen', ARGV[4])
return 1
"""

# Directories (KEYS in the namespace's slot). A label is listed in its owner's index before the
# block's keys are written (CREATE), and unlisted after they are deleted: a crash in between leaves
# a listed label without a block, which listing skips and a re-create of the label fills.

# KEYS: the owner's index, the owners set, the colony's index, the owner's shared index. ARGV:
# label, block id, max blocks per owner, owner. Lists the label unless it would collide in the
# owner's view or the owner has `max` blocks. Returns {'ok'}, {'listed'} (listed already: CREATE
# decides whether the block exists), {'full'}, {'colony'} (a colony block of that label), {'shared'}
# (a block of that label is shared with the owner).
LIST_AGENT_LABEL = r"""
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {'listed'} end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return {'colony'} end
for _, raw in ipairs(redis.call('HVALS', KEYS[4])) do
  local ok, grant = pcall(cjson.decode, raw)
  if ok and type(grant) == 'table' and grant['label'] == ARGV[1] then return {'shared'} end
end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return {'full'} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[4])
return {'ok'}
"""

# KEYS: the colony's index, the owners set, then the index of every agent in ARGV[5..] (the owners
# the caller read). ARGV: label, block id, max blocks, the colony owner, agent ids. Returns {'ok'},
# {'listed'}, {'full'}, {'agent', id} (that agent has a block of that label), or {'stale'} when an
# owner the caller did not pass has blocks now (the caller reads the owners again and retries).
LIST_COLONY_LABEL = r"""
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {'listed'} end
local passed = {}
for i = 5, #ARGV do passed[ARGV[i]] = true end
for _, owner in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if owner ~= ARGV[4] and not passed[owner] then return {'stale'} end
end
for i = 3, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[1]) == 1 then return {'agent', ARGV[i + 2]} end
end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return {'full'} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[4])
return {'ok'}
"""

# KEYS: the owner's index, the owners set. ARGV: label, owner. Unlists the label (and the owner
# from the owners set when it has no label left). Returns 1 when the label was listed.
UNLIST_LABEL = r"""
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[2]) end
return removed
"""

# KEYS: the agent's own index, the agent's shared index. ARGV: block id, label, grant (JSON), max
# blocks shared with one agent. Records the grant unless the label collides in the agent's view.
# Returns {'ok'}, {'own'} (the agent has its own block of that label), {'shared'} (another block of
# that label is shared with it), {'full'}.
GRANT_SHARE = r"""
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then
  if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then return {'own'} end
  local flat = redis.call('HGETALL', KEYS[2])
  for i = 1, #flat, 2 do
    local ok, grant = pcall(cjson.decode, flat[i + 1])
    if ok and type(grant) == 'table' and grant['label'] == ARGV[2] then return {'shared'} end
  end
  if #flat / 2 >= tonumber(ARGV[4]) then return {'full'} end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return {'ok'}
"""
