"""Storage faults: the errors that say storage cannot be written — a full disk or quota, a read-only file
system, permissions taken away — as opposed to a busy or briefly unreachable database. A fault lasts until
someone acts, so it is never retried: the run stops with one line naming the path and the cause (issue 27:
a full disk was retried in silence for 10+ minutes; a read-only cache dir ended as "the trial launcher
exited with code 120", the cause only in a log on the full disk)."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from autotune.core.errors import StorageFault

# errno values of a write the storage refuses: full, over quota, too large for the limits, read-only, denied
WRITE_FAULTS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
# what the databases say for the same: SQLite's SQLITE_FULL, SQLITE_READONLY, SQLITE_IOERR and
# SQLITE_CANTOPEN messages, PostgreSQL's disk_full (53100) and read_only_sql_transaction (25006)
DATABASE_FAULTS = (
    "database or disk is full",
    "attempt to write a readonly database",
    "disk i/o error",
    "unable to open database file",
    "no space left on device",
    "could not extend file",
    "read-only transaction",
)
PROBE_BYTES = 64 * 1024  # what a writability probe writes: more than a log line, less than any real file


def write_fault(error: BaseException) -> OSError | None:
    """The OSError of a refused write in ``error``'s cause chain, if there is one."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in WRITE_FAULTS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def database_fault(error: BaseException) -> str | None:
    """What the database said, where ``error``'s cause chain holds a database that cannot be written."""
    seen: BaseException | None = error
    while seen is not None:
        text = str(getattr(seen, "orig", None) or seen).strip()
        if any(fault in text.lower() for fault in DATABASE_FAULTS):
            return text.splitlines()[0][:200]
        seen = seen.__cause__ or seen.__context__
    return None


def unwritable(folder: Path) -> OSError | None:
    """Why ``folder`` cannot take a small file now (None: it can). Asked where a process left no file it
    should have written (the trial's launcher, the trial): was it the storage?"""
    probe = folder / f".writable-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def files_fault(folder: Path, error: OSError) -> StorageFault:
    """The one line for trial files that cannot be written in ``folder``."""
    return StorageFault(
        f"cannot write the trial files in {folder}: {error.strerror or error}; free space or make it writable, "
        "then run again: what was stored is kept"
    )


@contextlib.contextmanager
def writing_trial_files(folder: Path) -> Iterator[None]:
    """A refused write inside the block (write_fault) becomes the one line for trial files in ``folder``;
    any other OSError passes as it is."""
    try:
        yield
    except OSError as e:
        if (fault := write_fault(e)) is None:
            raise
        raise files_fault(folder, fault) from e
