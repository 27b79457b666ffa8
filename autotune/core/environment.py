"""Settings read from the environment (``AUTOTUNE_*``), checked where they are read and before any command
runs (issue 27: ``AUTOTUNE_HEARTBEAT_GRACE=abc`` or ``0`` and ``AUTOTUNE_BUSY_TIMEOUT=-1`` were silently
replaced by their defaults): a bad value is one line and exit 2, never a default the user did not ask for."""

from __future__ import annotations

import os
from collections.abc import Mapping

from autotune.core.errors import InputError

# the settings given in seconds, and what each sets
SECONDS = {
    "AUTOTUNE_HEARTBEAT_GRACE": "how long a lease's heartbeats may stop before its worker is taken for dead",
    "AUTOTUNE_BUSY_TIMEOUT": "how long SQLite waits for a lock",
    "AUTOTUNE_CONNECT_TIMEOUT": "how long to wait for a database server to answer a new connection",
    "AUTOTUNE_STORAGE_DEADLINE": "how long a busy or unreachable database is retried before giving up",
}


def seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """``$name`` as a positive number of seconds; ``default`` when unset or empty.

    Raises:
        InputError: a value that is not a positive number.
    """
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise InputError(
            f"{name} must be a positive number of seconds ({SECONDS.get(name, name)}), got {text!r}"
        )
    return value


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Every setting of SECONDS that is set, checked before a command runs.

    Raises:
        InputError: the first bad value, in one line.
    """
    for name in SECONDS:
        seconds(name, 1.0, environ)
