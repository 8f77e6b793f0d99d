"""The pytest plugin's helpers, for imports (the plugin itself is ``sharded_orm_pytest``).

The plugin lives outside the ``sharded_orm`` package, so that pytest loading it through
the ``pytest11`` entry point imports nothing of the library. Its hooks are not
re-exported here, so naming this module as a plugin as well registers nothing twice.
"""

from __future__ import annotations

from sharded_orm_pytest import EMULATOR_FIXTURES, emulator_required

__all__ = ["EMULATOR_FIXTURES", "emulator_required"]
