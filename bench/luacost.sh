#!/usr/bin/env bash
# luacost.sh: how many instructions Redis spends on one decision of each
# script — tollgate's six, and go-redis/redis_rate's for comparison —
# counted by valgrind's callgrind on a redis-server it starts on loopback.
#
# Instruction counts do not depend on what else the machine is doing, so
# unlike decisions/s they compare scripts reliably on a shared, noisy
# machine. The count includes Redis's own work around each EVALSHA (reading
# the pipelined request, writing the reply); that part is the same for
# every script. Needs valgrind, redis-server and redis-benchmark.
#
#   cd bench && ./luacost.sh            # N=20000 decisions per script
#   ONLY='^token_bucket' ./luacost.sh   # the rows whose name matches
set -euo pipefail
cd "$(dirname "$0")"
port=${PORT:-17399}
n=${N:-20000}
lua=../redisstore/lua
dir=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" \
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$dir/valgrind.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done

cli() { redis-cli -p "$port" "$@"; }
# measure NAME SOURCE-FILE KEYS ARGS...: N decisions over 1,000 keys, as
# EVALSHA calls of KEYS keys each (KEYS > 1: a batch, ARGS repeated for
# every key), 16 deep; prints instructions per decision.
measure() {
  local name=$1 src=$2 k=$3; shift 3
  [[ $name =~ ${ONLY:-.} ]] || return 0
  local sha i calls=$(( n / k )) argv=()
  sha=$(cli script load "$(cat "$src")")
  for (( i = 0; i < k; i++ )); do argv+=("k:${name//[^a-z_]/}:__rand_int__"); done
  for (( i = 0; i < k; i++ )); do argv+=("$@"); done
  redis-benchmark -p "$port" -n $(( 5000 / k + 1 )) -P 16 -c 4 -r 1000 -q EVALSHA "$sha" "$k" "${argv[@]}" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  redis-benchmark -p "$port" -n "$calls" -P 16 -c 4 -r 1000 -q EVALSHA "$sha" "$k" "${argv[@]}" >/dev/null
  callgrind_control -d "$pid" >/dev/null 2>&1
  local f ir
  f=$(ls -t "$dir"/cg.* | head -1)
  ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
  printf '| %s | %s |\n' "$name" "$(( ir / (calls * k) ))"
}
script() { cat "$lua/lib.lua"; echo; cat "$lua/$1.lua"; }

rr=$(go list -m -f '{{.Dir}}' github.com/go-redis/redis_rate/v10)
sed -n '/^var allowN = redis.NewScript(`/,/^`)/p' "$rr/lua.go" | sed '1d;$d' >"$dir/redis_rate.lua"
for a in token_bucket gcra fixed_window sliding_window_log sliding_window_counter leaky_bucket; do
  script "$a" >"$dir/$a.lua"
done

echo "| script (1,000/s, burst 1,000; every decision admitted and written) | instructions per decision |"
echo "| --- | ---: |"
# ARGV as redisstore sends them for 1,000 per second, burst 1,000, cost 1, Redis time.
measure token_bucket "$dir/token_bucket.lua" 1 1 1000 1000 1 ''
measure gcra "$dir/gcra.lua" 1 1 1000 1000 1 ''
measure fixed_window "$dir/fixed_window.lua" 1 1000 1000000 1 ''
measure sliding_window_log "$dir/sliding_window_log.lua" 1 1000 1000000 1 ''
measure sliding_window_counter "$dir/sliding_window_counter.lua" 1 1000 1000000 1000 1 ''
measure leaky_bucket "$dir/leaky_bucket.lua" 1 1 1000 1000 1 '' 0
measure "go-redis/redis_rate v10" "$dir/redis_rate.lua" 1 1000 1000 1 1
# The same scripts deciding 64 keys in one call, as WithPipeline batches them.
measure "token_bucket, batch of 64" "$dir/token_bucket.lua" 64 1 1000 1000 1 ''
measure "gcra, batch of 64" "$dir/gcra.lua" 64 1 1000 1000 1 ''
measure "fixed_window, batch of 64" "$dir/fixed_window.lua" 64 1000 1000000 1 ''
measure "sliding_window_log, batch of 64" "$dir/sliding_window_log.lua" 64 1000 1000000 1 ''
measure "sliding_window_counter, batch of 64" "$dir/sliding_window_counter.lua" 64 1000 1000000 1000 1 ''
measure "leaky_bucket, batch of 64" "$dir/leaky_bucket.lua" 64 1 1000 1000 1 '' 0
