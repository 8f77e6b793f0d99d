"""``sharded_orm.doctor``: read Spanner's hot-split statistics and say what to change.

Spanner reports hot splits in ``SPANNER_SYS.SPLIT_STATS_TOP_MINUTE`` (and the 10-minute
and hour views) as raw key ranges. ``doctor`` maps them back to the models: which table
or index, which shard and tenant, which pattern, and the fix in the library's terms.
Parts: ``keys`` (split keys decoded with the metadata), ``sources`` (an engine, rows, a
file), ``diagnose`` (grouping and classification), ``report`` (table and heatmap).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sharded_orm.errors import ShardTypeError
from sharded_orm.tools.doctor.diagnose import (
    PATTERNS,
    attribute_names,
    diagnose,
    metadata_of_models,
)
from sharded_orm.tools.doctor.findings import Diagnosis, EmptyWindowError, HotspotFinding
from sharded_orm.tools.doctor.keys import Catalog, Key, KeyPart, parse_key
from sharded_orm.tools.doctor.sources import (
    VIEWS,
    StatisticsUnavailableError,
    load_rows,
    query_for,
)


def doctor(
    source: Any,
    models: Any,
    *,
    window: str = "minute",
    since: dt.datetime | dt.timedelta | None = None,
) -> Diagnosis:
    """Diagnose the hot splits of ``source`` against ``models``.

    ``source``: an Engine on Spanner (reads ``SPANNER_SYS.SPLIT_STATS_TOP_<window>``), an
    iterable of dicts keyed by that view's column names (e.g. ``hot_split_rows()`` of a
    simulation), or a CSV/JSON export's path. ``models``: a declarative base, a MetaData or
    a list of models. ``window``: ``"minute"``, ``"10minute"`` or ``"hour"`` (the view);
    ``since``: the first interval end to read (a datetime, or a timedelta back from now;
    default for an engine: 6 hours).
    """
    if isinstance(since, dt.timedelta):
        since = dt.datetime.now(dt.timezone.utc) - since
    elif since is not None and not isinstance(since, dt.datetime):
        raise ShardTypeError(f"since must be a datetime or a timedelta, got {since!r}")
    elif since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=dt.timezone.utc)
    catalog = Catalog(metadata_of_models(models), attribute_names(models))
    diagnosis = diagnose(load_rows(source, window, since), catalog, window)  # one pass
    if diagnosis.heat.simulated:
        diagnosis.source = "simulated"
    elif hasattr(source, "dialect"):
        diagnosis.source = "production"
    elif isinstance(source, (str, Path)):
        diagnosis.source = f"exported statistics ({Path(source).name})"
    return diagnosis


__all__: Sequence[str] = (
    "PATTERNS",
    "VIEWS",
    "Catalog",
    "Diagnosis",
    "EmptyWindowError",
    "HotspotFinding",
    "Key",
    "KeyPart",
    "StatisticsUnavailableError",
    "doctor",
    "parse_key",
    "query_for",
)
