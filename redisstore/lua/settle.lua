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
--          tb, gcra  unit rate, unit, burst, ''
--          lb        unit rate, unit, burst, max delay µs
--          fw, swl   rate, period µs, '', ''
--          swc       rate, period µs, grain µs, ''
-- Reply    {1, remaining, 0, reset-after µs, 0, now µs}: the key after the
--          correction as a look (n = 0) at now reports it.
--
-- Why it is written this way:
--   * One script for the six algorithms, chosen by ARGV[1]: a settle is far
--     rarer than a decision, and the six corrections are short. Each reads
--     the state exactly as its algorithm's decide does — the same clock
--     step-back rule, the same rescaling after a rate change — corrects it,
--     and writes it back in the same form with the TTL a decision that
--     wrote would set (at least a millisecond: a state that is full again
--     disappears at once, as a decision's would).
--   * A refund never gives a key more than a full bucket or an empty
--     window; a charge never takes it past bound (a debt of at most
--     MaxDebt). A key already past bound (its limit was lowered) keeps what
--     it owes: a charge never lowers a debt.
--   * A settle that corrects nothing — d = 0, a refund of a key with no
--     state, of a window the key no longer keeps, or of log entries no
--     longer there — is a look (a decision of cost 0): it writes nothing,
--     and sets the TTL as a look does (when it finds the key and it is not
--     full). A charge of a key with no state starts one.
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

-- keep sets key's TTL after a settle: as a decision that wrote when it
-- wrote, else as a look that found the key (found), which keeps a key
-- that is not full until it is.
local function keep(key, wrote, found, reset)
  if wrote or (found and reset > 0) then
    expire(key, reset)
  end
end

-- tb corrects a token bucket (see token_bucket.lua for the state). A debt
-- is tokens below 0; bound - burst tokens at most.
local function tb(key, argv, o, now, d, bound)
  local rate = tonumber(argv[o + 6])
  local unit = tonumber(argv[o + 7])
  local burst = tonumber(argv[o + 8])
  local capacity = burst * unit
  local most = (bound - burst) * unit -- MaxDebt, in units

  local tokens, ts, same = capacity, now, false
  local st = redis.call('HMGET', key, 't', 'ts', 'u')
  if st[1] then
    tokens, ts = tonumber(st[1]), tonumber(st[2])
    same = st[3] == argv[o + 7]
    local u = unit
    if not same then
      u = tonumber(st[3])
    end
    if not (tokens and ts and u) then
      return corrupt()
    end
    -- As token_bucket.lua reads them: a debt at most MaxDebt.
    if u ~= unit and tokens >= 0 then
      tokens = muldiv(tokens, unit, u, capacity)
    elseif u ~= unit then
      tokens = -muldiv(-tokens, unit, u, most, true)
    elseif tokens < 0 then
      tokens = math.max(tokens, -most)
    end
    if now > ts then
      tokens = tokens + (now - ts) * rate
      ts = now
    end
    tokens = math.min(tokens, capacity)
  elseif d <= 0 then
    return look(burst, 0, now)
  end

  local lag = ts - now
  if d < 0 then
    tokens = math.min(tokens - d * unit, capacity)
  elseif d > 0 then
    tokens = math.max(tokens - d * unit, math.min(tokens, -most))
  end
  local reset = 0
  if tokens < capacity then
    reset = lag + cdiv(capacity - tokens, rate)
  end
  if d ~= 0 then
    if same then
      redis.call('HSET', key, 't', int(tokens), 'ts', int(ts))
    else
      redis.call('HSET', key, 't', int(tokens), 'ts', int(ts), 'u', argv[o + 7])
    end
  end
  keep(key, d ~= 0, true, reset)
  local remaining = 0
  if tokens > 0 then
    remaining = fdiv(tokens, unit)
  end
  return look(remaining, reset, now)
end

-- lb corrects a leaky bucket, policer or shaper (see leaky_bucket.lua). A
-- charge fills it up to bound requests, and to no more than leaks in 2^47
-- µs.
local function lb(key, argv, o, now, d, bound)
  local rate = tonumber(argv[o + 6])
  local unit = tonumber(argv[o + 7])
  local burst = tonumber(argv[o + 8])
  local maxdelay = tonumber(argv[o + 9])
  local capacity = burst * unit
  -- A read caps the level at what leaks in 2^47 µs, as leaky_bucket.lua's
  -- does, and a charge fills it no further.
  local most = rate * 140737488355328

  local level, ts, same = 0, now, false
  local st = redis.call('HMGET', key, 'l', 'ts', 'u')
  if st[1] then
    level, ts = tonumber(st[1]), tonumber(st[2])
    same = st[3] == argv[o + 7]
    local u = unit
    if not same then
      u = tonumber(st[3])
    end
    if not (level and ts and u) then
      return corrupt()
    end
    if u ~= unit then
      level = muldiv(level, unit, u, capacity + maxdelay * rate, false)
    end
    level = math.min(level, most)
    if now > ts then
      level = math.max(0, level - (now - ts) * rate)
      ts = now
    end
  elseif d <= 0 then
    return look(burst, 0, now)
  end

  local lag = ts - now
  if d < 0 then
    level = math.max(level + d * unit, 0)
  elseif d > 0 then
    level = math.min(level + d * unit, math.max(level, math.min(bound * unit, most)))
  end
  local reset = 0
  if level > 0 then
    reset = lag + cdiv(level, rate)
  end
  if d ~= 0 then
    if same then
      redis.call('HSET', key, 'l', int(level), 'ts', int(ts))
    else
      redis.call('HSET', key, 'l', int(level), 'ts', int(ts), 'u', argv[o + 7])
    end
  end
  keep(key, d ~= 0, true, reset)
  return look(fdiv(math.max(capacity - level, 0), unit), reset, now)
end

-- later reports whether the instant a µs and fraction f (of rate parts)
-- lies after b µs and g.
local function later(a, f, b, g)
  return a > b or (a == b and f > g)
end

-- gcra corrects a theoretical arrival time (see gcra.lua for its form): a
-- refund moves it -d intervals earlier, never before now; a charge d
-- intervals later, never more than bound intervals past now.
local function gcra(key, argv, o, now, d, bound)
  local rate = tonumber(argv[o + 6])
  local unit = tonumber(argv[o + 7])
  local burst = tonumber(argv[o + 8])

  local tat, frac = now, 0
  local v = redis.call('GET', key)
  if v then
    local t, f, u = tonumber(v), 0, rate
    if not t then
      local a, b, c = string.match(v, '^(%d+):(%d+):(%d+)$')
      t, f, u = tonumber(a), tonumber(b), tonumber(c)
      if not (t and f and u) or f >= u then
        return corrupt()
      end
      if u ~= rate then
        f = muldiv(f, rate, u, rate, true)
        if f == rate then
          t, f = t + 1, 0
        end
      end
    end
    if t >= now then
      tat, frac = t, f
    end
  elseif d <= 0 then
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
  if d ~= 0 then
    local value = int(tat)
    if frac > 0 then
      value = value .. ':' .. int(frac) .. ':' .. int(rate)
    end
    redis.call('SET', key, value, 'PX', math.max(1, cdiv(reset, 1000)))
  else
    keep(key, false, true, reset)
  end
  local remaining, used = 0, ahead * rate + frac
  if used < burst * unit then
    remaining = fdiv(burst * unit - used, unit)
  end
  return look(remaining, reset, now)
end

-- fw corrects a fixed window (see fixed_window.lua): a refund only the
-- window the reservation counted in, a charge the window a decision at now
-- counts in.
local function fw(key, argv, o, now, at, d, bound)
  local limit = tonumber(argv[o + 6])
  local period = tonumber(argv[o + 7])

  local current = fdiv(now, period)
  local w, c
  local st = redis.call('HMGET', key, 'w', 'c')
  if st[1] then
    w, c = tonumber(st[1]), tonumber(st[2])
    if not (w and c) then
      return corrupt()
    end
  end
  local wrote = false
  if d < 0 and w and w == fdiv(at, period) then
    c = math.max(c + d, 0)
    wrote = true
  elseif d > 0 then
    if not w or w < current then
      w, c = current, 0
    end
    c = math.min(c + d, math.max(c, bound))
    wrote = true
  end
  if wrote then
    redis.call('HSET', key, 'w', int(w), 'c', int(c))
  end

  local window, count = current, 0
  if w and w >= current then
    window, count = w, c
  end
  local reset = 0
  if count > 0 then
    reset = (window + 1) * period - now
  end
  keep(key, wrote, w ~= nil, reset)
  return look(math.max(limit - count, 0), reset, now)
end

-- swc corrects a sliding window counter (see sliding_window_counter.lua): a
-- refund the window the reservation counted in, while it still weighs (as
-- the current window or the previous one), a charge the window a decision
-- at now counts in.
local function swc(key, argv, o, now, at, d, bound)
  local limit = tonumber(argv[o + 6])
  local period = tonumber(argv[o + 7])
  local grain = tonumber(argv[o + 8])

  local current = fdiv(now, period)
  local w, c, p
  local st = redis.call('HMGET', key, 'w', 'c', 'p')
  if st[1] then
    w, c, p = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
    if not (w and c and p) then
      return corrupt()
    end
  end
  local wrote = false
  if d < 0 and w then
    local at_window = fdiv(at, period)
    if w == at_window then
      c, wrote = math.max(c + d, 0), true
    elseif w == at_window + 1 then
      p, wrote = math.max(p + d, 0), true
    end
  elseif d > 0 then
    if not w or w < current - 1 then
      w, c, p = current, 0, 0
    elseif w == current - 1 then
      w, c, p = current, 0, c
    end
    c, wrote = math.min(c + d, math.max(c, bound)), true
  end
  if wrote then
    redis.call('HSET', key, 'w', int(w), 'c', int(c), 'p', int(p))
  end

  -- The look at now, rolled as a decision rolls the windows.
  local window, cur, prev = current, 0, 0
  if w and w >= current then
    window, cur, prev = w, c, p
  elseif w and w == current - 1 then
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
  keep(key, wrote, w ~= nil, reset)
  return look(fdiv(math.max(limit * steps - weighted - cur * steps, 0), steps), reset, now)
end

-- logadd adds n entries at stamp to a log, numbered from seq on, in ZADD
-- calls of up to 500 members as sliding_window_log.lua adds them.
local function logadd(key, stamp, seq, n)
  local prefix, args, k = stamp .. ':', {}, 0
  for i = seq, seq + n - 1 do
    args[k + 1] = stamp
    args[k + 2] = prefix .. i
    k = k + 2
    if k == 1000 or i == seq + n - 1 then
      redis.call('ZADD', key, unpack(args, 1, k))
      k = 0
    end
  end
end

-- swl corrects a sliding window log (see sliding_window_log.lua): a refund
-- removes the newest-numbered entries at the reservation's instant, so the
-- entries of one µs stay numbered 0..k-1 for the next to be added; a charge
-- drops what a decision at now drops and adds entries where it would.
local function swl(key, argv, o, now, at, d, bound)
  local limit = tonumber(argv[o + 6])
  local period = tonumber(argv[o + 7])

  local wrote = false
  if d < 0 then
    local stamp = int(at)
    local m = redis.call('ZCOUNT', key, stamp, stamp)
    if m > 0 then
      local members = {}
      for i = m + math.max(d, -m), m - 1 do
        members[#members + 1] = stamp .. ':' .. i
      end
      -- At most Capacity members, below MaxLogRate: one call.
      redis.call('ZREM', key, unpack(members))
      wrote = true
    end
  elseif d > 0 then
    local t, newest = now, nil
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if last[2] then
      newest = tonumber(last[2])
      if not newest then
        return corrupt()
      end
      if newest >= now then
        if not string.find(last[1], '^%d+:%d+$') then
          return corrupt()
        end
        t = newest
      end
    end
    if newest and newest <= t - period then
      redis.call('UNLINK', key)
      newest = nil
    elseif newest then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', int(t - period))
    end
    local count = 0
    if newest then
      count = redis.call('ZCARD', key)
    end
    local add = math.min(d, bound - count)
    if add > 0 then
      local seq = 0
      if newest == t then
        seq = redis.call('ZCOUNT', key, int(t), int(t))
      end
      logadd(key, int(t), seq, add)
    end
    wrote = true
  end

  -- The look at now, counted as a decision counts.
  local t, newest, count = now, nil, 0
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    newest = tonumber(last[2])
    if not newest then
      return corrupt()
    end
    t = math.max(now, newest)
    if newest > t - period then
      count = redis.call('ZCOUNT', key, '(' .. int(t - period), '+inf')
    end
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
    return tb(key, argv, o, now, d, bound)
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
