"""Opening a database safely: any SQLAlchemy URL, with SQLite's traps handled (shared/RELIABILITY.md §3, §9).

- Tables are created once, under a lock (an flock next to a SQLite file; a PostgreSQL advisory lock):
  racing first starts on a fresh SQLite path otherwise fail while creating tables (optuna #4621).
- SQLite waits 60 s for a lock (the default 5 s fails trials with "database is locked" under load), and
  uses WAL (~26% faster here) only on a local disk: WAL on a network filesystem corrupts databases.
- The URL is shown only with its password hidden, and braces are escaped for Optuna, which runs
  ``url.format(...)`` on it (a ``{`` in a password would raise and leak part of it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import warnings
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from autotune.errors import StorageError

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
    """Parse a SQLAlchemy URL; plain ``postgresql://`` means the psycopg 3 driver (autotune's ``postgres`` extra)."""
    try:
        parsed = make_url(url)
    except (sa.exc.ArgumentError, ValueError) as e:
        raise StorageError(
            f"invalid storage URL {redact(url)!r}: expected e.g. sqlite:///path/autotune.db or postgresql://user@host/db"
        ) from e
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


def engine_kwargs(url: URL) -> dict[str, object]:
    if url.get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": BUSY_TIMEOUT_SECONDS}}
    return {"pool_pre_ping": True}


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
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _advisory_lock(url: URL) -> Iterator[None]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
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
        with contextlib.closing(sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS)) as conn:
            conn.execute("PRAGMA schema_version").fetchone()  # fails on a file that is not a database
            if not network:
                conn.execute("PRAGMA journal_mode=WAL").fetchone()
    except sqlite3.DatabaseError as e:
        raise StorageError(f"cannot open the database {path}: {e}") from e


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
