"""The statements ``merged()`` and ``page()`` accept: an allowlist of shapes, checked
before any statement runs.

A merge answers exactly when every row of the statement is one row of its FROMs,
computed from that row alone: then the first ``K`` rows of the union of each shard's
first rows are the statement's first ``K``. So a statement is accepted only when each
of its parts is one this module lists (docs/queries.md has the table):

- the select list: entities (their mapped expressions included), columns, and
  row-level expressions of them: operators, CASE, CAST, literals, bound values,
  functions named in ``ROW_FUNCTIONS`` (or declared with ``row_level``), and
  subqueries, which SQL evaluates in their own scope for each row;
- WHERE (SQL itself allows no aggregate or window there), joins (the sharded table on
  the side an outer join keeps, no FULL join; ``sharded_orm.read.order`` checks that
  each joined FROM has a key), DISTINCT, LIMIT and OFFSET;
- ORDER BY the merge's order (``sharded_orm.read.order``);
- ORM options: loader strategies (``joinedload``...; ``with_expression`` by the rule of
  the select list), loader criteria (applied in every statement of a read) and
  ``UserDefinedOption``; table hints.

Everything else is refused with why and what to do: window functions, aggregates,
GROUP BY, HAVING, DISTINCT ON, FOR UPDATE, SQL text (``text()``, ``literal_column``,
prefixes, suffixes, statement hints), CTEs added with ``add_cte``, options of other
kinds, and any part or construct this module does not list (a SQLAlchemy release that
adds one is refused until it is listed here).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect
from sqlalchemy.orm import UserDefinedOption
from sqlalchemy.sql import elements, functions, operators, selectable

from sharded_orm.errors import ShardConfigError


def _names(text: str) -> set[str]:
    return set(text.split())


#: functions computed from one row's values (SQLite's and Spanner's scalar functions),
#: lower case; an aggregate computed over the branches' rows would give another answer
ROW_FUNCTIONS = _names(
    """
    abs acos asin atan atan2 ceil ceiling cos cosh degrees div exp floor greatest
    ieee_divide least ln log log10 mod pi pow power radians round safe_add safe_divide
    safe_multiply safe_negate safe_subtract sign sin sinh sqrt tan tanh trunc coalesce
    ifnull nullif iif if zeroifnull ascii byte_length char char_length character_length chr
    code_points_to_bytes code_points_to_string concat ends_with format from_base32
    from_base64 from_hex hex instr length lower lpad ltrim normalize normalize_and_casefold
    octet_length printf quote regexp_contains regexp_extract regexp_extract_all
    regexp_instr regexp_replace repeat replace reverse rpad rtrim
    safe_convert_bytes_to_string soundex split starts_with strpos substr substring
    to_base32 to_base64 to_code_points to_hex trim unhex unicode upper glob like likelihood
    likely unlikely typeof zeroblob current_date current_time current_timestamp now
    localtime localtimestamp date datetime time julianday strftime timediff unixepoch
    date_add date_diff date_from_unix_date date_sub date_trunc extract format_date
    format_timestamp parse_date parse_timestamp timestamp timestamp_add timestamp_diff
    timestamp_micros timestamp_millis timestamp_seconds timestamp_sub timestamp_trunc
    unix_date unix_micros unix_millis unix_seconds farm_fingerprint md5 sha1 sha256 sha512
    bit_reverse bit_count json json_array json_array_length json_extract json_extract_array
    json_extract_scalar json_extract_string_array json_object json_query json_query_array
    json_quote json_type json_valid json_value json_value_array parse_json to_json
    to_json_string array_concat array_first array_includes array_is_distinct array_last
    array_length array_reverse array_to_string generate_array generate_date_array random
    generate_uuid
    """
)

#: aggregate functions named in refusals (every function not in ROW_FUNCTIONS is refused)
_AGGREGATES = frozenset(
    _names(
        """
    any_value array_agg array_concat_agg avg bit_and bit_or bit_xor count countif
    group_concat logical_and logical_or max min sum total string_agg stddev stddev_samp
    var_samp variance approx_count_distinct mode percentile_cont percentile_disc
    aggregate_strings rank dense_rank percent_rank cume_dist cube rollup grouping_sets
    """
    )
)

#: user constructs (``ClauseElement`` subclasses) declared row-level with ``row_level``
_ROW_CLASSES: set[type] = set()


def row_level(*functions_or_classes: str | type) -> None:
    """Declare your own SQL functions (by name, as ``func.<name>`` calls them) or your own
    constructs (``ColumnElement`` subclasses compiled with ``@compiles``) row-level:
    computed from one row's values alone, like ``lower()``, so that ``merged()`` and
    ``page()`` accept them in a select list. Declaring an aggregate or a window row-level
    makes those reads wrong: only declare what is."""
    for f in functions_or_classes:
        if isinstance(f, str) and f:
            ROW_FUNCTIONS.add(f.lower())
        elif isinstance(f, type) and issubclass(f, elements.ClauseElement):
            _ROW_CLASSES.add(f)
        else:
            raise ShardConfigError(
                f"row_level() takes function names (str) or ClauseElement subclasses, got {f!r}"
            )


def _refuse(what: str, why: str, instead: str) -> ShardConfigError:
    return ShardConfigError(f"merged()/page() cannot merge {what}: {why}. {instead}")


_ONE_QUERY = "Run it as one query (the statement itself, without merged()/page())"
_SUBQUERY = (
    "Compute it in a subquery, which SQL evaluates over the whole table for each row "
    "(select(func.count()).select_from(Model).scalar_subquery()), or run it as one query"
)

# Parts of a Select: accepted as they are (checked elsewhere, or changing nothing of
# what rows are read). Any other part that is set is refused.
_ACCEPTED_PARTS = frozenset(
    {
        "_where_criteria",  # row by row; subqueries in their own scope
        "_from_obj",  # joins: order.py checks their keys
        "_setup_joins",
        "_memoized_select_entities",  # the ORM's earlier entities (for joins)
        "_order_by_clauses",  # order.py checks it is the merge's order
        "_limit_clause",  # statement_window checks these
        "_offset_clause",
        "_fetch_clause",
        "_fetch_clause_options",
        "_distinct",  # order.py checks the order's columns are selected
        "_label_style",
        "_correlate",
        "_correlate_except",
        "_correlate_mode",
        "_hints",  # table hints (the FORCE_INDEX of sharded_select among them)
        "_annotations",
        "_propagate_attrs",
        "_compile_state_funcs",
        "_params",
        "dialect_options",
        "_compile_options",
        "_execution_options",
        "_independent_ctes_opts",
    }
)

#: parts refused when set: (what, why, what to do)
_REFUSED_PARTS = {
    "_group_by_clauses": (
        "a statement with GROUP BY",
        "a group can hold rows of several shards",
        _ONE_QUERY,
    ),
    "_having_criteria": (
        "a statement with HAVING",
        "HAVING filters groups, and a group can hold rows of several shards",
        _ONE_QUERY,
    ),
    "_distinct_on": (
        "DISTINCT ON",
        "it keeps one row of each group of rows, and a group can span shards",
        "Use .distinct() over the selected columns, or run it as one query",
    ),
    "_for_update_arg": (
        "FOR UPDATE",
        "the per-shard branches read rows the answer does not hold, which would be locked too",
        "Read the rows with merged()/page(), then lock them by primary key in a statement "
        "of their own",
    ),
    "_independent_ctes": (
        "a CTE added with add_cte()",
        "a read runs up to three statements, and each would run it",
        "Run it as a statement of its own",
    ),
    "_prefixes": (
        "a statement with a prefix (prefix_with)",
        "it is SQL text, which sharded-orm cannot prove changes nothing of what rows are read",
        "Drop the prefix, or run it as one query",
    ),
    "_suffixes": (
        "a statement with a suffix (suffix_with)",
        "it is SQL text, which sharded-orm cannot prove changes nothing of what rows are read",
        "Drop the suffix, or run it as one query",
    ),
    "_statement_hints": (
        "a statement hint (with_statement_hint)",
        "a merge sends statements of another shape, where the hint has no proven place",
        "Use a table hint (with_hint), or run it as one query",
    ),
    "_with_context_options": (
        "context options",
        "they are callables sharded-orm cannot read",
        _ONE_QUERY,
    ),
}


def check_shape(stmt: Any) -> None:
    """Raise ``ShardConfigError`` unless every part of ``stmt`` is on the allowlist."""
    for name, _ in type(stmt)._traverse_internals:
        if name in _ACCEPTED_PARTS:
            continue
        value = getattr(stmt, name, None)
        if value is None or (isinstance(value, (tuple, list, dict)) and not value):
            continue
        if value is False:  # (a flag unset)
            continue
        if name == "_raw_columns":
            for col in value:
                _check_selected(col)
        elif name == "_with_options":
            for opt in value:
                _check_option(opt)
        elif name in _REFUSED_PARTS:
            raise _refuse(*_REFUSED_PARTS[name])
        else:
            raise _refuse(
                f"a statement with {name.strip('_').replace('_', ' ')}",
                "that part of a Select is not on the list of those a merge is proven "
                "exact for (docs/queries.md)",
                _ONE_QUERY,
            )


def _check_option(opt: Any) -> None:
    if getattr(opt, "_is_criteria_option", False) or isinstance(opt, UserDefinedOption):
        return  # applied (or passed on) in every statement of the read
    if getattr(opt, "_is_strategy_option", False):
        for load in getattr(opt, "context", ()):
            if ("query_expression", True) in (getattr(load, "strategy", None) or ()):
                for expr in getattr(load, "_extra_criteria", ()):  # with_expression(attr, expr)
                    _check_row_level(expr)
        return
    raise _refuse(
        f"a statement with the option {type(opt).__name__}",
        "the options a merge is proven exact for are loader strategies (joinedload, "
        "selectinload, defer...), loader criteria (with_loader_criteria) and "
        "UserDefinedOption",
        _ONE_QUERY,
    )


#: mappers whose mapped expressions were found row-level
_ROW_MAPPERS: set[Any] = set()


def _check_selected(col: Any) -> None:
    if isinstance(col, selectable.FromClause) and not isinstance(col, functions.FunctionElement):
        # an entity or a table (a function is a FromClause too): its rows
        entity = col._annotations.get("parententity") if hasattr(col, "_annotations") else None
        if entity is not None:
            _check_mapper(inspect(entity).mapper)
        return
    _check_row_level(col)


def _check_mapper(mapper: Any) -> None:
    if mapper in _ROW_MAPPERS:
        return
    for m in mapper.self_and_descendants:
        for prop in m.column_attrs:
            for expr in prop.columns:
                if not (isinstance(expr, elements.ColumnClause) and not expr.is_literal):
                    _check_row_level(expr)
    _ROW_MAPPERS.add(mapper)


# constructs whose value is computed from the row's values and their children's
_ROW_NODES: tuple[type, ...] = tuple(
    getattr(elements, name)
    for name in (
        "Label",
        "Grouping",
        "BinaryExpression",
        "BooleanClauseList",
        "ClauseList",
        "ExpressionClauseList",
        "Tuple",
        "AsBoolean",
        "Cast",
        "TryCast",
        "TypeCoerce",
        "TypeClause",
        "Case",
        "Extract",
        "Null",
        "True_",
        "False_",
        "BindParameter",
        "CollationClause",
        "Slice",
        "IndexExpression",
    )
    if hasattr(elements, name)
)
#: subqueries and FROMs: evaluated by SQL in their own scope for each row
_OWN_SCOPE = (
    selectable.ScalarSelect,
    selectable.Exists,
    selectable.SelectBase,
    selectable.FromClause,
)
_WINDOWS = tuple(
    getattr(elements, n)
    for n in ("Over", "WithinGroup", "FunctionFilter", "AggregateOrderBy")
    if hasattr(elements, n)
)


def _function_name(fn: Any) -> str:
    return ".".join([*getattr(fn, "packagenames", ()), str(getattr(fn, "name", ""))]).lower()


def _check_row_level(expr: Any) -> None:
    """Raise unless ``expr`` (a select-list expression) is computed from one row."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if type(node) in _ROW_CLASSES or any(isinstance(node, c) for c in _ROW_CLASSES):
            continue
        if isinstance(node, _OWN_SCOPE) and not isinstance(node, functions.FunctionElement):
            continue  # a subquery (or a FROM's whole row): SQL evaluates it for each row
        if isinstance(node, _WINDOWS):
            raise _refuse(
                f"{_show(node)}",
                "a window function (OVER) or an aggregate clause is computed over the rows "
                "each statement of a merge holds, not over the statement's rows: "
                "count() OVER () would count a page's branches",
                _ONE_QUERY,
            )
        if isinstance(node, functions.FunctionElement):
            name = _function_name(node)
            if name in _AGGREGATES:
                raise _refuse(
                    f"{_show(node)}",
                    f"{name}() is an aggregate: over the branches' rows of a merge it "
                    "gives another answer than over the statement's rows",
                    _SUBQUERY,
                )
            if not isinstance(node, (functions.Function, functions.GenericFunction)) or (
                name not in ROW_FUNCTIONS
            ):
                raise _refuse(
                    f"{_show(node)}",
                    f"{name or type(node).__name__}() is not a function known to be "
                    "computed from one row (it could be an aggregate)",
                    f"If it is one row's, declare it: sharded_orm.read.shapes.row_level({name!r})",
                )
            stack.extend(node.clauses.clauses)
            continue
        if isinstance(node, elements.ColumnClause):
            if node.is_literal:
                raise _refuse(
                    f"literal_column({node.name!r}) in the select list",
                    "it is SQL text, which sharded-orm cannot prove is computed from one row",
                    "Use literal(value) for a value, or a SQL expression",
                )
            continue
        if isinstance(node, elements.UnaryExpression):
            if node.operator is operators.distinct_op:
                raise _refuse(
                    "distinct() in the select list",
                    "DISTINCT there applies to the whole statement, unseen by the merge",
                    "Use .distinct() on the statement",
                )
            stack.extend(node.get_children())
            continue
        if isinstance(node, _ROW_NODES):
            stack.extend(node.get_children())  # type: ignore[attr-defined]
            continue
        if isinstance(node, elements.TextClause):
            raise _refuse(
                "text() in the select list",
                "it is SQL text, which sharded-orm cannot prove is computed from one row",
                "Use a SQL expression, or declare your construct with row_level()",
            )
        raise _refuse(
            f"{_show(node)} ({type(node).__name__})",
            f"{type(node).__name__} is not a construct a merge is proven exact for",
            "If it is computed from one row, declare it: sharded_orm.read.shapes."
            f"row_level({type(node).__name__})",
        )


def _show(node: Any) -> str:
    try:
        text = str(node)
    except Exception:  # a construct without a default compile
        return type(node).__name__
    return text if len(text) <= 80 else text[:77] + "..."
