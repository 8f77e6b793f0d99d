"""A migration's schema change, sent and awaited within deadlines.

``Database.update_ddl(...).result()`` waits without end: the client sends
``UpdateDatabaseDdl`` under its default hour (retrying DEADLINE_EXCEEDED and UNAVAILABLE
for an hour more), and api-core polls the long-running operation with ``GetOperation``
calls of up to 600 s each, retried for 600 s. So a silent server held `alembic upgrade`
for hours. The admin API's calls in :mod:`sharded_orm.spanner.admin` (the same stub
``update_ddl`` uses) take a :class:`~sharded_orm.retry.Deadline` per call, and Spanner's
``operation_id`` makes a re-sent request safe (a second one is refused with
ALREADY_EXISTS): we send and poll with both.

Two limits, both ``alembic.config.Config.attributes``:

* ``sharded_orm.ddl_timeout`` (``DEFAULT_DDL_TIMEOUT``, 6 h): the most one batch may
  take, index backfills included (they can take hours on a large table);
* ``sharded_orm.ddl_call_timeout`` (``DEFAULT_DDL_CALL_TIMEOUT``, 60 s): the most
  Spanner may stay silent, sending the batch or answering a poll of its progress.

Past either, :class:`SchemaChangeTimeout` says what was sent, that Spanner may still
apply it, how to check, and how to go on.

A schema change is refused (FAILED_PRECONDITION, "... a concurrent schema change operation
or read-write transaction is already in progress") while another schema change runs, or,
on the emulator, while any read-write transaction is open: the app's writers keep one open
a few times a second. That refusal, and only it (matched by status and message,
:func:`is_busy_refusal`), is retried with capped exponential backoff and jitter
(:data:`BUSY_WAITS`, the library's one retry wait) under the ``ddl_timeout``, each wait
logged to ``alembic.sharded_orm`` (shown by ``alembic upgrade``); past the
``ddl_timeout``, :class:`SchemaChangeBusy` says what it waited for and how to go on.
Every other refusal is raised at once.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from sharded_orm.retry import DEFAULTS, Deadline, RetryPolicy
from sharded_orm.spanner import admin

from .errors import MigrationError
from .steps import PROGRESS_LOGGER

DDL_TIMEOUT_ATTRIBUTE = "sharded_orm.ddl_timeout"
DDL_CALL_TIMEOUT_ATTRIBUTE = "sharded_orm.ddl_call_timeout"
DEFAULT_DDL_TIMEOUT = DEFAULTS["schema_change"]
DEFAULT_DDL_CALL_TIMEOUT = DEFAULTS["schema_change_call"]


#: FAILED_PRECONDITION messages of a schema change refused because the database is busy
#: (another schema change, or, on the emulator, any open read-write transaction): retried.
BUSY_MESSAGES = (
    "concurrent schema change operation or read-write transaction is already in progress",
)
#: the google.rpc code of FAILED_PRECONDITION (an operation's error carries the number)
_FAILED_PRECONDITION = 9

_log = logging.getLogger(PROGRESS_LOGGER)
T = TypeVar("T")
#: the waits between refused attempts: 0.25-0.5 s first, doubling, at most 5-10 s (a
#: schema change waits on whole transactions and other schema changes, not on one row)
BUSY_WAITS = RetryPolicy(base_delay=0.5, max_delay=10.0)


class SchemaChangeTimeout(MigrationError):
    """A schema change did not finish within its limits; it may still finish on Spanner."""


class SchemaChangeBusy(MigrationError):
    """A schema change was refused until its deadline because the database stayed busy
    (another schema change, or a read-write transaction): nothing of it was applied."""


def _busy_message(message: str) -> bool:
    text = " ".join(message.lower().split())
    return any(m in text for m in BUSY_MESSAGES)


def is_busy_refusal(exc: BaseException) -> bool:
    """True for Spanner's refusal of a schema change while another schema change or a
    read-write transaction is in progress (retried); False for every other error."""
    return admin.is_failed_precondition(exc) and _busy_message(str(getattr(exc, "message", "")))


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


def apply_ddl(database: Any, statements: list[str], *, timeout: float, call_timeout: float) -> None:
    """Send ``statements`` as one ``UpdateDatabaseDdl`` and wait until Spanner applied them.

    Raises the client's error if Spanner refuses one, :class:`SchemaChangeTimeout` if the
    batch is not done within ``timeout`` or Spanner is silent for ``call_timeout``. A
    refusal because the database is busy (:func:`is_busy_refusal`) is retried after the
    waits of :data:`BUSY_WAITS` and logged, :class:`SchemaChangeBusy` once the wait would pass
    ``timeout``."""
    whole = Deadline.after(timeout, "the ddl_timeout")
    # silence: renewed at each answer of Spanner's
    quiet = [Deadline.after(call_timeout, "the ddl_call_timeout")]
    sent = [False]
    refusals = 0
    operation_id = ""

    def fail(why: str) -> SchemaChangeTimeout:
        return SchemaChangeTimeout(_message(why, database.name, operation_id, statements))

    def call(rpc: Callable[[Deadline], T]) -> T:
        """``rpc(deadline)`` until answered; silence for ``call_timeout`` is an error."""
        while True:
            if whole.expired:
                raise fail(f"it was not done within {timeout:g} s (the ddl_timeout)")
            if quiet[0].expired:
                raise fail(
                    f"Spanner did not answer for {call_timeout:g} s (the ddl_call_timeout) "
                    + ("while it ran" if sent[0] else "when it was sent")
                )
            first = whole.sooner(quiet[0])
            try:
                answer = rpc(first)
            except Exception as exc:
                if not admin.is_silence(exc):
                    raise
                time.sleep(first.cap(0.5))
                continue
            quiet[0] = Deadline.after(call_timeout, "the ddl_call_timeout")
            return answer

    def wait_until_free(reason: str) -> None:
        """The batch was refused as the database is busy: wait, or fail past ``whole``."""
        quiet[0] = Deadline.after(call_timeout, "the ddl_call_timeout")  # a refusal answers
        nonlocal refusals
        # one last try before the end
        delay = min(BUSY_WAITS.delay(refusals), whole.remaining() - 0.05)
        refusals += 1
        if delay <= 0:
            raise SchemaChangeBusy(
                _busy(reason, whole.elapsed(), refusals, timeout, database.name, statements)
            )
        _log.info(
            "schema change waiting: Spanner refused it because another schema change or a "
            "read-write transaction is in progress (the app's writers keep one open on the "
            "emulator); retry %d in %.1f s, waited %.0f s of the %g s ddl_timeout: %s",
            refusals, delay, whole.elapsed(), timeout, "; ".join(statements)[:300],
        )  # fmt: skip
        time.sleep(delay)

    while True:
        # a new id per attempt: a refused request created no operation, a failed one
        # keeps its id; within an attempt the same id makes a re-send safe
        operation_id = f"sharded_orm_{uuid.uuid4().hex}"
        sent[0] = False
        try:
            operation = call(functools.partial(admin.send_ddl, database, statements, operation_id))
        except Exception as exc:
            if not is_busy_refusal(exc):
                raise
            wait_until_free(str(getattr(exc, "message", exc)))
            continue
        sent[0] = True
        poll = functools.partial(admin.poll_ddl, database, operation_id)
        delay = 0.2
        while operation is None or not operation.done:
            if operation is not None:
                time.sleep(whole.cap(delay))
                delay = min(delay * 1.5, 10.0)
            operation = call(poll)
        if operation.code == _FAILED_PRECONDITION and _busy_message(operation.message):
            wait_until_free(operation.message)
            continue
        if operation.code:
            raise admin.operation_error(operation.code, operation.message)
        return


def _busy(
    reason: str, waited: float, refusals: int, timeout: float, database: str,
    statements: list[str],
) -> str:  # fmt: skip
    parts = database.split("/")
    instance, db = (parts[3], parts[5]) if len(parts) >= 6 else ("INSTANCE", database)
    return (
        f"The schema change of this migration was not applied: Spanner refused it {refusals} "
        f"time(s) in {waited:.0f} s ({reason}) because another schema change or a read-write "
        "transaction was in progress each time, and the next wait would pass the "
        f"{timeout:g} s ddl_timeout. Nothing of this batch was applied and the revision is "
        "not recorded. Stop or pause the writers that keep transactions open (on the "
        "emulator any open read-write transaction blocks a schema change), or wait for the "
        "other schema change (`gcloud spanner operations list "
        f"--instance={instance} --database={db} --type=DATABASE_UPDATE_DDL`), then run "
        "`alembic upgrade` again; or wait longer: config.attributes"
        f"[{DDL_TIMEOUT_ATTRIBUTE!r}] sets the limit. The batch: "
        f"{'; '.join(statements)[:2000]}"
    )


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
