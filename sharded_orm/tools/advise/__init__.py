"""``sharded_orm.advise``: the shard count a table needs, from its data, with its read cost.

Every system picks the bucket count by a rule of thumb (16, one per node, "100 for 100x").
``advise`` prices each candidate ``N`` from a sample of the data: the busiest split's write
rate against a target (the instance model ``simulate`` uses: a split above
``load_split_threshold x node_capacity`` is warm), and what the app's newest-``k`` and page
reads cost at that ``N`` by the library's own merge. It recommends the ``N`` that meets the
write target with the least read cost, and shows the curve (text; a PNG with the heatmap
extra). Parts: ``layout`` (what is sized), ``sample`` (where the rows come from), ``cost``
(writes and reads per ``N``), ``report`` (the advice, its table and its picture).
"""

from __future__ import annotations

from collections.abc import Sequence

from sharded_orm.tools.advise.report import CANDIDATES, Advice, advise

__all__: Sequence[str] = ("CANDIDATES", "Advice", "advise")
