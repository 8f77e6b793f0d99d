#!/usr/bin/env bash
# SQLAlchemy's own test suite on SQLite, stock or with sharded-orm imported and one sharded
# model defined. Usage: peer/sqlalchemy/run.sh stock|ours OUT.xml
# The sdist matching the installed SQLAlchemy is downloaded into a temp dir (never committed).
# SQLA_TESTS overrides the test directories (default below: what fits the CI budget).
set -euo pipefail
mode=${1:?stock|ours}
out=$(readlink -f "${2:?OUT.xml}")
here=$(cd "$(dirname "$0")" && pwd)
version=$(python -c 'import importlib.metadata as m; print(m.version("sqlalchemy"))')
work=${SQLA_SDIST_DIR:-$(mktemp -d)}
if [ ! -d "$work/sqlalchemy-$version/test" ]; then
    pip download -q --no-deps --no-binary :all: "sqlalchemy==$version" -d "$work"
    tar xzf "$work"/sqlalchemy-"$version".tar.gz -C "$work"
fi
# each run in its own copy: SQLAlchemy's SQLite tests keep files (attached schemas) in the
# working directory, so a stock and an ours run side by side must not share one
run_dir=$(mktemp -d)
cp -r "$work/sqlalchemy-$version" "$run_dir/"
trap 'rm -rf "$run_dir"' EXIT
cd "$run_dir/sqlalchemy-$version"
tests=${SQLA_TESTS:-test/orm test/sql test/engine}
case "$mode" in
    stock) plugin=(-p no:sharded_orm) ;;
    ours) plugin=(-p sharded_orm_peer) ;;
    *) echo "mode must be stock or ours" >&2; exit 2 ;;
esac
# python -s: the installed SQLAlchemy in both runs (test/conftest.py would otherwise put the
# sdist's lib/ first, without the compiled extensions).
# -p no:randomly etc.: only SQLAlchemy's own plugin decides what runs.
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python -s -m pytest $tests \
    "${plugin[@]}" -p no:cacheprovider -q --tb=line -o addopts="" \
    -W "error::DeprecationWarning:sqlalchemy" \
    --junitxml="$out" --dburi sqlite:///:memory: || true
test -s "$out"
