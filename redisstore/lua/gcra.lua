-- gcra.lua: one atomic GCRA (generic cell rate algorithm) decision.
--
-- KEYS[1]  the theoretical arrival time (TAT), a string: µs
-- ARGV[1]  emission interval T in µs: ceil(period / rate)
-- ARGV[2]  burst B; the tolerance is B * T
-- ARGV[3]  n: the cost (0 = report without spending)
-- ARGV[4]  now in µs, or '' for the Redis server's TIME
-- Reply    {allowed 0|1, remaining, retry-after µs, reset-after µs, 0}
--
-- Why it is written this way:
--   * One integer is the whole state: the time at which the key would be
--     back to zero if nothing more arrived. A request of cost n moves it n*T
--     later and is admitted if it then lies within B*T of now. Token bucket
--     semantics in one GET and one SET.
--   * T is rounded up to a whole µs so the TAT stays an integer: the rate
--     may be a few ppm lower than asked, never higher.
--   * A TAT in the past counts as now. A clock that went backwards makes
--     TAT - now larger, so the key gets less, never more.
--   * SET ... PX writes the value and its TTL (the TAT itself) in one
--     command; a denied request writes nothing.
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2]) * interval
local n = tonumber(ARGV[3])
local now = clock(ARGV[4])

local tat = now
local v = redis.call('GET', key)
if v then
  local t = tonumber(v)
  if not t then
    return corrupt()
  end
  if t > now then
    tat = t
  end
end

local nxt = tat + n * interval
local allowed, retry = 0, 0
if nxt - now <= tolerance then
  allowed = 1
  if n > 0 then
    tat = nxt
    redis.call('SET', key, int(tat), 'PX', math.max(1, cdiv(tat - now, 1000)))
  end
else
  retry = nxt - tolerance - now
end
return {allowed, fdiv(math.max(tolerance - (tat - now), 0), interval), retry, tat - now, 0}
