-- sliding_window_log.lua: one atomic sliding-window-log decision.
--
-- KEYS[1]  a sorted set of admitted requests: score = time (µs),
--          member = '<time>:<sequence>'
-- ARGV[1]  limit: requests per period
-- ARGV[2]  period in µs
-- ARGV[3]  n: the cost (0 = report without spending); a request of cost n
--          is n entries
-- ARGV[4]  now in µs, or '' for the Redis server's TIME
-- Reply    {allowed 0|1, remaining, retry-after µs, reset-after µs, 0,
--          now µs}
--
-- Why it is written this way:
--   * Exact: a request is admitted only if the entries in (now - period,
--     now] plus its cost stay within the limit.
--   * Members must be unique or ZADD silently merges two requests made in
--     the same µs. The sequence after the time continues the count of the
--     entries already at that time (ZCOUNT): entries of one µs arrive and
--     leave the window together, so they are always numbered 0..k-1. (The
--     newest member would not do: members of equal score sort as text, and
--     '<t>:9' sorts after '<t>:10'.) No random numbers, no second key.
--   * n = 0 only looks: it is always allowed and writes nothing, not even
--     the removal of expired entries, which it counts past instead (ZCOUNT).
--     A denial writes nothing either. Entries are removed only by an
--     admission, and only those at or before its time - period: the key's
--     time is the newest entry's, so they can never count again. Removing
--     them on a call that admits nothing would forget them too early: the
--     clock may step back to where they count.
--   * A denied request adds nothing, so a key holds at most limit entries,
--     however hard it is hammered.
--   * A clock that went backwards is never rewarded: time for this key is
--     the newest entry's time until the clock passes it.
--   * retry-after is exact: the time at which the oldest entries that stand
--     in the way leave the window. The TTL is the newest entry's time plus
--     the period, when the whole log has expired; every call that counts an
--     entry sets it (a denial or a look only the TTL).
--   * Expiry is invisible: a log whose newest entry has left the window
--     counts nothing under any rate, so it makes no difference whether
--     Redis has deleted it yet (its TTL runs in Redis's time, in whole
--     ms). A look that finds it so deletes it, so that a clock that steps
--     back does not count its entries again; a write replaces it.
--   * The state's read and writes are swl_read, swl_write and swl_remove,
--     the only code that knows the entries' form: settle.lua corrects a log
--     with the same functions.

-- swl_read returns the log key holds, as it stands at now for a period of
-- period µs: the key's time (now, or the newest entry's when that is
-- later: a clock that went backwards), the newest entry's time (nil for no
-- log) and how many entries lie in (time - period, time]. A key tollgate
-- did not write returns nil.
local function swl_read(key, now, period)
  local t, newest = now, nil
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    newest = tonumber(last[2])
    if not newest then
      return nil
    end
    if newest >= now then
      -- New entries will be numbered after this one's: it must be ours.
      -- (Checked only here, where it matters, to keep the usual path cheap.)
      if not string.find(last[1], '^%d+:%d+$') then
        return nil
      end
      t = newest
    end
  end
  -- Count the entries in (t - period, t]. Older ones are dropped only by a
  -- write, which moves the key's time to t for good: until then a clock
  -- back behind t would count them again.
  local count = 0
  if newest and newest > t - period then
    count = redis.call('ZCOUNT', key, '(' .. int(t - period), '+inf')
  end
  return t, newest, count
end

-- swl_write drops the entries of the log key holds (newest: its newest
-- entry's time, or nil) that lie at or before t - period, and adds n
-- entries at t, numbered after those already at t. The caller sets the
-- TTL.
local function swl_write(key, t, newest, n, period)
  if newest and newest <= t - period then
    -- The whole log has left the window: UNLINK frees it off Redis's main
    -- thread, where removing entry by entry would cost as much as adding.
    redis.call('UNLINK', key)
    newest = nil
  elseif newest then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(t - period))
  end
  if n <= 0 then
    return
  end
  local stamp = int(t)
  local seq = 0
  if newest == t then
    seq = redis.call('ZCOUNT', key, stamp, stamp)
  end
  -- ZADD in chunks of up to 500 members: one call per unit would cost
  -- several times more, and unpack must stay well below Lua's C stack
  -- limit (8,000 values). The sequence stays below MaxLogRate, so the
  -- default number-to-string conversion prints it exactly.
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

-- swl_remove removes the n newest-numbered entries at t from the log key
-- holds (all of them when it holds fewer), so that the entries left at t
-- are still numbered 0..k-1 for the next to be added, and reports whether
-- there were any. (settle.lua's refund: a decision removes entries only
-- as they leave the window.)
local function swl_remove(key, t, n)
  local stamp = int(t)
  local m = redis.call('ZCOUNT', key, stamp, stamp)
  if m == 0 then
    return false
  end
  local members = {}
  for i = math.max(m - n, 0), m - 1 do
    members[#members + 1] = stamp .. ':' .. i
  end
  -- At most Capacity members, below MaxLogRate: one call.
  redis.call('ZREM', key, unpack(members))
  return true
end

local function decide(key, argv, o, now, dry)
  local limit = tonumber(argv[o + 1])
  local period = tonumber(argv[o + 2])
  local n = tonumber(argv[o + 3])

  -- Entries older than the window are dropped only by an admission: a call
  -- that admits nothing writes nothing.
  local at, newest, count = swl_read(key, now, period)
  if not at then
    return corrupt()
  end
  local allowed, retry, reset = 0, 0, 0
  if n == 0 then
    allowed = 1
  elseif count + n <= limit then
    allowed = 1
    if not dry then
      swl_write(key, at, newest, n, period)
    end
    count = count + n
    newest = at
  else
    -- The oldest count + n - limit entries in the window stand in the way.
    local e = redis.call('ZRANGEBYSCORE', key, '(' .. int(at - period), '+inf', 'WITHSCORES', 'LIMIT', count + n - limit - 1, 1)
    retry = tonumber(e[2]) + period - now
  end
  if count > 0 then
    reset = newest + period - now
  end
  if allowed == 1 and n > 0 then
    if not dry then
      expire(key, reset)
    end
  elseif newest then
    -- A denial or a look that found the key keeps it until it is full under
    -- this call's limit (its value stays byte for byte as it was): after a
    -- limit change the TTL a write set may end before the retry-after
    -- reported here. A look that finds it full has found it expired (under
    -- any limit, full at the same instant): it deletes it, so that a clock
    -- that steps back does not find it again (UNLINK, as swl_write drops
    -- a whole log). A denial never finds it so.
    if reset > 0 then
      expire(key, reset)
    else
      redis.call('UNLINK', key)
    end
  end
  -- A lowered limit can leave more entries than it: nothing remains, not less.
  return {allowed, math.max(limit - count, 0), retry, reset, 0, now}
end

return run(decide, 4, 4, KEYS, ARGV)
