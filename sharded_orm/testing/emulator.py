"""Find, start and talk to Google's Cloud Spanner emulator.

Used by the pytest plugin and by the examples. The binary ``emulator_main`` is started
directly on a free loopback port and stopped by PID (``gcloud emulators spanner start``
leaves it orphaned when gcloud is killed). google-cloud-spanner is imported only when a
client is needed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: Environment variable naming the emulator binary. When set, it is the only place looked at.
BINARY_ENV = "SHARDED_ORM_EMULATOR_BIN"
HOST_ENV = "SPANNER_EMULATOR_HOST"
#: Where SDK installs put the binary, besides ``<dir of gcloud>/cloud_spanner_emulator``.
SDK_LOCATIONS = (
    "/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/usr/local/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/opt/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
)


class EmulatorNotFound(RuntimeError):
    """No emulator binary (and no ``SPANNER_EMULATOR_HOST``) on this machine."""


class EmulatorFailed(RuntimeError):
    """An emulator was found but cannot be used (it died, or nothing listens at the host)."""


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_binary() -> str:
    """The emulator binary, looked for in order at:

    1. ``$SHARDED_ORM_EMULATOR_BIN``: when set, the only place looked at (so a test or a CI
       job can pin, or disable with a path that does not exist, the lookup);
    2. ``emulator_main`` on ``PATH``;
    3. the gcloud SDK: ``<dir of realpath(gcloud)>/cloud_spanner_emulator/emulator_main``,
       then :data:`SDK_LOCATIONS`.
    """
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        if _executable(explicit):
            return explicit
        raise EmulatorNotFound(
            f"no Cloud Spanner emulator: {BINARY_ENV}={explicit} is not an executable file "
            f"(when set, it is the only place looked at; unset it to search PATH and the "
            f"gcloud SDK, or set {HOST_ENV} to a running emulator)"
        )
    on_path = shutil.which("emulator_main")
    if on_path:
        return on_path
    candidates: list[str] = []
    gcloud = shutil.which("gcloud")
    if gcloud:
        sdk_bin = Path(os.path.realpath(gcloud)).parent
        candidates.append(str(sdk_bin / "cloud_spanner_emulator" / "emulator_main"))
    candidates.extend(c for c in SDK_LOCATIONS if c not in candidates)
    for c in candidates:
        if _executable(c):
            return c
    raise EmulatorNotFound(
        "no Cloud Spanner emulator: looked for emulator_main on PATH and at "
        + ", ".join(candidates)
        + ". Install the gcloud component 'cloud-spanner-emulator' (Debian package "
        f"google-cloud-cli-spanner-emulator), set {BINARY_ENV} to the emulator_main binary, "
        f"or set {HOST_ENV} to a running emulator."
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Seconds to wait for a started emulator to accept connections.
START_TIMEOUT = 30.0


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_for_port(
    binary: str, host: str, port: int, proc: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = log.read_text(errors="replace")[-2000:].strip() or "(no output)"
            raise EmulatorFailed(
                f"the emulator {binary} exited with code {proc.returncode}: {output}"
            )
        if _accepts(host, port):
            return
        time.sleep(0.05)
    raise EmulatorFailed(
        f"the emulator {binary} did not listen on {host}:{port} within "
        f"{START_TIMEOUT:g} s: {log.read_text(errors='replace')[-2000:]}"
    )


def check_reachable(host: str) -> None:
    """Fail clearly when ``SPANNER_EMULATOR_HOST`` names a port nobody listens on
    (the client would otherwise retry for minutes)."""
    name, _, port = host.rpartition(":")
    if not name or not port.isdigit():
        raise EmulatorFailed(f"{HOST_ENV}={host!r} is not HOST:PORT")
    if not _accepts(name.strip("[]"), int(port)):
        raise EmulatorFailed(
            f"{HOST_ENV}={host} but nothing accepts connections there: start the emulator "
            f"or unset {HOST_ENV} to let sharded-orm start one"
        )


class Emulator:
    """A running emulator (ours or the one at ``SPANNER_EMULATOR_HOST``) with one instance."""

    def __init__(self, host: str, project: str = "sharded-orm", instance_id: str = "test-instance"):
        self.host = host
        self.project = project
        self.instance_id = instance_id
        self._base_instance_id = instance_id
        self._instance_of: dict[str, str] = {}  # database id -> its instance id
        self._client: Any = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    def through(self, host: str) -> Emulator:
        """A handle on the same project and databases, reached at ``host`` (a proxy in
        front of this emulator). It shares which instance holds each database, so a
        database this handle or that one makes later, in an instance a full one rolled
        over to, is found through either."""
        handle = Emulator(host, project=self.project, instance_id=self.instance_id)
        handle._base_instance_id = self._base_instance_id
        handle._instance_of = self._instance_of
        return handle

    @property
    def pid(self) -> int | None:
        """PID of the emulator process we started (None for one found at the host)."""
        return self._process.pid if self._process is not None else None

    @property
    def client(self) -> Any:
        """A google-cloud-spanner ``Client`` on this emulator (anonymous, no metrics)."""
        if self._client is None:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import spanner

            # the client prefers $SPANNER_EMULATOR_HOST to api_endpoint: point it here
            # while the client is made (it reads the variable once)
            with host_env(self.host):
                self._client = spanner.Client(
                    project=self.project,
                    credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                    client_options={"api_endpoint": self.host},
                    disable_builtin_metrics=True,
                )
        return self._client

    def instance(self, database_id: str | None = None) -> Any:
        """The instance new databases go to, or the one holding ``database_id``."""
        return self.client.instance(self._instance_of.get(database_id or "", self.instance_id))

    def ensure_instance(self) -> None:
        from google.api_core.exceptions import AlreadyExists

        instance = self.client.instance(
            self.instance_id,
            configuration_name=f"projects/{self.project}/instanceConfigs/emulator-config",
            display_name=self.instance_id,
            node_count=1,
        )
        with contextlib.suppress(AlreadyExists):  # SPANNER_EMULATOR_HOST reused
            instance.create().result(60)

    def create_database(self, ddl: list[str] | tuple[str, ...] = ()) -> str:
        """A new, empty database (plus ``ddl``); returns its id."""
        from google.api_core.exceptions import ResourceExhausted

        database_id = "db-" + uuid.uuid4().hex[:20]
        try:
            self.instance().database(database_id, ddl_statements=list(ddl)).create().result(120)
        except ResourceExhausted:
            # the emulator holds 100 databases an instance, as Spanner does: a long test
            # session goes on in a new instance (databases already made stay where they are)
            self.instance_id = (
                f"{self._base_instance_id}-{len(set(self._instance_of.values())) + 1}"
            )
            self.ensure_instance()
            self.instance().database(database_id, ddl_statements=list(ddl)).create().result(120)
        self._instance_of[database_id] = self.instance_id
        return database_id

    def drop_database(self, database_id: str) -> None:
        self.instance(database_id).database(database_id).drop()

    def database(self, database_id: str) -> Any:
        """The google-cloud-spanner ``Database`` object."""
        return self.instance(database_id).database(database_id)

    def url(self, database_id: str) -> str:
        """The SQLAlchemy URL of a database on this emulator."""
        return (
            f"spanner+spanner:///projects/{self.project}/instances/"
            f"{self._instance_of.get(database_id, self.instance_id)}/databases/{database_id}"
        )

    def engine(self, database_id: str, **kwargs: Any) -> Any:
        """A SQLAlchemy engine on a database of this emulator.

        It connects through :attr:`client`, so it reaches this emulator even where
        ``SPANNER_EMULATOR_HOST`` is unset (e.g. inside a test that also uses the mock).
        """
        import sqlalchemy as sa

        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args.setdefault("client", self.client)
        return sa.create_engine(self.url(database_id), connect_args=connect_args, **kwargs)

    def async_url(self, database_id: str) -> str:
        """The ``create_async_engine`` URL of a database on this emulator
        (``spanner+spanner_async://``, our async dialect)."""
        return self.url(database_id).replace("spanner+spanner:", "spanner+spanner_async:", 1)

    def async_engine(self, database_id: str, **kwargs: Any) -> Any:
        """A SQLAlchemy ``AsyncEngine`` on a database of this emulator (through
        :attr:`client`, as :meth:`engine`); dispose of it with ``await engine.dispose()``
        or :func:`sharded_orm.testing.async_engines.dispose`."""
        from sqlalchemy.ext.asyncio import create_async_engine

        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args.setdefault("client", self.client)
        return create_async_engine(self.async_url(database_id), connect_args=connect_args, **kwargs)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the emulator we started, by PID: terminate, then kill after ``timeout``.

        A no-op for an emulator found at ``SPANNER_EMULATOR_HOST``.
        """
        proc, self._process = self._process, None
        log, self._log = self._log, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        if log is not None:
            log.unlink(missing_ok=True)
        atexit.unregister(self.stop)


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, a ``preexec_fn`` that makes the child get SIGKILL when we die.

    Why: pytest killed by SIGKILL (a CI timeout, Ctrl-C twice) runs no cleanup, and an
    emulator started in its own session (so Ctrl-C reaches only pytest) would keep
    running. ``prctl(PR_SET_PDEATHSIG)`` is tied to the thread that starts the child:
    start emulators from a thread that lives as long as they should (pytest's main
    thread does). Elsewhere None: ``atexit`` and the fixture's ``stop()`` remain.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    try:  # loaded here, before the fork: the child only calls it
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: go now
            os._exit(1)

    return set_parent_death_signal


#: linux/prctl.h
PR_SET_PDEATHSIG = 1


def _launch(binary: str) -> Emulator:
    port = _free_port()
    fd, log_name = tempfile.mkstemp(prefix="spanner-emulator-", suffix=".log")
    os.close(fd)
    log = Path(log_name)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, "--host_port", f"127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches pytest, which then stops it by PID
            preexec_fn=_die_with_parent(),  # and if pytest is killed, it dies too
        )
    try:
        _wait_for_port(binary, "127.0.0.1", port, proc, log)
    except BaseException:
        proc.kill()
        proc.wait()
        log.unlink(missing_ok=True)
        raise
    emulator = Emulator(f"127.0.0.1:{port}")
    emulator._process, emulator._log = proc, log
    # a safety net: the process we started must not outlive us if stop() is never reached
    atexit.register(emulator.stop)
    return emulator


def start(binary: str | None = None, attempts: int = 3) -> Emulator:
    """Start ``emulator_main`` on a free loopback port; the caller must ``stop()`` it.

    A start is retried (``attempts`` in all) when the process dies at once: the free port
    may have been taken between choosing it and the emulator binding it.
    """
    binary = binary or find_binary()
    for attempt in range(1, attempts + 1):
        try:
            return _launch(binary)
        except EmulatorFailed:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


@contextmanager
def local_emulator() -> Iterator[Emulator]:
    """The emulator at ``SPANNER_EMULATOR_HOST`` if set, else one started (and stopped) here.

    While it runs, ``SPANNER_EMULATOR_HOST`` points at it, so any Spanner client in the
    process talks to the emulator with anonymous credentials.
    """
    existing = os.environ.get(HOST_ENV)
    if existing:
        check_reachable(existing)
    emulator = Emulator(existing) if existing else start()
    with host_env(emulator.host):
        try:
            emulator.ensure_instance()
            yield emulator
        finally:
            emulator.stop()


@contextmanager
def host_env(host: str) -> Iterator[None]:
    """``SPANNER_EMULATOR_HOST`` set to ``host`` inside the block, as it was after it."""
    saved = os.environ.get(HOST_ENV)
    os.environ[HOST_ENV] = host
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(HOST_ENV, None)
        else:
            os.environ[HOST_ENV] = saved
