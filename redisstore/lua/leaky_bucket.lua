-- leaky_bucket.lua: one atomic leaky-bucket decision, policing or shaping.
--
-- KEYS[1]  the bucket, a hash: l = level (fixed-point units),
--          ts = time of the last update (µs), u = units per request
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
--     write on denial and the TTL (until the bucket is empty, set by every
--     call that finds the key) as in token_bucket.lua.

local function decide(key, argv, o, now)
  local rate = tonumber(argv[o + 1])
  local unit = tonumber(argv[o + 2])
  local capacity = tonumber(argv[o + 3]) * unit
  local n = tonumber(argv[o + 4])
  local maxdelay = tonumber(argv[o + 6])

  local level, ts, same = 0, now, false
  local st = redis.call('HMGET', key, 'l', 'ts', 'u')
  if st[1] then
    level, ts = tonumber(st[1]), tonumber(st[2])
    -- u is stored as the text of ARGV[2]: while the rate is the same, the
    -- texts are equal and u needs neither reading nor writing.
    same = st[3] == argv[o + 2]
    local u = unit
    if not same then
      u = tonumber(st[3])
    end
    if not (level and ts and u) then
      return corrupt()
    end
    if u ~= unit then
      -- Exactly, rounded down as the token bucket's tokens are, and clamped
      -- to the most the bucket can hold: the capacity and what the max delay
      -- queues (Go checked that this stays below 2^53). A level of 10^9
      -- draining at one a day would outlast any duration.
      level = muldiv(level, unit, u, capacity + maxdelay * rate, false)
    end
    level = math.min(level, rate * 140737488355328)
    if now > ts then
      level = math.max(0, level - (now - ts) * rate)
      ts = now
    end
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
    if same then
      redis.call('HSET', key, 'l', int(level), 'ts', int(ts))
    else
      redis.call('HSET', key, 'l', int(level), 'ts', int(ts), 'u', argv[o + 2])
    end
    expire(key, reset)
  elseif st[1] and reset > 0 then
    -- A denial or a look that found the key keeps it until it is full under
    -- this call's limit (its value stays byte for byte as it was): after a
    -- limit change the TTL a write set may end before the retry-after
    -- reported here.
    expire(key, reset)
  end
  return {allowed, fdiv(math.max(capacity - level, 0), unit), retry, reset, delay, now}
end

return run(decide, 6, 5, KEYS, ARGV)
