"""Lua scripts of the block store: each touches one block's keys (one hash slot) atomically.

Blobs (Loro snapshots and updates) are base64 text: the shared Redis client decodes replies as
UTF-8. Metadata hash fields are listed in `colony.memory.blocks.store`. The `ver` list holds the
edit id of every update in the order it entered the log (the creation first); `vbase` in the
metadata counts the versions trimmed from its front, so version = vbase + position + 1.
"""

from __future__ import annotations

# KEYS: meta, snap, log, ver. ARGV: snapshot, creation edit id, then field/value pairs.
# 1 = created, 0 = exists.
CREATE = r"""
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4])
redis.call('RPUSH', KEYS[4], ARGV[2])
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
return 1
"""

# KEYS: meta, snap, log, ver. ARGV: cached generation, first update index wanted, '1' for the
# edit ids. Returns {gen, vbase, version count, #meta, meta..., snapshot or '', #ids, ids...,
# updates...}, or nil when the block is gone.
READ = r"""
local meta = redis.call('HGETALL', KEYS[1])
if #meta == 0 then return nil end
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
local out = {gen, redis.call('HGET', KEYS[1], 'vbase') or '0', redis.call('LLEN', KEYS[4]), #meta}
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

# KEYS: meta, log, ver. ARGV: update, updated_at, edit id, the generation the editor loaded.
# Returns {log length, version}; -1 when the block is gone, -2 when it was compacted meanwhile
# (the editor reloads and redoes the edit: its update could depend on folded history).
APPEND = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[4] then return -2 end
local n = redis.call('RPUSH', KEYS[2], ARGV[1])
local v = redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[1], 'updated_at', ARGV[2])
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
