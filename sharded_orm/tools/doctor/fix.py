"""``doctor --fix``: the reviewed Alembic revisions that remove what doctor found.

For each finding a schema change can fix (:mod:`.changes`), the revision(s) are rendered by
Alembic with the library's renderers (``alembic_ext.fix``) and, given the project's Alembic
configuration, written into its versions folder after its head, each with the model change
it assumes beside it (``<revision file>.model.txt``): apply both, and ``alembic check`` is
clean. Nothing is applied: the revisions are printed for review. Findings no migration
fixes, and schemas the revisions cannot carry, are listed with what they point at. A
finding whose revisions an earlier run wrote (pending or applied) is said, not written again.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharded_orm.errors import ShardConfigError
from sharded_orm.tools.doctor.changes import ModelChange, Planner, Refusal
from sharded_orm.tools.doctor.diagnose import attribute_names, metadata_of_models
from sharded_orm.tools.doctor.findings import Diagnosis
from sharded_orm.tools.doctor.keys import Catalog


@dataclass
class FixReport:
    """What ``fix`` planned and wrote: changes (with their revisions) and refusals."""

    changes: list[ModelChange]
    refusals: list[Refusal]
    #: per change, its revisions (``alembic_ext.fix.Revision``: message, upgrade, path...)
    revisions: list[list[Any]] = field(default_factory=list)
    #: changes an earlier run already wrote, with those revisions (``alembic_ext.fix.Prior``)
    already: list[tuple[ModelChange, list[Any]]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for change, revs in zip(self.changes, self.revisions, strict=True):
            out.append(
                {
                    **change.finding.as_dict(),
                    "fix": change.kind,
                    "count": change.count or None,
                    "model_change": change.model_text,
                    "revisions": [
                        {
                            "message": r.message,
                            "revision": r.revision,
                            "path": str(r.path) if r.path else None,
                            "upgrade": r.upgrade,
                            "downgrade": r.downgrade,
                        }
                        for r in revs
                    ],
                }
            )
        for change, prior in self.already:
            out.append(
                {
                    **change.finding.as_dict(),
                    "fix": change.kind,
                    "already_written": [
                        {
                            "message": r.message,
                            "revision": r.revision,
                            "path": str(r.path),
                            "state": r.state,
                        }
                        for r in prior
                    ],
                }
            )
        for refusal in self.refusals:
            out.append({**refusal.finding.as_dict(), "fix": None, "no_migration": refusal.reason})
        return {"fixes": out}

    def text(self) -> str:
        lines: list[str] = []
        for change, revs in zip(self.changes, self.revisions, strict=True):
            f = change.finding
            lines.append(f"== {f.table}: {f.pattern} -> {change.kind} ({len(revs)} revision(s))")
            lines.append("model change (apply it with the revisions; then alembic check is clean):")
            lines.extend(f"  {ln}" for ln in change.model_text.splitlines())
            for r in revs:
                where = f" -> {r.path}" if r.path else " (not written)"
                lines.append(f"-- revision {r.revision or '?'}: {r.message}{where}")
                lines.append("def upgrade():")
                lines.append(r.upgrade)
                lines.append("def downgrade():")
                lines.append(r.downgrade)
            lines.append("")
        for change, prior in self.already:
            f = change.finding
            lines.append(
                f"== {f.table}: {f.pattern} -> {change.kind}: already written by doctor --fix"
            )
            for r in prior:
                lines.append(f"-- revision {r.revision} ({r.state}): {r.message} -> {r.path}")
            pending = [r for r in prior if r.applied is not True]
            if pending:
                lines.append(
                    "  nothing new was written: apply these (alembic upgrade; a reshard: the "
                    "expand, deploy, then the contract) with the model change beside each "
                    "(<revision>.model.txt), or delete their files to have them written again"
                )
            else:
                lines.append(
                    "  nothing new was written: they are applied; if the models are not "
                    "changed yet, apply the model change beside each (<revision>.model.txt)"
                )
            lines.append("")
        for refusal in self.refusals:
            f = refusal.finding
            lines.append(f"== {f.table}: {f.pattern}: no migration")
            lines.append(f"  {refusal.reason}")
            lines.append("")
        if self.changes:
            lines.append(
                "Review each revision and its model change; nothing was applied. Apply with "
                "alembic upgrade (a reshard: the expand, deploy, then the contract)."
            )
        return "\n".join(lines).rstrip()


def _dialect() -> Any:
    from sqlalchemy.dialects import registry

    return registry.load("spanner.spanner")()


def fix(
    diagnosis: Diagnosis,
    models: Any,
    *,
    alembic: Any = None,
    count: int | None = None,
) -> FixReport:
    """Plan the fix of each finding of ``diagnosis`` against ``models``, render its
    revision(s) and, with ``alembic`` (an ``alembic.config.Config`` or the path of an
    ``alembic.ini``), write them into that project's versions folder after its head, each
    with its model change beside it. ``count``: the shard count to use (default: 10 for a
    new shard column, 16 for a new key shard, about twice the old one for a reshard; run
    ``sharded-orm advise`` to choose it). Never applies anything."""
    if not isinstance(diagnosis, Diagnosis):
        raise ShardConfigError(f"fix takes doctor()'s Diagnosis, got {diagnosis!r}")
    metadata = metadata_of_models(models)
    planner = Planner(Catalog(metadata, attribute_names(models)), metadata, count)
    changes: list[ModelChange] = []
    refusals: list[Refusal] = []
    changed: dict[str, str] = {}
    for finding in diagnosis.findings:
        planned = planner.plan(finding)
        if isinstance(planned, Refusal):
            refusals.append(planned)
        elif planned.table.name in changed:  # each revision is written against the models
            refusals.append(Refusal(finding, _one_change(planned, changed)))
        else:
            changed[planned.table.name] = f"{planned.finding.pattern} on {finding.table}"
            changes.append(planned)
    config = _config(alembic) if alembic is not None else None
    render = importlib.import_module("alembic_ext.fix")
    already: list[tuple[ModelChange, list[Any]]] = []
    if config is not None:  # what an earlier run wrote is said, not written again
        prior = [(change, render.written_before(config, change)) for change in changes]
        already = [(change, revs) for change, revs in prior if revs]
        changes = [change for change, revs in prior if not revs]
    dialect = _dialect() if changes else None
    report = FixReport(changes, refusals, already=already)
    # every revision rendered before the first is written: a refusal writes nothing
    report.revisions = [render.render_change(change, dialect) for change in changes]
    if config is not None:
        for change, revs in zip(changes, report.revisions, strict=True):
            render.write_revisions(config, revs)
            for r in revs:
                r.path.with_suffix(".model.txt").write_text(change.model_text + "\n")
    return report


def _one_change(change: ModelChange, changed: dict[str, str]) -> str:
    return (
        f"table {change.table.name} already gets a revision here (for "
        f"{changed[change.table.name]}), written against the models as they are: apply it "
        "and its model change, then run doctor --fix again for this finding"
    )


def _config(alembic: Any) -> Any:
    from alembic.config import Config

    if isinstance(alembic, Config):
        return alembic
    path = Path(alembic)
    if not path.is_file():
        raise ShardConfigError(
            f"no Alembic configuration at {str(path)!r}: give the project's alembic.ini "
            "(--alembic-ini), or run from the folder that holds it"
        )
    cfg = Config(str(path))
    if not cfg.get_main_option("script_location"):
        raise ShardConfigError(f"{str(path)!r} has no script_location: is it an alembic.ini?")
    return cfg
