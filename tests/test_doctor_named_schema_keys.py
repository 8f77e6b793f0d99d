"""doctor reads split keys of tables and indexes in a named schema (issue 43).

Spanner names them ``schema.Name(...)`` (``audit.AuditLogs(...)``): the parser refused
that as malformed, and the catalog keyed every table by its bare name, so a bare key
of the default schema's table could decode as another schema's table of that name.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from sharded_orm.errors import ShardValueError
from sharded_orm.tools.doctor.keys import Catalog, parse_key


def _metadata() -> sa.MetaData:
    md = sa.MetaData()
    sa.Table(
        "AuditLogs",
        md,
        sa.Column("LogId", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("Actor", sa.String(40)),
        sa.Index("AuditLogsByActor", "Actor"),
        schema="audit",
    )
    sa.Table(  # the default schema's table of the same name, another key
        "AuditLogs",
        md,
        sa.Column("Actor", sa.String(40), primary_key=True),
    )
    return md


def test_a_named_schema_key_parses() -> None:
    raw = parse_key('audit.AuditLogs(7,"x")')
    assert raw.name == "audit.AuditLogs"
    assert raw.parts[1] == "x"


def test_a_named_schema_key_decodes_as_that_schema_s_table() -> None:
    catalog = Catalog(_metadata())
    key = catalog.decode("audit.AuditLogs(7)")
    assert (key.kind, key.table) == ("table", "AuditLogs")
    assert [(p.column, p.value) for p in key.parts] == [("LogId", 7)]


def test_a_bare_key_is_the_default_schema_s_table() -> None:
    catalog = Catalog(_metadata())
    key = catalog.decode('AuditLogs("bob")')
    assert [(p.column, p.value) for p in key.parts] == [("Actor", "bob")]


def test_a_named_schema_index_key_decodes_with_the_table_key_after_it() -> None:
    catalog = Catalog(_metadata())
    key = catalog.decode('audit.AuditLogsByActor("bob",7)')
    assert key.kind == "index"
    assert [(p.column, p.value) for p in key.parts] == [("Actor", "bob"), ("LogId", 7)]


def test_an_unknown_schema_is_an_unknown_key_space_not_another_table() -> None:
    catalog = Catalog(_metadata())
    assert catalog.decode("other.AuditLogs(7)").kind == "unknown"


@given(
    schema=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
    name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
    key=st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
def test_any_qualified_name_parses(schema: str, name: str, key: int) -> None:
    raw = parse_key(f"{schema}.{name}({key})")
    assert raw.name == f"{schema}.{name}"
    assert raw.parts[0].text == str(key)


@pytest.mark.parametrize("text", ["a.b.c(1)", ".T(1)", "a.(1)", "a..b(1)"])
def test_names_spanner_does_not_print_are_refused(text: str) -> None:
    with pytest.raises(ShardValueError, match="malformed split key"):
        parse_key(text)
