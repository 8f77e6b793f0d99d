"""One deadline type, passed down every layer, and one default per kind of call (issue 45).

* an architecture check: no module but :mod:`sharded_orm.retry` defines a class named
  ``*Deadline`` (the client-facing adapters excepted, by name), and no ``def _left(``
  (the copies of "seconds until a float deadline") anywhere;
* :class:`sharded_orm.retry.Deadline` itself: clamped, capped, the sooner of two, and its
  one error (a ``TimeoutError`` naming the call and the seconds);
* the adapters hold that one deadline (no clock of their own);
* :data:`sharded_orm.retry.DEFAULTS` is the table docs/deadlines.md shows, and the modules
  that had their own defaults read theirs from it.
"""

from __future__ import annotations

import ast
import math
import re
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharded_orm.retry import DEFAULTS, Deadline, RetryDeadlineError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sharded_orm", "alembic_ext")
#: The module of the one deadline type.
HOME = "sharded_orm/retry.py"
#: Adapters of the one Deadline to a client's own timeout protocol (module, class).
ADAPTERS = {
    ("sharded_orm/spanner/deadlines.py", "StatementDeadline"),  # api-core's timeout decorator
    ("sharded_orm/spanner/streams.py", "StreamDeadline"),  # the same, for a whole stream
}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_only_the_deadline_module_defines_a_deadline_type() -> None:
    found = set()
    for path in _sources():
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), name)):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Deadline"):
                found.add((name, node.name))
    others = {f for f in found if f[0] != HOME} - ADAPTERS
    assert not others, (
        f"deadline types outside {HOME}: {sorted(others)}; pass sharded_orm.retry.Deadline "
        "down instead (or, for an adapter to a client's timeout protocol, add it to ADAPTERS)"
    )
    assert (HOME, "Deadline") in found
    assert found >= ADAPTERS, f"adapters gone: {sorted(ADAPTERS - found)} (update ADAPTERS)"


def test_no_copy_of_seconds_until_a_float_deadline() -> None:
    copies = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in _sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.match(r"\s*def _left\(", line)
    ]
    assert not copies, f"use Deadline.remaining()/call_timeout() instead of: {copies}"


def test_the_adapters_have_no_clock_of_their_own() -> None:
    from sharded_orm.spanner.deadlines import StatementDeadline
    from sharded_orm.spanner.streams import StreamDeadline

    one = Deadline.after(30.0, "commit_timeout")
    for adapter in (StatementDeadline(one), StreamDeadline(one)):
        assert adapter.deadline is one
        assert adapter.seconds == 30.0 and adapter.what == "commit_timeout"
        left = adapter.left
        assert left > 29.0 and one.remaining() <= left
        assert not adapter.given_up
    gone = Deadline.after(0.0)
    assert StatementDeadline(gone).given_up and StatementDeadline(gone).left == 0.0


@given(
    seconds=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    other=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    cap=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
)
def test_a_deadline_is_clamped_capped_and_ordered(seconds: float, other: float, cap: float) -> None:
    deadline, second = Deadline.after(seconds), Deadline.after(other)
    assert 0.0 <= deadline.remaining() <= seconds
    assert deadline.seconds == seconds
    assert 0.001 <= deadline.cap(cap) <= max(0.001, min(cap, seconds))
    assert 0.001 <= deadline.call_timeout() <= max(0.001, seconds)
    sooner = deadline.sooner(second)
    assert sooner.end == min(deadline.end, second.end)
    assert deadline.sooner(None) is deadline
    assert deadline.expired == (deadline.remaining() == 0.0)


def test_no_deadline_never_expires() -> None:
    never = Deadline.after(None)
    assert never.remaining() == math.inf and not never.expired
    never.check("a read")
    assert never.cap(5.0) == 5.0


def test_an_expired_deadline_raises_one_error_naming_the_call_and_the_seconds() -> None:
    deadline = Deadline.after(0.05, "its deadline")
    deadline.check("the copy of Events")  # not yet
    time.sleep(0.06)
    assert deadline.expired and deadline.remaining() == 0.0
    with pytest.raises(TimeoutError) as caught:
        deadline.check("the copy of Events")
    assert isinstance(caught.value, RetryDeadlineError)
    assert str(caught.value).startswith(
        "the copy of Events did not finish within its deadline of 0.05 s"
    )
    assert caught.value.elapsed >= 0.05


def _documented_defaults() -> dict[str, float]:
    text = (ROOT / "docs" / "deadlines.md").read_text()
    section = text.split("## Defaults", 1)[1].split("\n## ", 1)[0]
    units = {"s": 1.0, "min": 60.0, "h": 3600.0}
    found = {}
    for kind, number, unit in re.findall(r"^\| `(\w+)` \| ([\d.]+) (s|min|h) \|", section, re.M):
        found[kind] = float(number) * units[unit]
    return found


def test_the_defaults_table_in_the_docs_is_the_one_in_code() -> None:
    assert _documented_defaults() == dict(DEFAULTS)


def test_every_module_reads_its_default_from_the_one_table() -> None:
    from alembic_ext import schema_change
    from sharded_orm.spanner import commits, deadlines

    assert DEFAULTS["statement"] == deadlines.DEFAULT_READ_TIMEOUT
    assert DEFAULTS["commit"] == commits.DEFAULT_COMMIT_TIMEOUT
    assert DEFAULTS["schema_change"] == schema_change.DEFAULT_DDL_TIMEOUT
    assert DEFAULTS["schema_change_call"] == schema_change.DEFAULT_DDL_CALL_TIMEOUT
    # the commit of a migration had 120 s, Beam's reads 900 s and verify's 3,600 s
    from alembic_ext import commit

    assert DEFAULTS["commit"] == commit.DEFAULT_COMMIT_TIMEOUT
