"""Opening a database safely: any SQLAlchemy URL, with SQLite's traps handled (docs/reliability.md §3, §9).

- Tables are created once, under a lock (an flock next to a SQLite file; a PostgreSQL advisory lock):
  racing first starts on a fresh SQLite path otherwise fail while creating tables (optuna #4621).
- SQLite waits 60 s for a lock (AUTOTUNE_BUSY_TIMEOUT overrides it) (the default 5 s fails trials with "database is locked" under load), and
  uses WAL (~26% faster here) only on a local disk: WAL on a network filesystem corrupts databases.
- Workers call the database through ``retrying``: a lock held past the busy timeout or a dropped
  connection is retried, so a transient error never fails a live trial or loses a result.
- The URL is shown only with its password hidden, and braces are escaped for Optuna, which runs
  ``url.format(...)`` on it (a ``{`` in a password would raise and leak part of it).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import random
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from autotune.core.environment import seconds
from autotune.core.errors import StorageError, StorageFault
from autotune.core.faults import database_fault, write_fault

T = TypeVar("T")
log = logging.getLogger("autotune.storage")

BUSY_TIMEOUT_SECONDS = 60
NETWORK_FILESYSTEMS = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "lustre",
    "gpfs",
    "ceph",
    "glusterfs",
    "afs",
    "fuse.sshfs",
    "fuse.glusterfs",
    "fuse.s3fs",
    "fuse.gcsfuse",
}


SCHEMA_LOCK_KEY = 0x6175746F74756E65  # "autotune": the PostgreSQL advisory lock held while tables are created


def parse_url(url: str) -> URL:
    """Parse a SQLAlchemy URL; plain ``postgresql://`` means the psycopg 3 driver (autotune's ``postgres`` extra).

    Raises:
        StorageError: the URL cannot be parsed. The message never quotes it (its password could be
            anywhere in it) and the parser's own error is not chained (its text may quote the URL).
    """
    try:
        parsed = make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        raise StorageError(
            "invalid storage URL: expected e.g. sqlite:///path/autotune.db or postgresql://user:password@host/db; "
            "percent-encode characters such as @ : / % { } in the user name and password "
            "(python -c \"import urllib.parse; print(urllib.parse.quote('PASSWORD', safe=''))\")"
        ) from None
    return parsed.set(drivername="postgresql+psycopg") if parsed.drivername == "postgresql" else parsed


def redact(url: str | URL) -> str:
    """The URL with its password replaced by ***, safe for messages and logs."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return "<unparseable storage URL>"
    return parsed.render_as_string(hide_password=True)


def escape_for_optuna(url: str) -> str:
    return url.replace("{", "{{").replace("}", "}}")


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL (None for other databases or an in-memory SQLite)."""
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database).expanduser().resolve()


def read_only(path: Path) -> bool:
    """Whether an existing SQLite file lies on storage this process cannot write (a read-only mount or
    directory): WAL's shared-memory file and the creation lock could not be made there."""
    return path.exists() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))


def read_only_url(path: Path) -> URL:
    """SQLite's read-only, immutable open of ``path``: no lock, no -wal or -shm file (nothing writes to
    read-only storage, so nothing can change under the reader)."""
    return URL.create(
        "sqlite", database=f"file:{path}", query={"mode": "ro", "immutable": "1", "uri": "true"}
    )


def busy_timeout() -> float:
    """Seconds SQLite waits for a lock: BUSY_TIMEOUT_SECONDS, or AUTOTUNE_BUSY_TIMEOUT."""
    return seconds("AUTOTUNE_BUSY_TIMEOUT", BUSY_TIMEOUT_SECONDS)


CONNECT_TIMEOUT_SECONDS = 10
# The drivers' own connect-timeout arguments: a server that accepts the connection and never answers
# would otherwise hang every command (SQLite has no connection to wait for; its lock wait is the busy
# timeout).
_CONNECT_TIMEOUT_ARGUMENT = {"postgresql": "connect_timeout", "mysql": "connect_timeout"}
# What installs a missing driver, by dialect.
DRIVER_HINTS = {
    "postgresql": "pip install 'autotune[postgres]' (psycopg 3)",
    "mysql": "pip install pymysql and use mysql+pymysql://",
}


def connect_timeout() -> int:
    """Seconds to wait for a database server to answer a new connection: CONNECT_TIMEOUT_SECONDS, or
    AUTOTUNE_CONNECT_TIMEOUT."""
    return max(1, round(seconds("AUTOTUNE_CONNECT_TIMEOUT", CONNECT_TIMEOUT_SECONDS)))


def engine_kwargs(url: URL) -> dict[str, Any]:
    backend = url.get_backend_name()
    if backend == "sqlite":
        return {"connect_args": {"timeout": busy_timeout()}}
    timeout = _CONNECT_TIMEOUT_ARGUMENT.get(backend)
    return {"pool_pre_ping": True, "connect_args": {timeout: connect_timeout()} if timeout else {}}


@contextlib.contextmanager
def creation_lock(url: URL) -> Iterator[None]:
    """Held while tables are created or migrated: an flock beside a SQLite file, an advisory lock on
    PostgreSQL (racing first starts would otherwise collide creating the same tables)."""
    if url.get_backend_name() == "postgresql":
        with _advisory_lock(url):
            yield
        return
    path = sqlite_path(url)
    if path is None:
        yield
        return
    if not path.parent.is_dir():  # a typo in a path must not create a new, empty database somewhere
        raise StorageError(f"cannot open the database {path}: the directory {path.parent} does not exist")
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _advisory_lock(url: URL) -> Iterator[None]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, **engine_kwargs(url))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY - 2**63})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": SCHEMA_LOCK_KEY - 2**63})
                conn.commit()
    finally:
        engine.dispose()


def prepare_sqlite(path: Path) -> None:
    """Check the file is a database (or absent) and set its journal mode. Call under creation_lock."""
    network = filesystem_type(path.parent) in NETWORK_FILESYSTEMS
    if network:
        warnings.warn(
            f"{path.parent} is on a network filesystem ({filesystem_type(path.parent)}): SQLite locking is unreliable "
            "there, so WAL stays off; several workers should share PostgreSQL (--storage postgresql://...) instead",
            RuntimeWarning,
            stacklevel=3,
        )
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=busy_timeout())) as conn:
            conn.execute("PRAGMA schema_version").fetchone()  # fails on a file that is not a database
            if not network:
                conn.execute("PRAGMA journal_mode=WAL").fetchone()
    except sqlite3.DatabaseError as e:
        raise StorageError(f"cannot open the database {path}: {e}{backup_hint(path)}") from e


def backup_hint(path: Path) -> str:
    """For a damaged SQLite file: where autotune's newest backup of it is (kept before each schema
    upgrade), or nothing if there is none."""
    backups = sorted(path.parent.glob(f"{path.name}.backup-*"), key=lambda p: p.stat().st_mtime)
    return (
        f"; autotune's newest backup of it is {backups[-1]} (copy it over the file to restore)"
        if backups
        else ""
    )


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path``, from /proc/mounts ('' where unknown)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    real, best, kind = os.path.realpath(path), "", ""
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3:
            point = fields[1].replace("\\040", " ")
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


def is_transient(error: BaseException) -> bool:
    """A lock timeout or a lost connection (worth retrying), anywhere in ``error``'s cause chain; never a
    database that cannot be written (a full disk, read-only storage: autotune.core.faults).

    Optuna re-raises SQLAlchemy's errors as its own StorageInternalError, autotune as StorageError."""
    return (
        _transient_cause(error) is not None and database_fault(error) is None and write_fault(error) is None
    )


def _transient_cause(error: BaseException) -> BaseException | None:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (sa.exc.OperationalError, sa.exc.InterfaceError, sqlite3.OperationalError)):
            return seen
        if isinstance(seen, sa.exc.DBAPIError) and seen.connection_invalidated:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


STORAGE_DEADLINE_SECONDS = 600
SAY_EVERY_SECONDS = 60  # while retrying: a line this often, so that nothing waits in silence


def storage_deadline() -> float:
    """Seconds a busy or unreachable database is retried: STORAGE_DEADLINE_SECONDS, or
    AUTOTUNE_STORAGE_DEADLINE."""
    return seconds("AUTOTUNE_STORAGE_DEADLINE", STORAGE_DEADLINE_SECONDS)


def retrying(
    call: Callable[[], T],
    deadline: float | None = None,
    on_retry: Callable[[BaseException, int], None] | None = None,
    where: str = "the database",
) -> T:
    """``call()``, retried with jittered backoff (0.1 s doubling to 5 s) while it fails transiently.

    ``deadline``: seconds after which the last transient error is raised (None: storage_deadline()). A line
    says the first retry, what it waits for and until when, and another every SAY_EVERY_SECONDS. A
    database that cannot be written, and anything else, is raised at once.

    Raises:
        StorageError: the deadline passed (``where`` names the database).
    """
    limit = storage_deadline() if deadline is None else deadline
    started, attempt, said = time.monotonic(), 0, 0.0
    while True:
        try:
            return call()
        except Exception as e:
            if not is_transient(e):
                raise
            waited = time.monotonic() - started
            cause = _first_line(_transient_cause(e) or e)
            if waited > limit:
                if deadline is not None:
                    raise
                raise StorageError(
                    f"{where} stayed busy or unreachable for {_duration(waited)} "
                    f"(AUTOTUNE_STORAGE_DEADLINE): {cause}"
                ) from e
            attempt += 1
            if on_retry is not None:
                on_retry(e, attempt)
            elif attempt == 1:
                log.warning(
                    "%s is busy or unreachable, retrying for up to %s: %s", where, _duration(limit), cause
                )
            elif waited - said >= SAY_EVERY_SECONDS:
                said = waited
                log.warning(
                    "still retrying %s (%s of %s): %s", where, _duration(waited), _duration(limit), cause
                )
            time.sleep(min(5.0, 0.1 * 2**attempt) * random.uniform(0.5, 1.0))


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def retried(method: Callable[..., T]) -> Callable[..., T]:
    """``method`` with every call made through ``retrying``; a stored value that cannot be decoded (a
    damaged row: JSON cut short, bytes that are not UTF-8) is one StorageError naming the database, not a
    traceback, nor a row silently skipped; a database that cannot be written is one StorageFault naming it
    and the cause. ``method`` belongs to a Store or to Optuna's RDBStorage: its first argument."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> T:
        owner = args[0] if args else None
        try:
            return retrying(lambda: method(*args, **kwargs), where=f"the database {database_name(owner)}")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StorageError(damaged_row(owner, e)) from e
        except StorageFault:
            raise
        except Exception as e:
            fault: object = database_fault(e) or write_fault(e)
            if fault is not None:
                raise StorageFault(fault_message(database_name(owner), fault)) from e
            raise

    return call


def fault_message(name: str, cause: object) -> str:
    """One line for a database that cannot be written: which, why, and what to do."""
    why = cause.strerror if isinstance(cause, OSError) and cause.strerror else cause
    return (
        f"the database {name} cannot be written: {why}; free space or make it writable, then run again: "
        "what was stored is kept"
    )


def database_name(owner: object) -> str:
    """The database ``owner`` (a Store, Optuna's storage) uses: a SQLite file's path, else its URL without
    the password."""
    engine = getattr(owner, "_engine", None) or getattr(owner, "engine", None)  # a Store's, Optuna's
    url = getattr(engine, "url", None)
    if url is not None and url.get_backend_name() == "sqlite" and url.database:
        return str(Path(url.database))
    return str(getattr(owner, "display_url", "") or (redact(url) if url is not None else "in use"))


def damaged_row(owner: object, error: Exception) -> str:
    """What to say of a row whose stored value cannot be read: which database (never its password), what
    failed, and how to recover."""
    name = database_name(owner)
    path = Path(name) if name.startswith("/") else None
    hint = backup_hint(path) if path is not None else ""
    reason = str(error).splitlines()[0][:160]
    return (
        f"the database {name} holds a damaged row: a stored value cannot be read ({type(error).__name__}: "
        f"{reason}){hint or '; restore it from a backup, or tune into another --cache-dir or --storage'}"
    )
