"""The pytest plugin we ship: emulator fixtures, skip/fail rules, the mock server."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

pytest_plugins = ["pytester"]

USES_EMULATOR = """
def test_uses_emulator(spanner_engine):
    pass
"""


@pytest.fixture
def no_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child pytest that can find no emulator: no host, a binary path that doesn't exist."""
    monkeypatch.delenv("SPANNER_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("SHARDED_ORM_EMULATOR_BIN", "/nonexistent/emulator_main")


def test_missing_emulator_skips_with_reason(pytester: pytest.Pytester, no_emulator: None) -> None:
    pytester.makepyfile(USES_EMULATOR)
    result = pytester.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*emulator_main is not an executable file*"])


@pytest.mark.parametrize("how", ["CI=true", "--require-emulator"])
def test_missing_emulator_fails_when_required(
    pytester: pytest.Pytester, no_emulator: None, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    pytester.makepyfile(USES_EMULATOR)
    args = ["-p", "no:cacheprovider"]
    if how == "CI=true":
        monkeypatch.setenv("CI", "true")
    else:
        args.append(how)
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*the Spanner emulator is required here*"])


def test_emulator_tests_are_marked(pytester: pytest.Pytester, no_emulator: None) -> None:
    pytester.makepyfile(USES_EMULATOR + "\ndef test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-m", "not emulator", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=1)


def test_engine_is_a_fresh_database_that_works(spanner_engine: sa.Engine, spanner_emulator) -> None:  # type: ignore[no-untyped-def]
    assert sa.inspect(spanner_engine).get_table_names() == []
    md = sa.MetaData()
    t = sa.Table(
        "t",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("v", sa.String(10)),
    )
    md.create_all(spanner_engine)
    with spanner_engine.begin() as conn:
        conn.execute(t.insert(), [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    with spanner_engine.connect() as conn:
        assert conn.execute(sa.select(t.c.v).order_by(t.c.id)).scalars().all() == ["a", "b"]
    other = spanner_emulator.engine(spanner_emulator.create_database())
    try:
        assert sa.inspect(other).get_table_names() == []
    finally:
        other.dispose()


def test_mock_server_records_sql(mock_spanner) -> None:  # type: ignore[no-untyped-def]
    engine = mock_spanner.engine()
    t = sa.table("t", sa.column("c"), sa.column("id"))
    stmt = sa.select(t.c.c).where(t.c.id == 3)
    sql = str(stmt.compile(engine))
    mock_spanner.add_result(sql, [("c", "INT64")], [[7]])
    with engine.connect() as conn:
        assert conn.execute(stmt).all() == [(7,)]
    assert mock_spanner.executed_sql() == ["SELECT t.c\nFROM t\nWHERE t.id = @a0"]
    engine.dispose()
