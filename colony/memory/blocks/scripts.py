"""Lua scripts of the block store: each touches one block's keys (one hash slot) atomically.

Blobs (Loro snapshots and updates) are base64 text: the shared Redis client decodes replies as
UTF-8. Metadata hash fields are listed in `colony.memory.blocks.store`.
"""

from __future__ import annotations

# KEYS: meta, snap, log. ARGV: snapshot, then field/value pairs. 1 = created, 0 = exists.
CREATE = r"""
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
local fields = {}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
return 1
"""

# KEYS: meta, snap, log. ARGV: cached generation, first update index wanted.
# Returns {gen, meta fields..., '|', snapshot or '', updates...} or nil when the block is gone.
READ = r"""
local meta = redis.call('HGETALL', KEYS[1])
if #meta == 0 then return nil end
local gen = redis.call('HGET', KEYS[1], 'gen') or '0'
local out = {gen}
for i = 1, #meta do out[#out + 1] = meta[i] end
out[#out + 1] = '|'
local from = tonumber(ARGV[2])
if gen ~= ARGV[1] then
  out[#out + 1] = redis.call('GET', KEYS[2]) or ''
  from = 0
else
  out[#out + 1] = ''
end
local updates = redis.call('LRANGE', KEYS[3], from, -1)
for i = 1, #updates do out[#out + 1] = updates[i] end
return out
"""

# KEYS: meta, log. ARGV: update, updated_at. Returns the log's length, or -1 when the block is gone.
APPEND = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local n = redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'updated_at', ARGV[2])
return n
"""

# KEYS: meta, snap, log. ARGV: expected generation, updates folded in, snapshot, base version,
# the new generation.
# 1 = compacted, 0 = someone else compacted first.
COMPACT = r"""
local gen = redis.call('HGET', KEYS[1], 'gen')
if gen == false or gen ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[3], tonumber(ARGV[2]), -1)
redis.call('HSET', KEYS[1], 'gen', ARGV[5], 'base_version', ARGV[4])
return 1
"""
