-- fixed_window.lua: one atomic fixed-window decision.
--
-- KEYS[1]  the window, a hash: w = window index (now / period), c = count
-- ARGV[1]  limit: requests per window
-- ARGV[2]  period in µs
-- ARGV[3]  n: the cost (0 = report without spending)
-- ARGV[4]  now in µs, or '' for the Redis server's TIME
-- Reply    {allowed 0|1, remaining, retry-after µs, reset-after µs, 0,
--          now µs}
--
-- Why it is written this way:
--   * The classic INCR + EXPIRE in two calls leaves a key without a TTL
--     when the client dies between them; here the count and its TTL are
--     written in one script.
--   * Windows are aligned to the Unix epoch, so every replica agrees where
--     a window starts (a per-day window resets at midnight UTC).
--   * The window index is stored beside the count rather than put in the
--     key's name: a clock that went backwards into an earlier window finds
--     a newer index and stays in that window instead of starting a fresh,
--     empty one — it is never rewarded.
--   * A denied request writes nothing; the TTL runs to the window's end,
--     set by every call that finds a count in it (a denial or a look only
--     the TTL: the key must outlive the retry-after it reports).
--   * n = 0 only looks: it is always allowed (a lowered limit can leave the
--     count above it, and looking must not fail for that).
--   * Expiry is invisible: a count in a window that has ended decides as no
--     count under any rate, so it makes no difference whether Redis has
--     deleted the key yet (its TTL runs in Redis's time, in whole ms). A
--     look that finds it so deletes it, so that a clock that steps back
--     into that window does not find it again; a write replaces it.
--   * The state's read and write are fw_read and fw_write, the only code
--     that knows the hash's fields: settle.lua corrects a window with the
--     same two functions.

-- fw_read returns the window key holds: its index and count, and whether
-- the key held one. A key with none holds window current, empty; a key
-- tollgate did not write returns nil.
local function fw_read(key, current)
  local st = redis.call('HMGET', key, 'w', 'c')
  if not st[1] then
    return current, 0, false
  end
  local w, c = tonumber(st[1]), tonumber(st[2])
  if not (w and c) then
    return nil
  end
  return w, c, true
end

-- fw_write stores window w with count c in key. The caller sets the TTL.
local function fw_write(key, w, c)
  redis.call('HSET', key, 'w', int(w), 'c', int(c))
end

local function decide(key, argv, o, now, dry)
  local limit = tonumber(argv[o + 1])
  local period = tonumber(argv[o + 2])
  local n = tonumber(argv[o + 3])

  local window, count = fdiv(now, period), 0
  local w, c, found = fw_read(key, window)
  if not w then
    return corrupt()
  end
  if w >= window then
    window, count = w, c
  end

  local finish = (window + 1) * period
  local allowed, retry, reset = 0, 0, 0
  if n == 0 or count + n <= limit then
    allowed = 1
    if n > 0 then
      count = count + n
      if not dry then
        fw_write(key, window, count)
      end
    end
  else
    retry = finish - now
  end
  if count > 0 then
    reset = finish - now
  end
  if allowed == 1 and n > 0 then
    if not dry then
      expire(key, reset)
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
  -- A lowered limit can leave count above it: nothing remains, not less.
  return {allowed, math.max(limit - count, 0), retry, reset, 0, now}
end

return run(decide, 4, 4, KEYS, ARGV)
