#!/usr/bin/env bash
# sqlalchemy-spanner's compliance suite (tests/test_suite_20.py of its sdist) on the emulator.
#   peer/spanner_compliance/run.sh stock|ours OUT.xml
# stock: sqlalchemy-spanner's dialect, sharded-orm not imported (-p no:sharded_orm);
# ours: sharded-orm imported, so its dialect subclass serves spanner+spanner:// URLs.
# The suite is downloaded at run time (the installed sqlalchemy-spanner's version), never
# committed. Exit 0 when the suite ran (test failures are compare.py's business).
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

version="$(python -c 'from importlib.metadata import version; print(version("sqlalchemy-spanner"))')"
python -m pip download -q --no-deps --no-binary :all: "sqlalchemy-spanner==$version" -d "$work/sdist"
tar -xzf "$work/sdist/sqlalchemy_spanner-$version.tar.gz" -C "$work/sdist"
mkdir "$work/suite"
cp "$work/sdist/sqlalchemy_spanner-$version/tests/test_suite_20.py" "$here/conftest.py" \
  "$here/setup.cfg" "$work/suite/"
mkdir "$work/suite/tests"
touch "$work/suite/tests/__init__.py"
cp "$here/suite_helpers.py" "$work/suite/tests/_helpers.py"

# an emulator with one database, started and stopped as sharded_orm.testing.emulator does
python "$here/serve_emulator.py" >"$work/emulator.out" &
server=$!
for _ in $(seq 1200); do
  [ -s "$work/emulator.out" ] && break
  kill -0 "$server" 2>/dev/null || { echo "the emulator did not start" >&2; exit 1; }
  sleep 0.1
done
read -r host url <"$work/emulator.out" || { echo "the emulator did not start" >&2; exit 1; }

plugins=()
[ "$mode" = stock ] && plugins=(-p no:sharded_orm)
cd "$work/suite"
rc=0
SPANNER_EMULATOR_HOST="$host" SPANNER_COMPLIANCE_MODE="$mode" SPANNER_COMPLIANCE_URL="$url" \
  python -m pytest test_suite_20.py -q -p no:cacheprovider "${plugins[@]}" \
  --dburi "$url" --junitxml "$out" -o junit_suite_name="spanner-$mode" || rc=$?
# 0: all passed; 1: some tests failed (compare.py judges them); anything else: no verdict
[ "$rc" -le 1 ] || exit "$rc"
