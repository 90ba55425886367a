-- concurrency_acquire.lua: take one slot of a concurrency limit, atomically.
--
-- KEYS[1]  a sorted set of the key's permits: member = permit ID (32 hex
--          digits, random, made by the client), score = when its lease
--          ends (µs)
-- ARGV[1]  max: how many permits may be held at once
-- ARGV[2]  lease in µs
-- ARGV[3]  the new permit's ID
-- ARGV[4]  now in µs, or '' for the Redis server's TIME
-- Reply    {allowed 0|1, remaining, retry-after µs, expires µs}: expires is
--          when the new permit lapses (0 when denied); retry-after is, when
--          denied, how long until enough leases end to free a slot.
--
-- Why it is written this way:
--   * One key per call, so it works on a Cluster: the set is named with the
--     caller's key in a hash tag, like every other tollgate key.
--   * A permit whose holder died must not hold its slot for good, so every
--     permit has a lease and every call first drops the lapsed ones
--     (ZREMRANGEBYSCORE up to now, inclusive: a lease ending at now has
--     ended). A lapsed permit is gone for good, also if the clock steps
--     back: it cannot have been renewed.
--   * A denial adds nothing, so the set never holds more than max members
--     (the largest max the key was called with): memory is bounded however
--     hard the key is hammered.
--   * IDs come from the client (128 random bits), not from Lua: math.random
--     in a Redis script is seeded the same on every call, and a counter would
--     need a second key.
--   * An ID the set already holds is denied, not renewed: a caller may name
--     its permit (a gateway's request ID, hashed), and two requests sent
--     under one name must not share one slot. retry-after is then when
--     that permit's lease ends.
--   * retry-after is the time until the (count - max + 1)-th earliest lease
--     ends: with the key at max, the earliest; after max was lowered, as
--     many as stand in the way. It is an upper bound when holders release
--     early, which they usually do.
--   * The key's TTL is the latest lease, set in the same script that adds a
--     member (and again by every call that finds the key), so an idle key
--     disappears once every permit has lapsed and a client that dies
--     between calls cannot leave a key without one.
local key = KEYS[1]
local max = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local now = clock(ARGV[4])

redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
local count = redis.call('ZCARD', key)
local held = redis.call('ZSCORE', key, ARGV[3])
if held then
  local at = tonumber(held)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local latest = tonumber(last[2])
  if not at or not latest then
    return corrupt()
  end
  expire(key, latest - now)
  return {0, 0, at - now, 0}
end
if count >= max then
  local e = redis.call('ZRANGE', key, count - max, count - max, 'WITHSCORES')
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local at, latest = tonumber(e[2]), tonumber(last[2])
  if not at or not latest then
    return corrupt()
  end
  -- The TTL follows the latest lease on every call that finds the key, as
  -- the rate limits' does, so the key outlives no permit if a clock given
  -- to the store stepped back, and nothing longer than its latest lease.
  expire(key, latest - now)
  return {0, 0, at - now, 0}
end
local expires = now + lease
redis.call('ZADD', key, int(expires), ARGV[3])
-- The latest lease may be another holder's, longer than this one.
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
expire(key, math.max(tonumber(last[2]), expires) - now)
return {1, max - count - 1, 0, expires}
