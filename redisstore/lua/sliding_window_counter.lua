-- sliding_window_counter.lua: one atomic sliding-window-counter decision.
--
-- KEYS[1]  a hash: w = current window index, c = its count,
--          p = the previous window's count
-- ARGV[1]  limit: requests per period
-- ARGV[2]  period in µs
-- ARGV[3]  grain in µs: the step at which the previous window is weighed
-- ARGV[4]  n: the cost (0 = report without spending)
-- ARGV[5]  now in µs, or '' for the Redis server's TIME
-- Reply    {allowed 0|1, remaining, retry-after µs, reset-after µs, 0,
--          now µs}
--
-- Why it is written this way:
--   * The estimate of the sliding window is the current count plus the
--     previous window's count weighed by the share of it the sliding window
--     still covers: prev * (steps - step) / steps. Compared after
--     multiplying by steps, so the check is exact in integers:
--     prev * (steps - step) + (cur + n) * steps <= limit * steps.
--     Go checked that limit * steps stays below 2^51.
--   * Both counts live in one hash with the window index: one key, and a
--     clock that went backwards stays in the newer window (never rewarded).
--   * retry-after is computed, not guessed: the first instant at which the
--     previous window weighs little enough, or, if the current window
--     alone is too full, the instant in the next window at which this
--     window's count has faded enough.
--   * A denied request writes nothing; the TTL runs to the end of the next
--     window, when this window's count stops weighing (set by every call
--     that finds the key, a denial or a look only the TTL).
--   * n = 0 only looks: it is always allowed, even when a lowered limit
--     leaves the counts above it.
--   * Expiry is invisible: counts that no longer weigh (the current one two
--     windows on, the previous one a window on) decide as none under any
--     rate, so it makes no difference whether Redis has deleted the key
--     yet (its TTL runs in Redis's time, in whole ms). A look that finds
--     them so deletes the key, so that a clock that steps back does not
--     find them again; a write replaces them.
--   * The state's read and write are swc_read and swc_write, the only code
--     that knows the hash's fields: settle.lua corrects the counts with the
--     same two functions.

-- swc_read returns the windows key holds: the current window's index and
-- count, the previous window's count, and whether the key held them. A key
-- with none holds window current, empty; a key tollgate did not write
-- returns nil.
local function swc_read(key, current)
  local st = redis.call('HMGET', key, 'w', 'c', 'p')
  if not st[1] then
    return current, 0, 0, false
  end
  local w, c, p = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  if not (w and c and p) then
    return nil
  end
  return w, c, p, true
end

-- swc_write stores window w with count c, and the previous window's count
-- p, in key. The caller sets the TTL.
local function swc_write(key, w, c, p)
  redis.call('HSET', key, 'w', int(w), 'c', int(c), 'p', int(p))
end

local function decide(key, argv, o, now, dry)
  local limit = tonumber(argv[o + 1])
  local period = tonumber(argv[o + 2])
  local grain = tonumber(argv[o + 3])
  local n = tonumber(argv[o + 4])

  local window, cur, prev = fdiv(now, period), 0, 0
  local w, c, p, found = swc_read(key, window)
  if not w then
    return corrupt()
  end
  if w >= window then
    window, cur, prev = w, c, p
  elseif w == window - 1 then
    prev = c
  end

  local start = window * period
  local steps = period / grain
  local step = fdiv(math.max(now, start) - start, grain)
  local weighted = prev * (steps - step)
  local allowed, retry, reset = 0, 0, 0
  if n == 0 or weighted + (cur + n) * steps <= limit * steps then
    allowed = 1
    if n > 0 then
      cur = cur + n
      if not dry then
        swc_write(key, window, cur, prev)
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
      local k = 0
      if cur > 0 then
        -- Below 0 when this window's count alone leaves room at the next
        -- window's start: the request fits there.
        k = math.max(steps - fdiv((limit - n) * steps, cur), 0)
      end
      at = start + period + k * grain
    end
    retry = at - now
  end
  if cur > 0 then
    reset = start + 2 * period - now
  elseif prev > 0 then
    reset = start + period - now
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
  return {allowed, fdiv(math.max(limit * steps - weighted - cur * steps, 0), steps), retry, reset, 0, now}
end

return run(decide, 5, 5, KEYS, ARGV)
