#!/usr/bin/env bash
# compare.sh: measure tollgate serve (memory store and Redis) and, when
# ENVOY_RATELIMIT names its binary, envoyproxy/ratelimit on the same Redis,
# with the same load: gRPC with 64 requests in flight over 4 connections and
# /json with vegeta, over 10,000 descriptor values.
#
# The services run in interleaved rounds — every service once per round, in
# an order that rotates from round to round — so that a change in the
# machine's load (it is shared) hits them alike. Each run starts the service
# afresh. At the end it prints, per service and API, the median over the
# rounds of decisions/s, p50, p99 and the CPU per decision of each process
# that ran: the service, the load generator (serveload) and redis-server
# (for the services on Redis), each read from /proc over the measured run;
# then tollgate on Redis against envoyproxy/ratelimit: the median of the
# rounds' ratios (each round's pair ran minutes apart at most) and the ratio
# of the medians; and last, tollgate on Redis's own CPU per decision,
# decisions/s and p99 over gRPC set against envoyproxy/ratelimit's and their
# goals (CPU at most a third of envoy's, decisions/s at least 2.5 times,
# p99 at most a third).
#
#   bench/serveload/compare.sh                       # tollgate only
#   ENVOY_RATELIMIT=/path/to/ratelimit bench/serveload/compare.sh
#   ROUNDS=5 DURATION=20s APIS=grpc bench/serveload/compare.sh
#
# Settings (environment): ROUNDS (3), DURATION of each measured run (10s,
# after 2 s of warm-up), INFLIGHT (64), CONNS gRPC connections (4), VALUES
# (10000), APIS (grpc json), MEMORY=0 to leave out the memory store,
# CLIENT of the gRPC load (lean, serveload's own HTTP/2 client, the least
# CPU a call; grpc-go for grpc-go's client, as runs before the lean client
# measured), TOLLGATE_BASE=/path/to/tollgate to run a second tollgate binary on Redis
# beside this tree's (a build of an earlier commit: before and after in one
# run) under the label BASE_LABEL (tollgate-base), PROFILE=file.pprof to take a CPU profile of tollgate on Redis under
# gRPC load in the last round, RESULTS=file to keep the raw lines (TSV).
#
# envoyproxy/ratelimit is not part of this repository: build it yourself from
# its source (go build ./src/service_cmd), outside this tree, and point
# ENVOY_RATELIMIT at it.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
INFLIGHT=${INFLIGHT:-64}
CONNS=${CONNS:-4}
VALUES=${VALUES:-10000}
APIS=${APIS:-grpc json}
MEMORY=${MEMORY:-1}
BASE_LABEL=${BASE_LABEL:-tollgate-base}
CLIENT=${CLIENT:-lean}
work=$(mktemp -d)
tsv=${RESULTS:-$work/results.tsv}
: >"$tsv"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "nothing on port $1" >&2; return 1; }
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

(cd ../.. && go build -o "$work/tollgate" ./cmd/tollgate)
go build -o "$work/serveload" .

rport=$(freeport)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
rpid=$!
pids+=("$rpid")
waitport "$rport"

# load label pid store-pid grpc-addr json-url [debug-addr]: one measured run
# per API, measuring the CPU of the service (pid), serveload and the store
# (store-pid, 0 for none). With a debug address and PROFILE set, the gRPC
# run is profiled.
load() {
  local label=$1 pid=$2 spid=$3; shift 3
  local api
  for api in $APIS; do
    local prof=""
    if [ "$api" = grpc ] && [ -n "${3:-}" ]; then
      local secs=${DURATION%s}
      curl -s -o "$PROFILE" "http://$3/debug/pprof/profile?seconds=$((secs + 1))" &
      prof=$!
    fi
    case $api in
      grpc) "$work/serveload" grpc --client "$CLIENT" --addr "$1" --conns "$CONNS" --inflight "$INFLIGHT" --values "$VALUES" --duration "$DURATION" --pid "$pid" --store-pid "$spid" --label "$label" --tsv "$tsv" ;;
      json) "$work/serveload" json --url "$2" --inflight "$INFLIGHT" --values "$VALUES" --duration "$DURATION" --pid "$pid" --store-pid "$spid" --label "$label" --tsv "$tsv" ;;
    esac
    if [ -n "$prof" ]; then wait "$prof" || true; fi
  done
}

run_tollgate() { # label binary profile(0/1) store-pid extra-args...
  local label=$1 bin=$2 profile=$3 spid=$4; shift 4
  local hp gp dp="" debug=()
  hp=$(freeport); gp=$(freeport)
  if [ "$profile" = 1 ]; then dp=127.0.0.1:$(freeport); debug=(--debug "$dp"); fi
  "$bin" serve --config ratelimit.yaml --http "127.0.0.1:$hp" --grpc "127.0.0.1:$gp" --log-level warn "${debug[@]}" "$@" &
  local pid=$!
  waitport "$gp"
  load "$label" "$pid" "$spid" "127.0.0.1:$gp" "http://127.0.0.1:$hp/json" "$dp"
  # Descriptors answered by the failure mode (the store failed or missed
  # its deadline) are answers that made no decision: count them, so that a
  # service that fails open under load cannot pass for a fast one.
  curl -s "http://127.0.0.1:$hp/metrics" |
    awk -v l="$label" '/^tollgate_serve_decisions_total/ && /outcome="fail_(open|closed)"/ {n += $NF} END {printf "%s\t%d\n", l, n}' >>"$work/failmode.tsv"
  stop "$pid"
}

run_envoy() {
  mkdir -p "$work/runtime/ratelimit/config"
  cp ratelimit.yaml "$work/runtime/ratelimit/config/"
  local hp gp dp
  hp=$(freeport); gp=$(freeport); dp=$(freeport)
  env RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
    USE_STATSD=false LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$rport" \
    HOST=127.0.0.1 PORT="$hp" GRPC_HOST=127.0.0.1 GRPC_PORT="$gp" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$dp" \
    "$ENVOY_RATELIMIT" >"$work/envoy.log" 2>&1 &
  local pid=$!
  waitport "$gp"
  load "envoyproxy/ratelimit redis" "$pid" "$rpid" "127.0.0.1:$gp" "http://127.0.0.1:$hp/json"
  stop "$pid"
}

services=()
if [ "$MEMORY" != 0 ]; then services+=(memory); fi
services+=(redis)
if [ -n "${TOLLGATE_BASE:-}" ]; then services+=(base); fi
if [ -n "${ENVOY_RATELIMIT:-}" ]; then services+=(envoy); fi

run_service() { # name round
  local profile=0
  if [ -n "${PROFILE:-}" ] && [ "$2" = "$ROUNDS" ]; then profile=1; fi
  case $1 in
    memory) run_tollgate "tollgate memory" "$work/tollgate" 0 0 ;;
    redis) run_tollgate "tollgate redis" "$work/tollgate" "$profile" "$rpid" --redis "redis://127.0.0.1:$rport" ;;
    base) run_tollgate "$BASE_LABEL redis" "$TOLLGATE_BASE" 0 "$rpid" --redis "redis://127.0.0.1:$rport" ;;
    envoy) run_envoy ;;
  esac
}

echo "# $(date -u +%FT%TZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $INFLIGHT in flight ($CONNS gRPC connections, $CLIENT client) over $VALUES values, $DURATION each, $ROUNDS rounds"
n=${#services[@]}
for r in $(seq "$ROUNDS"); do
  echo "## round $r, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for i in $(seq 0 $((n - 1))); do
    run_service "${services[$(((i + r - 1) % n))]}" "$r"
  done
done

touch "$work/failmode.tsv"
python3 - "$tsv" "$BASE_LABEL redis" "$work/failmode.tsv" <<'EOF'
import statistics, sys
from collections import defaultdict

failed = defaultdict(int)  # label -> descriptors answered by the failure mode, all runs and APIs
for line in open(sys.argv[3]):
    label, n = line.rstrip("\n").split("\t")
    failed[label] += int(n)

# (label, api) -> [(rate, p50, p99, service CPU, serveload CPU, redis-server CPU)], in
# round order; CPU in µs per decision, NaN when not measured.
runs = defaultdict(list)
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    f += [""] * (8 - len(f))
    label, api, rate, p50, p99 = f[:5]
    runs[(label, api)].append((float(rate), int(p50), int(p99), *(float(c) if c else float("nan") for c in f[5:8])))

med = lambda xs: statistics.median(xs)

def cpu(rs, i):
    xs = [r[i] for r in rs if r[i] == r[i]]
    return f"{med(xs):.1f} µs" if xs else "—"

print("\n| service | API | rounds | decisions/s (median; min–max) | p50 | p99 (median; min–max) | service CPU/decision | serveload CPU/decision | redis-server CPU/decision | answered by the failure mode (all its runs, every API) |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for (label, api), rs in runs.items():
    rate = [r[0] for r in rs]; p99 = [r[2] for r in rs]
    print(f"| {label} | {api} | {len(rs)} | {med(rate):,.0f} ({min(rate):,.0f}–{max(rate):,.0f}) | "
          f"{med([r[1] for r in rs]) / 1000:.1f} ms | {med(p99) / 1000:.1f} ms ({min(p99) / 1000:.1f}–{max(p99) / 1000:.1f}) | "
          f"{cpu(rs, 3)} | {cpu(rs, 4)} | {cpu(rs, 5)} | {failed[label] if label in failed else '—'} |")

def compare(a, b):
    for api in ("grpc", "json"):
        x, y = runs.get((a, api)), runs.get((b, api))
        if not x or not y:
            continue
        k = min(len(x), len(y))
        rate = [x[i][0] / y[i][0] for i in range(k)]
        p99 = [x[i][2] / y[i][2] for i in range(k)]
        cpu = [x[i][3] / y[i][3] for i in range(k)]
        print(f"{a} / {b}, {api}: decisions/s {med(rate):.2f}× (rounds {', '.join(f'{v:.2f}' for v in rate)}; "
              f"ratio of medians {med([r[0] for r in x]) / med([r[0] for r in y]):.2f}×), "
              f"p99 {med(p99):.2f}× (rounds {', '.join(f'{v:.2f}' for v in p99)}; "
              f"ratio of medians {med([r[2] for r in x]) / med([r[2] for r in y]):.2f}×), "
              f"service CPU/decision {med(cpu):.2f}× (rounds {', '.join(f'{v:.2f}' for v in cpu)})")

print()
compare("tollgate redis", "envoyproxy/ratelimit redis")
compare("tollgate redis", sys.argv[2])
compare(sys.argv[2], "envoyproxy/ratelimit redis")

# The goals of tollgate on Redis against envoyproxy/ratelimit on the same
# Redis, over gRPC (Envoy's protocol), from the medians over the rounds.
t, e = runs.get(("tollgate redis", "grpc")), runs.get(("envoyproxy/ratelimit redis", "grpc"))
if t and e:
    verdict = lambda ok: "met" if ok else "missed"
    tc, ec = med([r[3] for r in t]), med([r[3] for r in e])
    print(f"\nservice CPU per decision: tollgate {tc:.1f} µs, envoy {ec:.1f} µs = {tc / ec:.2f} of envoy's (goal ≤ 0.33): {verdict(tc / ec <= 0.33)}")
    tr, er = med([r[0] for r in t]), med([r[0] for r in e])
    print(f"decisions/s: tollgate {tr:,.0f}, envoy {er:,.0f} = {tr / er:.2f}× envoy's (goal ≥ 2.5×): {verdict(tr / er >= 2.5)}")
    tp, ep = med([r[2] for r in t]), med([r[2] for r in e])
    print(f"p99: tollgate {tp / 1000:.2f} ms, envoy {ep / 1000:.2f} ms = {tp / ep:.2f} of envoy's (goal ≤ ⅓): {verdict(tp / ep <= 1 / 3)}")
EOF
