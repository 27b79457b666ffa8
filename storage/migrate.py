"""Bring autotune's own tables to HEAD_REVISION, backing up a SQLite file before changing an old schema.

Alembic is imported only when a migration is needed: opening an up-to-date database stays fast.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from pathlib import Path

import sqlalchemy as sa

from autotune.core.errors import StorageError
from autotune.storage.schema import HEAD_REVISION, VERSION_TABLE

log = logging.getLogger("autotune.storage")
MIGRATIONS = Path(__file__).with_name("migrations")
KNOWN_REVISIONS = ["0001", "0002", "0003", "0004", "0005", "0006"]  # in order; the last is HEAD_REVISION


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(VERSION_TABLE):
            return None
        row = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).first()
    return row[0] if row else None


def migrate(engine: sa.Engine, sqlite_file: Path | None) -> None:
    """Upgrade autotune's tables to HEAD. Call under the database's creation lock.

    Raises:
        StorageError: the database was written by a newer autotune.
    """
    revision = current_revision(engine)
    if revision == HEAD_REVISION:
        return
    if revision is not None and revision not in KNOWN_REVISIONS:
        raise StorageError(
            f"the database's autotune schema (revision {revision}) is newer than this autotune knows "
            f"({HEAD_REVISION}): upgrade autotune"
        )
    backup = None
    if revision is not None and sqlite_file is not None:
        backup = sqlite_file.with_name(
            f"{sqlite_file.name}.backup-{revision}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        _backup_sqlite(sqlite_file, backup)
    _upgrade(engine)
    if revision is not None:  # a new database is created, not upgraded: nothing to say
        kept = f"; the old one is kept at {backup}" if backup is not None else ""
        log.warning("autotune upgraded its tables from schema %s to %s%s", revision, HEAD_REVISION, kept)


def _backup_sqlite(source: Path, target: Path) -> None:
    # SQLite's backup API, not a file copy: a copy can miss commits that are still in the WAL file.
    with (
        contextlib.closing(sqlite3.connect(source)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)


def _upgrade(engine: sa.Engine) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
