"""The linter on the seeds' schemas (examples/hotspots.py) and on key-strategy markers."""

from __future__ import annotations

import importlib.util
import itertools
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import BitReversedPrimaryKeyMixin, TableSequence, UUIDPrimaryKeyMixin
from sharded_orm.tools.lint import lint
from sharded_orm.tools.simulate import guess_role

EXAMPLES = Path(__file__).parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hotspots = load_example("hotspots")


def test_every_seed_anti_pattern_is_caught() -> None:
    found = {(f.rule, f.table, f.target) for f in lint(hotspots.Naive)}
    assert found == {
        ("SO101", "Users", "column LastAccessTimestamp"),  # timestamp-first key
        ("SO102", "Events", "index EventsByTimestamp"),  # index on a timestamp alone
        ("SO107", "LogEntries", "index LogEntriesByCompany"),  # (CompanyId, Timestamp)
    }


def test_the_seeds_fixes_pass() -> None:
    assert lint(hotspots.Fixed) == []
    for shards in (10, 100):
        assert lint(hotspots.sharded_log_entry(shards)) == []


def test_the_seed_scenarios_run(capsys: Any) -> None:
    assert hotspots.main(["--scale", "0.01", "--only", "timestamp_key"]) == 0
    out = capsys.readouterr().out
    assert "lint, fixed schemas: 0 findings" in out
    assert "timestamp first" in out and "swapped" in out and "ShardId first" in out


def model(**cols: Any) -> type:
    class B(DeclarativeBase):
        pass

    return type("M", (B,), {"__tablename__": "t", **cols})


def test_counters_identity_and_sequences() -> None:
    engine = sa.create_engine("sqlite://")
    plain = TableSequence(engine, "orders")
    spread = TableSequence(engine, "orders", bit_reversed=True)
    counter_key = model(id=mapped_column(sa.BigInteger, primary_key=True, default=plain.next_id))
    assert [f.rule for f in lint(counter_key)] == ["SO101"]
    assert "TableSequence" in lint(counter_key)[0].message
    assert guess_role(counter_key.__table__.c.id) == "counter"  # type: ignore[attr-defined]
    spread_key = model(id=mapped_column(sa.BigInteger, primary_key=True, default=spread.next_id))
    assert lint(spread_key) == []
    assert guess_role(spread_key.__table__.c.id) == "bit_reversed"  # type: ignore[attr-defined]
    counted = itertools.count(1)
    count_key = model(id=mapped_column(sa.BigInteger, primary_key=True, default=counted.__next__))
    assert [f.rule for f in lint(count_key)] == ["SO101"]
    assert next(counted) == 1  # the linter never called the default
    # Spanner renders Sequence and Identity as bit_reversed_positive: no hotspot
    seq_key = model(id=mapped_column(sa.BigInteger, sa.Sequence("s"), primary_key=True))
    assert lint(seq_key) == []

    class B(DeclarativeBase):
        pass

    class Orders(BitReversedPrimaryKeyMixin, B):
        __tablename__ = "orders"

    class Carts(UUIDPrimaryKeyMixin, B):
        __tablename__ = "carts"

    assert lint(B) == []
    assert guess_role(Orders.__table__.c.id) == "bit_reversed"  # type: ignore[attr-defined]
    assert guess_role(Carts.__table__.c.id) == "uuid4"  # type: ignore[attr-defined]


def uuid7() -> uuid.UUID:  # a stand-in for uuid6.uuid7 / Python 3.14's uuid.uuid7
    return uuid.uuid4()


def test_time_ordered_uuid_generators_by_name() -> None:
    v7: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=uuid7)
    v1: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=uuid.uuid1)
    assert "UUID version 7" in lint(model(id=v7))[0].message
    assert "UUID version 1" in lint(model(id=v1))[0].message
