-- leaky_bucket.lua: one atomic leaky-bucket decision, policing or shaping.
--
-- KEYS[1]  the bucket, a hash: l = level (fixed-point units),
--          ts = time of the last update (µs), u = units per request,
--          e = when it expires (µs): empty under the limit that set it
-- ARGV[1]  unit rate: units that leak per µs  (rate / gcd(rate, period µs))
-- ARGV[2]  unit: units per request            (period µs / the same gcd)
-- ARGV[3]  burst: the capacity, in requests
-- ARGV[4]  n: the cost (0 = report without spending)
-- ARGV[5]  now in µs, or '' for the Redis server's TIME
-- ARGV[6]  max delay in µs (0 = policing)
-- Reply    {allowed 0|1, remaining, retry-after µs, reset-after µs, delay µs,
--          now µs}
--
-- Why it is written this way:
--   * The bucket fills with what is admitted and leaks at the rate. As a
--     policer (max delay 0) a request that would overflow is rejected: the
--     mirror image of token_bucket.lua, and it decides identically.
--   * As a shaper, a request that would overflow by x units is admitted
--     with a delay of lag + x / unit-rate µs — the moment the bucket has
--     leaked enough for it, in the caller's time — as long as that delay is
--     within the max delay: the delay returned is the delay checked, also
--     after the clock stepped back. The level then stands above the
--     capacity by what is queued, so the next request is delayed behind
--     it: admitted requests leave spaced at the rate. retry-after is
--     exact: the instant at which that delay is the max delay.
--   * n = 0 only looks: always allowed, no delay (nothing is sent), even
--     when a lowered limit left the level above the capacity.
--   * A changed rate rescales the level exactly, rounded down, clamped to
--     the capacity plus what the max delay queues.
--   * Every read caps the level at what leaks in 2^47 µs at this rate (twice
--     the longest period or max delay, so no level this limit leaves is
--     above it). Another rate can share the unit (997 and 1 per a period
--     997 does not divide): its level is read whole, and at this rate might
--     take centuries to leak, more µs than a double counts. Capped, every
--     duration is at most the lag plus 2^47, within 2^53 for any time up to
--     exact.MaxNow. rate * 2^47 is exact (a power of two times an integer).
--   * Fixed-point units, exact leak (max(0, level - elapsed * rate), exact
--     for the reason token_bucket.lua's refill is), backwards clocks, no
--     write on denial, the TTL (until the bucket is empty, set by every
--     call that finds the key) and its expiry e (a bucket empty under the
--     limit that set it is no bucket under any: a level of 1 draining at
--     8,000 a day is gone in 11s, at 20 a day it would take 72 minutes) as
--     in token_bucket.lua.
--   * The state's read and write are lb_read and lb_write, the only code
--     that knows the hash's fields: settle.lua corrects a bucket with the
--     same two functions, and fills it by a charge no further than
--     lb_horizon lets a read keep.

-- lb_horizon is 2^47 µs: a read caps the level at what leaks in that long.
local lb_horizon = 140737488355328

-- lb_read returns the bucket key holds, as it stands at now under a limit
-- of rate units a µs, unit units a request (utext: the unit as its
-- argument reads, the form u is stored in), capacity units and a max delay
-- of maxdelay µs: the level (units, leaked up to now), ts, whether u is
-- utext, whether the key held a live bucket, and its expiry e (nil when it
-- has none stored, or holds no bucket). A key with no bucket, or one that
-- has expired (then the last value is true: a bucket is there to delete),
-- is an empty one at now; a key tollgate did not write returns nil.
local function lb_read(key, now, rate, unit, utext, capacity, maxdelay)
  local st = redis.call('HMGET', key, 'l', 'ts', 'u', 'e')
  if not st[1] then
    return 0, now, false, false
  end
  local level, ts, e = tonumber(st[1]), tonumber(st[2]), st[4]
  -- u is stored as the text of the unit's argument: while the rate is the
  -- same, the texts are equal and u needs neither reading nor writing.
  local same = st[3] == utext
  local u = unit
  if not same then
    u = tonumber(st[3])
  end
  if e then
    e = tonumber(e)
    if not e then
      return nil
    end
    if now >= e then
      return 0, now, same, false, nil, true
    end
  end
  if not (level and ts and u) then
    return nil
  end
  if u ~= unit then
    -- Exactly, rounded down as the token bucket's tokens are, and clamped
    -- to the most the bucket can hold: the capacity and what the max delay
    -- queues (Go checked that this stays below 2^53). A level of 10^9
    -- draining at one a day would outlast any duration.
    level = muldiv(level, unit, u, capacity + maxdelay * rate, false)
  end
  level = math.min(level, rate * lb_horizon)
  if now > ts then
    level = math.max(0, level - (now - ts) * rate)
    ts = now
  end
  return level, ts, same, true, e
end

-- lb_write stores level (units), ts and the expiry e in key, and u (as
-- utext) unless same says it is stored already. The caller sets the TTL.
local function lb_write(key, level, ts, same, utext, e)
  if same then
    redis.call('HSET', key, 'l', int(level), 'ts', int(ts), 'e', int(e))
  else
    redis.call('HSET', key, 'l', int(level), 'ts', int(ts), 'e', int(e), 'u', utext)
  end
end


local function decide(key, argv, o, now, dry)
  local rate = tonumber(argv[o + 1])
  local unit = tonumber(argv[o + 2])
  local capacity = tonumber(argv[o + 3]) * unit
  local n = tonumber(argv[o + 4])
  local maxdelay = tonumber(argv[o + 6])

  local level, ts, same, found, e, stale = lb_read(key, now, rate, unit, argv[o + 2], capacity, maxdelay)
  if not level then
    return corrupt()
  end

  local lag = ts - now
  local cost = n * unit
  -- level - capacity first: a level kept under another rate of the same
  -- unit may lie near 2^53 (a settle's charge), where level + cost is no
  -- longer a double.
  local excess = level - capacity
  local over = excess + cost
  local allowed, retry, reset, delay = 0, 0, 0, 0
  if n == 0 or over <= 0 then
    allowed = 1
  else
    -- The time to leak the excess. It is at most 2^47 µs plus the max
    -- delay, but the excess itself, over, passes 2^53 when such a level
    -- meets a large cost: then the ceiling comes from each part's
    -- quotient and remainder.
    local leak
    if over < 9007199254740992 then
      leak = cdiv(over, rate)
    else
      local qe, qc = fdiv(excess, rate), fdiv(cost, rate)
      local re, rc = excess - qe * rate, cost - qc * rate
      leak = qe + qc
      if re > rate - rc then
        leak = leak + 2
      elseif re + rc > 0 then
        leak = leak + 1
      end
    end
    -- When the request could go: the lag, then the leak. The sum may pass
    -- 2^53 (a lag back from 2250 to 1970, and a full shaper's years) and
    -- round, but never to at most maxdelay when it is more; retry, at most
    -- 2^53, subtracts maxdelay from the lag first, so it is exact.
    local wait = lag + leak
    if wait <= maxdelay then
      allowed = 1
      delay = wait
    else
      retry = (lag - maxdelay) + leak
    end
  end
  if allowed == 1 then
    level = level + cost
  end
  if level > 0 then
    reset = lag + cdiv(level, rate)
  end
  if allowed == 1 and n > 0 then
    if not dry then
      lb_write(key, level, ts, same, argv[o + 2], now + reset)
      expire(key, reset)
    end
  else
    -- A denial or a look that found the key keeps it until it is empty
    -- under this call's limit (its level stays as it was, its expiry
    -- moves): after a limit change the TTL a write set may end before the
    -- retry-after reported here.
    bucket_keep(key, found, e, stale, now, reset)
  end
  return {allowed, fdiv(math.max(capacity - level, 0), unit), retry, reset, delay, now}
end

return run(decide, 6, 5, KEYS, ARGV)
