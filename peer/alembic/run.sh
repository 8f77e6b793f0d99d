#!/usr/bin/env bash
# Alembic's own suite on a fresh Spanner emulator: run.sh stock|ours OUT.xml
#   stock: sqlalchemy-spanner + the minimal SpannerImpl users write today (no sharded-orm)
#   ours:  sharded-orm's dialect, impl and autogenerate plugin
# Compare: python peer/compare.py alembic stock.xml ours.xml --known peer/alembic/known_differences.txt
set -euo pipefail
mode="${1:?usage: run.sh stock|ours OUT.xml}"
out="$(realpath -m "${2:?usage: run.sh stock|ours OUT.xml}")"
here="$(cd "$(dirname "$0")" && pwd)"
case "$mode" in stock|ours) ;; *) echo "mode must be stock or ours" >&2; exit 2 ;; esac

# the emulator binary, found as the project's pytest plugin finds it
binary="$(python -c 'from sharded_orm.testing.emulator import find_binary; print(find_binary())')"
port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp)"
"$binary" --host_port "127.0.0.1:$port" >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT
export SPANNER_EMULATOR_HOST="127.0.0.1:$port"
project=peer-alembic instance=peer database=alembic
python - "$project" "$instance" "$database" <<'PY'
import socket
import sys
import time

from google.auth.credentials import AnonymousCredentials
from google.cloud import spanner

project, instance_id, database_id = sys.argv[1:]
host, port = __import__("os").environ["SPANNER_EMULATOR_HOST"].split(":")
deadline = time.monotonic() + 30
while True:  # ready in ~0.1 s
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("the emulator did not start")
        time.sleep(0.05)
client = spanner.Client(
    project=project, credentials=AnonymousCredentials(), disable_builtin_metrics=True
)
instance = client.instance(
    instance_id, configuration_name=f"projects/{project}/instanceConfigs/emulator-config",
    display_name=instance_id, node_count=1,
)
instance.create().result(60)
instance.database(database_id).create().result(60)
PY

plugin_opts=()
[ "$mode" = stock ] && plugin_opts=(-p no:sharded_orm)
# each run in its own copy: Alembic's suite stages scripts under ./scratch, and .ci/peers
# runs stock and ours at once
work="$(mktemp -d)"
cp "$here"/*.py "$here"/setup.cfg "$work"/
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"; rm -rf "$work"' EXIT
cd "$work"
set +e
PEER_ALEMBIC_MODE="$mode" python -m pytest "${plugin_opts[@]}" -q \
  --dburi "spanner+spanner:///projects/$project/instances/$instance/databases/$database" \
  --junitxml "$out" -o junit_suite_name="alembic-$mode" test_suite_alembic.py
rc=$?
set -e
# test failures are what compare.py judges; anything else (no report, usage) is an error
[ -s "$out" ] || { echo "no JUnit report written (pytest exit $rc)" >&2; exit 1; }
[ "$rc" -le 1 ] || { echo "pytest exit $rc" >&2; exit "$rc"; }
exit 0
