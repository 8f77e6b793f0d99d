"""The order the plugin gives a table's operations: Spanner compares names
case-insensitively, so a constraint or index re-added under the same name (any case)
must be dropped first, or Spanner refuses the migration ("Duplicate name in schema")."""

from __future__ import annotations

from alembic.operations import ops

from alembic_ext.shaping import order_in_table


def _fk(name: str) -> ops.CreateForeignKeyOp:
    return ops.CreateForeignKeyOp(name, "child", "parent", ["pid"], ["id"])


def test_constraint_renamed_in_case_is_dropped_before_it_is_added() -> None:
    add = _fk("FK_CHILD_PARENT")
    drop = ops.DropConstraintOp("fk_child_parent", "child", type_="foreignkey")
    assert order_in_table([add, drop]) == [drop, add]


def test_changed_constraint_same_name_is_dropped_first() -> None:
    add = _fk("fk_a")
    drop = ops.DropConstraintOp("fk_a", "child", type_="foreignkey")
    assert order_in_table([add, drop]) == [drop, add]


def test_replaced_constraint_stays_until_its_successor_exists() -> None:
    add = _fk("fk_new")
    drop = ops.DropConstraintOp("fk_old", "child", type_="foreignkey")
    assert order_in_table([drop, add]) == [add, drop]


def test_index_renamed_in_case_is_dropped_first() -> None:
    create = ops.CreateIndexOp("IX_A", "child", ["pid"])
    drop = ops.DropIndexOp("ix_a", "child")
    assert order_in_table([create, drop]) == [drop, create]
