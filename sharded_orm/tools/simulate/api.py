"""The simulator's entry points: ``simulate`` and ``sample_rows``."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Table

from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.progress import Mode
from sharded_orm.schema.columns import table_of
from sharded_orm.tools.simulate.instance import Instance, spaces_of
from sharded_orm.tools.simulate.limits import check_ticks
from sharded_orm.tools.simulate.results import Comparison
from sharded_orm.tools.simulate.run import Run, key_columns, rows_at
from sharded_orm.tools.simulate.workload import RowMaker, Workload


def _schema_items(schemas: Any) -> list[tuple[str, Table]]:
    if isinstance(schemas, Mapping):
        items = list(schemas.items())
    elif isinstance(schemas, (list, tuple)):
        items = [(_default_name(s), s) for s in schemas]
    else:
        items = [(_default_name(schemas), schemas)]
    if not items:
        raise ShardConfigError("give at least one model or Table to simulate")
    out = []
    names = set()
    for name, obj in items:
        if not isinstance(name, str) or not name:
            raise ShardTypeError(f"schema names are non-empty strings, got {name!r}")
        if name in names:
            raise ShardConfigError(f"two schemas are named {name!r}: name them in a dict")
        names.add(name)
        try:
            table = table_of(obj)
        except ShardTypeError:
            raise ShardTypeError(
                f"schema {name!r}: expected a mapped class or a Table, got {obj!r}"
            ) from None
        out.append((name, table))
    return out


def _default_name(obj: Any) -> str:
    if isinstance(obj, Table):
        return obj.name
    return str(getattr(obj, "__name__", None) or table_of(obj).name)


def sample_rows(model: Any, workload: Workload, n: int = 10) -> list[dict[str, Any]]:
    """The first ``n`` rows the simulator would write for ``workload``, by column name.

    The values of the key and index columns (and shard sources) as the application and the
    library would write them: see what a workload makes before simulating it.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ShardConfigError(f"n must be a positive int, got {n!r}")
    table = table_of(model)
    maker = RowMaker(table, workload, key_columns(spaces_of(table)))
    rows = rows_at(maker, workload, random.Random(workload.seed), range(n))
    return [{c.name: v for c, v in row.items()} for row in rows]


def simulate(
    schemas: Any,
    workload: Workload,
    instance: Instance | None = None,
    *,
    heatmap: str | Path | None = None,
    progress_mode: Mode = "auto",
) -> Comparison:
    """Run ``workload`` against each schema and compare them.

    ``schemas``: a mapped class or a ``Table``, a list of them (named after the class or
    table), or a mapping of name -> class/Table to compare side by side. The same rows
    (same seed) go to every schema. ``heatmap``: write a PNG there (needs matplotlib).
    Each run reports through :mod:`sharded_orm.progress` (``progress_mode``: ``"auto"``, a bar
    on a terminal and log lines elsewhere; ``"off"``).
    """
    if not isinstance(workload, Workload):
        raise ShardTypeError(f"workload must be a Workload, got {workload!r}")
    instance = Instance() if instance is None else instance
    if not isinstance(instance, Instance):
        raise ShardTypeError(f"instance must be an Instance, got {instance!r}")
    check_ticks(workload, instance)
    items = _schema_items(schemas)
    if heatmap is not None:
        from sharded_orm.tools.simulate.heatmap import require_matplotlib

        require_matplotlib()
        from sharded_orm.tools.simulate.heatmap import check_output_path

        check_output_path(heatmap)
    results = [Run(name, table, workload, instance).run(progress_mode) for name, table in items]
    comparison = Comparison(workload, instance, results)
    if heatmap is not None:
        comparison.heatmap(heatmap)
    return comparison
