"""Split a one-step reshard into its expand and its contract revision.

A model change that replaces a shard column in one step (the new column and its
ShardedIndex added, the old ones removed) must still reach the database as two
revisions: readers of the old index keep working until every one of them runs the new
code. An autogenerate plugin only sees the operations of one revision, so the split is
done by Alembic's public ``process_revision_directives`` hook, given once in env.py::

    import alembic_ext
    context.configure(..., process_revision_directives=alembic_ext.split_reshard)

Without it autogenerate refuses the one-step change and says how to do it in two steps.
"""

from __future__ import annotations

from typing import Any

from alembic import util
from alembic.operations import ops

from .ops import AddShardColumnOp, DropShardColumnOp, VerifyShardOp

CONTRACT_NOTE = (
    "CONTRACT of a reshard: apply only after every reader runs the new code "
    "(it drops the old shard column and its index)"
)


def _contract_part(mod: ops.ModifyTableOps) -> list[ops.MigrateOperation]:
    """Move out of ``mod`` what the contract does: verify, drop old indexes and columns."""
    found = mod.ops
    if not (
        any(type(o) is AddShardColumnOp for o in found)
        and any(isinstance(o, DropShardColumnOp) for o in found)
    ):
        return []
    created = {o.index_name for o in found if isinstance(o, ops.CreateIndexOp)}
    moved: list[ops.MigrateOperation] = [
        o
        for o in found
        if isinstance(o, (DropShardColumnOp, VerifyShardOp))
        or (isinstance(o, ops.DropIndexOp) and o.index_name not in created)
    ]
    mod.ops = [o for o in found if not any(o is m for m in moved)]
    return moved


def split_reshard(context: Any, revision: Any, directives: list[ops.MigrationScript]) -> None:
    """``process_revision_directives`` hook: a revision that adds a shard column and
    drops the one it replaces becomes the expand plus a contract revision after it."""
    extra: list[ops.MigrationScript] = []
    for script in directives:
        if script.rev_id is None or not script.upgrade_ops_list:
            continue
        contract_ups: list[ops.UpgradeOps] = []
        contract_downs: list[ops.DowngradeOps] = []
        for i, up in enumerate(script.upgrade_ops_list):
            tables: list[ops.MigrateOperation] = []
            for o in up.ops:
                if isinstance(o, ops.ModifyTableOps):
                    moved = _contract_part(o)
                    if moved:
                        tables.append(ops.ModifyTableOps(o.table_name, moved, schema=o.schema))
            if not tables:
                continue
            down = script.downgrade_ops_list[i]
            up.reverse_into(down)  # the expand's downgrade: without the contract's part
            c_up = ops.UpgradeOps(tables, upgrade_token=up.upgrade_token)
            contract_ups.append(c_up)
            contract_downs.append(
                c_up.reverse_into(ops.DowngradeOps([], downgrade_token=down.downgrade_token))
            )
        if not contract_ups:
            continue
        script_c = ops.MigrationScript(
            rev_id=util.rev_id(),
            message=f"{script.message or 'reshard'}: {CONTRACT_NOTE}",
            upgrade_ops=contract_ups[0],
            downgrade_ops=contract_downs[0],
            head=script.rev_id,
            version_path=script.version_path,
        )
        script_c.upgrade_ops, script_c.downgrade_ops = contract_ups, contract_downs
        extra.append(script_c)
    directives.extend(extra)
