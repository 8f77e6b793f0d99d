"""The Spanner DB-API's statement classification, memoised per text in our cursor.

The DB-API runs ``sqlparse.format`` over every statement's text on every execution
(``parse_utils.classify_statement``): 39 % of ``merged()``'s CPU at N = 64, k = 100.
``sharded_orm.spanner.statements`` keeps, per text, only what depends on the text, and
each call builds its statement from its own arguments with the DB-API's functions:
the memo must answer exactly as the DB-API does, for every text and argument.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import sqlalchemy as sa
import sqlparse
from google.cloud.spanner_dbapi import parse_utils
from hypothesis import given, settings
from hypothesis import strategies as st

from sharded_orm.spanner.statements import MEMO_SIZE, StatementMemo


def _dbapi(sql: str, args: Any) -> Any:
    try:
        return parse_utils.classify_statement(sql, args)
    except Exception as exc:
        return (type(exc), exc.args)


def _memo(memo: StatementMemo, sql: str, args: Any) -> Any:
    try:
        return memo.classify(sql, args)
    except Exception as exc:
        return (type(exc), exc.args)


# What applications and SQLAlchemy send: statements of every kind, comments, placeholders
# (some in comments, some escaped), non-ASCII names, client-side statements, blanks.
HEADS = [
    "SELECT a, b FROM t WHERE a = %s",
    "select * from `t` where x in (%s, %s) limit %s",
    "WITH q AS (SELECT 1 AS x) SELECT x FROM q WHERE x > %s",
    "INSERT INTO t (a, b) VALUES (%s, %s)",
    "insert or update into t (a) values (%s)",
    "UPDATE t SET a = %s WHERE b = %s",
    "UPDATE t SET a = %s",
    "DELETE FROM t WHERE a = %s",
    "delete from t",
    "CREATE TABLE t (a INT64) PRIMARY KEY (a)",
    "DROP INDEX ix",
    "SELECT 'it''s 100%% done', %s",
    "SELECT föö FROM t WHERE a = %s",
    "BEGIN",
    "COMMIT",
    "START BATCH DML",
    "RUN BATCH",
    "SHOW VARIABLE COMMIT_TIMESTAMP",
    "SET AUTOCOMMIT_DML_MODE = 'PARTITIONED_NON_ATOMIC'",
    "",
    "   ",
    "-- only a comment",
    "SELECT a FROM t WHERE a = %(a)s",
]
COMMENTS = ["", "-- note %s\n", "/* %s */ ", "# hash %s\n", "/* multi\nline */\n"]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)


@st.composite
def calls(draw: Any) -> tuple[str, Any]:
    sql = draw(st.sampled_from(COMMENTS)) + draw(st.sampled_from(HEADS))
    sql += draw(st.sampled_from(["", " ", "\n", ";", " -- tail %s"]))
    wanted = sql.count("%s") - sql.count("%%s")
    count = draw(st.sampled_from([wanted, max(0, wanted - 1), wanted + 1]))
    args = draw(
        st.one_of(
            st.none(),
            st.just(()),
            st.lists(VALUES, min_size=count, max_size=count).map(tuple),
            st.lists(VALUES, min_size=count, max_size=count),
            st.fixed_dictionaries({"a": VALUES}),
        )
    )
    return sql, args


@settings(max_examples=60, deadline=None)
@given(st.lists(calls(), min_size=1, max_size=6))
def test_the_memo_answers_as_the_dbapi_does(batch: list[tuple[str, Any]]) -> None:
    memo_answers_as_the_dbapi_does(batch)


# the oracle's wide variant (many drawn batches); quick loop:
# test_the_memo_answers_as_the_dbapi_does
@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(calls(), min_size=1, max_size=6))
def test_the_memo_answers_as_the_dbapi_does_wide(batch: list[tuple[str, Any]]) -> None:
    memo_answers_as_the_dbapi_does(batch)


def memo_answers_as_the_dbapi_does(batch: list[tuple[str, Any]]) -> None:
    memo = StatementMemo(size=4)
    # each text three times (seen, learnt, answered from the memo), other texts between
    for sql, args in batch * 3:
        assert _memo(memo, sql, args) == _dbapi(sql, args), (sql, args)


def test_each_call_gets_its_own_statement() -> None:
    memo = StatementMemo()
    sql = "UPDATE t SET a = %s"
    for _ in range(2):
        memo.classify(sql, (1,))
    first, second = memo.classify(sql, (1,)), memo.classify(sql, ("x",))
    assert memo.hits == 2
    assert first.statement is not second.statement
    assert first.statement.params == {"a0": 1} and second.statement.params == {"a0": "x"}
    assert first.statement.sql == second.statement.sql == "UPDATE t SET a = @a0 WHERE 1=1"
    assert first.statement.param_types != second.statement.param_types
    first.statement.sql = "changed by its caller"
    assert memo.classify(sql, (1,)).statement.sql == "UPDATE t SET a = @a0 WHERE 1=1"


def test_the_memo_is_bounded() -> None:
    memo = StatementMemo(size=8)
    for i in range(100):
        for _ in range(3):
            memo.classify(f"SELECT {i} FROM t WHERE a = %s", (i,))
    assert len(memo) == 8
    assert MEMO_SIZE <= 4096
    by_size = StatementMemo(size=1000, chars=3_000)
    for i in range(100):
        for _ in range(3):
            by_size.classify(f"SELECT {i:03d}, '{'x' * 80}' FROM t", ())
    assert 0 < len(by_size) <= 3_000 // (3 * 100)
    huge = "SELECT '" + "x" * 400 + "'"  # over a tenth of the budget: never kept
    hits = by_size.hits
    for _ in range(3):
        assert by_size.classify(huge) == parse_utils.classify_statement(huge)
    assert by_size.hits == hits


def _counting_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = sqlparse.format

    def counted(sql: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(sql)
        return real(sql, *args, **kwargs)

    monkeypatch.setattr(sqlparse, "format", counted)
    return seen


def test_upstream_still_parses_every_statement_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trips when upstream memoises the classification itself (then drop ours:
    ``sharded_orm.spanner.statements``), or stops classifying in ``Cursor._execute``."""
    from google.cloud.spanner_dbapi.cursor import Cursor

    from sharded_orm.spanner.connection import ShardedCursor

    parses = _counting_parses(monkeypatch)
    for _ in range(3):
        parse_utils.classify_statement("SELECT a FROM t WHERE a = %s", (1,))
    assert len(parses) == 3
    assert not hasattr(parse_utils.classify_statement, "cache_info")
    assert "sqlparse.format(query, strip_comments=True)" in inspect.getsource(
        parse_utils.classify_statement
    )
    code = Cursor._execute.__code__
    assert {"parse_utils", "classify_statement"} <= set(code.co_names)
    assert ShardedCursor._execute.__code__ is code  # the DB-API's own code, run as is


@pytest.mark.emulator
def test_our_cursor_parses_a_statement_text_three_times_at_most(
    spanner_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through our dialect: the stock cursor parses the text on every execution (10
    times here); ours when it first sees it, twice when it learns it (its own pass, and
    the DB-API's answer it checks it against), then never."""
    parses = _counting_parses(monkeypatch)
    text = sa.text("SELECT :x + 1 AS y /* statement memo test */")
    with spanner_engine.connect() as conn:
        got = [conn.execute(text, {"x": i}).scalar() for i in range(10)]
    assert got == list(range(1, 11))
    assert sum("statement memo test" in p for p in parses) == 3
