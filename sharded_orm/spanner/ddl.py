"""Our DDL compiler and identifier preparer (see :mod:`.dialect`, fixes 1, 4 and 7).

Apart from the dialect so that the DDL hooks keyed by dialect name (:mod:`.stock`) can
render a stock-dialect engine's DDL with them without importing the dialect module.
"""

from __future__ import annotations

import re
from typing import Any

from google.cloud.sqlalchemy_spanner import sqlalchemy_spanner as _stock
from sqlalchemy import Table
from sqlalchemy.sql.compiler import DDLCompiler

from sharded_orm.checks import check_spanner_name
from sharded_orm.schema.keys import is_descending

_ESCAPES = {"\\": "\\\\", "`": "\\`"}


def _escape_char(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch


class SpannerIdentifierPreparer(_stock.SpannerIdentifierPreparer):  # type: ignore[misc]
    """Backtick quoting with GoogleSQL's escapes; in DDL, Spanner's naming rule."""

    ddl_names = False

    def _escape_identifier(self, value: str) -> str:
        return "".join(_escape_char(ch) for ch in value)

    def _unescape_identifier(self, value: str) -> str:
        return re.sub(
            r"\\(x[0-9a-f]{2}|.)",
            lambda m: chr(int(m[1][1:], 16)) if len(m[1]) == 3 else m[1],
            value,
        )

    def quote(self, ident: str) -> str:
        if self.ddl_names:
            check_spanner_name(ident, "Spanner DDL name")
        return str(super().quote(ident))

    def for_ddl(self) -> SpannerIdentifierPreparer:
        """A copy that refuses, instead of quoting, any name Spanner would not accept."""
        prep = self.__class__.__new__(self.__class__)
        prep.__dict__.update(self.__dict__)
        prep._strings = {}
        prep.ddl_names = True
        return prep


class ShardedSpannerDDLCompiler(_stock.SpannerDDLCompiler):  # type: ignore[misc]
    sharded_orm_dialect = True  # .stock.MARK: the DDL hooks keyed by dialect name defer to us

    # Every name a DDL statement renders goes through this preparer, so checking it here
    # covers tables, columns, indexes, sequences, constraints and interleave parents alike.
    @property
    def preparer(self) -> Any:
        return self._ddl_preparer

    @preparer.setter
    def preparer(self, value: Any) -> None:
        if not isinstance(value, SpannerIdentifierPreparer):
            # a stock dialect's (a stock engine's DDL that .stock gives our rendering)
            value = SpannerIdentifierPreparer(self.dialect)
        self._ddl_preparer = value.for_ddl()

    def post_create_table(self, table: Table) -> str:
        if "TEMPORARY" in table._prefixes:
            raise NotImplementedError("Temporary tables are not supported.")
        quote = self.preparer.quote
        parts = [
            quote(c.name) + (" DESC" if is_descending(c) else "") for c in table.primary_key.columns
        ]
        text = f" PRIMARY KEY ({', '.join(parts)})"
        parent = table.kwargs.get("spanner_interleave_in")
        if parent:
            text += f",\nINTERLEAVE IN PARENT {quote(parent)}"
            if table.kwargs.get("spanner_interleave_on_delete_cascade"):
                text += " ON DELETE CASCADE"
        return text

    def visit_create_index(
        self, create: Any, include_schema: bool = True, include_table_schema: bool = True, **kw: Any
    ) -> str:
        # The generic CREATE INDEX (columns, DESC), then Spanner's clauses. The stock
        # version iterates ``storing`` even when it is unset (None) once the keywords are
        # declared, and would render an empty ``STORING ()``. As the stock one, the index
        # of a table in a named schema is named in that schema (``schema.ix``).
        text: str = DDLCompiler.visit_create_index(  # type: ignore[no-untyped-call]
            self, create, include_schema, include_table_schema, **kw
        )
        index = create.element
        options = index.dialect_options["spanner"]
        quote = self.preparer.quote
        if options.get("null_filtered"):
            text = re.sub(r"^(\s*CREATE\s+(?:UNIQUE\s+)?)INDEX", r"\1NULL_FILTERED INDEX", text)
        storing = options.get("storing") or ()
        if storing:
            names = [c if isinstance(c, str) else c.name for c in storing]
            cols = [index.table.c[n].name if n in index.table.c else n for n in names]
            text += " STORING (" + ", ".join(quote(c) for c in cols) + ")"
        parent = options.get("interleave_in")
        if parent:
            text += f", INTERLEAVE IN {quote(parent)}"
        return text
