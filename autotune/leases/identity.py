"""A worker's identity, ``host:pid:start-time``, and whether a worker of this host is still alive."""

from __future__ import annotations

import enum
import os
import socket
from pathlib import Path


class WorkerState(enum.Enum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"  # another host's worker: only its heartbeat can tell


def host_name() -> str:
    """This host's name in worker ids: AUTOTUNE_WORKER_HOST, else the hostname. Set it where several
    hosts (containers with their own pid namespaces) share one hostname: a worker judges workers of
    its own host by their pids, and others' by their heartbeats."""
    return os.environ.get("AUTOTUNE_WORKER_HOST") or socket.gethostname()


def worker_id() -> str:
    """host:pid:start-time — unique even when the pid is reused."""
    return f"{host_name()}:{os.getpid()}:{_start_time(os.getpid())}"


def worker_state(worker: str, host: str) -> WorkerState:
    """Alive or dead for a worker id of ``host`` (the pid's start time guards against pid reuse); unknown
    for another host's, or an id that is not one (a lease's worker is a database row: ``str.isdigit`` takes
    '²', which ``int`` does not)."""
    parts = worker.split(":")
    if len(parts) != 3 or parts[0] != host or not parts[1].isascii() or not parts[1].isdigit():
        return WorkerState.UNKNOWN
    try:
        start = _start_time(int(parts[1]))
    except (OSError, IndexError):
        return WorkerState.DEAD
    return WorkerState.ALIVE if start == parts[2] else WorkerState.DEAD


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
