-- calendar.lua: one atomic decision of a fixed window or a sliding window
-- counter whose windows are calendar days, weeks or months of a time zone
-- (tollgate.Limit.Calendar).
--
-- KEYS[1]  a hash: w = the window's start (µs), e = its end, c = its count;
--          the sliding counter also f = the next window's end and p = the
--          previous window's count
-- ARGV[1]  'fw' (fixed window) or 'swc' (sliding window counter)
-- ARGV[2]  limit: requests per window
-- ARGV[3..7]  e0 < e1 < e2 < e3 < e4: the edges of four consecutive
--          windows, in µs since the epoch, that Go found around its own
--          clock (which lies in [e1, e2))
-- ARGV[8]  n: the cost (0 = report without spending)
-- ARGV[9]  now in µs, or '' for the Redis server's TIME
-- Reply    {allowed 0|1, remaining, retry-after µs, reset-after µs, 0,
--          now µs}, or an error when now is outside [e0, e3)
--
-- Why it is written this way:
--   * Lua in Redis has no time zone database, and a calendar window's
--     edges depend on one (a day across a DST change is 23 or 25 hours, a
--     month 28 to 31 days). Go computes them, from its own clock, and the
--     script picks the window that holds its now: [e0, e1), [e1, e2) or
--     [e2, e3), the next one ending at the edge after. So the decision
--     keeps the server's clock, as every script does, and stays one
--     atomic round trip; the application's clock only has to be within a
--     window of the server's. When it is not, now falls outside the edges
--     and the script refuses to decide (an error the store reports),
--     rather than decide in a window it does not know.
--   * The window is named by its start and stored with its end (and the
--     sliding counter's with the next window's end), so that a clock that
--     stepped back stays in the newer window with that window's own edges
--     (never rewarded), whatever edges this call was given; and a stored
--     window whose end is this window's start is the previous one.
--   * The sliding counter weighs the previous window's count by the share
--     of the current window still to come, in whole seconds (windows start
--     and end on whole seconds): prev * (steps - step) / steps, steps the
--     window's seconds, step those elapsed. Compared after multiplying by
--     steps, exact in integers; Go checked that limit * steps stays below
--     2^51 for the longest window of the unit. retry-after is the first
--     second at which the request fits, in this window or in the next,
--     whose own length weighs this window's count then.
--   * Everything else is as in fixed_window.lua and
--     sliding_window_counter.lua: a denial writes nothing but the TTL; a
--     look is always allowed; the TTL runs to when the counts stop
--     weighing (the window's end, or the next window's for the sliding
--     counter), set by every call that finds the key; a look that finds
--     them so deletes the key; expiry is invisible.
--   * It is a script of its own, not a branch of the epoch windows' files:
--     their calls keep their few arguments (each costs Redis about 1,000
--     instructions), and a calendar decision is sent alone, not in a
--     pipeline's batch.

-- cal_read returns what key holds: the window's start, end, next end,
-- count and previous count, and whether the key held them; nil for a key
-- tollgate did not write.
local function cal_read(key)
  local st = redis.call('HMGET', key, 'w', 'e', 'f', 'c', 'p')
  if not st[1] then
    return 0, 0, 0, 0, 0, false
  end
  local w, e, f, c, p = tonumber(st[1]), tonumber(st[2]), tonumber(st[3] or '0'), tonumber(st[4]), tonumber(st[5] or '0')
  if not (w and e and f and c and p) then
    return nil
  end
  return w, e, f, c, p, true
end

local function decide(key, argv, o, now, dry)
  local alg = argv[o + 1]
  local limit = tonumber(argv[o + 2])
  local edges = {}
  for i = 1, 5 do
    edges[i] = tonumber(argv[o + 2 + i])
  end
  local n = tonumber(argv[o + 8])

  local start, finish, after
  for i = 1, 3 do
    if edges[i] <= now and now < edges[i + 1] then
      start, finish, after = edges[i], edges[i + 1], edges[i + 2]
    end
  end
  if not start then
    return redis.error_reply('tollgate: the time ' .. int(now) .. ' is outside the calendar windows given (' ..
      int(edges[1]) .. ' to ' .. int(edges[4]) .. '): the clocks differ by more than a window')
  end

  local w, e, f, c, p, found = cal_read(key)
  if not w then
    return corrupt()
  end
  local cur, prev = 0, 0
  if found then
    if w >= start then -- this window, or a newer one: the clock stepped back
      start, finish, after, cur, prev = w, e, f, c, p
    elseif e == start then
      prev = c
    end
  end

  local allowed, retry, reset, remaining = 0, 0, 0, 0
  if alg == 'fw' then
    prev = 0
    if n == 0 or cur + n <= limit then
      allowed = 1
      if n > 0 then
        cur = cur + n
        if not dry then
          redis.call('HSET', key, 'w', int(start), 'e', int(finish), 'c', int(cur))
        end
      end
    else
      retry = finish - now
    end
    if cur > 0 then
      reset = finish - now
    end
    remaining = math.max(limit - cur, 0)
  else
    local grain = 1000000
    local steps = (finish - start) / grain
    local step = fdiv(math.max(now, start) - start, grain)
    local weighted = prev * (steps - step)
    if n == 0 or weighted + (cur + n) * steps <= limit * steps then
      allowed = 1
      if n > 0 then
        cur = cur + n
        if not dry then
          redis.call('HSET', key, 'w', int(start), 'e', int(finish), 'f', int(after), 'c', int(cur), 'p', int(prev))
        end
      end
    else
      local at = 0
      if cur + n <= limit then
        local k = steps - fdiv((limit - cur - n) * steps, prev)
        if k < steps then
          at = start + k * grain
        end
      end
      if at == 0 then
        local nsteps = (after - finish) / grain
        local k = 0
        if cur > 0 then
          k = math.max(nsteps - fdiv((limit - n) * nsteps, cur), 0)
        end
        at = finish + k * grain
      end
      retry = at - now
    end
    if cur > 0 then
      reset = after - now
    elseif prev > 0 then
      reset = finish - now
    end
    remaining = fdiv(math.max(limit * steps - weighted - cur * steps, 0), steps)
  end
  if allowed == 1 and n > 0 then
    if not dry then
      expire(key, reset)
    end
  elseif found then
    if reset > 0 then
      expire(key, reset)
    else
      redis.call('DEL', key)
    end
  end
  return {allowed, remaining, retry, reset, 0, now}
end

return run(decide, 9, 9, KEYS, ARGV)
