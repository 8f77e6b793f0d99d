"""What we rely on in google-cloud-spanner beyond its public API: trips when upstream changes.

``RawSpanner.commit_mutations`` (sharded_orm/spanner/mutations.py) lets the client's ``Batch``
encode values into ``Mutation`` protos and sends them itself, to keep the client's hour-long
commit retries out of our retry policy. The encoded list is ``Batch._mutations``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from google.cloud.spanner_v1 import Mutation
from google.cloud.spanner_v1.batch import Batch


class _NoSession:
    _database: Any = None


def test_batch_exposes_its_encoded_mutations() -> None:
    batch = Batch(_NoSession())  # type: ignore[no-untyped-call]
    ts = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    batch.insert_or_update("LogEntries", columns=["CompanyId", "Timestamp"], values=[["a", ts]])
    mutations = batch._mutations
    assert isinstance(mutations, list) and len(mutations) == 1
    assert isinstance(mutations[0], Mutation)
    write = mutations[0].insert_or_update
    assert write.table == "LogEntries"
    assert list(write.columns) == ["CompanyId", "Timestamp"]
    assert str(write.values[0][1]).startswith("2026-01-02T03:04:05")
