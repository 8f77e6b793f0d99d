"""Bulk loading, step 2: the prepared rows staged on disk, sorted by key, checked for
duplicate keys and cut into ranges and batches, in memory bounded by the batch settings.

``bulk_load`` promises that every row is checked, duplicate keys across the whole input
included, before anything is written, and that rows are written by contiguous key
ranges. Both need the whole input; holding it in memory took about 300 to 800 bytes a
row (242 MiB at 150,000 rows, about 8 GB at 10 million). So the input is read once, as
it comes (a generator is fine), and staged in a private temporary directory (``TMPDIR``
chooses where; about the size of the prepared rows, removed at the end):

1. rows are prepared in input order and gathered into runs of at most one batch's worth
   (``batch_bytes`` and the rows a commit may hold, or ``MIN_RUN_ROWS``), each sorted by
   (key, position) and written to its own file;
2. the runs are merged (at most ``MAX_FAN_IN`` at a time) into one stream in key order:
   equal keys are neighbours there, so every duplicate is found, and the first one in
   input order is reported, as before; the stream is cut into the same ranges and
   batches as before (the row count is known by then), each batch written as one record
   of a batch file;
3. each worker reads its batch from the file when it commits it.

In memory at any time: one run being gathered (or sorted), one block of each run being
merged, one batch being cut, and one batch per worker being committed.
"""

from __future__ import annotations

import heapq
import os
import pickle
import random
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from sharded_orm.errors import ShardTypeError
from sharded_orm.limits import row_bytes
from sharded_orm.load.prepare import BulkValidationError, RowPreparer, duplicate_key_error

RANGES_PER_WORKER = 10
#: A run is at least this many rows (a load of tiny batches still sorts in few runs).
MIN_RUN_ROWS = 4096
#: Runs merged at once (each has one block in memory while merged).
MAX_FAN_IN = 32
#: Records per block of a run file (one pickle each).
BLOCK_RECORDS = 256

#: (key, position, ...): a staged row is (key, position, values, bytes, successor values
#: or None); a successor's key (key, position).
Record = tuple[Any, ...]


def _mixed_types(exc: TypeError) -> ShardTypeError:
    return ShardTypeError(
        f"key values of mixed types cannot be ordered ({exc}); give every row the same "
        "type of value in each key column"
    )


def _write_run(path: str, records: list[Record]) -> None:
    with open(path, "wb") as f:
        for i in range(0, len(records), BLOCK_RECORDS):
            pickle.dump(records[i : i + BLOCK_RECORDS], f, pickle.HIGHEST_PROTOCOL)


def _read_run(path: str) -> Iterator[Record]:
    with open(path, "rb") as f:
        while True:
            try:
                block = pickle.load(f)
            except EOFError:
                return
            yield from block


def _unpicklable(records: list[Record]) -> BulkValidationError | None:
    """The first record that cannot be staged (a value pickle cannot write)."""
    for record in sorted(records, key=lambda r: r[1]):
        try:
            pickle.dumps(record, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            return BulkValidationError(
                f"a value cannot be staged for the load ({type(exc).__name__}: {exc}); "
                "bulk_load stages rows on disk with pickle: give plain values",
                record[1],
            )
    return None


class KeySorter:
    """Records in (key, position) order, whatever their number: kept in memory up to
    ``run_rows`` rows or ``run_bytes`` bytes, then sorted and written to a run file."""

    def __init__(self, directory: str, name: str, run_rows: int, run_bytes: int) -> None:
        self.directory = directory
        self.name = name
        self.run_rows = run_rows
        self.run_bytes = run_bytes
        self.buffer: list[Record] = []
        self.buffered_bytes = 0
        self.runs: list[str] = []
        self.count = 0

    def add(self, record: Record, size: int = 16) -> None:
        """Add ``record``, (key, position, ...)."""
        self.buffer.append(record)
        self.buffered_bytes += size
        self.count += 1
        if len(self.buffer) >= self.run_rows or self.buffered_bytes >= self.run_bytes:
            self._spill()

    def _sort(self) -> None:
        try:
            self.buffer.sort()  # (key, position) is unique: payloads are never compared
        except TypeError as exc:
            raise _mixed_types(exc) from None

    def _new_path(self) -> str:
        fd, path = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".run", dir=self.directory)
        os.close(fd)
        return path

    def _spill(self) -> None:
        if not self.buffer:
            return
        self._sort()
        path = self._new_path()
        try:
            _write_run(path, self.buffer)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise _unpicklable(self.buffer) or exc from None
        self.runs.append(path)
        self.buffer, self.buffered_bytes = [], 0

    def _merged(self, paths: list[str]) -> Iterator[Record]:
        try:
            yield from heapq.merge(*(_read_run(p) for p in paths))
        except TypeError as exc:
            raise _mixed_types(exc) from None

    def sorted(self) -> Iterator[Record]:
        """Every record added, in (key, position) order (the sorter is spent)."""
        if not self.runs:
            self._sort()
            records, self.buffer = self.buffer, []
            return iter(records)
        self._spill()
        while len(self.runs) > MAX_FAN_IN:  # merge the oldest runs into one, until few
            group, self.runs = self.runs[:MAX_FAN_IN], self.runs[MAX_FAN_IN:]
            path = self._new_path()
            with open(path, "wb") as f:
                block: list[Record] = []
                for record in self._merged(group):
                    block.append(record)
                    if len(block) == BLOCK_RECORDS:
                        pickle.dump(block, f, pickle.HIGHEST_PROTOCOL)
                        block = []
                if block:
                    pickle.dump(block, f, pickle.HIGHEST_PROTOCOL)
            for p in group:
                os.remove(p)
            self.runs.append(path)
        return self._merged(list(self.runs))

    def first_duplicate(self) -> BulkValidationError | None:
        """The error for the first row, in input order, whose key an earlier row has."""
        return first_duplicate(self.sorted())


class _Duplicates:
    """Watches a stream in (key, position) order for the first repeat in input order."""

    def __init__(self) -> None:
        self.key: Any = None
        self.first = -1
        self.found: tuple[int, int, tuple[Any, ...]] | None = None  # (position, first, key)

    def see(self, key: tuple[Any, ...], pos: int) -> None:
        if self.first >= 0 and key == self.key:
            if self.found is None or pos < self.found[0]:
                self.found = (pos, self.first, key)
            self.first = min(self.first, pos)
            return
        self.key, self.first = key, pos

    def error(self) -> BulkValidationError | None:
        if self.found is None:
            return None
        pos, first, key = self.found
        return duplicate_key_error(key, pos, first)


def first_duplicate(records: Iterable[Record]) -> BulkValidationError | None:
    watch = _Duplicates()
    for record in records:
        watch.see(record[0], record[1])
    return watch.error()


@dataclass
class StagedLoad:
    """A load's batches on disk: ``rows(b)`` reads batch ``b`` (thread-safe)."""

    directory: str
    total: int
    bytes: int = 0  # the rows' size as their commits carry them (index entries, successor)
    counts: list[int] = field(default_factory=list)  # rows per batch, batches in key order
    batch_range: list[int] = field(default_factory=list)
    by_worker: dict[int, list[int]] = field(default_factory=dict)
    offsets: list[tuple[int, int]] = field(default_factory=list)  # (offset, length)
    _fd: int = -1
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def rows(self, b: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]] | None]:
        """Batch ``b``'s rows as sent, and its successor table's rows (or None)."""
        offset, length = self.offsets[b]
        data = os.pread(self._fd, length, offset)
        values, successor = pickle.loads(data)
        return values, successor


def cut_batches(
    staged: StagedLoad,
    records: Iterator[Record],
    out: BinaryIO,
    workers: int,
    byte_limit: int,
    rows_per_commit: int,
) -> _Duplicates:
    """Cut the key-ordered ``records`` into ``RANGES_PER_WORKER * workers`` contiguous
    ranges and each range into batches (within ``byte_limit`` and ``rows_per_commit``),
    writing each batch to ``out``; the duplicate keys seen on the way are returned."""
    total = staged.total
    n_ranges = max(1, min(total, RANGES_PER_WORKER * workers))
    per_range = -(-total // n_ranges) if total else 1
    watch = _Duplicates()
    batch: list[Any] = []
    successor: list[Any] = []
    positions: list[int] = []  # the batch's rows' input positions, for an error
    batch_bytes, batch_range = 0, 0

    def flush() -> None:
        try:
            data = pickle.dumps((batch, successor or None), pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            records = [((), p, v) for p, v in zip(positions, batch, strict=True)]
            raise _unpicklable(records) or exc from None
        staged.offsets.append((out.tell(), len(data)))
        out.write(data)
        staged.counts.append(len(batch))
        staged.batch_range.append(batch_range)

    for i, (key, pos, values, size, also) in enumerate(records):
        watch.see(key, pos)
        r = i // per_range
        if batch and (r != batch_range or batch_bytes + size > byte_limit
                      or len(batch) >= rows_per_commit):  # fmt: skip
            flush()
            batch, successor, positions, batch_bytes = [], [], [], 0
        batch_range = r
        batch.append(values)
        positions.append(pos)
        if also is not None:
            successor.append(also)
        batch_bytes += size
        staged.bytes += size
    if batch:
        flush()
    return watch


def assign_workers(staged: StagedLoad, workers: int, seed: int) -> None:
    """Range ``r`` belongs to worker ``r % workers``, which commits its batches in a
    shuffled order (no stream in key order)."""
    rng = random.Random(seed)
    staged.by_worker = {w: [] for w in range(workers)}
    for b, r in enumerate(staged.batch_range):
        staged.by_worker[r % workers].append(b)
    for w in staged.by_worker:
        rng.shuffle(staged.by_worker[w])


def open_batches(staged: StagedLoad, path: str) -> None:
    staged._fd = os.open(path, os.O_RDONLY)


def close_batches(staged: StagedLoad) -> None:
    if staged._fd >= 0:
        os.close(staged._fd)
        staged._fd = -1


#: A run holds at least this many bytes of rows (tiny batches still sort in few runs).
MIN_RUN_BYTES = 1 << 20


def stage(
    rows: Iterable[Any],
    preparer: RowPreparer,
    successor: tuple[Any, RowPreparer] | None,
    directory: str,
    *,
    workers: int,
    byte_limit: int,
    rows_per_commit: int,
    seed: int,
    indexes: bool = True,
) -> StagedLoad:
    """Read ``rows`` once: prepare and check each, stage them in ``directory`` sorted by
    key, find duplicate keys (of the table, and of ``successor``'s, a key reshard's new
    table, whose rows are made from each filled row by its plan), cut the batches and
    give each worker its own. A batch holds at most ``byte_limit`` bytes as its commit
    carries them (:func:`sharded_orm.limits.row_bytes`: each row's values, its secondary
    index entries unless ``indexes`` is False, and its successor row with that row's
    index entries). Raises ``BulkValidationError`` for the first problem in
    input order; nothing is written to the database here."""
    run_rows, run_bytes = max(rows_per_commit, MIN_RUN_ROWS), max(byte_limit, MIN_RUN_BYTES)
    table = KeySorter(directory, "rows", run_rows, run_bytes)
    keys2 = KeySorter(directory, "keys", 4 * run_rows, 4 * run_bytes) if successor else None
    # what a row costs the commit that carries it: its values, its index entries and, in a
    # key reshard, its successor row and that row's index entries (sharded_orm.limits)
    sized = row_bytes(preparer.table, preparer.names, indexes=indexes)
    sized2 = row_bytes(successor[1].table, successor[1].names) if successor else None
    try:
        for pos, raw in enumerate(rows):
            filled = preparer.filled(raw, pos)
            values, key, _ = preparer.prepare(filled, pos)
            size = sized(values)
            also = None
            if successor is not None and keys2 is not None and sized2 is not None:
                plan, preparer2 = successor
                also, key2, _ = preparer2.prepare(preparer2.filled(plan.new_row(filled), pos), pos)
                keys2.add((key2, pos))
                size += sized2(also)
            if size > byte_limit:
                raise BulkValidationError(
                    f"about {size} bytes with its index entries"
                    f"{' and its successor row' if successor else ''}: larger than one commit "
                    f"may carry ({byte_limit} bytes); raise batch_bytes (up to 100 MB), or "
                    f"load this row on its own{' with defer_indexes=True' if indexes else ''}",
                    pos,
                )
            table.add((key, pos, values, size, also), size)
    except BulkValidationError as exc:
        # a duplicate key earlier in the input is the first problem, as it always was
        earlier = _earliest(
            [table.first_duplicate(), keys2.first_duplicate() if keys2 is not None else None]
        )
        if earlier is not None and earlier.position < exc.position:
            raise earlier from None
        raise
    staged = StagedLoad(directory, table.count)
    path = os.path.join(directory, "batches")
    with open(path, "wb") as out:
        watch = cut_batches(staged, table.sorted(), out, workers, byte_limit, rows_per_commit)
    error = _earliest([watch.error(), keys2.first_duplicate() if keys2 is not None else None])
    if error is not None:
        raise error
    assign_workers(staged, workers, seed)
    open_batches(staged, path)
    return staged


def _earliest(errors: list[BulkValidationError | None]) -> BulkValidationError | None:
    found = [e for e in errors if e is not None]
    return min(found, key=lambda e: e.position) if found else None
