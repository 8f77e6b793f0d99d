"""Each fix in sharded_orm/spanner/dialect.py: it works, and upstream still needs it.

The ``test_upstream_*`` tests assert the stock sqlalchemy-spanner gap is still there.
When one fails, upstream fixed it: drop our fix and its test.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import sqlalchemy as sa
from google.api_core.exceptions import GoogleAPICallError, NotFound
from google.cloud.spanner_dbapi import exceptions as dbapi_exceptions
from google.cloud.sqlalchemy_spanner import sqlalchemy_spanner as stock
from sqlalchemy import orm
from sqlalchemy.schema import CreateIndex, CreateTable

from sharded_orm import primary_key
from sharded_orm.spanner.dialect import SpannerDialect


def users_table() -> sa.Table:
    return sa.Table(
        "Users",
        sa.MetaData(),
        sa.Column("UserId", sa.BigInteger),
        sa.Column("LastAccessTimestamp", sa.DateTime(timezone=True)),
        primary_key("UserId", sa.desc("LastAccessTimestamp")),
    )


@pytest.mark.parametrize("path", ["/nonsense", "/projects/p", "/projects/p/instances/i/databases/"])
def test_bad_urls_are_refused_with_an_argument_error(path: str) -> None:
    with pytest.raises(sa.exc.ArgumentError, match="not a Spanner URL"):
        sa.create_engine(f"spanner+spanner://{path}")


def test_upstream_crashes_on_a_bad_url() -> None:
    url = sa.engine.make_url("spanner+spanner:///nonsense")
    with pytest.raises(AttributeError, match="group"):
        stock.SpannerDialect().create_connect_args(url)


def test_engines_use_our_dialect() -> None:
    eng = sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d")
    assert type(eng.dialect) is SpannerDialect
    assert eng.dialect.name == "spanner+spanner"


def test_primary_key_quoted_with_desc() -> None:
    ddl = str(CreateTable(users_table()).compile(dialect=SpannerDialect()))
    assert "PRIMARY KEY (`UserId`, `LastAccessTimestamp` DESC)" in ddl


def test_upstream_primary_key_has_no_desc_and_no_quoting() -> None:
    # the stock compiler's own method: a stock engine's CREATE TABLE of a key with a
    # descending part is given our rendering (sharded_orm/spanner/stock.py)
    dialect = stock.SpannerDialect()
    compiler = dialect.ddl_compiler(dialect, None)
    assert compiler.post_create_table(users_table()) == (
        " PRIMARY KEY (UserId, LastAccessTimestamp)"
    )


def test_spanner_keywords_validate_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ix = sa.Index("ix", "a", spanner_storing=["b"], spanner_null_filtered=True)
        sa.Table("t", sa.MetaData(), sa.Column("a", sa.Integer), spanner_interleave_in="p")
    assert ix.dialect_options["spanner"]["null_filtered"] is True


def test_upstream_declares_no_keywords() -> None:
    assert getattr(stock.SpannerDialect, "construct_arguments", None) is None


def test_index_without_storing_renders_no_storing_clause() -> None:
    t = sa.Table("t", sa.MetaData(), sa.Column("a", sa.Integer), sa.Column("b", sa.Integer))
    ix = sa.Index("ix", t.c.a, spanner_null_filtered=True)
    assert str(CreateIndex(ix).compile(dialect=SpannerDialect())) == (
        "CREATE NULL_FILTERED INDEX ix ON t (a)"
    )


def hinted(dialect_name: str) -> sa.Select[tuple[int]]:
    t = sa.table("t", sa.column("a"))
    return sa.select(t.c.a).with_hint(t, "@{FORCE_INDEX=ix}", dialect_name=dialect_name)


@pytest.mark.parametrize("name", ["spanner", "spanner+spanner", "*"])
def test_table_hint_renders_for_either_dialect_name(name: str) -> None:
    assert "FROM t @{FORCE_INDEX=ix}" in str(hinted(name).compile(dialect=SpannerDialect()))


def test_upstream_drops_hints_named_spanner() -> None:
    assert "FORCE_INDEX" not in str(hinted("spanner").compile(dialect=stock.SpannerDialect()))


def test_upstream_returns_bytes_base64_encoded() -> None:
    dialect = stock.SpannerDialect()
    process = dialect.type_descriptor(sa.LargeBinary()).result_processor(dialect, None)
    # the client hands b"/wBh" (base64 of b"\xff\x00a"); stock passes it through as is
    assert process is None or process(b"/wBh") == b"/wBh"


@pytest.mark.emulator
def test_bytes_and_hints_on_the_emulator(spanner_engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = sa.Table(
        "blobs",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("b", sa.LargeBinary(64)),
        sa.Index("blobs_by_b", "b"),
    )
    md.create_all(spanner_engine)
    raw = b"\xff\x00binary\x01"
    with spanner_engine.begin() as conn:
        conn.execute(t.insert(), {"id": 1, "b": raw})
    with spanner_engine.connect() as conn:
        assert conn.execute(sa.select(t.c.b)).scalar_one() == raw
        stmt = sa.select(t.c.id).with_hint(t, "@{FORCE_INDEX=blobs_by_b}", dialect_name="spanner")
        assert conn.execute(stmt).scalars().all() == [1]
        bad = sa.select(t.c.id).with_hint(t, "@{FORCE_INDEX=no_such_index}", "spanner")
        with pytest.raises(sa.exc.DBAPIError):
            conn.execute(bad).all()  # the hint really reached Spanner


def _insert(engine: sa.Engine) -> sa.Insert:
    t = sa.Table("t", sa.MetaData(), sa.Column("id", sa.BigInteger, primary_key=True))
    return t.insert().values(id=1)


@pytest.mark.parametrize(
    ("method", "code", "error"),
    [
        ("Commit", "NOT_FOUND", sa.exc.IntegrityError),
        ("ExecuteStreamingSql", "NOT_FOUND", sa.exc.IntegrityError),
        ("Commit", "PERMISSION_DENIED", sa.exc.OperationalError),
    ],
)
def test_client_errors_reach_sqlalchemy_as_dbapi_errors(
    mock_spanner: Any, method: str, code: str, error: type[Exception]
) -> None:
    engine = mock_spanner.engine()
    insert = _insert(engine)
    mock_spanner.add_update_count(str(insert.compile(engine)), 1)
    mock_spanner.add_error(method, code, "refused by the test", times=2)
    with pytest.raises(error, match="refused by the test") as caught, engine.begin() as conn:
        conn.execute(insert)
    assert isinstance(caught.value, sa.exc.DBAPIError)
    assert isinstance(caught.value.orig.__cause__, GoogleAPICallError)
    engine.dispose()


@pytest.mark.parametrize("method", ["Commit", "ExecuteStreamingSql"])
def test_upstream_dbapi_lets_not_found_escape_unmapped(mock_spanner: Any, method: str) -> None:
    engine = mock_spanner.engine()
    insert = _insert(engine)
    sql = str(insert.compile(engine))
    mock_spanner.add_update_count(sql, 1)
    mock_spanner.add_error(method, "NOT_FOUND", "refused by the test", times=2)
    raw = engine.raw_connection()
    try:
        dbapi_conn = raw.driver_connection
        with pytest.raises(NotFound) as caught:
            cursor = dbapi_conn.cursor()
            cursor.execute(sql, {"a0": 1})
            dbapi_conn.commit()
        assert not isinstance(caught.value, dbapi_exceptions.Error)
    finally:
        raw.close()
        engine.dispose()


# ---------------------------------------------------------------- Spanner's parameter limit


def test_dialect_batches_under_spanners_parameter_limit() -> None:
    assert SpannerDialect.insertmanyvalues_max_parameters == 950
    assert SpannerDialect.use_insertmanyvalues  # the flush batches multi-VALUES INSERTs


def test_upstream_batches_over_spanners_parameter_limit() -> None:
    # SQLAlchemy's default: 1,000 rows or 32,700 parameters per batch, far over 950
    assert stock.SpannerDialect.insertmanyvalues_max_parameters > 950
    assert stock.SpannerDialect.use_insertmanyvalues


class _ParamBase(orm.DeclarativeBase):
    pass


class FiveColumns(_ParamBase):
    """Five values sent per row; the generated column makes the flush fetch it back
    (RETURNING), which is when SQLAlchemy batches rows into one multi-VALUES INSERT."""

    __tablename__ = "five"
    id: orm.Mapped[int] = orm.mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    c1: orm.Mapped[int] = orm.mapped_column(sa.BigInteger)
    c2: orm.Mapped[int] = orm.mapped_column(sa.BigInteger)
    c3: orm.Mapped[str] = orm.mapped_column(sa.String(16))
    c4: orm.Mapped[str] = orm.mapped_column(sa.String(16))
    generated: orm.Mapped[int] = orm.mapped_column(sa.BigInteger, sa.Computed("c1 + 1"))


class ElevenColumns(_ParamBase):
    __table__ = sa.Table(
        "eleven",
        _ParamBase.metadata,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        *[sa.Column(f"c{i}", sa.BigInteger) for i in range(1, 11)],
        sa.Column("generated", sa.BigInteger, sa.Computed("c1 + 1")),
    )


class ParameterCounter:
    """Records the number of parameters of every statement the engine sends."""

    def __init__(self, engine: sa.Engine) -> None:
        self.counts: list[int] = []
        sa.event.listen(engine, "before_cursor_execute", self.record)

    def record(self, conn: Any, cursor: Any, stmt: str, params: Any, ctx: Any, many: bool) -> None:
        if stmt.lstrip().upper().startswith("INSERT"):
            # executemany: a list of rows; a single statement: the values of one statement
            nested = many and params and isinstance(params[0], (list, tuple, dict))
            self.counts.append(max(len(p) for p in params) if nested else len(params))


def five_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": i, "c1": i, "c2": i, "c3": "x", "c4": "y"} for i in range(start, start + n)]


def count_rows(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


@pytest.mark.emulator
@pytest.mark.parametrize(("model", "n"), [(FiveColumns, 200), (ElevenColumns, 100)])
def test_orm_flush_respects_the_parameter_limit(
    spanner_engine: sa.Engine, model: Any, n: int
) -> None:
    _ParamBase.metadata.create_all(spanner_engine)
    counter = ParameterCounter(spanner_engine)
    table = model.__table__
    columns = [c.key for c in table.columns if c.key != "generated"]

    def value(column: str, i: int) -> Any:
        return "v" if isinstance(table.c[column].type, sa.String) else i

    with orm.Session(spanner_engine) as session:
        session.add_all([model(**{c: value(c, i) for c in columns}) for i in range(n)])
        session.commit()
    assert count_rows(spanner_engine, model.__table__) == n
    assert len(counter.counts) >= 2  # batched, each batch under the limit
    assert max(counter.counts) <= 950


@pytest.mark.emulator
def test_executemany_with_returning_respects_the_limit(spanner_engine: sa.Engine) -> None:
    _ParamBase.metadata.create_all(spanner_engine)
    table = FiveColumns.__table__
    counter = ParameterCounter(spanner_engine)
    with spanner_engine.begin() as conn:
        ids = conn.execute(sa.insert(table).returning(table.c.id), five_rows(500)).scalars().all()
    assert len(set(ids)) == 500
    assert max(counter.counts) <= 950
    with spanner_engine.begin() as conn:  # plain executemany: one statement per row
        conn.execute(sa.insert(table), five_rows(400, start=500))
    assert count_rows(spanner_engine, table) == 900


@pytest.mark.emulator
def test_orm_bulk_insert_respects_the_limit(spanner_engine: sa.Engine) -> None:
    _ParamBase.metadata.create_all(spanner_engine)
    counter = ParameterCounter(spanner_engine)
    with orm.Session(spanner_engine) as session:
        stmt = sa.insert(FiveColumns).returning(FiveColumns.id, FiveColumns.generated)
        rows = session.execute(stmt, five_rows(300)).all()
        session.execute(sa.insert(FiveColumns), five_rows(300, start=1000))
        session.commit()
    assert sorted(r.generated for r in rows) == [i + 1 for i in range(300)]
    assert count_rows(spanner_engine, FiveColumns.__table__) == 600
    assert max(counter.counts) <= 950


@pytest.mark.emulator
def test_multi_values_insert_over_the_limit_is_refused_before_sending(
    spanner_engine: sa.Engine,
) -> None:
    _ParamBase.metadata.create_all(spanner_engine)
    table = FiveColumns.__table__
    too_many = pytest.raises(sa.exc.ProgrammingError, match="at most 950 per statement")
    with too_many, spanner_engine.begin() as conn:
        conn.execute(sa.insert(table).values(five_rows(200)))
    assert count_rows(spanner_engine, table) == 0
    with spanner_engine.begin() as conn:
        conn.execute(sa.insert(table).values(five_rows(190)))  # 190 x 5 = 950
    assert count_rows(spanner_engine, table) == 190
    long_in = pytest.raises(sa.exc.ProgrammingError, match="split a long IN list")
    with long_in, spanner_engine.connect() as conn:
        conn.execute(sa.select(table.c.id).where(table.c.c1.in_(range(1000)))).all()
