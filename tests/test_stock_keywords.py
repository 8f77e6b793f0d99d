"""Every ``spanner_*`` keyword sqlalchemy-spanner honours is accepted with sharded-orm
imported, and renders as the stock dialect renders it (issue 31, item 1).

Our dialect declares ``construct_arguments``, which switches on SQLAlchemy's validation
of every ``spanner_*`` keyword: one the stock dialect reads that we do not declare is
an ``ArgumentError`` at import for every app that uses it. The keywords are found by
reading the installed stock module's source (its AST), so a keyword upstream starts
reading fails ``test_we_declare_every_keyword_the_stock_dialect_reads`` until declared.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from google.cloud.sqlalchemy_spanner import sqlalchemy_spanner as stock
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.sql.base import DialectKWArgs

import sharded_orm  # noqa: F401  (registers our dialect, as an app importing the library)
from sharded_orm.spanner.dialect import SpannerDialect

HERE = Path(__file__).resolve().parent

#: the stock methods that read dialect options -> the construct whose options they read
READERS: dict[str, type[DialectKWArgs]] = {
    "get_column_specification": sa.Column,
    "returning_clause": sa.Column,
    "visit_foreign_key_constraint": sa.ForeignKeyConstraint,
    "post_create_table": sa.Table,
    "visit_create_index": sa.Index,
}
#: ``spanner_*`` strings of the stock module that name no keyword a user passes: its
#: compiler flags, and reflection's output (``Index`` ``storing``, declared)
NOT_KEYWORDS = {"spanner_aliased", "spanner_is_returning", "spanner_storing"}


def _is_spanner_options(node: ast.AST, names: set[str]) -> bool:
    """``x.dialect_options["spanner"]``, ``x.dialect_options.get("spanner", ...)`` or a
    name bound to one of them."""
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Subscript):
        owner, key = node.value, node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr != "get" or not node.args:
            return False
        owner, key = node.func.value, node.args[0]
    else:
        return False
    return (
        isinstance(owner, ast.Attribute)
        and owner.attr == "dialect_options"
        and isinstance(key, ast.Constant)
        and key.value == "spanner"
    )


def _key_read(node: ast.AST) -> tuple[ast.AST, str] | None:
    """(the mapping read, the constant key) for ``m.get("k")``, ``m["k"]``, ``"k" in m``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        return node.func.value, str(node.args[0].value)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.value, str(node.slice.value)
    if (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Constant)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.In)
    ):
        return node.comparators[0], str(node.left.value)
    return None


def keywords_read() -> set[tuple[str, str]]:
    """(stock method, keyword without ``spanner_``) for every dialect option it reads."""
    tree = ast.parse(Path(stock.__file__).read_text())
    found: set[tuple[str, str]] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        names = {
            t.id
            for a in ast.walk(fn)
            if isinstance(a, ast.Assign) and _is_spanner_options(a.value, set())
            for t in a.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(fn):
            read = _key_read(node)
            if read is None:
                continue
            mapping, key = read
            if _is_spanner_options(mapping, names) and key != "spanner":
                found.add((fn.name, key))
            elif (
                isinstance(mapping, ast.Attribute)
                and mapping.attr == "kwargs"
                and key.startswith("spanner_")
            ):
                found.add((fn.name, key.removeprefix("spanner_")))
    return found


def test_the_scan_finds_what_the_stock_dialect_reads_today() -> None:
    """The scan itself works (sqlalchemy-spanner 1.20 reads these)."""
    assert {
        ("get_column_specification", "allow_commit_timestamp"),
        ("returning_clause", "exclude_from_returning"),
        ("visit_foreign_key_constraint", "not_enforced"),
        ("post_create_table", "interleave_in"),
        ("post_create_table", "interleave_on_delete_cascade"),
        ("visit_create_index", "storing"),
        ("visit_create_index", "null_filtered"),
        ("visit_create_index", "interleave_in"),
    } <= keywords_read()


def test_no_spanner_keyword_escapes_the_scan() -> None:
    """Every ``spanner_*`` string and every ``dialect_options`` use of the stock module is
    one the scan reads: a new form of reading an option fails here."""
    tree = ast.parse(Path(stock.__file__).read_text())
    scanned = {kw for _, kw in keywords_read()}
    strings = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and re.fullmatch(r"spanner_[a-z_]+", n.value)
    }
    unknown = {s for s in strings - NOT_KEYWORDS if s.removeprefix("spanner_") not in scanned}
    assert not unknown, f"the stock dialect uses {unknown}: a keyword? declare it, or list it"
    options = [
        n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "dialect_options"
    ]
    parents = {
        id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)
    }
    for node in options:
        parent = parents[id(node)]
        if isinstance(parent, ast.Attribute):  # .get(...)
            parent = parents[id(parent)]
        compare = isinstance(parent, ast.Compare) and isinstance(parent.left, ast.Constant)
        assert _is_spanner_options(parent, set()) or compare, ast.unparse(parent)


def test_we_declare_every_keyword_the_stock_dialect_reads() -> None:
    declared: dict[type, set[str]] = {}
    for cls, args in SpannerDialect.construct_arguments:
        declared.setdefault(cls, set()).update(args)
    missing = []
    for method, keyword in sorted(keywords_read()):
        cls = READERS.get(method)
        assert cls is not None, (
            f"sqlalchemy-spanner now reads spanner_{keyword} in {method}: add the method "
            "to READERS with the construct it compiles, and declare the keyword"
        )
        if keyword not in declared.get(cls, set()):
            missing.append(f"{cls.__name__} spanner_{keyword} (read in {method})")
    assert not missing, "declare in SpannerDialect.construct_arguments: " + ", ".join(missing)
    # and nothing more than the stock dialect honours
    read = {(READERS[m], k) for m, k in keywords_read()}
    assert {(c, k) for c, ks in declared.items() for k in ks} == read


def test_every_stock_keyword_is_accepted_without_warnings() -> None:
    """The upstream samples' model, as they write it: no ArgumentError, no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        col = sa.Column("Ts", sa.DateTime, spanner_allow_commit_timestamp=True)
        hidden = sa.Column("V", sa.Integer, spanner_exclude_from_returning=True)
        fk = sa.ForeignKey("p.id", spanner_not_enforced=True)
        t = sa.Table("t", sa.MetaData(), sa.Column("id", sa.Integer, fk), col, hidden)
        fkc = sa.ForeignKeyConstraint(["id"], ["p.id"], spanner_not_enforced=True)
    assert col.dialect_options["spanner"]["allow_commit_timestamp"] is True
    assert hidden.dialect_options["spanner"]["exclude_from_returning"] is True
    assert fkc.dialect_options["spanner"]["not_enforced"] is True
    (constraint,) = t.foreign_key_constraints
    assert constraint.dialect_options["spanner"]["not_enforced"] is True
    with pytest.raises(sa.exc.ArgumentError, match="spanner_allow_commit_timestmp"):
        sa.Column("Ts", sa.DateTime, spanner_allow_commit_timestmp=True)  # misspelt


def test_every_keyword_renders_as_the_stock_dialect_renders_it() -> None:
    """The same constructs compiled by the stock dialect in a process that never imports
    sharded-orm, and by ours here: the same SQL, except that we quote every name of a
    primary key and an interleave parent (fix 1 of sharded_orm/spanner/dialect.py), and
    that an UPDATE with no WHERE gets ``WHERE true`` before its ``THEN RETURN`` (fix 15,
    docs/dialect.md item 13: the DB-API would append ``WHERE 1=1`` after it)."""
    out = subprocess.run(
        [sys.executable, str(HERE / "stock_constructs.py")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    theirs = json.loads(out.stdout)
    sys.path.insert(0, str(HERE))
    try:
        from stock_constructs import rendered
    finally:
        sys.path.remove(str(HERE))
    ours = rendered(SpannerDialect())
    assert set(ours) == set(theirs)
    theirs["update_returning"] = theirs["update_returning"].replace(
        " THEN RETURN", " WHERE true THEN RETURN", 1
    )
    for name, sql in theirs.items():
        assert ours[name].replace("`", "") == sql.replace("`", ""), name
    assert "OPTIONS (allow_commit_timestamp=true)" in ours["table_commit_timestamp"]
    assert "NOT ENFORCED" in ours["table_fk_constraint_not_enforced"]
    assert "NOT ENFORCED" in ours["table_fk_not_enforced"]
    assert "Updated" not in ours["insert_returning"].partition("THEN RETURN")[2]
    assert (
        ours["table_interleaved"]
        .strip()
        .endswith(
            "PRIMARY KEY (`SingerId`, `AlbumId`),\nINTERLEAVE IN PARENT `Singers` ON DELETE CASCADE"
        )
    )


STOCK_MODEL = """
import sqlalchemy as sa

md = sa.MetaData()
sa.Table("singers", md, sa.Column("id", sa.String(36), primary_key=True))
sa.Table(
    "concerts",
    md,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("singer_id", sa.String(36), sa.ForeignKey("singers.id", spanner_not_enforced=True)),
    sa.Column("updated", sa.DateTime(timezone=True), spanner_allow_commit_timestamp=True),
)
"""


def test_lint_reads_a_model_written_for_the_stock_dialect(tmp_path: Path) -> None:
    """``sharded-orm lint`` imports the app's module: it failed at import too."""
    (tmp_path / "stock_model.py").write_text(STOCK_MODEL)
    cli = Path(sys.executable).parent / "sharded-orm"
    out = subprocess.run(
        [str(cli), "lint", "stock_model"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
    )
    assert "ArgumentError" not in out.stdout + out.stderr
    assert out.returncode == 0, out.stderr
    assert "0 errors" in out.stdout


CONSTRUCTS: dict[type[DialectKWArgs], Any] = {
    sa.Column: lambda **kw: sa.Column("c", sa.Integer, **kw),
    sa.Table: lambda **kw: sa.Table("t", sa.MetaData(), sa.Column("a", sa.Integer), **kw),
    sa.Index: lambda **kw: sa.Index("ix", "a", **kw),
    sa.ForeignKeyConstraint: lambda **kw: sa.ForeignKeyConstraint(["a"], ["p.a"], **kw),
}
DECLARED = {(cls, kw) for cls, args in SpannerDialect.construct_arguments for kw in args}
ALL_KEYWORDS = sorted({kw for _, kw in DECLARED})


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(list(CONSTRUCTS)),
    st.one_of(
        st.sampled_from(ALL_KEYWORDS),
        st.from_regex(r"[a-z][a-z_]{0,20}", fullmatch=True),
    ),
    st.one_of(st.booleans(), st.none(), st.just(["a"]), st.just("p")),
)
def test_a_keyword_is_accepted_exactly_where_the_stock_dialect_reads_it(
    cls: type[DialectKWArgs], keyword: str, value: Any
) -> None:
    make = CONSTRUCTS[cls]
    if (cls, keyword) in DECLARED:
        made = make(**{f"spanner_{keyword}": value})
        assert made.dialect_options["spanner"][keyword] == value
    else:
        with pytest.raises(sa.exc.ArgumentError, match=f"spanner_{keyword}"):
            make(**{f"spanner_{keyword}": value})
