"""What every group of autotune's tables shares: the engine, a connection that turns SQLAlchemy's errors into
one-line StorageErrors naming the database, and the clock rows are stamped with."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from autotune.core.errors import StorageError


class Tables:
    """Base of the Store's table groups (studies.py, jobs.py, leases.py)."""

    def __init__(self, engine: sa.Engine, display_url: str) -> None:
        self.display_url = display_url  # the URL with its password hidden
        self._engine = engine

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sa.Connection]:
        try:
            with self._engine.begin() if write else self._engine.connect() as conn:
                yield conn
        except sa.exc.SQLAlchemyError as e:
            raise StorageError(f"database {self.display_url}: {first_line(e)}") from e


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__
