-- lib.lua: helpers every tollgate script starts with (the store prepends
-- this file to each algorithm's file; the pair is one script, one SHA). On
-- Redis 7, Load also loads this file once, followed by every algorithm's,
-- as one function library (see functions.go): the same code, with its
-- helpers built once instead of on every call.
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

-- cdiv returns ceil(a / b) exactly, for 0 <= a < 2^53 and b >= 1. The
-- ceiling of the rounded quotient is the true one or one below it (the
-- quotient rounds to no integer beyond the integers either side of it,
-- each a double), so one correction upwards is enough; it never forms
-- a + b - 1, which may pass 2^53 and round (a bucket of nearly 2^53 units,
-- a TTL at the far end of time). It does not call fdiv: every decision
-- divides up twice or more, and a Lua call costs Redis more than the
-- division does (bench/luacost.sh).
local function cdiv(a, b)
  local q = math.ceil(a / b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- int formats an integer-valued number with all its digits. '%d' converts
-- to a C long first, 64 bits wherever Redis runs (LP64), and is cheaper than
-- formatting a double with '%.0f' (about 2,000 instructions a call less).
local function int(x)
  return string.format('%d', x)
end

-- server is the time of the decision being made, in µs, when it is the
-- Redis server's, else false: clock and run set it before each decision,
-- for expire.
local server = false

-- clock returns now in µs: the caller's, when the store was given a clock
-- (tests, simulations), else the Redis server's. Server time is the
-- default so that replicas with skewed clocks agree; reading it before a
-- write is safe because Redis (5+) replicates a script's effects, not the
-- script.
local function clock(arg)
  if arg ~= '' then
    server = false
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  server = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return server
end

-- ttl returns the option and value of SET that make a key expire us µs
-- after now, once its state is back to full, never before. On the
-- server's clock that is the instant itself, rounded up to a ms (PXAT):
-- Redis counts a relative TTL from the ms its script started in, which may
-- be before the ms of the script's TIME, and would delete the key up to a
-- ms early (a TTL of 1 ms at once). On a caller's clock, which Redis does
-- not know, it is the TTL, rounded up to whole ms (PX, at least one).
local function ttl(us)
  if server then
    return 'PXAT', int(cdiv(server + us, 1000))
  end
  return 'PX', math.max(1, cdiv(us, 1000))
end

-- expire sets a key's expiry as ttl says.
local function expire(key, us)
  if server then
    redis.call('PEXPIREAT', key, int(cdiv(server + us, 1000)))
  else
    redis.call('PEXPIRE', key, math.max(1, cdiv(us, 1000)))
  end
end

-- bucket_keep is what a bucket (token or leaky) does after a call that wrote
-- nothing: the live bucket key (found; e its stored expiry) keeps its state
-- until reset µs after now, its TTL and its e moved to match; an expired
-- bucket (stale) is deleted, so that a clock that steps back does not find
-- it again; one at rest (reset 0: a token bucket full, a leaky bucket
-- empty) is left as it is.
local function bucket_keep(key, found, e, stale, now, reset)
  if found and reset > 0 then
    if now + reset ~= e then
      redis.call('HSET', key, 'e', int(now + reset))
    end
    expire(key, reset)
  elseif stale then
    redis.call('DEL', key)
  end
end

-- corrupt stops the script when a key holds something tollgate did not write.
-- The key's name stays out of the message: it holds client addresses and
-- API keys, and errors end up in logs.
local function corrupt()
  return redis.error_reply('tollgate: unexpected state (delete the key to start afresh)')
end

-- muldiv returns floor(v * to / from) exactly (ceil when up is true), or
-- limit when that is larger, for 0 <= v, to < 2^53, 1 <= from < 2^53 and
-- limit <= 2^53. A double is not enough: 498 / 1e6 * 5e5 is
-- 248.99999999999997. The product is kept in 24-bit limbs and divided one
-- bit at a time, the remainder never reaching 2^53. It runs only when a
-- key's stored unit differs from its limit's (the rate changed), so its
-- cost, a few thousand instructions, is off the hot path.
local function muldiv(v, to, from, limit, up)
  local b = 16777216 -- 2^24: a limb; limb products stay below 2^48
  local function split(x)
    local l0 = x % b
    x = (x - l0) / b
    local l1 = x % b
    return {l0, l1, (x - l1) / b}
  end
  local a, c, p = split(v), split(to), {0, 0, 0, 0, 0, 0}
  for i = 1, 3 do
    for j = 1, 3 do
      p[i + j - 1] = p[i + j - 1] + a[i] * c[j]
    end
  end
  local carry = 0
  for k = 1, 6 do
    local x = p[k] + carry
    p[k] = x % b
    carry = (x - p[k]) / b
  end
  local q, r = 0, 0
  for k = 6, 1, -1 do
    local limb = p[k]
    for bit = 23, 0, -1 do
      local pow = 2 ^ bit
      local d = math.floor(limb / pow) % 2
      -- r = 2r + d, less from when that reaches it; never above from.
      local gap = from - r - d
      if r >= gap then
        r = r - gap
        q = q + q + 1
      else
        r = r + r + d
        q = q + q
      end
      if q >= limit then
        return limit
      end
    end
  end
  if up and r > 0 then
    q = q + 1
  end
  return math.min(q, limit)
end

-- run makes the decisions of one call and returns the reply. Each
-- algorithm's file ends with run(decide, nargs, nowarg, KEYS, ARGV) (as a
-- Redis 7 function, the same with the function's keys and arguments):
-- decide(key, argv, o, now) makes one decision on key with its arguments in
-- argv[o + 1 .. o + nargs], the one at nowarg being the time, already read
-- by run, and returns its reply, now last. (A fifth argument, dry, is
-- true only in all.lua's first pass, which asks every limit of a set what
-- it would decide before any spends: an admission then writes nothing,
-- neither the state nor its expiry; a denial or a look writes what it
-- always does.)
--
-- With one key (keys[1], argv[1 .. nargs]) the reply is that decision's,
-- and an error stops the call as any script error does.
--
-- Each decision's reply ends with now, the time it was made at in µs: a
-- reservation (Store.ReserveN) needs it to settle later. Every reply has
-- it, so that no argument says whether it is wanted (an argument costs
-- Redis about 1,000 instructions, the integer in the reply less), and
-- decide puts it in the table it builds: appending it here, to a table
-- built with five elements, made Redis grow the table, and cost twice as
-- much (bench/luacost.sh). With more, the call
-- is a batch: keys[i] is decided with argv[(i-1)*nargs + 1 .. i*nargs], in
-- order, and the reply is an array holding each decision's reply or its
-- error, so one bad decision fails no other. Why a batch:
--   * A script call costs Redis about 13,000 instructions before it does
--     anything (reading the command, the KEYS and ARGV tables, the call
--     into Lua, the reply), each argument about 1,000 more, and TIME with
--     its conversion 10,000; a batch pays the call and the clock once.
--   * Each decision is still atomic: the whole batch is, Redis running one
--     script at a time. Decisions on one key see each other's writes, in
--     the order given.
--   * The server's time is read once for the batch: its decisions are made
--     within microseconds of each other, in one script, and so at one
--     instant as far as any client can tell.
--   * A decision's error (a key tollgate did not write, a command Redis
--     refused) is caught with pcall and becomes that decision's reply;
--     what it wrote before failing stays, as it would had it run alone.
local function run(decide, nargs, nowarg, keys, argv)
  if #keys == 1 then
    return decide(keys[1], argv, 0, clock(argv[nowarg]))
  end
  if #argv ~= #keys * nargs then
    return redis.error_reply('tollgate: a batch needs ' .. nargs .. ' arguments a key')
  end
  local out, t = {}, nil
  for i = 1, #keys do
    local o = (i - 1) * nargs
    local now = argv[o + nowarg]
    if now ~= '' then
      now = tonumber(now)
      server = false
    else
      if not t then
        t = clock('')
      end
      now = t
      server = t
    end
    local ok, r = pcall(decide, keys[i], argv, o, now)
    if not ok and type(r) ~= 'table' then
      r = redis.error_reply(tostring(r))
    end
    out[i] = r
  end
  return out
end
