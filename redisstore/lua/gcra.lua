-- gcra.lua: one atomic GCRA (generic cell rate algorithm) decision.
--
-- KEYS[1]  the theoretical arrival time (TAT), a string: '<µs>' or
--          '<µs>:<fraction>:<fraction units per µs>'
-- ARGV[1]  unit rate: fraction units per µs (rate / gcd(rate, period µs))
-- ARGV[2]  unit: the emission interval in fraction units
--          (period µs / the same gcd)
-- ARGV[3]  burst B; the tolerance is B intervals
-- ARGV[4]  n: the cost (0 = report without spending)
-- ARGV[5]  now in µs, or '' for the Redis server's TIME
-- Reply    {allowed 0|1, remaining, retry-after µs, reset-after µs, 0,
--          now µs}
--
-- Why it is written this way:
--   * One value is the whole state: the time at which the key would be
--     back to full if nothing more arrived. A request of cost n moves it n
--     intervals later and is admitted if it then lies within B intervals of
--     now. Token bucket semantics in one GET and one SET.
--   * Exact at every rate: the TAT is whole µs plus a fraction counted in
--     units of 1/unit-rate µs, in which the interval period/rate is exactly
--     `unit` units (2,000,000/s is 1 unit of half a µs; 3/s is 1,000,000
--     units of a third of a µs). So GCRA decides exactly as token_bucket.lua
--     does as long as the clock does not step back.
--   * Differences from now are compared as (TAT - now) * unit-rate <= room,
--     room being below B * unit <= 2^53 (Go checked it). When the product
--     outgrows 2^53 (a clock that stepped back far) it is no longer exact,
--     but rounding never moves a double across a value it can hold
--     exactly, so the comparison still is; and where it could round down
--     onto the bound, what follows from it is 0 either way. A division
--     would be exact too, and cost a function call more per comparison.
--   * A TAT with no fraction is stored as the plain integer it always was,
--     so a value of either form reads correctly. A fraction stored under
--     another rate is converted to this one rounded up: never more lenient.
--   * A TAT in the past counts as now. A clock that went backwards makes
--     TAT - now larger, so the key gets less, never more.
--   * n = 0 only looks: always allowed, even when the lag of a clock that
--     stepped back puts the TAT beyond the tolerance.
--   * SET ... PX writes the value and its TTL (until the TAT) in one
--     command; a denied request writes nothing. A denial or a look that
--     finds the TAT ahead sets the TTL only (to reset-after, under its own
--     limit), so the key outlives the retry-after it reports.
--   * Expiry is invisible: a TAT at or before now (the instant the key's
--     TTL was set to reach, on the decision's clock) is a full bucket under
--     any rate and burst, and decides as no key, so it makes no difference
--     whether Redis has deleted it yet (its TTL runs in Redis's time, in
--     whole ms). A look that finds it so deletes it, so that a clock that
--     steps back does not find it again; a write replaces it.
--   * The state's read and write are gcra_read and gcra_write, the only
--     code that knows the value's form: settle.lua corrects a TAT with the
--     same two functions.

-- gcra_read returns the TAT key holds, as it stands at now at rate
-- fraction units a µs: whole µs and a fraction below rate, now and 0 for a
-- TAT in the past, and whether the key held one. A key with no TAT is one
-- at now; a key tollgate did not write returns nil.
local function gcra_read(key, now, rate)
  local v = redis.call('GET', key)
  if not v then
    return now, 0, false
  end
  local t, f, u = tonumber(v), 0, rate
  if not t then
    local a, b, c = string.match(v, '^(%d+):(%d+):(%d+)$')
    t, f, u = tonumber(a), tonumber(b), tonumber(c)
    if not (t and f and u) or f >= u then
      return nil
    end
    if u ~= rate then
      f = muldiv(f, rate, u, rate, true)
      if f == rate then
        t, f = t + 1, 0
      end
    end
  end
  if t >= now then
    return t, f, true
  end
  return now, 0, true
end

-- gcra_write stores the TAT tat + frac / rate µs in key, in the shorter
-- form when frac is 0, with a TTL of reset µs (until the TAT) in the same
-- command.
local function gcra_write(key, tat, frac, rate, reset)
  local value = int(tat)
  if frac > 0 then
    value = value .. ':' .. int(frac) .. ':' .. int(rate)
  end
  redis.call('SET', key, value, ttl(reset))
end

local function decide(key, argv, o, now, dry)
  local rate = tonumber(argv[o + 1])
  local unit = tonumber(argv[o + 2])
  local burst = tonumber(argv[o + 3])
  local n = tonumber(argv[o + 4])

  local tat, frac, found = gcra_read(key, now, rate)
  if not tat then
    return corrupt()
  end

  local ahead = tat - now -- whole µs; the TAT is ahead + frac / rate past now
  local room = (burst - n) * unit - frac -- in units: how far ahead it may be
  local allowed, retry = 0, 0
  if n == 0 or ahead * rate <= room then
    allowed = 1
    if n > 0 then
      -- Move the TAT n intervals on, carrying the fraction into whole µs.
      local step = n * unit
      if rate == 1 then
        tat = tat + step
      else
        local whole = fdiv(step, rate)
        local part = step - whole * rate
        tat = tat + whole
        if frac >= rate - part then
          tat, frac = tat + 1, frac - (rate - part)
        else
          frac = frac + part
        end
      end
      ahead = tat - now
    end
  else
    -- The first whole µs at which ahead + frac/rate + n intervals <= B
    -- intervals: ceil of a quotient that may be negative.
    local x = -room
    if x >= 0 then
      retry = ahead + cdiv(x, rate)
    else
      retry = ahead - fdiv(-x, rate)
    end
  end

  local reset = ahead
  if frac > 0 then
    reset = ahead + 1
  end
  if allowed == 1 and n > 0 then
    if not dry then
      gcra_write(key, tat, frac, rate, reset)
    end
  elseif found then
    -- A denial or a look that found the key keeps it until it is full under
    -- this call's limit (its value stays byte for byte as it was): after a
    -- limit change the TTL a write set may end before the retry-after
    -- reported here. A look that finds it full has found it expired (under
    -- any limit, full at the same instant): it deletes it, so that a clock
    -- that steps back does not find it again. A denial never finds it so.
    if reset > 0 then
      expire(key, reset)
    else
      redis.call('DEL', key)
    end
  end
  local remaining, used = 0, ahead * rate + frac
  if used < burst * unit then
    remaining = fdiv(burst * unit - used, unit)
  end
  return {allowed, remaining, retry, reset, 0, now}
end

return run(decide, 5, 5, KEYS, ARGV)
