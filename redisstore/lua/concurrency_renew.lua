-- concurrency_renew.lua: extend a held permit of a concurrency limit.
--
-- KEYS[1]  the key's sorted set of permits (see concurrency_acquire.lua)
-- ARGV[1]  the permit's ID
-- ARGV[2]  the new lease in µs, counted from now
-- ARGV[3]  now in µs, or '' for the Redis server's TIME
-- Reply    {held 0|1, expires µs}: 0 when the permit had lapsed or was
--          released (nothing changes then), else when it now lapses
--
-- Why it is written this way:
--   * A lapsed permit is never brought back, even with a slot free: its
--     holder's work ran unprotected for a while, and it should know (the
--     store reports ErrPermitExpired) and Acquire again, against max.
--   * The new lease counts from now, not from the old expiry, so a holder
--     that renews every lease/3 never holds a slot further ahead than one
--     lease; a shorter lease shortens the permit.
--   * The TTL follows the latest lease held, which a renewal may move
--     either way.
local key = KEYS[1]
local lease = tonumber(ARGV[2])
local now = clock(ARGV[3])

redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
if not redis.call('ZSCORE', key, ARGV[1]) then
  return {0, 0}
end
local expires = now + lease
redis.call('ZADD', key, 'XX', int(expires), ARGV[1])
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local at = tonumber(last[2])
if not at then
  return corrupt()
end
expire(key, at - now)
return {1, expires}
