"""A sharded read carries the library's one deadline type (issue 45).

``merged()``/``page()`` take ``timeout=`` in seconds; it is made a
:class:`sharded_orm.retry.Deadline` once, where it enters (``read_deadline``), and that
object is what ``MergeQuery`` and ``ReadContext`` hold and pass along. Before, the read
kept a float (``time.monotonic() + timeout``) and worked out the time left with a clock
of its own: the eighth notion of a deadline. The rule below refuses that again.

Behaviour: the read's statements, and the restarts of their result streams, share the
one budget: the time of its statements together is bounded by one ``timeout``.
"""

from __future__ import annotations

import ast
import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from plans import forced
from sqlalchemy import event
from sqlalchemy.orm import Session

from sharded_orm import merged, page, sharded_select
from sharded_orm.read.branches import MergeQuery
from sharded_orm.retry import Deadline

ROOT = Path(__file__).resolve().parent.parent
READ = ROOT / "sharded_orm" / "read"
#: the functions that take the user's ``timeout=`` seconds (the public ones, and the
#: span around each): the only places in read/ where a deadline is a number
ENTRIES = {"merged", "page", "_merged", "_page", "_read_page", "read_deadline"}


def _annotation(node: ast.expr | None) -> str:
    return "" if node is None else ast.unparse(node)


def _float_deadlines(text: str, name: str) -> list[str]:
    """Where the module ``name`` (its source ``text``) holds or takes a deadline that is
    not a ``Deadline``."""
    tree = ast.parse(text, name)
    found: list[str] = []
    for node in ast.walk(tree):
        # a clock of its own: the time left is the Deadline's to say
        if isinstance(node, ast.Attribute) and node.attr in ("monotonic", "perf_counter"):
            found.append(f"{name}:{node.lineno}: time.{node.attr} (use Deadline.remaining())")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            for arg in args:
                ann = _annotation(arg.annotation)
                if "deadline" in arg.arg.lower() and "Deadline" not in ann:
                    found.append(f"{name}:{node.lineno}: {node.name}({arg.arg}: {ann})")
                if arg.arg == "timeout" and node.name not in ENTRIES:
                    found.append(
                        f"{name}:{node.lineno}: {node.name}(timeout: {ann}) takes seconds "
                        "past the entry (pass the read's Deadline)"
                    )
        if isinstance(node, ast.AnnAssign):
            target = ast.unparse(node.target)
            if "deadline" in target.lower() and "Deadline" not in _annotation(node.annotation):
                found.append(f"{name}:{node.lineno}: {target}: {_annotation(node.annotation)}")
        if isinstance(node, ast.Assign):
            for t in node.targets:
                target = ast.unparse(t)
                if "deadline" not in target.lower():
                    continue
                value = node.value
                # passed along (a name, an attribute), none, or made by the one type
                passed = isinstance(value, (ast.Name, ast.Attribute)) or (
                    isinstance(value, ast.Constant) and value.value is None
                )
                made = isinstance(value, ast.Call) and ast.unparse(value.func) in (
                    "Deadline",
                    "Deadline.after",
                    "read_deadline",
                )
                if not (passed or made):
                    found.append(f"{name}:{node.lineno}: {target} = {ast.unparse(value)}")
    return found


def test_no_float_deadline_in_the_read_layer() -> None:
    found = [
        f
        for path in sorted(READ.glob("*.py"))
        for f in _float_deadlines(path.read_text(), path.relative_to(ROOT).as_posix())
    ]
    assert not found, (
        "a read's deadline is the one sharded_orm.retry.Deadline, made once where "
        f"timeout= enters (read_deadline) and passed along: {found}"
    )


def test_the_rule_refuses_a_float_deadline() -> None:
    """The rule catches the shape the read had before (its own float and clock)."""
    before = (
        "import time\n"
        "class ReadContext:\n"
        "    def __init__(self, conn, stmt, timeout: float | None = None) -> None:\n"
        "        self.deadline = None if timeout is None else time.monotonic() + timeout\n"
        "    def left(self, deadline: float) -> float:\n"
        "        return deadline - time.monotonic()\n"
    )
    found = _float_deadlines(before, "sharded_orm/read/context.py")
    assert len(found) == 5, found  # timeout=, the float sum, two clocks, deadline: float


# ----------------------------------------------------------------- the one budget

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def test_a_merge_query_holds_the_deadline_it_is_given() -> None:
    from test_read_deadlines import Base, Tick

    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    one = Deadline.after(30.0, "timeout")
    stmt = sharded_select(Tick, index="ticks_by_ts").order_by(Tick.ts.desc())
    with engine.connect() as conn:
        query = MergeQuery(conn, stmt, one)
        assert query.context.deadline is one
        assert MergeQuery(conn, stmt).context.deadline is None
    engine.dispose()


@pytest.fixture
def ticks() -> Iterator[sa.Engine]:
    from test_read_deadlines import Base, Tick

    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add_all(Tick(id=i, ts=T0 + dt.timedelta(seconds=i)) for i in range(50))
    yield engine
    engine.dispose()


@pytest.mark.parametrize("plan", ["two rounds", "probe"])
@pytest.mark.parametrize("read", ["merged", "page"])
def test_every_statement_of_a_read_gets_what_is_left_of_one_budget(
    ticks: sa.Engine, read: str, plan: str
) -> None:
    """Each statement (slow: 0.15 s) starts with the time left of the one deadline the
    read made: the i-th has at most ``timeout - i * 0.15`` s."""
    from test_read_deadlines import Tick

    stmt = sharded_select(Tick, index="ticks_by_ts").order_by(Tick.ts.desc())
    seen: list[float] = []
    started: list[float] = []

    @event.listens_for(ticks, "before_cursor_execute")
    def slow(*args: Any) -> None:
        seen.append(args[4].execution_options["timeout"])
        started.append(time.monotonic())
        time.sleep(0.15)

    with forced(plan), Session(ticks) as session:
        begun = time.monotonic()
        if read == "merged":
            got = [t.id for t in merged(session, stmt, 40, timeout=20)]
        else:
            got = [t.id for t in page(session, stmt, 40, timeout=20).rows]
    assert got == list(range(49, 9, -1))
    assert seen and len(seen) == len(started)
    ended = [begun, *(at + 0.15 for at in started)]  # the read began; each slow one ended
    for left, at, after in zip(seen, started, ended, strict=False):
        # what is left of 20 s from the read's start: the time until the statement
        # started is spent, and at least that until the statement before it ended
        assert 20 - (at - begun) <= left <= 20 - (after - begun)
    assert all(b <= a - 0.15 for a, b in zip(seen, seen[1:], strict=False))


@pytest.mark.emulator
def test_a_read_s_statements_and_stream_restarts_share_one_timeout(
    spanner_emulator: Any,
) -> None:
    """A page's bound round takes 1.5 s of a ``timeout=3`` read; the rows statement's stream
    is then cut again and again (it restarts from its resume token each time): the read
    ends with its error at 3 s, not at 1.5 s + a whole 3 s of restarts."""
    from test_read_streams import ROWS, Big, newest  # (a page: its bound round apart)

    from sharded_orm.testing.faults import FaultProxy

    timeout = 3.0
    with FaultProxy(spanner_emulator.host, resume_tokens=True) as proxy:
        engine = proxy.emulator(spanner_emulator).engine(spanner_emulator.create_database())
        Big.metadata.create_all(engine)
        with engine.begin() as conn:
            rows = [{"id": i, "ts": T0 + dt.timedelta(seconds=i), "pad": "x"} for i in range(ROWS)]
            conn.execute(sa.insert(Big), rows)
        seen: list[float] = []

        @event.listens_for(engine, "before_cursor_execute")
        def slow_then_cut(*args: Any) -> None:
            seen.append(args[4].execution_options["timeout"])
            if len(seen) == 1:
                time.sleep(1.5)  # the bound round: a slow server
            else:  # the rows: one message, then every restart cut at once
                proxy.cut_stream("ExecuteStreamingSql", after=1)
                proxy.cut_stream("ExecuteStreamingSql", after=0, times=10_000)

        proxy.clear()
        try:
            with forced("two rounds"), engine.connect() as conn:
                started = time.monotonic()
                with pytest.raises(sa.exc.OperationalError, match="can be retried") as caught:
                    page(conn, newest(), 10, timeout=timeout)
                took = time.monotonic() - started
            restarts = proxy.count("ExecuteStreamingSql", "cut after 0")
        finally:
            proxy.clear()
            engine.dispose()
    assert len(seen) == 2 and seen[1] <= timeout - 1.5
    assert restarts >= 2, "the rows statement's stream did not restart"
    assert "deadline" in str(caught.value) or "connection" in str(caught.value)
    assert took < timeout + 1.0, f"the read took {took:.1f} s under timeout={timeout}"
