"""The Store: autotune's tables (by group: studies.py, jobs.py, leases.py) and Optuna's RDB storage, in one
database; and ``open_store``, which creates or migrates that database safely."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import URL

from autotune.core.errors import InputError, StorageError
from autotune.storage import database, schema
from autotune.storage.base import Tables, first_line
from autotune.storage.database import retried
from autotune.storage.jobs import JobTables
from autotune.storage.leases import LeaseTables
from autotune.storage.migrate import current_revision, migrate
from autotune.storage.studies import StudyTables

if TYPE_CHECKING:
    from optuna.storages import RDBStorage


class Store(StudyTables, JobTables, LeaseTables):
    """One database: autotune's tables, read and written here, and ``optuna``, the RDBStorage that studies
    are created and loaded with.

    Every public method is retried while the database is locked or unreachable (see RetryingRDBStorage)."""

    def __init__(self, engine: sa.Engine, display_url: str, optuna_storage: Callable[[], RDBStorage]) -> None:
        """``optuna_storage`` returns Optuna's storage of this database; called once, on first use."""
        super().__init__(engine, display_url)
        self._optuna_storage = optuna_storage
        self._optuna: RDBStorage | None = None
        self._optuna_lock = threading.Lock()

    @property
    def optuna(self) -> RDBStorage:
        with self._optuna_lock:
            if self._optuna is None:
                self._optuna = self._optuna_storage()
            return self._optuna

    def forget_study(self, name: str) -> None:
        """Delete a study, its trials, leases and best plan (``--force``)."""
        with self._connect(write=True) as conn:
            conn.execute(sa.delete(schema.leases).where(schema.leases.c.study_name == name))
            conn.execute(sa.delete(schema.best).where(schema.best.c.study_name == name))
            conn.execute(sa.delete(schema.studies).where(schema.studies.c.study_name == name))
        import optuna

        with suppress(KeyError):  # no Optuna study of that name: nothing to delete
            optuna.delete_study(study_name=name, storage=self.optuna)


def _retry_every_method(cls: type[Store]) -> None:
    """Wrap every public method of the Store and its table groups in ``retried`` (once each)."""
    names = {
        name
        for klass in cls.__mro__
        if issubclass(klass, Tables)
        for name, method in vars(klass).items()
        if callable(method) and not name.startswith("_")
    }
    for name in names:
        setattr(cls, name, retried(getattr(cls, name)))


_retry_every_method(Store)


def open_store(url: str, *, answering: bool = False, must_exist: bool = False) -> Store:
    """Open (creating or migrating if needed) the database at SQLAlchemy ``url``.

    ``answering``: for the commands that only answer from the database (best, studies, show). A database
    whose autotune tables are current opens without the creation lock, and Optuna's storage is built on
    first use: importing Optuna and building its storage was ~0.5 s of a 0.75 s ``autotune best``, which
    answers a verified winner from autotune's tables alone.

    Raises:
        StorageError: a bad URL, an unreadable or corrupt file, or an incompatible schema; one line
            that names the database (a SQLite file by its path, other URLs with the password hidden).
        InputError: ``must_exist`` and the SQLite file does not exist (nothing is created).
    """
    parsed = database.parse_url(url)
    display = database.redact(parsed)
    path = database.sqlite_path(parsed)
    name = str(path) if path is not None else display
    if must_exist and path is not None and not path.exists():  # `best` creates nothing (issue 27)
        raise InputError(
            f"no autotune database at {path}: nothing was tuned there yet (autotune run creates it)"
        )
    with _one_line_errors(name, parsed.get_backend_name()):
        if answering and path is not None and database.read_only(path):
            return _read_only_store(path, display, name)
        if answering:
            engine = _engine_if_current(parsed, path)
            if engine is not None:
                return Store(engine, display, lambda: _optuna_storage(parsed, name))
        with database.creation_lock(parsed):
            if path is not None:
                database.prepare_sqlite(path)
            storage = _rdb_storage(parsed)
            migrate(storage.engine, path)
    return Store(storage.engine, display, lambda: storage)


def _engine_if_current(parsed: URL, path: Path | None) -> sa.Engine | None:
    """An engine on the database if its autotune tables are at HEAD (it needs no creation or migration)."""
    if path is not None and not path.exists():
        return None
    engine = sa.create_engine(parsed, **database.engine_kwargs(parsed))
    if current_revision(engine) == schema.HEAD_REVISION:
        return engine
    engine.dispose()
    return None


def _read_only_store(path: Path, display: str, name: str) -> Store:
    """A SQLite database on read-only storage, opened read-only (no creation lock, no WAL write): answers
    only, from a schema that is current.

    Raises:
        StorageError: its schema is older or missing (it would have to be written to upgrade).
    """
    url = database.read_only_url(path)
    engine = sa.create_engine(url, **database.engine_kwargs(url))
    if current_revision(engine) != schema.HEAD_REVISION:
        engine.dispose()
        raise StorageError(
            f"database {name} is read-only and its autotune tables are not current: open it once where it "
            "can be written (autotune studies upgrades it)"
        )
    return Store(engine, display, lambda: _rdb_storage(url))


def _optuna_storage(parsed: URL, name: str) -> RDBStorage:
    """Optuna's storage of a database opened for answering: built under the creation lock, since Optuna
    creates its tables where they are missing."""
    with _one_line_errors(name, parsed.get_backend_name()), database.creation_lock(parsed):
        return _rdb_storage(parsed)


def _rdb_storage(parsed: URL) -> RDBStorage:
    from autotune.storage.optuna_storage import RetryingRDBStorage

    return RetryingRDBStorage(
        database.escape_for_optuna(parsed.render_as_string(hide_password=False)),
        engine_kwargs=database.engine_kwargs(parsed),
    )


@contextmanager
def _one_line_errors(name: str, backend: str) -> Iterator[None]:
    try:
        yield
    except ImportError as e:  # SQLAlchemy imports the dialect's driver when it builds the engine
        fix = database.DRIVER_HINTS.get(backend, f"install the Python package that provides {e.name!r}")
        raise StorageError(
            f"cannot open the database {name}: its {backend} driver is not installed: {fix}"
        ) from e
    except sa.exc.SQLAlchemyError as e:
        damaged = backend == "sqlite" and isinstance(getattr(e, "orig", None), sqlite3.DatabaseError)
        hint = database.backup_hint(Path(name)) if damaged else ""
        raise StorageError(f"cannot open the database {name}: {first_line(e)}{hint}") from e
    except RuntimeError as e:  # Optuna: its own schema is older or newer than the installed optuna
        raise StorageError(f"database {name}: {first_line(e)}") from e
    except OSError as e:
        raise StorageError(f"cannot open the database {name}: {e}") from e
