"""The one cache mechanism, ``sharded_orm.memo.Memo``, and the caches that use it.

A memo keeps at most ``maxsize`` entries (and ``maxbytes``), dropping the least recently
used, and is safe to share between threads. The library's caches used to clear
*everything* when full, so a hot entry was rebuilt each time the cache filled with
one-off entries; the tests at the end check that a hot entry now survives.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from sharded_orm.memo import Memo

# ---------------------------------------------------------------- the memo itself

ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 12), st.integers(0, 40)),
        st.tuples(st.just("get"), st.integers(0, 12), st.just(0)),
        st.tuples(st.just("clear"), st.just(0), st.just(0)),
    ),
    max_size=80,
)


def _reference(
    model: OrderedDict[int, int], op: str, key: int, size: int, maxsize: int, maxbytes: int | None
) -> None:
    """The documented policy, written the plain way: LRU by count, then by bytes."""
    if op == "clear":
        model.clear()
    elif op == "get":
        if key in model:
            model.move_to_end(key)
    else:
        model.pop(key, None)
        if maxbytes is not None and size > maxbytes:
            return
        model[key] = size
        while len(model) > maxsize or (maxbytes is not None and sum(model.values()) > maxbytes):
            model.popitem(last=False)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 6), st.one_of(st.none(), st.integers(1, 100)))
def test_the_memo_keeps_the_most_recently_used_within_both_bounds(
    steps: list[tuple[str, int, int]], maxsize: int, maxbytes: int | None
) -> None:
    memo: Memo[int, int] = Memo("test", maxsize, maxbytes=maxbytes, sizeof=lambda v: v)
    model: OrderedDict[int, int] = OrderedDict()
    for op, key, size in steps:
        if op == "put":
            memo.put(key, size)
        elif op == "get":
            assert memo.get(key) == model.get(key)
        else:
            memo.clear()
        _reference(model, op, key, size, maxsize, maxbytes)
        assert memo.keys() == list(model)  # least recently used first
        assert len(memo) == len(model) <= maxsize
        stats = memo.stats()
        assert stats.nbytes == (sum(model.values()) if maxbytes is not None else 0)
        if maxbytes is not None:
            assert stats.nbytes <= maxbytes
        for k in range(13):
            assert (k in memo) == (k in model)


def test_a_get_makes_its_entry_the_last_to_go() -> None:
    memo: Memo[str, int] = Memo("test", 3)
    for i, k in enumerate("abc"):
        memo.put(k, i)
    assert memo.get("a") == 0
    memo.put("d", 3)
    assert "b" not in memo and memo.keys() == ["c", "a", "d"]
    assert memo.get("b") is None and memo.get("b", -1) == -1
    assert "c" in memo and memo.keys() == ["c", "a", "d"]  # `in` does not refresh
    assert memo.stats().hits == 1 and memo.stats().misses == 2
    assert memo.stats().evictions == 1


def test_a_value_over_the_byte_budget_is_not_kept_nor_its_older_value() -> None:
    memo: Memo[str, str] = Memo("test", 10, maxbytes=10, sizeof=len)
    memo.put("k", "small")
    memo.put("other", "x")
    memo.put("k", "much too large")
    assert memo.get("k") is None and memo.keys() == ["other"]
    assert memo.stats().nbytes == 1


def test_the_byte_bound_defaults_to_getsizeof() -> None:
    memo: Memo[int, bytes] = Memo("test", 100, maxbytes=1000)
    for i in range(50):
        memo.put(i, bytes(100))
    assert 0 < len(memo) < 10
    assert memo.stats().nbytes <= 1000


@pytest.mark.parametrize(
    ("maxsize", "maxbytes", "message"),
    [
        (0, None, "maxsize must be a positive int, got 0"),
        (True, None, "maxsize must be a positive int, got True"),
        (2.5, None, "maxsize must be a positive int, got 2.5"),
        (4, 0, "maxbytes must be a positive int or None, got 0"),
    ],
)
def test_bad_bounds_are_refused_with_what_to_pass(
    maxsize: Any, maxbytes: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        Memo("mine", maxsize, maxbytes=maxbytes)
    assert "'mine'" in str(info.value) and "pass the" in str(info.value)


def test_an_unhashable_key_raises_type_error_and_leaves_the_memo_usable() -> None:
    memo: Memo[Any, int] = Memo("test", 2)
    with pytest.raises(TypeError):
        memo.get([1])
    with pytest.raises(TypeError):
        memo.put([1], 1)
    memo.put("k", 1)  # the lock was released
    assert memo.get("k") == 1


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 64), st.integers(2, 8))
def test_threads_putting_and_getting_at_once_keep_the_bounds_and_the_counts(
    maxsize: int, threads: int
) -> None:
    memo: Memo[tuple[int, int], int] = Memo("test", maxsize, maxbytes=60 * maxsize, sizeof=int)
    per_thread = 500
    start = threading.Barrier(threads)
    wrong: list[str] = []

    def work(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            memo.put((t, i), 1 + i % 50)
            got = memo.get((t, i // 2))
            if got is not None and got != 1 + (i // 2) % 50:
                wrong.append(f"{(t, i // 2)} -> {got}")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not wrong
    stats = memo.stats()
    assert stats.size == len(memo) <= maxsize
    assert stats.nbytes == sum(memo.get(k) or 0 for k in list(memo.keys())) <= 60 * maxsize
    assert stats.evictions == threads * per_thread - stats.size  # every key put once
    assert stats.hits + stats.misses == threads * per_thread


# ---------------------------------------------------- the library's caches, now memos


def test_a_hot_columns_coercer_outlives_a_flood_of_one_off_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sharded_orm.schema import coerce

    built: list[str] = []
    real = coerce.coercer_for

    def counting(column: Any) -> Any:
        built.append(column.name)
        return real(column)

    monkeypatch.setattr(coerce, "coercer_for", counting)
    hot = sa.Column("hot", sa.Integer)
    others = [sa.Column(f"c{i}", sa.Integer) for i in range(5000)]
    for i, column in enumerate(others):
        assert coerce.stored_value(column, i) == i
        assert coerce.stored_value(hot, i) == i
    assert built.count("hot") == 1  # the old cache cleared itself at 4096 and rebuilt it


def test_a_hot_binds_span_attributes_outlive_a_flood_of_tables(
    otel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sharded_orm.telemetry import conventions, spans

    described: list[str | None] = []
    real = conventions.database_attributes

    def counting(bind: Any, name: str, table: str | None) -> Any:
        described.append(table)
        return real(bind, name, table)

    monkeypatch.setattr(spans, "database_attributes", counting)
    engine = sa.create_engine("sqlite://")
    for i in range(600):
        with spans.operation("memo_test", engine, table=f"t{i}"):
            pass
        with spans.operation("memo_test", engine, table="hot"):
            pass
    assert described.count("hot") == 1  # the old cache cleared itself at 512


def test_a_hot_databases_namespace_outlives_a_flood_of_databases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sharded_orm.telemetry import conventions, skew

    asked: list[str] = []
    real = conventions.database_attributes

    def counting(bind: Any, name: str, table: str | None) -> Any:
        asked.append(str(bind.url))
        return real(bind, name, table)

    monkeypatch.setattr(conventions, "database_attributes", counting)
    dialect = sa.create_engine("sqlite://").dialect

    def bind(name: str) -> Any:
        return SimpleNamespace(dialect=dialect, url=sa.make_url(f"sqlite:///{name}.db"))

    hot = bind("memo_hot")
    for i in range(600):
        assert skew.database_of(bind(f"memo_{i}")) == f"memo_{i}.db"
        assert skew.database_of(hot) == "memo_hot.db"
    assert asked.count("sqlite:///memo_hot.db") == 1  # the old cache cleared itself at 512
    nameless = SimpleNamespace(dialect=dialect, url=sa.make_url("sqlite://"))
    assert skew.database_of(nameless) is None and skew.database_of(nameless) is None
    assert asked.count("sqlite://") == 1  # no namespace: None, and remembered as None


def test_no_cache_clears_itself_when_full() -> None:
    """One eviction policy (issue 45): no module empties a cache because it is full
    (``if len(cache) >= N: cache.clear()``); bounded caches are ``Memo``s."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for package in ("sharded_orm", "alembic_ext"):
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
                    continue
                left = node.test.left
                if not (
                    isinstance(left, ast.Call)
                    and isinstance(left.func, ast.Name)
                    and left.func.id == "len"
                    and left.args
                ):
                    continue
                sized = ast.unparse(left.args[0])
                for stmt in node.body:
                    call = stmt.value if isinstance(stmt, ast.Expr) else None
                    if (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "clear"
                        and ast.unparse(call.func.value) == sized
                    ):
                        found.append(f"{path.relative_to(root)}:{node.lineno} {sized}")
    assert not found, f"caches emptied when full (use sharded_orm.memo.Memo): {found}"
