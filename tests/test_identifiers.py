"""No name becomes SQL: identifiers reaching DDL, hints and text SQL are quoted or refused.

On the emulator a ``ShardedIndex`` (or plain ``Index``) named
``ix` ON t (ts); DROP TABLE victim; CREATE INDEX `z`` used to drop ``victim`` during
``create_all``: the stock preparer does not escape backticks and the DB-API splits DDL at
``;``. Now every DDL name must follow Spanner's naming rule or is refused before any DDL is
sent; in queries, names are escaped as GoogleSQL does, so odd labels round-trip.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.schema import CreateIndex, CreateTable

from sharded_orm import ShardConfigError, ShardedIndex, interleave_in, shard_column
from sharded_orm.checks import check_spanner_name, quote_identifier
from sharded_orm.spanner.dialect import SpannerDialect

INJECTION = "ix` ON t (ts); DROP TABLE victim; CREATE INDEX `z"
BAD_NAMES = [
    INJECTION,
    "has`backtick",
    'has"quote',
    "has'quote",
    "semi;colon",
    "with space",
    "ünïcode",
    "tab\tname",
    "1leading_digit",
    "_leading_underscore",
    "a" * 129,
]


def victim_and(spanner_engine: sa.Engine) -> sa.MetaData:
    md = sa.MetaData()
    sa.Table("victim", md, sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False))
    md.create_all(spanner_engine)
    return md


def table_names(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def sharded_table(md: sa.MetaData) -> sa.Table:
    shard = shard_column("id", count=4).column
    shard.name = shard.key = "shard"
    return sa.Table(
        "t",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("ts", sa.BigInteger),
        shard,
    )


# ---------------------------------------------------------------------- offline


@pytest.mark.parametrize("name", [*BAD_NAMES, ""])
def test_sharded_index_name_refused_at_declaration(name: str) -> None:
    with pytest.raises(ShardConfigError, match="not a valid Spanner name"):
        ShardedIndex(name, "ts", shard="shard")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_interleave_parent_refused(name: str) -> None:
    with pytest.raises(ShardConfigError, match="interleave parent"):
        interleave_in(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_sharded_index_interleave_parent_refused(name: str) -> None:
    with pytest.raises(ShardConfigError, match="interleave_in"):
        ShardedIndex("ix", "ts", shard="shard", interleave_in=name)


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("where", ["table", "column", "index", "key", "sequence", "parent"])
def test_ddl_refuses_every_bad_name(name: str, where: str) -> None:
    md = sa.MetaData()
    table_name = name if where == "table" else "t"
    col = name if where in ("column", "key") else "c"
    extra: dict[str, Any] = {"spanner_interleave_in": name} if where == "parent" else {}
    default = sa.Sequence(name) if where == "sequence" else None
    args: list[Any] = [sa.Column("id", sa.BigInteger, default, primary_key=True)]
    args.append(sa.Column(col, sa.BigInteger, primary_key=where == "key"))
    t = sa.Table(table_name, md, *args, **extra)
    dialect = SpannerDialect()
    with pytest.raises(ShardConfigError, match="not a valid Spanner name"):
        if where == "index":
            CreateIndex(sa.Index(name, t.c.c)).compile(dialect=dialect)
        elif where == "sequence":
            sa.schema.CreateSequence(default).compile(dialect=dialect)  # type: ignore[arg-type]
        else:
            CreateTable(t).compile(dialect=dialect)


def test_reserved_words_are_quoted_not_refused() -> None:
    t = sa.Table(
        "Order",
        sa.MetaData(),
        sa.Column("select", sa.BigInteger, primary_key=True),
        spanner_interleave_in="Group",
    )
    ddl = str(CreateTable(t).compile(dialect=SpannerDialect()))
    assert "CREATE TABLE `Order`" in ddl
    assert "PRIMARY KEY (`select`)" in ddl
    assert "INTERLEAVE IN PARENT `Group`" in ddl


@given(st.text(max_size=20))
def test_query_names_escape_and_unescape(name: str) -> None:
    prep = SpannerDialect().identifier_preparer
    quoted = prep.quote_identifier(name)
    body = quoted[1:-1]
    # no unescaped backtick inside, no raw control character
    assert "`" not in body.replace("\\\\", "").replace("\\`", "")
    assert not any(ord(ch) < 0x20 for ch in body)
    assert prep._unescape_identifier(body) == name


def test_upstream_preparer_does_not_escape_backticks() -> None:
    from google.cloud.sqlalchemy_spanner import sqlalchemy_spanner as stock

    t = sa.Table("t", sa.MetaData(), sa.Column("ts", sa.BigInteger))
    ddl = str(CreateIndex(sa.Index(INJECTION, t.c.ts)).compile(dialect=stock.SpannerDialect()))
    assert "; DROP TABLE victim;" in ddl  # when this fails, upstream escapes: keep our check


@pytest.mark.parametrize(
    ("dialect", "name", "quoted"),
    [
        ("sqlite", 'a"b', '"a""b"'),
        ("sqlite", "with space", '"with space"'),
        ("spanner", "Timestamp", "`Timestamp`"),
        ("spanner", "shard_v2", "`shard_v2`"),
    ],
)
def test_quote_identifier(dialect: str, name: str, quoted: str) -> None:
    d = SpannerDialect() if dialect == "spanner" else sa.create_engine("sqlite://").dialect
    assert quote_identifier(d, name) == quoted


@pytest.mark.parametrize("name", ["a`b", "a;b", "a b", "ünï", ""])
def test_quote_identifier_refuses_on_spanner(name: str) -> None:
    with pytest.raises(ShardConfigError):
        quote_identifier(SpannerDialect(), name)


@pytest.mark.parametrize("name", ["a\nb", "a\x00b", ""])
def test_quote_identifier_refuses_control_characters_everywhere(name: str) -> None:
    with pytest.raises(ShardConfigError, match="control characters"):
        quote_identifier(sa.create_engine("sqlite://").dialect, name)


@given(st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,127}", fullmatch=True))
def test_every_spanner_name_passes(name: str) -> None:
    assert check_spanner_name(name) == name


# ---------------------------------------------------------------------- emulator


@pytest.mark.emulator
def test_injection_through_an_index_name_is_refused(spanner_engine: sa.Engine) -> None:
    victim_and(spanner_engine)
    md = sa.MetaData()
    t = sharded_table(md)
    sa.Index(INJECTION, t.c.ts)
    with pytest.raises(ShardConfigError, match="not a valid Spanner name"):
        md.create_all(spanner_engine)
    assert "victim" in table_names(spanner_engine)


@pytest.mark.emulator
@pytest.mark.parametrize("name", BAD_NAMES[:8])
@pytest.mark.parametrize("where", ["table", "column", "index", "parent"])
def test_bad_names_never_touch_another_table(
    spanner_engine: sa.Engine, name: str, where: str
) -> None:
    victim_and(spanner_engine)
    md = sa.MetaData()
    table_name = name if where == "table" else "t"
    col = name if where == "column" else "c"
    extra: dict[str, Any] = {"spanner_interleave_in": name} if where == "parent" else {}
    t = sa.Table(
        table_name,
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column(col, sa.BigInteger),
        **extra,
    )
    if where == "index":
        sa.Index(name, t.c.c)
    with pytest.raises(ShardConfigError, match="not a valid Spanner name"):
        md.create_all(spanner_engine)
    assert table_names(spanner_engine) == {"victim"}


@pytest.mark.emulator
def test_reserved_and_mixed_case_names_work(spanner_engine: sa.Engine) -> None:
    md = sa.MetaData()
    parent = sa.Table(
        "Order", md, sa.Column("select", sa.BigInteger, primary_key=True, autoincrement=False)
    )
    child = sa.Table(
        "Group",
        md,
        sa.Column("select", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("From", sa.BigInteger, primary_key=True, autoincrement=False),
        **interleave_in("Order"),
    )
    sa.Index("Where", child.c.From)
    md.create_all(spanner_engine)
    with spanner_engine.begin() as conn:
        conn.execute(parent.insert(), {"select": 1})
        conn.execute(child.insert(), {"select": 1, "From": 2})
    with spanner_engine.connect() as conn:
        stmt = sa.select(child.c.From).with_hint(child, "@{FORCE_INDEX=`Where`}", "spanner")
        assert conn.execute(stmt).scalars().all() == [2]


@pytest.mark.emulator
@pytest.mark.parametrize("label", ["a`b", "semi;colon", "with space", "back\\slash", "q'uote"])
def test_odd_labels_round_trip_in_queries(spanner_engine: sa.Engine, label: str) -> None:
    with spanner_engine.connect() as conn:
        result = conn.execute(sa.select(sa.literal(1).label(label)))
        assert list(result.keys()) == [label]
        assert result.scalar_one() == 1


@pytest.mark.emulator
def test_force_index_hint_refuses_a_bad_index_name(spanner_engine: sa.Engine) -> None:
    from sharded_orm import sharded_select

    md = sa.MetaData()
    sharded_table(md)
    with pytest.raises(ShardConfigError, match="plain identifier"):
        sharded_select(md.tables["t"], index="ix}; DROP TABLE victim")


@pytest.mark.parametrize("name", ["a`b", "a; DROP TABLE victim", "ünï"])
def test_shard_sql_refuses_names_it_would_paste(name: str) -> None:
    from sharded_orm.spanner.expressions import shard_sql

    with pytest.raises(ShardConfigError, match="not a valid Spanner name"):
        shard_sql([sa.Column(name, sa.String)], 8)


def test_shard_sql_checks_its_count() -> None:
    from sharded_orm.spanner.expressions import shard_sql

    with pytest.raises(ShardConfigError, match="shard count"):
        shard_sql([sa.Column("a", sa.String)], "8); DROP TABLE victim; --")  # type: ignore[arg-type]
