-- concurrency_release.lua: give a concurrency limit's permit back.
--
-- KEYS[1]  the key's sorted set of permits (see concurrency_acquire.lua)
-- ARGV[1]  the permit's ID
-- ARGV[2]  now in µs, or '' for the Redis server's TIME
-- Reply    1 when the permit was held, 0 when it had lapsed or was
--          already released
--
-- Why it is written this way:
--   * Releasing twice, or after the lease ended, changes nothing: a
--     deferred release is always safe. A lapsed permit is not "released
--     late": its slot may already be someone else's.
--   * Lapsed permits are dropped here too, and the TTL follows the latest
--     lease still held, so the key lives no longer than its permits. Redis
--     deletes a sorted set whose last member is removed.
local key = KEYS[1]
local now = clock(ARGV[2])

redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
local held = redis.call('ZREM', key, ARGV[1])
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then
  local at = tonumber(last[2])
  if not at then
    return corrupt()
  end
  expire(key, at - now)
end
return held
