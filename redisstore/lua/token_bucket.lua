-- token_bucket.lua: one atomic token-bucket decision.
--
-- KEYS[1]  the bucket, a string 't:ts:u:e': t = tokens (fixed-point units,
--          below 0 a debt), ts = time of the last update (µs), u = units
--          per token, e = when it expires (µs): full under the limit that
--          set it. (A hash of the same fields, as earlier versions wrote
--          it, e possibly missing, is read too, and written as a string.)
-- ARGV[1]  unit rate: units added per µs     (rate / gcd(rate, period µs))
-- ARGV[2]  unit: units per token             (period µs / the same gcd)
-- ARGV[3]  burst: the capacity, in tokens
-- ARGV[4]  n: the cost in tokens (0 = report without spending)
-- ARGV[5]  now in µs, or '' for the Redis server's TIME
-- ARGV[6]  MaxDebt: the most tokens a key may owe (tollgate.Params.MaxDebt)
-- Reply    {allowed 0|1, remaining tokens, retry-after µs, reset-after µs, 0,
--          now µs}
--
-- Why it is written this way:
--   * Tokens are counted in units of 1/unit token, so refill is exactly
--     unit-rate units per µs: no fractions, nothing lost between calls, and
--     a per-second limit counts in micro-tokens. Go reduced rate and period
--     by their gcd and checked that burst * unit < 2^53.
--   * One string, one key: read, refill, decide and write in one call; the
--     hash tag around the caller's key is in KEYS[1] already. A string
--     costs Redis fewer instructions than a hash of the same fields: GET
--     instead of HMGET, and one SET with its expiry (PXAT or PX) instead of
--     HSET and PEXPIREAT — a sixth less a decision (bench/luacost.sh). Its
--     integers are written with '%d', every digit, and read back exactly.
--   * A clock that went backwards is never rewarded: time for this key
--     stands still (no refill) until the clock passes ts again; durations
--     in the reply include that lag, so they are true in the caller's time.
--   * u is stored so a changed rate rescales the tokens instead of
--     misreading them: exactly, rounded down (never more than the key had),
--     a debt rounded up and to at most the new limit's MaxDebt.
--   * Tokens may be below 0: a debt a settle's extra charge left
--     (settle.lua), which refills like any shortfall. It is at most the
--     MaxDebt of the limit a call is made under (a lowered burst forgives
--     the rest), so every quantity stays below 2^53. A look at a key in
--     debt is allowed and reports nothing remaining. MaxDebt is Go's
--     (limit.go), an argument read only when a key is in debt: one
--     definition, not a copy of its formula here.
--   * The state's read and write are tb_read, tb_write and tb_keep, the
--     only code that knows its form: settle.lua corrects a bucket with the
--     same functions.
--   * A denied request, or n = 0, writes nothing: the stored state still
--     describes the bucket exactly.
--   * The TTL is the time until the bucket is full again: an idle key
--     disappears exactly when forgetting it changes nothing. Every call
--     that finds the key sets it (a denial or a look only it, when the
--     reset-after is above 0): a limit changed since the write may take
--     longer to refill, and the key must outlive the retry-after reported.
--   * Expiry is invisible: once full under the limit that set its expiry,
--     a bucket decides as no bucket under any limit, so that it makes no
--     difference whether Redis has deleted it yet. A TTL does not say
--     when that is: it runs in Redis's time, in whole ms, while the
--     decision's clock may be the caller's. Nor does the bucket itself,
--     under another limit: full at burst 2 is not full at burst 5. So e
--     holds the instant, on the decision's clock, now + reset-after of
--     the last call that set the TTL; a call at or after it finds no
--     bucket (and a look deletes it, so that a clock that steps back does
--     not find it again). Under the limit that set it, every call computes
--     the same instant, so a denial or a look writes e only after a limit
--     change. A bucket written before e was stored has none: it is live
--     until its TTL ends, as it always was, and gains e from the first
--     call that sets its TTL (a denial or a look writes e into the hash; a
--     write makes it a string with e).
--   * Refill is min(capacity, tokens + elapsed * rate): when the product
--     outgrows 2^53 it is no longer exact, but then it is far above the
--     capacity, and rounding never moves a double across a value it can
--     hold exactly — so the minimum is exact. One ceil-division per
--     decision fewer than comparing elapsed with the time to fill.

-- tb_read returns the bucket key holds, as it stands at now under a limit
-- of rate units a µs, unit units a token (utext: the unit as its argument
-- reads, the form u is stored in), capacity units, and a debt of at most
-- maxdebt tokens (MaxDebt's argument, read only for a key in debt): tokens
-- (units, refilled up to now and at most capacity), ts, whether u is
-- utext, whether the key held a live bucket, its expiry e (nil when it
-- has none stored, or holds no bucket), whether an expired bucket is there
-- to delete, and the stored string (nil for a hash, or no bucket), which
-- tb_keep rewrites. A key with no bucket, or one that has expired, is a
-- full one at now; a key tollgate did not write returns nil.
--
-- The bucket is one string, 't:ts:u:e'. One written in an older form, a
-- hash of the same four fields (e possibly missing), is read as it is and
-- becomes a string on its next write. GET is sent with redis.pcall, which
-- returns a wrong type as an error reply instead of stopping the script:
-- one command for a string or no key, a second (HMGET) only for a hash.
local function tb_read(key, now, rate, unit, utext, capacity, maxdebt)
  local v = redis.pcall('GET', key)
  if not v then
    return capacity, now, false, false
  end
  local t, ts, u, e, sv
  if type(v) == 'string' then
    sv = v
    t, ts, u, e = string.match(v, '^(-?%d+):(%d+):(%d+):(%d+)$')
  end
  if not e then
    -- A hash (GET's reply was its WRONGTYPE error), or a string tollgate
    -- did not write: HMGET reads the first, and stops the script at the
    -- second with Redis's own WRONGTYPE, as on a key of any other type.
    sv = nil
    local h = redis.call('HMGET', key, 't', 'ts', 'u', 'e')
    if not h[1] then
      return capacity, now, false, false
    end
    t, ts, u, e = h[1], h[2], h[3], h[4]
  end
  local tokens = tonumber(t)
  ts = tonumber(ts)
  -- u is stored as the text of the unit's argument: while the rate is the
  -- same, the texts are equal and u needs no conversion.
  local same = u == utext
  if same then
    u = unit
  else
    u = tonumber(u)
  end
  if e then
    e = tonumber(e)
    if not e then
      return nil
    end
    if now >= e then
      return capacity, now, same, false, nil, true
    end
  end
  if not (tokens and ts and u) then
    return nil
  end
  if u ~= unit and tokens >= 0 then
    tokens = muldiv(tokens, unit, u, capacity)
  elseif tokens < 0 then
    -- A debt is at most this limit's MaxDebt, in units: a lowered burst
    -- forgives the rest, and a debt kept under another unit, rounded to
    -- the larger debt, would not count exactly under a much finer one.
    local most = tonumber(maxdebt) * unit
    if u ~= unit then
      tokens = -muldiv(-tokens, unit, u, most, true)
    else
      tokens = math.max(tokens, -most)
    end
  end
  if now > ts then
    tokens = tokens + (now - ts) * rate
    ts = now
  end
  return math.min(tokens, capacity), ts, same, true, e, false, sv
end

-- tb_write stores tokens (units), ts, u (as utext) and the expiry e = now
-- + reset in key, as one string, with its TTL: one SET, whatever the key
-- held before.
local function tb_write(key, tokens, ts, utext, reset, now)
  redis.call('SET', key, string.format('%d:%d:%s:%d', tokens, ts, utext, now + reset), ttl(reset))
end

-- tb_keep is bucket_keep (lib.lua) for the bucket tb_read found, stored
-- as the string sv (nil: a hash, or no bucket): a live one keeps its
-- tokens, ts and u, its expiry moved to now + reset — for a string, by
-- one SET of the same text with the new e, or only its TTL when e stays.
local function tb_keep(key, found, e, stale, now, reset, sv)
  if sv and found and reset > 0 and now + reset ~= e then
    redis.call('SET', key, string.match(sv, '^(.*:)') .. int(now + reset), ttl(reset))
  else
    bucket_keep(key, found, e, stale, now, reset)
  end
end


local function decide(key, argv, o, now, dry)
  local rate = tonumber(argv[o + 1])
  local unit = tonumber(argv[o + 2])
  local capacity = tonumber(argv[o + 3]) * unit
  local n = tonumber(argv[o + 4])

  local tokens, ts, same, found, e, stale, sv = tb_read(key, now, rate, unit, argv[o + 2], capacity, argv[o + 6])
  if not tokens then
    return corrupt()
  end

  local lag = ts - now -- > 0 only when the clock went backwards
  local cost = n * unit
  local allowed, retry, reset = 0, 0, 0
  -- n = 0 only looks: always allowed, even by a key in debt.
  if n == 0 or tokens >= cost then
    allowed = 1
    tokens = tokens - cost
  end
  if tokens < capacity then
    reset = lag + cdiv(capacity - tokens, rate)
  end
  if allowed == 0 then
    retry = lag + cdiv(cost - tokens, rate)
  end
  if allowed == 1 and n > 0 then
    if not dry then
      tb_write(key, tokens, ts, argv[o + 2], reset, now)
    end
  else
    -- A denial or a look that found the key keeps it until it is full under
    -- this call's limit (its tokens stay as they were, its expiry moves):
    -- after a limit change the TTL a write set may end before the
    -- retry-after reported here.
    tb_keep(key, found, e, stale, now, reset, sv)
  end
  -- Tokens below 0 are a debt (a settle charged more than the bucket
  -- held): nothing remains.
  local remaining = 0
  if tokens > 0 then
    remaining = fdiv(tokens, unit)
  end
  return {allowed, remaining, retry, reset, 0, now}
end

return run(decide, 6, 5, KEYS, ARGV)
