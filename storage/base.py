"""What every group of autotune's tables shares: the engine, a connection that turns SQLAlchemy's errors into
one-line StorageErrors naming the database, and the clock rows are stamped with."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa

from autotune.core.errors import InputError, StorageError
from autotune.core.names import check_study_name
from autotune.core.text import invisible_in

log = logging.getLogger("autotune.storage")
_SAID: set[str] = set()  # the damaged-row lines this process printed
T = TypeVar("T")


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

    def _checked(self, rows: Sequence[Any], parse: Callable[[dict[str, Any]], T], kind: str) -> list[T]:
        """``rows`` parsed one by one; a damaged one (DamagedRow) skipped with one line naming it."""
        parsed = []
        for row in rows:
            values = dict(row._mapping)
            try:
                parsed.append(parse(values))
            except DamagedRow as e:
                say_once(f"database {self.display_url}: skipping {kind} {values['study_name']!r}: {e}")
        return parsed


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


class DamagedRow(ValueError):
    """A stored row that is not what autotune wrote: why, in a few words."""


def say_once(line: str) -> None:
    """``line`` on the ``autotune.storage`` log, once per process (a worker reads the same row every poll)."""
    if line not in _SAID:
        _SAID.add(line)
        log.warning("%s", line)


def text_of(values: dict[str, Any], column: str, optional: bool = False) -> Any:
    """``values[column]``, which must be text (None too, if ``optional``).

    Raises:
        DamagedRow: it is not.
    """
    value = values[column]
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise DamagedRow(f"its {column} is not text")
    return value


def plain_text_of(values: dict[str, Any], column: str, optional: bool = False) -> Any:
    """``values[column]`` as ``text_of`` reads it, without control or format characters (a plan, a worker
    id: shown in every table and line, and a plan is applied).

    Raises:
        DamagedRow: it is not text, or holds one.
    """
    text = text_of(values, column, optional)
    if text is not None and invisible_in(text) is not None:
        raise DamagedRow(f"its {column} {text!r} holds a control character")
    return text


def whole_of(values: dict[str, Any], column: str, low: int = 0, optional: bool = False) -> Any:
    """``values[column]``, which must be a whole number >= ``low`` (None too, if ``optional``): never text
    in an INTEGER column, which SQLite keeps and a changed column type gives back.

    Raises:
        DamagedRow: it is not.
    """
    value = values[column]
    if (value is not None or not optional) and (type(value) is not int or value < low):
        raise DamagedRow(f"its {column} {value!r} is not a whole number >= {low}")
    return value


def number_of(values: dict[str, Any], column: str, optional: bool = False) -> Any:
    """``values[column]``, which must be a finite number (None too, if ``optional``). Its sign is not
    checked: an interval's low edge is below 0 where a loaded machine's readings scatter widely.

    Raises:
        DamagedRow: it is not.
    """
    value = values[column]
    if (value is not None or not optional) and (type(value) not in (int, float) or not math.isfinite(value)):
        raise DamagedRow(f"its {column} {value!r} is not a number")
    return value


def study_name_of(values: dict[str, Any]) -> str:
    """The row's study name, which must follow the rule names are given by (core.names): a name a database
    writer set to ``../x`` would otherwise become a path.

    Raises:
        DamagedRow: it does not.
    """
    try:
        return check_study_name(text_of(values, "study_name"))
    except InputError as e:
        raise DamagedRow(str(e)) from None


def json_of(values: dict[str, Any], column: str) -> Any:
    """``values[column]`` parsed as JSON (the column read as text: one row's bad JSON fails only that row).

    Raises:
        DamagedRow: it is not JSON.
    """
    try:
        return json.loads(text_of(values, column))
    except json.JSONDecodeError as e:
        raise DamagedRow(f"its {column} is not JSON ({e.msg} at character {e.pos})") from None
