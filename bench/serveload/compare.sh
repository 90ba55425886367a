#!/usr/bin/env bash
# compare.sh: measure tollgate serve (memory store and Redis) and, when
# ENVOY_RATELIMIT names its binary, envoyproxy/ratelimit on the same Redis,
# one after the other in one run, with the same load: gRPC with 64 requests
# in flight and /json with vegeta, over 10,000 descriptor values.
#
#   bench/serveload/compare.sh                       # tollgate only
#   ENVOY_RATELIMIT=/path/to/ratelimit bench/serveload/compare.sh
#   DURATION=20s bench/serveload/compare.sh
#
# envoyproxy/ratelimit is not part of this repository: build it yourself from
# its source (go build ./src/service_cmd) and point ENVOY_RATELIMIT at it.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"
DURATION=${DURATION:-10s}
INFLIGHT=${INFLIGHT:-64}
VALUES=${VALUES:-10000}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "nothing on port $1" >&2; return 1; }

(cd ../.. && go build -o "$work/tollgate" ./cmd/tollgate)
go build -o "$work/serveload" .

rport=$(freeport)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
waitport "$rport"

load() { # label pid grpc-addr json-url
  "$work/serveload" grpc --addr "$3" --inflight "$INFLIGHT" --values "$VALUES" --duration "$DURATION" --pid "$2" --label "$1 gRPC"
  "$work/serveload" json --url "$4" --inflight "$INFLIGHT" --values "$VALUES" --duration "$DURATION" --pid "$2" --label "$1 /json"
}

run_tollgate() { # label extra-args...
  local label=$1; shift
  local hp gp
  hp=$(freeport); gp=$(freeport)
  "$work/tollgate" serve --config ratelimit.yaml --http "127.0.0.1:$hp" --grpc "127.0.0.1:$gp" --log-level warn "$@" &
  local pid=$!
  pids+=($pid)
  waitport "$gp"
  load "$label" "$pid" "127.0.0.1:$gp" "http://127.0.0.1:$hp/json"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

echo "# $(date -u +%FT%TZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $INFLIGHT in flight over $VALUES values, $DURATION each"
run_tollgate "tollgate memory"
run_tollgate "tollgate redis" --redis "redis://127.0.0.1:$rport"

if [ -n "${ENVOY_RATELIMIT:-}" ]; then
  mkdir -p "$work/runtime/ratelimit/config"
  cp ratelimit.yaml "$work/runtime/ratelimit/config/"
  hp=$(freeport); gp=$(freeport); dp=$(freeport)
  env RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
    USE_STATSD=false LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$rport" \
    HOST=127.0.0.1 PORT="$hp" GRPC_HOST=127.0.0.1 GRPC_PORT="$gp" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$dp" \
    "$ENVOY_RATELIMIT" >"$work/envoy.log" 2>&1 &
  pid=$!
  pids+=($pid)
  waitport "$gp"
  load "envoyproxy/ratelimit redis" "$pid" "127.0.0.1:$gp" "http://127.0.0.1:$hp/json"
fi
