"""Exported split statistics read from a file, as a stream (memory: a block and a row,
whatever the file's size): the shapes the docs and the help name, from the tools that
make them.

- gcloud's own, ``gcloud spanner databases execute-sql --sql=... --format=json``: the
  ``ResultSet`` (``{"metadata": {"rowType": {"fields": [...]}}, "rows": [[...], ...]}``,
  keys sorted, INT64 as strings, a row's trailing NULLs left out, no ``rows`` when empty);
- the table gcloud prints without ``--format`` (padded columns, NULL as ``None``, arrays
  as Python lists);
- CSV with a header of column names (the console's download);
- a JSON list of row objects, or an object holding one under ``rows`` / ``results``.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sharded_orm.errors import ShardConfigError, ShardValueError

#: the columns every row needs (SPANNER_SYS.SPLIT_STATS_TOP_*)
REQUIRED = ("INTERVAL_END", "SPLIT_START", "SPLIT_LIMIT", "CPU_USAGE_SCORE")

#: the largest export doctor reads (a minute view keeps at most 100 rows per interval)
MAX_FILE_BYTES = 512 << 20
#: the largest row of a JSON export (a row is a few hundred bytes)
MAX_ROW_CHARS = 1 << 20
_CHUNK = 1 << 16


def _not_utf8(p: Path, exc: UnicodeDecodeError) -> ShardValueError:
    return ShardValueError(
        f"{str(p)!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} near offset "
        f"{exc.start} of a block): export the statistics as UTF-8 CSV or JSON"
    )


def checked_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ShardConfigError(f"no such file: {str(p)!r} (give a CSV or JSON export)")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ShardValueError(
            f"{str(p)!r} is {size:,} bytes, more than doctor reads ({MAX_FILE_BYTES:,}): "
            "export a shorter window (--since, or a WHERE INTERVAL_END >= ... in the export)"
        )
    return p


def rows_from_file(path: str | Path) -> Iterator[dict[str, Any]]:
    """Rows exported as CSV (a header of column names), as JSON (a list of objects, or
    gcloud's result set: ``gcloud spanner databases execute-sql ... --format=json``) or as
    the table gcloud prints without ``--format``, read as a stream: memory holds one block
    and one row, whatever the file's size."""
    p = checked_file(path)
    try:
        with p.open(encoding="utf-8-sig", newline="") as f:
            head = f.read(1)
            while head.isspace():
                head = f.read(1)
            f.seek(0)
            if p.suffix.lower() == ".json" or head in ("[", "{"):
                yield from _json_rows(p, f)
                return
            first = f.readline(MAX_ROW_CHARS)
            f.seek(0)
            if _is_gcloud_table(first):
                yield from _table_rows(p, f)
            else:
                yield from _csv_rows(p, f)
    except UnicodeDecodeError as exc:
        raise _not_utf8(p, exc) from None


def _is_gcloud_table(header: str) -> bool:
    """Whether ``header`` is the first line of the table ``gcloud spanner databases
    execute-sql`` prints by default (column names padded with spaces, no commas)."""
    names = header.split()
    return (
        "," not in header
        and "\t" not in header
        and {n.upper() for n in names} >= set(REQUIRED)
        and all(c.isidentifier() or c == "(Unspecified)" for c in names)
    )


def _table_rows(p: Path, f: Any) -> Iterator[dict[str, Any]]:
    """The rows of gcloud's default table: each column starts where its name starts in
    the header (gcloud pads every value to its column's width); NULL prints as ``None``."""
    header = f.readline(MAX_ROW_CHARS)
    spans = [(m.group(), m.start()) for m in re.finditer(r"\S+", header)]
    for i, line in enumerate(f):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        if len(line) > MAX_ROW_CHARS:
            raise ShardValueError(
                f"{str(p)!r} line {i + 2}: more than {MAX_ROW_CHARS:,} characters: not a row of "
                "gcloud's table"
            )
        row: dict[str, Any] = {}
        for k, (name, start) in enumerate(spans):
            end = spans[k + 1][1] if k + 1 < len(spans) else len(line)
            if start > 0 and line[start - 1 : start] not in (" ", ""):
                raise ShardValueError(
                    f"{str(p)!r} line {i + 2}: its values do not line up under the header's "
                    "column names (an edited or wrapped table?): export with --format=json"
                )
            cell = line[start:end].strip()
            row[name] = None if cell == "None" else cell
        yield row


def _csv_rows(p: Path, f: Any) -> Iterator[dict[str, Any]]:
    try:
        for i, row in enumerate(csv.DictReader(f)):
            if None in row or None in row.values():  # a short or long line: a truncated file
                raise ShardValueError(
                    f"{str(p)!r} line {i + 2}: {len([v for v in row.values() if v is not None])}"
                    " fields where the header has a different number (a truncated or edited "
                    "export?)"
                )
            yield row
    except csv.Error as exc:
        raise ShardValueError(f"{str(p)!r} is not a readable CSV export: {exc}") from None


class _JsonStream:
    """JSON read from a text file a block at a time: values are decoded one by one
    (``raw_decode`` over a buffer of blocks), so memory holds a block and one value."""

    def __init__(self, p: Path, f: Any) -> None:
        self.p, self.f = p, f
        self.buf, self.pos = "", 0
        self.decoder = json.JSONDecoder()

    def _bad(self, what: str) -> ShardValueError:
        return ShardValueError(f"{str(self.p)!r} is not valid JSON (truncated?): {what}")

    def _more(self) -> bool:
        chunk = self.f.read(_CHUNK)
        self.buf, self.pos = self.buf[self.pos :] + chunk, 0
        return bool(chunk)

    def peek(self) -> str:
        """The next character that is not white space ("" at the end of the file)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos].isspace():
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def take(self, expected: str, what: str) -> None:
        if self.peek() != expected:
            raise self._bad(f"expected {what}")
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value, whole (a row, a key, the metadata: small)."""
        self.peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise ShardValueError(
                    f"{str(self.p)!r} is nested too deeply to be a split statistics export "
                    "(a JSON list of row objects, or gcloud's result set)"
                ) from None
            except ValueError as exc:
                if len(self.buf) - self.pos > MAX_ROW_CHARS:
                    raise ShardValueError(
                        f"{str(self.p)!r}: a value of more than {MAX_ROW_CHARS:,} characters, "
                        f"or not valid JSON: {exc}"
                    ) from None
                if self._more():
                    continue
                raise self._bad(str(exc)) from None
            self.pos = end
            return obj

    def items(self) -> Iterator[Any]:
        """The values of the list that starts here, one at a time."""
        self.take("[", "a list")
        if self.peek() == "]":
            self.pos += 1
            return
        while True:
            yield self.value()
            c = self.peek()
            self.pos += 1
            if c == "]":
                return
            if c != ",":
                raise self._bad("expected , or ] after a list item")

    def members(self) -> Iterator[str]:
        """The keys of the object that starts here; the caller reads each one's value
        (``value()`` or ``items()``) before asking for the next key."""
        self.take("{", "an object")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            if self.peek() != '"':
                raise self._bad("expected a key in quotes")
            key = self.value()
            self.take(":", ": after a key")
            yield key
            c = self.peek()
            self.pos += 1
            if c == "}":
                return
            if c != ",":
                raise self._bad("expected , or } after a value")

    def end(self) -> None:
        if self.peek():
            raise ShardValueError(f"{str(self.p)!r} is not valid JSON: text after the export")


#: the keys of an object export that hold its rows (gcloud's result set: ``rows``)
ROW_KEYS = ("rows", "results")


def _json_rows(p: Path, f: Any) -> Iterator[Any]:
    """The rows of a JSON export, read as a stream (memory: one block and one row):

    - a list of row objects (``[{"INTERVAL_END": ..., ...}, ...]``);
    - gcloud's own (``gcloud spanner databases execute-sql --sql=... --format=json``): the
      ``ResultSet``, ``{"metadata": {"rowType": {"fields": [{"name": ...}, ...]}}, "rows":
      [[value, ...], ...]}``, each row a list in the fields' order (trailing NULLs left out,
      an empty result without ``rows``);
    - an object holding a list of row objects under ``rows`` or ``results``, or one row.
    """
    stream = _JsonStream(p, f)
    first = stream.peek()
    if not first:
        raise ShardValueError(f"{str(p)!r} is empty: not a JSON export (truncated?)")
    if first == "[":
        yield from stream.items()
        stream.end()
        return
    if first != "{":
        raise ShardValueError(
            f"{str(p)!r}: expected a JSON list of rows or gcloud's result set "
            '({"metadata": ..., "rows": [...]}), got a JSON value starting with '
            f"{first!r}"
        )
    fields: list[str] | None = None
    single: dict[str, Any] = {}
    skipped = False  # rows came before the metadata: read again once the fields are known
    for key in stream.members():
        if key in ROW_KEYS and stream.peek() == "[":
            for i, item in enumerate(stream.items()):
                if isinstance(item, list) and fields is None:
                    skipped = True  # list rows: their columns are in the metadata
                    continue
                yield _result_row(p, item, fields, i)
        elif key == "metadata":
            fields = _fields(p, stream.value())
        else:
            single[key] = stream.value()
            if len(single) > 64:
                raise ShardValueError(
                    f"{str(p)!r}: an object of more than 64 keys with no rows or results "
                    "list: not a split statistics export"
                )
    stream.end()
    if skipped:
        if fields is None:
            raise ShardValueError(
                f"{str(p)!r}: its rows are lists of values but no metadata.rowType.fields "
                "names their columns: pass gcloud's whole output "
                "(gcloud spanner databases execute-sql ... --format=json)"
            )
        f.seek(0)
        again = _JsonStream(p, f)
        for key in again.members():
            if key in ROW_KEYS and again.peek() == "[":
                for i, item in enumerate(again.items()):
                    yield _result_row(p, item, fields, i)
            else:
                again.value()
        return
    if single and fields is None:
        yield single  # one row object


def _fields(p: Path, metadata: Any) -> list[str]:
    """The column names of gcloud's ``metadata.rowType.fields``."""
    fields = metadata.get("rowType", {}).get("fields") if isinstance(metadata, dict) else None
    if not isinstance(fields, list) or not all(
        isinstance(x, dict) and isinstance(x.get("name"), str) for x in fields
    ):
        raise ShardValueError(
            f"{str(p)!r}: metadata has no rowType.fields list of named columns: not gcloud's "
            "result set (gcloud spanner databases execute-sql ... --format=json)"
        )
    return [x["name"] for x in fields]


def _result_row(p: Path, item: Any, fields: list[str] | None, i: int) -> Any:
    """A row of gcloud's result set (a list in the fields' order) as a dict; other rows as
    they are."""
    if fields is None or not isinstance(item, list):
        return item
    if len(item) > len(fields):
        raise ShardValueError(
            f"{str(p)!r} row {i + 1}: {len(item)} values where metadata.rowType.fields names "
            f"{len(fields)} columns (an edited export?)"
        )
    # gcloud leaves a row's trailing NULLs out: the missing values are NULL
    return dict(itertools.zip_longest(fields, item))
