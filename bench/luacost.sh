#!/usr/bin/env bash
# luacost.sh: how many instructions Redis spends on one decision of each
# script — tollgate's six and its settle, and go-redis/redis_rate's for
# comparison —
# counted by valgrind's callgrind on a redis-server it starts on loopback.
#
# Instruction counts do not depend on what else the machine is doing, so
# unlike decisions/s they compare scripts reliably on a shared, noisy
# machine. The count includes Redis's own work around each EVALSHA (reading
# the pipelined request, writing the reply); that part is the same for
# every script. Needs valgrind, redis-server and redis-benchmark.
#
# The sliding window log's rows are the exception: its decisions read the
# Redis server's time, and what a key's log holds when it is decided again
# (entries still in the window, or none, the key expired) depends on how
# fast the server under valgrind gets through the run. Two runs of the same
# code differ by up to a tenth there; compare its rows over several runs.
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
# measure NAME SCRIPT-FILE|fn:FUNCTION KEYS ARGS...: N decisions over
# 1,000 keys, as EVALSHA calls of the script (or FCALL of the library's
# function) with KEYS keys each (KEYS > 1: a batch, ARGS repeated for every
# key), 16 deep; prints instructions per decision.
measure() {
  local name=$1 src=$2 k=$3; shift 3
  [[ $name =~ ${ONLY:-.} ]] || return 0
  local call i calls=$(( n / k )) argv=()
  if [[ $src == fn:* ]]; then
    call=(FCALL "${src#fn:}")
  else
    call=(EVALSHA "$(cli script load "$(cat "$src")")")
  fi
  for (( i = 0; i < k; i++ )); do argv+=("k:${name//[^a-z_]/}:__rand_int__"); done
  for (( i = 0; i < k; i++ )); do argv+=("$@"); done
  redis-benchmark -p "$port" -n $(( 5000 / k + 1 )) -P 16 -c 4 -r 1000 -q "${call[@]}" "$k" "${argv[@]}" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  redis-benchmark -p "$port" -n "$calls" -P 16 -c 4 -r 1000 -q "${call[@]}" "$k" "${argv[@]}" >/dev/null
  callgrind_control -d "$pid" >/dev/null 2>&1
  local f ir
  f=$(ls -t "$dir"/cg.* | head -1)
  ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
  printf '| %s | %s |\n' "$name" "$(( ir / (calls * k) ))"
}
script() { cat "$lua/lib.lua"; echo; cat "$lua/$1.lua"; }
# An algorithm's file is its header (up to the first blank line), its state
# functions, and its decide (from "local function decide(" on): above is
# the first two, decide the last, state the state functions alone.
above() { sed '/^local function decide(/,$d' "$lua/$1.lua"; }
decide() { sed -n '/^local function decide(/,$p' "$lua/$1.lua"; }
state() { above "$1" | sed '1,/^$/d'; }
# settle_script is the settle's script as redisstore composes it
# (composeSettle in redisstore/functions.go): lib.lua, then settle.lua with
# the state functions of the file each "-- uses <file>:" line names after
# that line.
settle_script() {
  cat "$lua/lib.lua"
  echo
  local line
  while IFS= read -r line; do
    printf '%s\n' "$line"
    if [[ $line =~ ^[[:space:]]*--\ uses\ ([a-z_]+)\.lua:\  ]]; then
      state "${BASH_REMATCH[1]}"
    fi
  done <"$lua/settle.lua"
}
# register NAME: a decide's run line turned into the registration of the
# library's function NAME.
register() {
  sed -E "s/^return (run\(decide, [0-9]+, [0-9]+), KEYS, ARGV\)\s*$/redis.register_function('$1', function(keys, argv) return \1, keys, argv) end)/"
}

rr=$(go list -m -f '{{.Dir}}' github.com/go-redis/redis_rate/v10)
sed -n '/^var allowN = redis.NewScript(`/,/^`)/p' "$rr/lua.go" | sed '1d;$d' >"$dir/redis_rate.lua"
# The scripts as redisstore runs them, and the function library as Load
# loads it (redisstore/functions.go): lib.lua once, each algorithm's header
# and state functions, then each algorithm's decide and settle.lua in a
# block of its own, the last line registering its function instead of
# returning.
algs=(token_bucket gcra fixed_window sliding_window_log sliding_window_counter leaky_bucket)
{ echo '#!lua name=tollgate_luacost'
  cat "$lua/lib.lua"
  for a in "${algs[@]}"; do echo; above "$a"; done
  for a in "${algs[@]}"; do echo; echo do; decide "$a" | register "$a"; echo end; done
  echo; echo do; register settle <"$lua/settle.lua"; echo end
} >"$dir/library.lua"
for a in "${algs[@]}"; do script "$a" >"$dir/$a.lua"; done
settle_script >"$dir/settle.lua"
cli function load "$(cat "$dir/library.lua")" >/dev/null

echo "| script (1,000/s, burst 1,000; every decision admitted and written) | instructions per decision |"
echo "| --- | ---: |"
# ARGV as redisstore sends them for 1,000 per second, burst 1,000, cost 1,
# Redis time (and the token bucket's MaxDebt, 1,000).
tb=(1 1000 1000 1 '' 1000) gcra=(1 1000 1000 1 '') fw=(1000 1000000 1 '') swl=(1000 1000000 1 '')
swc=(1000 1000000 1000 1 '') lb=(1 1000 1000 1 '' 0)
for form in script function; do
  for k in 1 64; do
    suffix=""
    [[ $form == function ]] && suffix=", function"
    (( k > 1 )) && suffix="$suffix, batch of $k"
    src() { if [[ $form == function ]]; then echo "fn:$1"; else echo "$dir/$1.lua"; fi; }
    measure "token_bucket$suffix" "$(src token_bucket)" "$k" "${tb[@]}"
    measure "gcra$suffix" "$(src gcra)" "$k" "${gcra[@]}"
    measure "fixed_window$suffix" "$(src fixed_window)" "$k" "${fw[@]}"
    measure "sliding_window_log$suffix" "$(src sliding_window_log)" "$k" "${swl[@]}"
    measure "sliding_window_counter$suffix" "$(src sliding_window_counter)" "$k" "${swc[@]}"
    measure "leaky_bucket$suffix" "$(src leaky_bucket)" "$k" "${lb[@]}"
  done
done
# A settle (lua/settle.lua) charging one more token to a token bucket of
# 1,000/s, burst 1,000: each is written, the debt stopping at MaxDebt.
settle=(tb '' 0 1 2000 1 1000 1000 1000)
measure "settle, token_bucket" "$dir/settle.lua" 1 "${settle[@]}"
measure "settle, token_bucket, function" fn:settle 1 "${settle[@]}"
measure "go-redis/redis_rate v10" "$dir/redis_rate.lua" 1 1000 1000 1 1
