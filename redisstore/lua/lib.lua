-- lib.lua: helpers every tollgate script starts with (the store prepends
-- this file to each algorithm's file; the pair is one script, one SHA).
--
-- Redis runs Lua 5.1: every number is a double, exact for integers below
-- 2^53 and for nothing else. tollgate keeps every quantity an integer below
-- that bound (Limit.Validate guarantees it), and these helpers keep it so:
--   * division is floor/ceil with a correction step, because a/b rounded
--     to the nearest double can land on the integer just above the true
--     quotient;
--   * numbers go back to Redis through int(), never tostring(): tostring
--     keeps 14 significant digits, and a time in µs has 16.
-- What a script costs Redis was measured in instructions (valgrind
-- --tool=callgrind on redis-server, which counts the same on a busy machine
-- as on an idle one); the choices below that say "cheaper" were measured so.

-- fdiv returns floor(a / b) exactly, for 0 <= a < 2^53 and b >= 1.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- cdiv returns ceil(a / b) exactly, for 0 <= a and b >= 1.
local function cdiv(a, b)
  return fdiv(a + b - 1, b)
end

-- int formats an integer-valued number with all its digits. '%d' converts
-- to a C long first, 64 bits wherever Redis runs (LP64), and is cheaper than
-- formatting a double with '%.0f' (about 2,000 instructions a call less).
local function int(x)
  return string.format('%d', x)
end

-- clock returns now in µs: the caller's, when the store was given a clock
-- (tests, simulations), else the Redis server's. Server time is the
-- default so that replicas with skewed clocks agree; reading it before a
-- write is safe because Redis (5+) replicates a script's effects, not the
-- script.
local function clock(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- expire sets a key's TTL to the given µs, rounded up to whole ms (at least
-- one): a key disappears once its state is back to full, never before.
local function expire(key, us)
  redis.call('PEXPIRE', key, math.max(1, cdiv(us, 1000)))
end

-- corrupt stops the script when a key holds something tollgate did not write.
-- The key's name stays out of the message: it holds client addresses and
-- API keys, and errors end up in logs.
local function corrupt()
  return redis.error_reply('tollgate: unexpected state (delete the key to start afresh)')
end
