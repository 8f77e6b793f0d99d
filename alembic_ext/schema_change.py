"""A migration's schema change, sent and awaited within deadlines.

``Database.update_ddl(...).result()`` waits without end: the client sends
``UpdateDatabaseDdl`` under its default hour (retrying DEADLINE_EXCEEDED and UNAVAILABLE
for an hour more), and api-core polls the long-running operation with ``GetOperation``
calls of up to 600 s each, retried for 600 s. So a silent server held `alembic upgrade`
for hours. The client's own admin API (the same stub ``update_ddl`` uses) takes a
``timeout`` per call, and Spanner's ``operation_id`` makes a re-sent request safe (a
second one is refused with ALREADY_EXISTS): we send and poll with both.

Two limits, both ``alembic.config.Config.attributes``:

* ``sharded_orm.ddl_timeout`` (``DEFAULT_DDL_TIMEOUT``, 6 h): the most one batch may
  take, index backfills included (they can take hours on a large table);
* ``sharded_orm.ddl_call_timeout`` (``DEFAULT_DDL_CALL_TIMEOUT``, 60 s): the most
  Spanner may stay silent, sending the batch or answering a poll of its progress.

Past either, :class:`SchemaChangeTimeout` says what was sent, that Spanner may still
apply it, how to check, and how to go on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from .errors import MigrationError

DDL_TIMEOUT_ATTRIBUTE = "sharded_orm.ddl_timeout"
DDL_CALL_TIMEOUT_ATTRIBUTE = "sharded_orm.ddl_call_timeout"
DEFAULT_DDL_TIMEOUT = 6 * 3600.0
DEFAULT_DDL_CALL_TIMEOUT = 60.0


class SchemaChangeTimeout(MigrationError):
    """A schema change did not finish within its limits; it may still finish on Spanner."""


def _seconds(attributes: dict[str, Any], key: str, default: float) -> float:
    value = attributes.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise MigrationError(
            f"config.attributes[{key!r}] must be a positive number of seconds, got {value!r}"
        )
    return float(value)


def ddl_timeouts(attributes: dict[str, Any]) -> dict[str, float]:
    """``timeout`` and ``call_timeout`` for :func:`apply_ddl`, from ``Config.attributes``."""
    return {
        "timeout": _seconds(attributes, DDL_TIMEOUT_ATTRIBUTE, DEFAULT_DDL_TIMEOUT),
        "call_timeout": _seconds(attributes, DDL_CALL_TIMEOUT_ATTRIBUTE, DEFAULT_DDL_CALL_TIMEOUT),
    }


def _silent(exc: BaseException) -> bool:
    """No answer (or none usable) from the server: the same call may be made again."""
    from google.api_core import exceptions as api

    retryable = (api.DeadlineExceeded, api.ServiceUnavailable, api.ResourceExhausted)
    return isinstance(exc, retryable)


def apply_ddl(database: Any, statements: list[str], *, timeout: float, call_timeout: float) -> None:
    """Send ``statements`` as one ``UpdateDatabaseDdl`` and wait until Spanner applied them.

    Raises the client's error if Spanner refuses one, :class:`SchemaChangeTimeout` if the
    batch is not done within ``timeout`` or Spanner is silent for ``call_timeout``."""
    from google.api_core import exceptions as api
    from google.cloud.spanner_admin_database_v1.types import UpdateDatabaseDdlRequest

    # Database.update_ddl sends through this stub without a timeout: we send with ours
    admin = database._instance._client.database_admin_api
    metadata = [("google-cloud-resource-prefix", database.name)]
    operation_id = f"sharded_orm_{uuid.uuid4().hex}"
    name = f"{database.name}/operations/{operation_id}"
    request = UpdateDatabaseDdlRequest(
        database=database.name, statements=statements, operation_id=operation_id
    )
    end = time.monotonic() + timeout
    state = {"answered": time.monotonic(), "sent": False}

    def fail(why: str) -> SchemaChangeTimeout:
        return SchemaChangeTimeout(_message(why, database.name, operation_id, statements))

    def call(rpc: Callable[[float], Any]) -> Any:
        """``rpc(seconds)`` until answered; silence for ``call_timeout`` is an error."""
        while True:
            now = time.monotonic()
            quiet_until = state["answered"] + call_timeout
            if now >= end:
                raise fail(f"it was not done within {timeout:g} s (the ddl_timeout)")
            if now >= quiet_until:
                raise fail(
                    f"Spanner did not answer for {call_timeout:g} s (the ddl_call_timeout) "
                    + ("while it ran" if state["sent"] else "when it was sent")
                )
            try:
                answer = rpc(max(0.001, min(end, quiet_until) - now))
            except Exception as exc:
                if not _silent(exc):
                    raise
                time.sleep(min(0.5, max(0.0, min(end, quiet_until) - time.monotonic())))
                continue
            state["answered"] = time.monotonic()
            return answer

    def send(seconds: float) -> Any:
        try:
            return admin.update_database_ddl(
                request=request, metadata=metadata, timeout=seconds, retry=None
            ).operation
        except api.AlreadyExists:  # an earlier attempt reached Spanner: poll it
            return None

    def poll(seconds: float) -> Any:
        return admin.get_operation(
            request={"name": name}, metadata=metadata, timeout=seconds, retry=None
        )

    operation = call(send)
    state["sent"] = True
    delay = 0.2
    while operation is None or not operation.done:
        if operation is not None:
            time.sleep(max(0.0, min(delay, end - time.monotonic())))
            delay = min(delay * 1.5, 10.0)
        operation = call(poll)
    if operation.error.code:
        raise api.from_grpc_status(operation.error.code, operation.error.message)  # type: ignore[no-untyped-call]


def _message(why: str, database: str, operation_id: str, statements: list[str]) -> str:
    parts = database.split("/")
    instance, db = (parts[3], parts[5]) if len(parts) >= 6 else ("INSTANCE", database)
    listed = "; ".join(statements)
    return (
        f"The schema change of this migration did not finish: {why}. Statements sent as one "
        f"UpdateDatabaseDdl (operation {operation_id}): {listed[:2000]}. It is a long-running "
        "operation: Spanner may still apply it (statement by statement, in order) after this "
        f"error. Check it with `gcloud spanner operations describe {operation_id} "
        f"--instance={instance} --database={db}` (or `gcloud spanner operations list "
        f"--instance={instance} --database={db} --type=DATABASE_UPDATE_DDL`). Once it is done "
        "(or failed), run `alembic upgrade` again: this revision is not recorded, so it runs "
        "again from its start, and every statement the impl sends is safe to repeat (IF NOT "
        "EXISTS / IF EXISTS, or checked in INFORMATION_SCHEMA), so those already applied are "
        "skipped; your own op.execute() DML runs again. config.attributes"
        f"[{DDL_TIMEOUT_ATTRIBUTE!r}] and [{DDL_CALL_TIMEOUT_ATTRIBUTE!r}] set these limits."
    )
