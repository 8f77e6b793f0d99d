"""Server defaults as Spanner stores them: quoted literals compared by value."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext
from hypothesis import given
from hypothesis import strategies as st

from alembic_ext.defaults import string_literal_value
from sharded_orm.spanner.dialect import SpannerDialect


@given(st.text())
def test_escaped_literal_reads_back(value: str) -> None:
    body = value.replace("\\", "\\\\").replace("'", "\\'")
    assert string_literal_value(f"'{body}'") == value


@given(st.text().filter(lambda v: '"""' not in v and not v.endswith(("\\", '"'))))
def test_raw_triple_quoted_literal_reads_back(value: str) -> None:
    assert string_literal_value(f'r"""{value}"""') == value


def test_not_one_literal() -> None:
    for sql in ("5", "'a' || 'b'", "CONCAT('a', 'b')", "'a'b'", "r'a\\'"):
        assert string_literal_value(sql) is None, sql


def _differs(meta_default: object, reflected: str) -> bool:
    ctx = MigrationContext.configure(dialect=SpannerDialect(), opts={"as_sql": True})
    meta = sa.Column("c", sa.String(10), server_default=meta_default)  # type: ignore[arg-type]
    rendered = meta_default if isinstance(meta_default, str) else str(meta_default)
    real = sa.Column("c", sa.String(10))
    return bool(ctx.impl.compare_server_default(real, meta, rendered, reflected))


def test_compare_server_default() -> None:
    assert not _differs("plain", "'plain'")
    assert not _differs("it's", 'r"""it\'s"""')
    assert _differs("fancy", "'plain'")
    assert not _differs(sa.text("5"), "5")
    assert not _differs(sa.text("(a + b)"), "a  +  b")
    assert _differs(sa.text("(a) + (b)"), "a) + (b")
    assert _differs(sa.text("6"), "5")
