-- all.lua: several limits on one key decided together, all or nothing
-- (tollgate.Combiner): n is spent under every limit when each would admit
-- it, else under none.
--
-- KEYS[i]  the state of limit i, as its algorithm's script keeps it; each
--          has the caller's key as its hash tag, so all are in one Cluster
--          slot
-- ARGV[1]  now in µs, or '' for the Redis server's TIME
-- ARGV[2]  n: the cost, the same under every limit
-- ARGV[3..] for each limit, in the order of KEYS: its algorithm's short
--          name (tb, gcra, lb, fw, swc, swl, or cal for a calendar window),
--          then the arguments its own script takes, n among them (its time
--          is not read: ARGV[1] is every limit's)
-- Reply    an array of one reply per limit, each its own script's: {allowed,
--          remaining, retry-after µs, reset-after µs, delay µs, now µs}
--
-- Why it is written this way:
--   * Two passes, at one reading of the clock. The first asks each limit's
--     decide what it would decide, dry: an admission then writes nothing.
--     When every limit would admit, the second decides n under each for
--     real, and each decides exactly as it did dry: its key is its own, and
--     nothing else changed in between. Otherwise no limit spends: one that
--     would deny has written what a denial writes (its expiry, when it must
--     outlive the retry-after) and keeps its reply; one that would admit is
--     asked a look (n = 0) instead, whose reply says what it has left, and
--     which keeps its expiry as any look does. So each limit ends as if it
--     alone had been asked, n or a look, which the reference model states.
--   * The decides are the algorithms' own, each file's decide, collected in
--     the table decides where the store composes this script and the
--     function library (functions.go): a limit decides together exactly as
--     alone, and its state keeps one format.
--   * shapes holds each decide's argument count and where its cost is, as
--     each file's run call and header say; a test in Go checks them.
--   * n = 0 looks at every limit, in one pass.
--   * A decide's error (a key tollgate did not write) fails the call: the
--     set cannot be decided. The first pass has then written nothing but
--     denials' expiries.

local shapes = {
  tb = {6, 4}, lb = {6, 4}, gcra = {5, 4}, fw = {4, 3}, swl = {4, 3}, swc = {5, 4}, cal = {9, 8},
}

-- look asks decide d for a look (n = 0) at key with the arguments of shape
-- s at argv[o + 1 ..].
local function look(d, s, key, argv, o, now)
  local a = {}
  for k = 1, s[1] do
    a[k] = argv[o + k]
  end
  a[s[2]] = '0'
  return d(key, a, 0, now)
end

local function all(keys, argv)
  local n = tonumber(argv[2])
  local fs, ss, offs = {}, {}, {}
  local at = 2
  for i = 1, #keys do
    local name = argv[at + 1]
    local d, s = decides[name], shapes[name]
    if not (d and s) then
      return redis.error_reply('tollgate: no algorithm named ' .. tostring(name))
    end
    fs[i], ss[i], offs[i] = d, s, at + 1
    at = at + 1 + s[1]
  end
  if at ~= #argv or #keys == 0 or not n then
    return redis.error_reply('tollgate: all needs the time, the cost and each key\'s algorithm and arguments')
  end
  local now = clock(argv[1])

  local out, admit = {}, true
  if n > 0 then
    for i = 1, #keys do
      local r = fs[i](keys[i], argv, offs[i], now, true)
      if r.err then
        return r
      end
      out[i] = r
      admit = admit and r[1] == 1
    end
  end
  for i = 1, #keys do
    local r
    if n == 0 or admit then
      r = fs[i](keys[i], argv, offs[i], now)
    elseif out[i][1] == 1 then
      r = look(fs[i], ss[i], keys[i], argv, offs[i], now)
    end
    if r then
      if r.err then
        return r
      end
      out[i] = r
    end
  end
  return out
end

return all(KEYS, ARGV)
