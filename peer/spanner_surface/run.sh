#!/usr/bin/env bash
# Our own test module of sqlalchemy-spanner's surface (test_stock_surface.py) on the emulator.
#   peer/spanner_surface/run.sh stock|ours OUT.xml
# stock: sqlalchemy-spanner's dialect, sharded-orm not imported (-p no:sharded_orm);
# ours: sharded-orm imported first, so its dialect subclass serves spanner+spanner:// URLs.
# Exit 0 when the suite ran (test failures are compare.py's business).
set -euo pipefail
mode="${1:-}"
out="${2:-}"
case "$mode" in stock | ours) ;; *) echo "usage: $0 stock|ours OUT.xml" >&2; exit 2 ;; esac
[ -n "$out" ] || { echo "usage: $0 stock|ours OUT.xml" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
out="$(realpath -m "$out")"
work="$(mktemp -d)"
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# an emulator with one database (its instance serves each test's fresh database)
python "$here/../spanner_compliance/serve_emulator.py" >"$work/emulator.out" &
server=$!
for _ in $(seq 1200); do
  [ -s "$work/emulator.out" ] && break
  kill -0 "$server" 2>/dev/null || { echo "the emulator did not start" >&2; exit 1; }
  sleep 0.1
done
read -r host url <"$work/emulator.out" || { echo "the emulator did not start" >&2; exit 1; }

plugins=()
[ "$mode" = stock ] && plugins=(-p no:sharded_orm)
cd "$here"
rc=0
SPANNER_EMULATOR_HOST="$host" SPANNER_SURFACE_MODE="$mode" SPANNER_SURFACE_URL="$url" \
  python -m pytest test_stock_surface.py -c setup.cfg -q -p no:randomly "${plugins[@]}" \
  --junitxml "$out" -o junit_suite_name="surface-$mode" || rc=$?
# 0: all passed; 1: some tests failed (compare.py judges them); anything else: no verdict
[ "$rc" -le 1 ] || exit "$rc"
