"""Generated row functions for the insert hot path, built once per shard column or table.

A shard over ``(company_id, ts)`` costs, per row, about what the seeds' hand-written
``zlib.crc32((company_id + ts.isoformat()).encode()) % 10`` costs only if the whole
canonical string is built by one f-string straight from the row, with no helper call or
list per value. So for the exact common types (a plain ASCII ``str``, an ``int``, a
datetime in ``timezone.utc``) a small function is generated that reads the sources,
checks their types, builds the canonical string and hashes it. Any other value takes the
general path (``ShardColumn.compute``: stored-value coercion, then the canonical
encoding); both give the same shard by construction, and hypothesis tests compare them.

Only fixed code and variable names appear in the generated source: row keys, counts and
helpers are bound as closure cells, never pasted into the code.
"""

from __future__ import annotations

import datetime as _dt
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from sharded_orm.errors import ShardValueError
from sharded_orm.hashing import CRC32, INT64_MAX, INT64_MIN, THREE_DIGITS, TWO_DIGITS
from sharded_orm.schema.columns import ShardColumn, piece_kind
from sharded_orm.schema.pieces import PIECE_INT, PIECE_STR, PIECE_UTC_DATETIME

RowsFiller = Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]]

_COMMON: dict[str, Any] = {
    "CRC": zlib.crc32,
    "DT": _dt.datetime,
    "UTC": _dt.timezone.utc,
    "LO": INT64_MIN,
    "HI": INT64_MAX,
    "D2": TWO_DIGITS,
    "D3": THREE_DIGITS,
}


def _source_code(v: str, kind: str | None) -> tuple[str, str] | None:
    """(type test, f-string piece) for the source held in variable ``v``.

    An f-string of plain ``str`` pieces is the cheapest way to build the text, so the
    zero-padded datetime fields come from lookup tables (``D2``: "00".."99", ``D3``:
    "000".."999") rather than ``%02d`` conversions; the year needs none from 1000 on."""
    if kind == PIECE_STR:
        return (f"{v}.__class__ is str and {v}.isascii()", f"{{len({v})}}:{{{v}}}")
    if kind == PIECE_INT:
        t = f"t{v}"
        return (f"{v}.__class__ is int and LO <= {v} <= HI", f"{{len({t} := str({v}))}}:{{{t}}}")
    if kind == PIECE_UTC_DATETIME:
        us = f"u{v}"
        return (
            f"{v}.__class__ is DT and {v}.tzinfo is UTC and {v}.year >= 1000",
            f"27:{{{v}.year}}-{{D2[{v}.month]}}-{{D2[{v}.day]}}T{{D2[{v}.hour]}}"
            f":{{D2[{v}.minute]}}:{{D2[{v}.second]}}"
            f".{{D3[({us} := {v}.microsecond) // 1000]}}{{D3[{us} % 1000]}}Z",
        )
    return None


def _shard_code(
    j: int,
    names: Sequence[str],
    sc: ShardColumn,
    ns: dict[str, Any],
    pad: str,
) -> str:
    """Lines that set ``s<j>`` to the shard of ``sc`` from the variables ``names``.

    A value off the inline path is replaced in its variable by the form its column stores
    (``ShardColumn.values_to_send``), and ``dirty`` is set when one changed, so the caller
    sends what was hashed."""
    parts = [_source_code(v, piece_kind(c)) for v, c in zip(names, sc.sources, strict=True)]
    ns[f"SLOW{j}"] = sc.shard_fn
    listed = ", ".join(names)
    ns[f"SEND{j}"] = sc.values_to_send
    changed = " or ".join(f"w{j}[{i}] is not {v}" for i, v in enumerate(names))
    slow = (
        f"w{j} = SEND{j}([{listed}])\n"
        f"{pad}if {changed}:\n"
        f"{pad}    {listed}, = w{j}\n"
        f"{pad}    dirty = True\n"
        f"{pad}s{j} = SLOW{j}(w{j})"
    )
    if sc.algorithm != CRC32 or any(p is None for p in parts):
        return f"{pad}{slow}\n"
    ns[f"N{j}"] = sc.count
    tests = " and ".join(p[0] for p in parts if p)
    text = "".join(p[1] for p in parts if p)
    return (
        f"{pad}if {tests}:\n"
        f'{pad}    s{j} = CRC(f"{text}".encode()) % N{j}\n'
        f"{pad}else:\n"
        f"{pad}    {slow.replace(chr(10), chr(10) + '    ')}\n"
    )


def _build(header: str, body: str, ns: dict[str, Any]) -> Any:
    """Compile ``def generated(header): body`` with the names of ``ns`` as closure cells:
    read as fast as locals, and free to call (keyword defaults would be copied into every
    call's frame, which costs more than the hashing on a per-row function)."""
    names = ", ".join(ns)
    inner = "".join(f"    {line}\n" for line in body.splitlines())
    src = f"def make({names}):\n    def generated({header}):\n{inner}    return generated\n"
    scope: dict[str, Any] = {}
    exec(compile(src, "<sharded_orm.write.fastpath>", "exec"), scope)  # noqa: S102
    return scope["make"](**ns)


def rows_filler(
    shards: Sequence[ShardColumn],
    slow_row: Callable[[dict[str, Any]], Any],
    *,
    in_place: bool = False,
) -> RowsFiller:
    """``rows -> rows to send`` for an INSERT executemany whose rows carry every source.

    A row with no shard given gets a copy with the shards filled (``in_place``: the row
    itself, which the caller made for this statement alone: the ORM flush's); a row with
    every shard given is sent as it is when they agree; anything else (a disagreeing
    shard, a missing source, an unusual type) goes through ``slow_row``, which checks it or
    raises the precise error.
    """
    ns: dict[str, Any] = dict(_COMMON)
    ns["SLOW_ROW"] = slow_row
    ns["UNHASHABLE"] = ShardValueError  # a None source: the slow path tries its default
    source_keys: list[str] = []
    for sc in shards:
        for k in sc.source_keys:
            if k not in source_keys:
                source_keys.append(k)
    var = {k: f"v{i}" for i, k in enumerate(source_keys)}
    for i, k in enumerate(source_keys):
        ns[f"K{i}"] = k
    for j, sc in enumerate(shards):
        ns[f"G{j}"] = sc.key
    gets = "".join(f"        g{j} = row.get(G{j})\n" for j in range(len(shards)))
    none = " and ".join(f"g{j} is None" for j in range(len(shards)))
    reads = "".join(f"                v{i} = row[K{i}]\n" for i in range(len(source_keys)))
    given = " and ".join(f"g{j} is not None" for j in range(len(shards)))
    agree = " and ".join(
        f"(g{j} == s{j} and g{j}.__class__ is not bool)" for j in range(len(shards))
    )
    compute = "".join(
        _shard_code(j, [var[k] for k in sc.source_keys], sc, ns, "                ")
        for j, sc in enumerate(shards)
    )
    sets = "".join(f"            new[G{j}] = s{j}\n" for j in range(len(shards)))
    resets = "".join(f"                new[K{i}] = v{i}\n" for i in range(len(source_keys)))
    body = (
        "    out = []\n"
        "    append = out.append\n"
        "    for row in rows:\n"
        "        dirty = False\n"
        f"{gets}"
        f"        if {none}:\n"
        "            try:\n"
        f"{reads}{compute}"
        "            except (KeyError, UNHASHABLE):\n"
        "                append(SLOW_ROW(row))\n"
        "                continue\n"
        f"            new = {'row' if in_place else 'row.copy()'}\n"  # faster than {**row, G0: s0}
        f"{sets}"
        "            if dirty:\n"
        f"{resets}"
        "            append(new)\n"
        f"        elif {given}:\n"
        "            try:\n"
        f"{reads}{compute}"
        "            except (KeyError, UNHASHABLE):\n"
        "                append(SLOW_ROW(row))\n"
        "                continue\n"
        f"            append(row if not dirty and {agree} else SLOW_ROW(row))\n"
        "        else:\n"
        "            append(SLOW_ROW(row))\n"
        "    return out\n"
    )
    fn: RowsFiller = _build("rows", body, ns)
    return fn


UpdateFiller = Callable[
    [
        Sequence[dict[str, Any]],
        Sequence[Any],
        Mapping[Any, Any],
        Callable[[dict[str, Any]], dict[str, Any]],
    ],
    list[dict[str, Any]],
]


def update_rows_filler(
    plans: Sequence[tuple[ShardColumn, Sequence[bool]]],
    missing: Sequence[str],
    *,
    in_place: bool = False,
) -> UpdateFiller:
    """``(rows, keys, found, slow_row) -> rows to send`` for an UPDATE executemany whose rows set
    some sources of each shard of ``plans`` (``given[i]``: the row sets source ``i``) and
    whose other sources, ``missing``, were read from the stored rows: ``found`` maps each
    row's key (``keys[i]``) to the tuple of their stored values, in ``missing``'s order
    (to the value itself when one is missing; a NULL one goes through ``slow_row``).
    Each row gets a copy with its shards computed (its given sources in their stored form;
    ``in_place``: the row itself, which the caller made for this statement alone);
    a row whose key was not read, or with a missing key or an unusual value, goes through
    ``slow_row``, which reads it alone, checks it or raises the precise error."""
    ns: dict[str, Any] = dict(_COMMON)
    ns["UNHASHABLE"] = ShardValueError
    var: dict[str, str] = {}
    reads = ""
    resets = ""
    for sc, given in plans:
        for k, g in zip(sc.source_keys, given, strict=True):
            if k in var:
                continue
            v = var[k] = f"v{len(var)}"
            ns[f"K{v}"] = k
            if g:
                reads += f"            {v} = row[K{v}]\n"
                resets += f"            new[K{v}] = {v}\n"
            elif len(missing) == 1:  # the stored value itself (StoredRows.batch)
                reads += f"            {v} = st\n"
            else:
                reads += f"            {v} = st[{missing.index(k)}]\n"
    compute = "".join(
        _shard_code(j, [var[k] for k in sc.source_keys], sc, ns, "            ")
        for j, (sc, _) in enumerate(plans)
    )
    pass_line = "            pass\n"
    sets = ""
    for j, (sc, _) in enumerate(plans):
        ns[f"G{j}"] = sc.key
        sets += f"        new[G{j}] = s{j}\n"
    body = (
        "    out = []\n"
        "    append = out.append\n"
        "    get = found.get\n"
        "    for row, key in zip(rows, keys):\n"
        "        st = get(key)\n"
        "        if st is None:\n"
        "            append(slow_row(row))\n"
        "            continue\n"
        "        dirty = False\n"
        "        try:\n"
        f"{reads}{compute}"
        "        except (KeyError, UNHASHABLE):\n"
        "            append(slow_row(row))\n"
        "            continue\n"
        f"        new = {'row' if in_place else 'row.copy()'}\n"
        f"{sets}"
        "        if dirty:\n"
        f"{resets or pass_line}"
        "        append(new)\n"
        "    return out\n"
    )
    fn: UpdateFiller = _build("rows, keys, found, slow_row", body, ns)
    return fn


ObjectFiller = Callable[[dict[str, Any]], bool]

#: Prefix of the key, in an ORM instance's ``__dict__``, of ``(shard, *source values)``
#: recorded for one shard attribute by the attribute ``set`` listener when it derives the
#: shard from immutable sources; the flush takes that shard when the same objects are
#: still there, instead of hashing them a second time.
DERIVED_MARK = "_sharded_orm_derived_"


def derived_mark_key(shard_attr: str) -> str:
    return DERIVED_MARK + shard_attr


#: Prefix of the key, in an ORM instance's ``__dict__``, of the shard value the caller
#: set on the shard attribute (its ``set`` event). A shard value the instance holds is the
#: caller's only while it equals this mark; any other (derived by an earlier flush that was
#: rolled back, loaded from a row and kept by ``make_transient``, set by the library) is
#: derived again from the sources. It lives in the instance's ``__dict__``, so it travels
#: with the object through every session state: pending, rolled back, expunged, re-added.
GIVEN_MARK = "_sharded_orm_given_"


def given_mark_key(shard_attr: str) -> str:
    return GIVEN_MARK + shard_attr


#: Exact types whose values cannot change in place, so ``is`` proves the source unchanged.
IMMUTABLE_SOURCE_TYPES = frozenset(
    {str, int, bool, bytes, _dt.datetime, _dt.date, Decimal, uuid.UUID}
)


def object_filler(plans: Sequence[tuple[ShardColumn, str, Sequence[str]]]) -> ObjectFiller:
    """``instance dict -> done`` for the ORM's ``before_insert``: computes every shard of
    the object from its attributes and stores it, or takes the shard the ``set`` listener
    derived (``DERIVED_MARK``) from the very source objects the instance still holds.
    Returns False, changing nothing, when a source is missing or None, a value is of an
    unusual type, or a shard was given that disagrees: the caller's general path then
    evaluates defaults or raises the precise error."""
    ns: dict[str, Any] = dict(_COMMON)
    ns["UNHASHABLE"] = ShardValueError
    attrs: list[str] = []
    for _, _, source_attrs in plans:
        for a in source_attrs:
            if a not in attrs:
                attrs.append(a)
    var = {a: f"v{i}" for i, a in enumerate(attrs)}
    for i, a in enumerate(attrs):
        ns[f"K{i}"] = a
    for j, (_, shard_attr, _) in enumerate(plans):
        ns[f"G{j}"] = shard_attr
        ns[f"M{j}"] = derived_mark_key(shard_attr)
    reads = "".join(f"        v{i} = d[K{i}]\n" for i in range(len(attrs)))
    compute = ""
    for j, (sc, _, source_attrs) in enumerate(plans):
        same = " and ".join(f"m{j}[{i + 1}] is {var[a]}" for i, a in enumerate(source_attrs))
        compute += (
            f"        m{j} = d.get(M{j})\n"
            f"        if m{j} is not None and {same}:\n"
            f"            s{j} = m{j}[0]\n"
            "        else:\n"
            + _shard_code(j, [var[a] for a in source_attrs], sc, ns, "            ")
        )
    gets = "".join(f"    g{j} = d.get(G{j})\n" for j in range(len(plans)))
    agree = " and ".join(f"(g{j} is None or g{j} == s{j})" for j in range(len(plans)))
    sets = "".join(
        f"        if g{j} is not s{j}:\n            d[G{j}] = s{j}\n" for j in range(len(plans))
    )
    resets = "".join(f"            d[K{i}] = v{i}\n" for i in range(len(attrs)))
    body = (
        "    dirty = False\n"
        "    try:\n"
        f"{reads}{compute}"
        "    except (KeyError, UNHASHABLE):\n"
        "        return False\n"
        f"{gets}"
        f"    if {agree}:\n"
        f"{sets}"
        "        if dirty:  # the object keeps, and the INSERT sends, the stored form\n"
        f"{resets}"
        "        return True\n"
        "    return False\n"
    )
    fn: ObjectFiller = _build("d", body, ns)
    return fn
