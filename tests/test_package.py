"""Package-level promises: a light import, types that keep sources hashable."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
import sqlalchemy as sa

from sharded_orm import ShardValueError, UTCDateTime


def test_import_does_not_load_the_spanner_client() -> None:
    code = (
        "import sys, sharded_orm, alembic_ext\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('google.cloud.spanner', 'grpc')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_utc_datetime_round_trips_aware_on_sqlite() -> None:
    md = sa.MetaData()
    t = sa.Table(
        "t", md, sa.Column("id", sa.Integer, primary_key=True), sa.Column("ts", UTCDateTime)
    )
    eng = sa.create_engine("sqlite://")
    md.create_all(eng)
    paris = dt.timezone(dt.timedelta(hours=2))
    value = dt.datetime(2024, 6, 1, 12, 0, 0, 123456, tzinfo=paris)
    with eng.begin() as conn:
        conn.execute(t.insert(), {"id": 1, "ts": value})
        back = conn.execute(sa.select(t.c.ts)).scalar_one()
    assert back == value and back.tzinfo == dt.timezone.utc
    # SQLAlchemy wraps errors of bind processors; ours is the cause
    with pytest.raises(sa.exc.StatementError, match="naive datetime") as info, eng.begin() as conn:
        conn.execute(t.insert(), {"id": 2, "ts": dt.datetime(2024, 1, 1)})
    assert isinstance(info.value.orig, ShardValueError)
