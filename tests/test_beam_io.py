"""sharded_orm.beam.spanner_io without a database: credentials reach every worker's
client, and the writer commits mutations sorted by key in batches under its limits."""

from __future__ import annotations

import threading
from typing import Any

import apache_beam as beam  # the beam extra (tests/conftest.py BEAM_ONLY)
import pytest
from apache_beam.internal import pickler
from at_scale_models import CrcLogEntry
from google.auth.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from sharded_orm.beam import Backfill, WriteSharded
from sharded_orm.beam.spanner_io import Database, Mutation, WriteMutations

pytestmark = pytest.mark.beam

IDS = {"project_id": "p", "instance_id": "i", "database_id": "d"}


class _Token(Credentials):  # type: ignore[misc]
    """Credentials a test can recognise after a round trip through Beam's pickler."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    def refresh(self, request: Any) -> None:
        pass


@pytest.fixture
def no_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client honours given credentials only off the emulator (there it is anonymous)."""
    monkeypatch.delenv("SPANNER_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("SPANNER_DISABLE_BUILTIN_METRICS", "true")


def test_credentials_reach_the_clients_the_workers_open(no_emulator: None) -> None:
    backfill = Backfill(CrcLogEntry, "EntryShardV2", credentials=_Token("b"), **IDS)
    write = WriteSharded(CrcLogEntry, credentials=_Token("w"), **IDS)
    # as a runner ships them to workers: pickled, then unpickled elsewhere
    for db, token in (
        (backfill.read.db, "b"), (backfill.writer.fn.db, "b"), (write.writer.fn.db, "w"),
    ):  # fmt: skip
        shipped = pickler.loads(pickler.dumps(db))
        assert shipped.client().credentials.token == token


_COMMITS: list[list[Mutation]] = []
_LOCK = threading.Lock()


class _Recorder:
    """Stands in for the writer's ``RawSpanner``: ``commit_writes`` records each commit."""

    def commit_writes(self, writes: list[Any], timeout: float) -> None:
        assert 0 < timeout <= 60
        mutations = [
            Mutation(op, table, tuple(columns), tuple(v), 2)
            for op, table, columns, values in writes
            for v in values
        ]
        with _LOCK:
            _COMMITS.append(mutations)

    def close(self) -> None:
        pass


class _RecordingDatabase(Database):
    def writer(self) -> Any:
        return _Recorder()


# 15 drawn Beam writes; quick loop: test_credentials_reach_the_clients_the_workers_open
@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(
    keys=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(-50, 50)), unique=True,
        min_size=1, max_size=120,
    ),
    rows=st.integers(1, 9),
    cells=st.integers(3, 30),
)  # fmt: skip
def test_mutations_are_committed_sorted_by_key_in_batches_under_the_limits(
    keys: list[tuple[str, int]], rows: int, cells: int
) -> None:
    _COMMITS.clear()
    mutations = [Mutation("update", "T", ("K1", "K2", "V"), (*k, i), 2) for i, k in enumerate(keys)]
    with beam.Pipeline() as p:
        _ = (
            p
            | beam.Create(mutations, reshuffle=False)
            | WriteMutations(
                _RecordingDatabase("p", "i", "d"), batch_rows=rows, batch_cells=cells,
                batch_bytes=10**6,
            )
        )  # fmt: skip
    committed = [m.values for batch in _COMMITS for m in batch]
    assert sorted(committed) == sorted(m.values for m in mutations)  # each exactly once
    for batch in _COMMITS:
        assert [m.values for m in batch] == sorted(m.values for m in batch)  # by key
        assert 0 < len(batch) <= rows
        assert sum(len(m.values) for m in batch) <= cells
    # the writer buffers 20 batches' worth, sorts and cuts it: batches run in key order
    # except where a new buffer starts
    descents = sum(a[-1].values > b[0].values for a, b in zip(_COMMITS, _COMMITS[1:], strict=False))
    assert descents <= len(mutations) // (20 * rows)
