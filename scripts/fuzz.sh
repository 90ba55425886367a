#!/usr/bin/env bash
# fuzz.sh: run every native fuzz target (func FuzzXxx) in the module's
# packages, one after the other, each for FUZZTIME (default 30s). Targets
# are found afresh on every run, so new ones join without editing this file.
# A target that fails does not stop the others; go test writes the failing
# input under the package's testdata/fuzz/<target>/, where the next
# `make test` replays it, and the script exits non-zero at the end.
set -euo pipefail

FUZZTIME=${FUZZTIME:-30s}
GO=${GO:-go}
cd "$(dirname "$0")/.."

# Packages of this module only (nested modules such as bench/ are their
# own), with the test files of each.
targets=0
failed=()
while read -r pkg dir files; do
  [ -n "$files" ] || continue
  for name in $(cd "$dir" && grep -hoE '^func Fuzz[A-Za-z0-9_]*' $files | sed 's/^func //' | sort -u); do
    echo "== $pkg $name ($FUZZTIME)"
    "$GO" test -run='^$' -fuzz="^${name}\$" -fuzztime="$FUZZTIME" "$pkg" || failed+=("$pkg $name")
    targets=$((targets + 1))
  done
done < <("$GO" list -f '{{.ImportPath}} {{.Dir}} {{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}' ./...)

if [ "$targets" -eq 0 ]; then
  echo "fuzz.sh: no fuzz targets found" >&2
  exit 1
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} of $targets targets failed:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "fuzz.sh: $targets targets, $FUZZTIME each, no failures"
