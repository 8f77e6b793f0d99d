"""A split simulator: where a schema's writes land, before production does it for you.

Spanner's Key Visualizer shows a hotspot only after real traffic has hit it. This package
replays a described workload through the *real* models: rows get their shard columns from
``ShardColumn.compute`` (the function the write hooks use), bit-reversed ids from
``sharded_orm.bit_reverse``, and every key is ordered as the table's primary key or the
index orders it, descending parts included. Each row is one table write plus one write per
secondary index (indexes are tables of their own on Spanner).

Its parts, each importing only the ones above it:

- ``workload``: the :class:`Workload` and the rows it makes;
- ``instance``: the modelled :class:`Instance`, its key spaces, splitting and placement;
- ``results``: :class:`SimulationResult` and :class:`Comparison` (and the split
  statistics rows a run predicts, ``hot_split_rows()``);
- ``run``: the run loop; ``api``: :func:`simulate` and :func:`sample_rows`;
- ``heatmap``: Key-Visualizer-style pictures (matplotlib, only when drawing).
"""

from __future__ import annotations

from collections.abc import Sequence

from sharded_orm.tools.simulate.api import sample_rows, simulate
from sharded_orm.tools.simulate.instance import Instance, desc_transform
from sharded_orm.tools.simulate.results import Comparison, SimulationResult, text_heatmap
from sharded_orm.tools.simulate.workload import ROLES, Workload, guess_role

__all__: Sequence[str] = (
    "ROLES",
    "Comparison",
    "Instance",
    "SimulationResult",
    "Workload",
    "desc_transform",
    "guess_role",
    "sample_rows",
    "simulate",
    "text_heatmap",
)
