#!/usr/bin/env bash
# deps.sh: install the programs tollgate's tests start (redis-server, nginx, caddy,
# prometheus and its promtool)
# when they are missing. As root it installs them with apt-get; otherwise it
# says what to install and fails.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# nginx lives in /usr/sbin, which is not on every user's PATH. The tests need
# its auth_request module, which Debian's nginx package includes.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
# Caddy for examples/caddy (forward_auth); Debian's package is 2.6.
command -v caddy >/dev/null 2>&1 || need+=(caddy)
# Prometheus (Debian's is 2.42) and promtool, for deploy/prometheus's rules
# and deploy/grafana's dashboard (internal/test/promtest).
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "tollgate's tests start real servers and need: ${need[*]}" >&2
  echo "install them, e.g. 'sudo apt-get install -y ${need[*]}' (Debian/Ubuntu) or 'brew install redis nginx caddy prometheus' (macOS)" >&2
  exit 1
fi
echo "installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${need[@]}" >/dev/null ||
  { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
# The Debian package starts a service on the default port where systemd
# runs; tests start their own servers and do not need it.
