-- settle.lua: one atomic settle, the correction of a key's state once a
-- reservation's actual cost is known, for every algorithm.
--
-- KEYS[1]  the key's state, as the algorithm's script keeps it
-- ARGV[1]  the algorithm's short name: tb, gcra, lb, fw, swc or swl
-- ARGV[2]  now in µs, or '' for the Redis server's TIME
-- ARGV[3]  at: the time of the reservation's decision, in µs (its reply's
--          sixth integer)
-- ARGV[4]  d: actual − reserved, already bounded by Go (tollgate.CheckSettle):
--          below 0 a refund of -d, above 0 an extra charge, 0 a look
-- ARGV[5]  bound: Capacity + MaxDebt, the most a charge may take the key to
--          (in tokens or requests)
-- ARGV[6..9] the limit as the algorithm's script gets it, without n and now:
--          tb        unit rate, unit, burst, MaxDebt
--          gcra      unit rate, unit, burst, ''
--          lb        unit rate, unit, burst, max delay µs
--          fw, swl   rate, period µs, '', ''
--          swc       rate, period µs, grain µs, ''
-- Reply    {1, remaining, 0, reset-after µs, 0, now µs}: the key after the
--          correction as a look (n = 0) at now reports it.
--
-- Why it is written this way:
--   * One script for the six algorithms, chosen by ARGV[1]: a settle is far
--     rarer than a decision, and the six corrections are short. Each reads
--     and writes the state with its algorithm's own functions (tb_read and
--     tb_write in token_bucket.lua, and so on) — the same clock step-back
--     rule, the same rescaling after a rate change, the same form — and
--     sets the TTL (and a bucket's expiry) a decision that wrote would
--     set.
--   * Those functions are not in this file: each correction names the
--     file it uses on a line '-- uses <file>: <functions>'. In the script
--     the store puts that file's state functions (all of it between its
--     header and its decide) right after the line (composeSettle in
--     functions.go), so a settle builds only its own algorithm's functions;
--     in the function library they are defined once, ahead of every decide
--     and of this file, and the line stays a comment.
--   * A refund never gives a key more than a full bucket or an empty
--     window; a charge never takes it past bound (a debt of at most
--     MaxDebt; the token bucket's is ARGV[9], as its script gets it). A key
--     already past bound (its limit was lowered) keeps what it owes: a
--     charge never lowers a debt.
--   * A settle that corrects nothing — d = 0, a refund of a key with no
--     state, of a window the key no longer keeps, or of log entries no
--     longer there — is a look (a decision of cost 0): it writes nothing,
--     and sets the TTL as a look does (when it finds the key and it is not
--     full; a key it finds expired, it deletes). A charge of a key with no
--     state, or an expired one, starts one.
--   * A correction that leaves the key full (a refund of everything it
--     spent) leaves it expired: it is deleted, where a decision would set
--     a TTL of a millisecond, so that it decides as no state from now on,
--     under any limit.
--   * The time is one argument (ARGV[2]) like a decision's, so run reads
--     TIME as a decision does, and the reply ends with it as a decision's.
--     Go sends one key a call (run could take a batch; settles come one a
--     request, after it): one key, so one Cluster slot, the hash tag in
--     KEYS[1] as in every script.
--   * The windows find the reservation by at, not by the key's time: a
--     refund goes to the window at fell in, and only while the key keeps
--     it (fixed window: as its window; counter: as its window or the
--     previous one). The log removes entries at exactly at, the newest
--     numbered first, so the entries of one µs stay numbered 0..k-1 and
--     the next added at that µs merge with none.

-- look is the reply once the key's state is known.
local function look(remaining, reset, now)
  return {1, remaining, 0, reset, 0, now}
end

-- keep sets key's TTL after a settle of a window, a log or a TAT: as a
-- decision that wrote when it wrote, else as a look that found the key
-- (found), which keeps a key that is not full until it is. A key full at
-- now (reset 0) has expired: it is deleted, whether the settle left it so
-- or found it so, so that a clock that steps back does not find it again
-- (UNLINK: a log may be long). These states are full at the same instant
-- under any limit; the buckets' expiry is their own (lib.lua's bucket_keep).
local function keep(key, wrote, found, reset)
  if reset > 0 and (wrote or found) then
    expire(key, reset)
  elseif wrote or found then
    redis.call('UNLINK', key)
  end
end

-- tb corrects a token bucket. A debt is tokens below 0, MaxDebt tokens at
-- most.
local function tb(key, argv, o, now, d)
  -- uses token_bucket.lua: tb_read, tb_write, tb_keep
  local rate = tonumber(argv[o + 6])
  local unit = tonumber(argv[o + 7])
  local burst = tonumber(argv[o + 8])
  local capacity = burst * unit

  local tokens, ts, same, found, e, stale, sv = tb_read(key, now, rate, unit, argv[o + 7], capacity, argv[o + 9])
  if not tokens then
    return corrupt()
  end
  if not found and d <= 0 then
    bucket_keep(key, false, nil, stale, now, 0)
    return look(burst, 0, now)
  end

  local lag = ts - now
  if d < 0 then
    tokens = math.min(tokens - d * unit, capacity)
  elseif d > 0 then
    local most = tonumber(argv[o + 9]) * unit -- MaxDebt, in units
    tokens = math.max(tokens - d * unit, math.min(tokens, -most))
  end
  local reset = 0
  if tokens < capacity then
    reset = lag + cdiv(capacity - tokens, rate)
  end
  if d == 0 then
    tb_keep(key, true, e, false, now, reset, sv)
  elseif reset > 0 then
    tb_write(key, tokens, ts, argv[o + 7], reset, now)
  else
    redis.call('DEL', key) -- refunded to full: it expires now
  end
  local remaining = 0
  if tokens > 0 then
    remaining = fdiv(tokens, unit)
  end
  return look(remaining, reset, now)
end

-- lb corrects a leaky bucket, policer or shaper. A charge fills it up to
-- bound requests, and to no more than a read keeps (what leaks in
-- lb_horizon).
local function lb(key, argv, o, now, d, bound)
  -- uses leaky_bucket.lua: lb_horizon, lb_read, lb_write
  local rate = tonumber(argv[o + 6])
  local unit = tonumber(argv[o + 7])
  local burst = tonumber(argv[o + 8])
  local maxdelay = tonumber(argv[o + 9])
  local capacity = burst * unit

  local level, ts, same, found, e, stale = lb_read(key, now, rate, unit, argv[o + 7], capacity, maxdelay)
  if not level then
    return corrupt()
  end
  if not found and d <= 0 then
    bucket_keep(key, false, nil, stale, now, 0)
    return look(burst, 0, now)
  end

  local lag = ts - now
  if d < 0 then
    level = math.max(level + d * unit, 0)
  elseif d > 0 then
    level = math.min(level + d * unit, math.max(level, math.min(bound * unit, rate * lb_horizon)))
  end
  local reset = 0
  if level > 0 then
    reset = lag + cdiv(level, rate)
  end
  if d == 0 then
    bucket_keep(key, true, e, false, now, reset)
  elseif reset > 0 then
    lb_write(key, level, ts, same, argv[o + 7], now + reset)
    expire(key, reset)
  else
    redis.call('DEL', key) -- refunded to empty: it expires now
  end
  return look(fdiv(math.max(capacity - level, 0), unit), reset, now)
end

-- later reports whether the instant a µs and fraction f (of rate parts)
-- lies after b µs and g.
local function later(a, f, b, g)
  return a > b or (a == b and f > g)
end

-- gcra corrects a theoretical arrival time: a refund moves it -d intervals
-- earlier, never before now; a charge d intervals later, never more than
-- bound intervals past now.
local function gcra(key, argv, o, now, d, bound)
  -- uses gcra.lua: gcra_read, gcra_write
  local rate = tonumber(argv[o + 6])
  local unit = tonumber(argv[o + 7])
  local burst = tonumber(argv[o + 8])

  local tat, frac, found = gcra_read(key, now, rate)
  if not tat then
    return corrupt()
  end
  if not found and d <= 0 then
    return look(burst, 0, now)
  end

  -- Intervals are counted in whole µs and fractions, as gcra.lua moves the
  -- TAT: never a product of a µs count that may be far off (a clock that
  -- stepped back) and the rate.
  if d < 0 then
    local step = -d * unit
    local whole = fdiv(step, rate)
    local part = step - whole * rate
    tat = tat - whole
    if frac >= part then
      frac = frac - part
    else
      tat, frac = tat - 1, frac + rate - part
    end
    if tat < now then
      tat, frac = now, 0
    end
  elseif d > 0 then
    local step = d * unit
    local whole = fdiv(step, rate)
    local t, f = tat + whole, frac + step - whole * rate
    if f >= rate then
      t, f = t + 1, f - rate
    end
    local most = bound * unit
    local mw = fdiv(most, rate)
    local mt, mf = now + mw, most - mw * rate
    if later(t, f, mt, mf) then
      if later(tat, frac, mt, mf) then
        t, f = tat, frac -- already past the bound: kept, not lowered
      else
        t, f = mt, mf
      end
    end
    tat, frac = t, f
  end

  local ahead = tat - now
  local reset = ahead
  if frac > 0 then
    reset = ahead + 1
  end
  if d ~= 0 and reset > 0 then
    gcra_write(key, tat, frac, rate, reset)
  else
    keep(key, d ~= 0, true, reset)
  end
  local remaining, used = 0, ahead * rate + frac
  if used < burst * unit then
    remaining = fdiv(burst * unit - used, unit)
  end
  return look(remaining, reset, now)
end

-- fw corrects a fixed window: a refund only the window the reservation
-- counted in, a charge the window a decision at now counts in.
local function fw(key, argv, o, now, at, d, bound)
  -- uses fixed_window.lua: fw_read, fw_write
  local limit = tonumber(argv[o + 6])
  local period = tonumber(argv[o + 7])

  local current = fdiv(now, period)
  local w, c, found = fw_read(key, current)
  if not w then
    return corrupt()
  end
  local wrote = false
  if d < 0 and found and w == fdiv(at, period) then
    c = math.max(c + d, 0)
    wrote = true
  elseif d > 0 then
    if w < current then
      w, c = current, 0
    end
    c = math.min(c + d, math.max(c, bound))
    wrote = true
  end
  if wrote then
    fw_write(key, w, c)
  end

  local window, count = current, 0
  if w >= current then
    window, count = w, c
  end
  local reset = 0
  if count > 0 then
    reset = (window + 1) * period - now
  end
  keep(key, wrote, found, reset)
  return look(math.max(limit - count, 0), reset, now)
end

-- swc corrects a sliding window counter: a refund the window the
-- reservation counted in, while it still weighs (as the current window or
-- the previous one), a charge the window a decision at now counts in.
local function swc(key, argv, o, now, at, d, bound)
  -- uses sliding_window_counter.lua: swc_read, swc_write
  local limit = tonumber(argv[o + 6])
  local period = tonumber(argv[o + 7])
  local grain = tonumber(argv[o + 8])

  local current = fdiv(now, period)
  local w, c, p, found = swc_read(key, current)
  if not w then
    return corrupt()
  end
  local wrote = false
  if d < 0 and found then
    local at_window = fdiv(at, period)
    if w == at_window then
      c, wrote = math.max(c + d, 0), true
    elseif w == at_window + 1 then
      p, wrote = math.max(p + d, 0), true
    end
  elseif d > 0 then
    if w < current - 1 then
      w, c, p = current, 0, 0
    elseif w == current - 1 then
      w, c, p = current, 0, c
    end
    c, wrote = math.min(c + d, math.max(c, bound)), true
  end
  if wrote then
    swc_write(key, w, c, p)
  end

  -- The look at now, rolled as a decision rolls the windows.
  local window, cur, prev = current, 0, 0
  if w >= current then
    window, cur, prev = w, c, p
  elseif w == current - 1 then
    prev = c
  end
  local start = window * period
  local steps = period / grain
  local step = fdiv(math.max(now, start) - start, grain)
  local weighted = prev * (steps - step)
  local reset = 0
  if cur > 0 then
    reset = start + 2 * period - now
  elseif prev > 0 then
    reset = start + period - now
  end
  keep(key, wrote, found, reset)
  return look(fdiv(math.max(limit * steps - weighted - cur * steps, 0), steps), reset, now)
end

-- swl corrects a sliding window log: a refund removes the newest-numbered
-- entries at the reservation's instant, so the entries of one µs stay
-- numbered 0..k-1 for the next to be added; a charge drops what a decision
-- at now drops and adds entries where it would.
local function swl(key, argv, o, now, at, d, bound)
  -- uses sliding_window_log.lua: swl_read, swl_write, swl_remove
  local limit = tonumber(argv[o + 6])
  local period = tonumber(argv[o + 7])

  local wrote = false
  if d < 0 then
    wrote = swl_remove(key, at, -d)
  elseif d > 0 then
    local t, newest, count = swl_read(key, now, period)
    if not t then
      return corrupt()
    end
    swl_write(key, t, newest, math.min(d, bound - count), period)
    wrote = true
  end

  -- The look at now, counted as a decision counts.
  local t, newest, count = swl_read(key, now, period)
  if not t then
    return corrupt()
  end
  local reset = 0
  if count > 0 then
    reset = newest + period - now
  end
  -- A log emptied by a refund is no key at all: nothing to expire.
  keep(key, wrote and newest ~= nil, newest ~= nil, reset)
  return look(math.max(limit - count, 0), reset, now)
end

local function decide(key, argv, o, now)
  local alg = argv[o + 1]
  local at = tonumber(argv[o + 3])
  local d = tonumber(argv[o + 4])
  local bound = tonumber(argv[o + 5])
  if not (at and d and bound) then
    return redis.error_reply('tollgate: settle needs at, d and bound')
  end
  if alg == 'tb' then
    return tb(key, argv, o, now, d)
  elseif alg == 'gcra' then
    return gcra(key, argv, o, now, d, bound)
  elseif alg == 'lb' then
    return lb(key, argv, o, now, d, bound)
  elseif alg == 'fw' then
    return fw(key, argv, o, now, at, d, bound)
  elseif alg == 'swc' then
    return swc(key, argv, o, now, at, d, bound)
  elseif alg == 'swl' then
    return swl(key, argv, o, now, at, d, bound)
  end
  return redis.error_reply('tollgate: settle of an unknown algorithm')
end

return run(decide, 9, 2, KEYS, ARGV)
