"""A time-ordered key doctor recognised by its values (a UUIDv7 made by an app's own helper,
a ULID, a date-led text id) reaches ``--fix``: the planner takes the growing part from the
finding's roles, not from the declaration, and plans the key reshard over that column."""

from __future__ import annotations

import pytest
from test_doctor_inputs import MODELS, TIME_ORDERED_IDS, _tail_rows

from sharded_orm import doctor
from sharded_orm.tools.doctor.changes import ModelChange, Planner
from sharded_orm.tools.doctor.diagnose import attribute_names
from sharded_orm.tools.doctor.keys import Catalog


@pytest.mark.parametrize("kind", list(TIME_ORDERED_IDS))
def test_a_key_growing_by_its_values_is_planned_as_a_key_reshard(kind: str) -> None:
    table, make, _ = TIME_ORDERED_IDS[kind]
    [finding] = doctor(_tail_rows(table, make, 8, 3), MODELS).findings
    planner = Planner(Catalog(MODELS.metadata, attribute_names(MODELS)), MODELS.metadata)
    change = planner.plan(finding)
    assert isinstance(change, ModelChange), change
    assert change.kind == "key_reshard"
    key = MODELS.metadata.tables[table].primary_key.columns[0].name
    [shard] = [c for c in change.after.columns if c.name == change.new_shard]
    assert change.after.primary_key.columns[0].name == shard.name  # the shard leads the key
    text = change.model_text.replace('"', "'")
    assert f"primary_key('{shard.name}', '{key}')" in text, text
    assert "shard_column(" in text and f"grows at {key}" in text, text
