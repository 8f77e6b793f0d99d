"""What Spanner cannot do, for Alembic's suite (SQLAlchemy's requirements mechanism).

Each property below changes Alembic's default for a reason of Spanner's, said beside it.
Nothing is excluded because it fails for sharded-orm: a test of a feature Spanner has
runs in both configurations (stock and ours) and ``peer/compare.py`` compares them.
"""

from alembic.testing.requirements import SuiteRequirements
from sqlalchemy.testing import exclusions


class Requirements(SuiteRequirements):
    # -- what Spanner has, that Alembic's defaults leave off

    @property
    def autocommit_isolation(self):
        # the Spanner DB-API has an autocommit mode (SQLAlchemy's AUTOCOMMIT level)
        return exclusions.open()

    @property
    def computed_columns(self):
        # Spanner has generated columns: AS (expr) STORED
        return exclusions.open()

    # -- what Spanner does not have

    @property
    def integer_subtype_comparisons(self):
        # Spanner has one integer type, INT64: Integer and BigInteger are the same column
        return exclusions.closed()

    @property
    def fk_ondelete_is_reflected(self):
        # left closed (Alembic's default): the emulator's INFORMATION_SCHEMA.
        # REFERENTIAL_CONSTRAINTS says DELETE_RULE 'NO ACTION' for a key created ON DELETE
        # CASCADE (checked on emulator 1.5.x), so no dialect can reflect it there
        return exclusions.closed()

    @property
    def identity_columns(self):
        # Spanner's IDENTITY is bit-reversed with START COUNTER WITH / SKIP RANGE only: no
        # INCREMENT, MINVALUE, MAXVALUE or CYCLE, which every identity test varies
        return exclusions.closed()

    @property
    def fk_onupdate(self):
        # Spanner's foreign keys have no ON UPDATE action (the key column cannot change)
        return exclusions.closed()

    @property
    def fk_ondelete_restrict(self):
        # Spanner's ON DELETE is NO ACTION or CASCADE; there is no RESTRICT
        return exclusions.closed()

    @property
    def fk_onupdate_restrict(self):
        # no ON UPDATE at all (see fk_onupdate)
        return exclusions.closed()

    @property
    def fk_initially(self):
        # no deferred constraint checking on Spanner
        return exclusions.closed()

    @property
    def fk_deferrable(self):
        # no deferred constraint checking on Spanner
        return exclusions.closed()
