"""One exception root for everything autotune reports to a user.

Each subclass carries the process exit code the CLI uses for it; only ``autotune.cli.main`` turns an error
into an exit code and a printed line.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose. ``str(error)`` is one line for the user."""

    exit_code = 1


class InputError(AutotuneError):
    """Bad user input: a budget, a plan string, a command line, an option value."""

    exit_code = 2


class TrialError(AutotuneError):
    """A trial could not be started or its result could not be read (not: the trial's script failed)."""

    exit_code = 3


class TrialLost(TrialError):
    """The machine a trial ran on went away mid-trial (a cluster node lost): the trial is interrupted, not
    out of memory, and its configuration is retried once elsewhere, as a dead worker's is."""


class DeviceError(AutotuneError):
    """The requested device cannot be measured (no NVML, unknown index or UUID)."""

    exit_code = 4


class StorageError(AutotuneError):
    """The database cannot be opened, read or written."""

    exit_code = 5


class StorageFault(StorageError):
    """Storage that cannot be written — a full disk, a read-only file system — under the database or the
    trial files: not retried (it lasts until someone frees space); the run stops, its trial released."""


class DamagedData(AutotuneError):
    """A row read back from the database is not what autotune wrote there (a writer of the database edited
    it): the job it belongs to stops here, with one line naming the row; nothing is run from it."""

    exit_code = 5


class NoFitError(AutotuneError):
    """No configuration that was measured fits the budget."""

    exit_code = 6


class ScriptError(AutotuneError):
    """The training script itself failed (not out of memory) in every trial it was given."""

    exit_code = 7


def first_line(text: str | None) -> str:
    """An error's one line for a table cell or a trial line: its first line, or, for a traceback, its last
    (the exception and its message)."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]
