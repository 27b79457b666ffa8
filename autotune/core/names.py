"""The rule for study names, checked where a name is given (``--study``) and where one is read back from a
database that anyone with write access could have edited (a name is a file name too: ``autotune report``)."""

from __future__ import annotations

from autotune.core.errors import InputError
from autotune.core.text import invisible_in

MAX_STUDY_NAME = 128


def check_study_name(name: str) -> str:
    """Validate a user-given study name (it must work on SQLite and PostgreSQL alike).

    Raises:
        InputError: control or format characters (Unicode's too: U+0085, U+202E, a zero-width space, which
            break every table that shows the name), '/', '..', or more than 128 characters.
    """
    if not name or len(name) > MAX_STUDY_NAME:
        raise InputError(f"study name must be 1 to {MAX_STUDY_NAME} characters, got {len(name)}")
    if invisible_in(name) is not None or "/" in name or ".." in name:
        raise InputError(f"invalid study name {name!r}: no control or format characters, '/' or '..'")
    return name
