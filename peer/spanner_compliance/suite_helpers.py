"""What the suite imports as ``tests._helpers`` (a module of sqlalchemy-spanner's repo, not
in its sdist): the database URL and project of this run. ``run.sh`` installs it there."""

from __future__ import annotations

import os
import re


def get_db_url() -> str:
    """The emulator database of this run (``run.sh`` passes it, as to ``--dburi``)."""
    return os.environ["SPANNER_COMPLIANCE_URL"]


def get_project() -> str:
    """The project named in that URL."""
    found = re.search(r"projects/([^/]+)/", get_db_url())
    if found is None:
        raise ValueError(f"no project in {get_db_url()!r}")
    return found[1]
