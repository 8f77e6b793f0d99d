"""How ``sharded-orm`` reports what it could not do (issue 33 item 3): under ``--format json``
the error is the JSON envelope on stdout, never a text line on stderr; and no password of a
URL reaches stdout, stderr or an exception's text, whatever characters it holds.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import registry
from sqlalchemy.engine.default import DefaultDialect

from sharded_orm.tools.cli import main

MODELS = """
import datetime as dt
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sharded_orm import UTCDateTime, shard_column


class Base(DeclarativeBase):
    pass


class Sharded(Base):
    __tablename__ = "Sharded"
    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime, primary_key=True)
    shard: Mapped[int] = shard_column("company_id", "ts", count=4, name="ShardId")
"""


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("cli_errors")
    (d / "secret_models.py").write_text(textwrap.dedent(MODELS))
    sys.path.insert(0, str(d))
    yield d
    sys.path.remove(str(d))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def json_error(code: int, out: str, err: str, command: str | None) -> dict[str, Any]:
    """The error envelope alone on stdout, nothing on stderr, exit 2."""
    assert code == 2 and err == "", (code, out, err)
    data = json.loads(out)
    assert set(data) == {"command", "version", "summary", "error"}
    assert data["command"] == command and data["version"]
    assert data["summary"] == {"ok": False, "exit_code": 2}
    assert set(data["error"]) == {"type", "message"} and data["error"]["message"]
    return data["error"]  # type: ignore[no-any-return]


class _DBAPI:
    """A driver that refuses every connection and, as some do (a DSN or ODBC string in the
    message), echoes what it was given: the password included."""

    paramstyle = "named"

    class Error(Exception):
        pass

    class OperationalError(Error):
        pass

    Warning = InterfaceError = DatabaseError = InternalError = OperationalError
    ProgrammingError = IntegrityError = DataError = NotSupportedError = OperationalError

    @staticmethod
    def connect(*args: Any, **kwargs: Any) -> Any:
        raise _DBAPI.OperationalError(f"cannot connect with {kwargs}: connection refused")


class EchoingDialect(DefaultDialect):
    name = "echoing"
    driver = "echo"
    supports_statement_cache = True

    @classmethod
    def import_dbapi(cls) -> Any:
        return _DBAPI

    def create_connect_args(self, url: Any) -> Any:
        return [], url.translate_connect_args()


registry.register("echoing.echo", __name__, "EchoingDialect")
UNREACHABLE = "echoing+echo://user:hunter2@127.0.0.1:1/db"

#: (argv, command, type, words in the message): each must be an envelope under json
JSON_ERRORS = {
    "usage": (("verify",), "verify", "UsageError", ("required",)),
    "no subcommand": ((), None, "UsageError", ("SUBCOMMAND",)),
    "unknown subcommand": (("frobnicate",), None, "UsageError", ("frobnicate",)),
    "bad choice": (("backfill", "sqlite://", "T", "C", "--sources", "A", "--count", "4",
                    "--algorithm", "md5"), "backfill", "UsageError", ("md5",)),
    "no module": (("lint", "nowhere:Base"), "lint", "ShardingError", ("nowhere",)),
    "bad url": (("verify", "not a url", "secret_models:Base"), "verify", "ShardingError",
                ("not a database URL",)),
    "bad port": (("verify", "postgresql://u:hunter2@h:port/db", "secret_models:Base"), "verify",
                 "ShardingError", ("not a database URL", "u:***@h")),
    "unreachable": (("verify", UNREACHABLE, "secret_models:Base"), "verify", "ShardingError",
                    ("user:***@127.0.0.1", "'password': '***'", "connection refused")),
    "unreachable backfill": (("backfill", UNREACHABLE, "T", "C", "--sources", "A", "--count",
                              "4"), "backfill", "ShardingError", ("user:***@127.0.0.1",)),
    "missing sqlite": (("verify", "sqlite:///no_such_file.db", "secret_models:Base"), "verify",
                       "ShardingError", ("no_such_file.db",)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(JSON_ERRORS))
def test_every_error_is_the_json_envelope_under_format_json(
    name: str, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, command, kind, words = JSON_ERRORS[name]
    for form in (("--format", "json"), ("--format=json",)):
        error = json_error(*run(capsys, *argv, *form), command)
        assert error["type"] == kind
        for word in words:
            assert word in error["message"], (word, error)
        assert "hunter2" not in error["message"]
    # the text format says the same in one line on stderr
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith("sharded-orm: error: ")
    assert err.strip().removeprefix("sharded-orm: error: ") == error["message"]


def test_an_interrupted_run_is_the_json_envelope(
    models_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(spec: str) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr("sharded_orm.tools.commands.load_target", interrupted)
    error = json_error(*run(capsys, "lint", "x:y", "--format", "json"), "lint")
    assert error == {"type": "KeyboardInterrupt", "message": "interrupted"}


# --- no password printed --------------------------------------------------------------------

#: a password starts with this canary: no part of it from its start may be printed
CANARY = "Zq7s3cr"
ODD = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=0,
    max_size=12,
)


def _urls(password: str) -> list[str]:
    """The URL as SQLAlchemy writes it (the password %-escaped), and as typed by hand where
    that still means this password (SQLAlchemy reads a password up to the first @)."""
    made = sa.engine.URL.create(
        "echoing+echo", username="user", password=password, host="127.0.0.1", database="db"
    )
    urls = [made.render_as_string(hide_password=False)]
    if "@" not in password:
        urls.append(f"echoing+echo://user:{password}@127.0.0.1:1/db")
    urls.append(f"postgresql://user:{password.replace('@', '%40')}@host:notaport/db")
    return urls


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(odd=ODD)
def test_no_password_reaches_stdout_stderr_or_an_exception(
    odd: str, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    no_password_reaches_stdout_stderr_or_an_exception(odd, capsys)


# the check's wide variant (many drawn passwords); quick loop:
# test_no_password_reaches_stdout_stderr_or_an_exception
@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(odd=ODD)
def test_no_password_reaches_stdout_stderr_or_an_exception_wide(
    odd: str, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    no_password_reaches_stdout_stderr_or_an_exception(odd, capsys)


def no_password_reaches_stdout_stderr_or_an_exception(
    odd: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import sharded_orm
    from sharded_orm.checks import render_url

    password = CANARY + odd
    for url in _urls(password):
        for fmt in ("text", "json"):
            for argv in (
                ("verify", url, "secret_models:Base"),
                ("backfill", url, "T", "C", "--sources", "A", "--count", "4"),
                ("doctor", url, "secret_models:Base"),
            ):
                code, out, err = run(capsys, *argv, "--format", fmt)
                assert code == 2, (argv, out, err)
                assert CANARY not in out + err, (url, out, err)
                if fmt == "json":
                    assert err == "" and json.loads(out)["error"]["message"]
        # the library's own messages: a URL string where an Engine belongs
        calls: list[tuple[Any, tuple[Any, ...]]] = [
            (sharded_orm.verify, (url, "Sharded")),
            (sharded_orm.bulk_load, (url, "Sharded", [])),
            (sharded_orm.presplit, (url, "Sharded")),
            (sharded_orm.watch, (url,)),
            (sharded_orm.TableSequence, (url, "seq")),
        ]
        for fn, args in calls:
            with pytest.raises(Exception) as info:
                fn(*args)
            assert CANARY not in str(info.value) and CANARY not in repr(info.value)
        assert CANARY not in render_url(url)
