"""The docs show DDL the code really generates."""

from __future__ import annotations

import re
from pathlib import Path

import sqlalchemy as sa
from seed_models import Naive, Sharded
from sqlalchemy.schema import CreateIndex, CreateTable

from sharded_orm.spanner.dialect import SpannerDialect

DOCS = Path(__file__).parent.parent / "docs"


def generated_ddl(metadata: sa.MetaData) -> set[str]:
    dialect = SpannerDialect()
    out = set()
    for t in metadata.sorted_tables:
        out.add(str(CreateTable(t).compile(dialect=dialect)).strip().replace(" \n", "\n") + ";")
        out.update(str(CreateIndex(ix).compile(dialect=dialect)).strip() + ";" for ix in t.indexes)
    return out


def test_schema_guide_ddl_is_what_the_models_generate() -> None:
    known = generated_ddl(Naive.metadata) | generated_ddl(Sharded.metadata)
    blocks = re.findall(r"```sql\n(.*?)```", (DOCS / "schema.md").read_text(), re.S)
    assert len(blocks) == 6
    for block in blocks:
        for statement in re.split(r"(?<=;)\n", block.strip()):
            assert statement.strip() in known, statement
