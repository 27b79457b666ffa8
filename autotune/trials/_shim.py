"""The trial shim: a tiny process between the tuner and a trial. Standard library only, run as
``python -I -S _shim.py RESULT TUNER_PID GRACE LOG_LIMIT -- COMMAND...``.

Why it exists (docs/reliability.md §1, §2, §7):

- ``ru_maxrss`` of an exec'd child includes the high-water mark of the process that forked it, so a
  tuner holding 800 MiB would see every trial read >= 800 MiB. The shim is small; it forks the trial and
  reads the trial's own peak with ``wait4``.
- It is a child subreaper: a grandchild that calls ``setsid()`` and escapes the trial's process group is
  re-parented to the shim, which kills every descendant before it exits.
- It dies with the tuner (PR_SET_PDEATHSIG), and its trial dies with it, so a killed tuner leaves no trial.

SIGUSR1 (the tuner's timeout or Ctrl-C) stops the trial gracefully: SIGTERM to every descendant, GRACE
seconds, then SIGKILL. SIGTERM (PR_SET_PDEATHSIG when the tuner dies, or anyone else) kills at once. The
two must differ: PDEATHSIG fires when the tuner *thread* that started the shim exits, and under SIGKILL
that thread can die before the tuner's other threads, so getppid() may still name the tuner. It writes
RESULT (JSON) and exits 0.

The trial's stdout and stderr come to the shim through pipes and go to ``stdout.log`` and ``stderr.log``
beside RESULT, each keeping its last LOG_LIMIT bytes (0: all of it): a log past the limit is set aside
once, a new one started, and at the end the two are joined to the last LOG_LIMIT bytes under a line that
says how much was dropped. A log never holds more than twice LOG_LIMIT on disk (issue 27: one
configuration's trials left 951 MiB of stdout).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
EXIT_EXEC_FAILED = 127

_libc = ctypes.CDLL(None, use_errno=True)


_stop_request: int | None = None  # the signal that asked for a stop; SIGTERM (no grace) wins over SIGUSR1


def _on_stop(signum: int, frame: object) -> None:
    global _stop_request
    if _stop_request is None or signum == signal.SIGTERM:
        _stop_request = signum


def descendants(root: int) -> list[int]:
    """PIDs of every live or zombie descendant of ``root``, through /proc/PID/task/TID/children."""
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


def reap() -> None:
    """Collect every exited child (ours or re-parented to us); never blocks."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def signal_all(sig: int) -> None:
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def kill_everything(deadline_s: float = 10.0) -> None:
    """SIGKILL every descendant until none is left (a dying process may have forked once more)."""
    end = time.monotonic() + deadline_s
    while descendants(os.getpid()) and time.monotonic() < end:
        signal_all(signal.SIGKILL)
        time.sleep(0.005)
        reap()


class TailLog:
    """A log file that keeps its last ``limit`` bytes (0: everything): past the limit the file is set aside
    as ``PATH.old`` (the one before it dropped) and a new one begun; ``close`` joins the two."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit, self.dropped = path, limit, 0
        self.file = open(path, "ab")  # noqa: SIM115 (kept open for the trial's life; closed by close())
        self.size = self.file.tell()

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.size += len(data)
        if self.limit and self.size > self.limit:
            self.file.close()
            with contextlib.suppress(FileNotFoundError):
                self.dropped += os.path.getsize(self.path + ".old")
            os.replace(self.path, self.path + ".old")
            self.file, self.size = open(self.path, "ab"), 0  # noqa: SIM115

    def close(self) -> None:
        self.file.close()
        old = self.path + ".old"
        if not os.path.exists(old):
            return
        keep = max(0, self.limit - self.size)
        with open(old, "rb") as f:
            f.seek(0, os.SEEK_END)
            self.dropped += max(0, f.tell() - keep)
            f.seek(max(0, f.tell() - keep))
            kept = f.read()
        cut = kept.find(b"\n", 0, 4096) + 1 if len(kept) == keep else 0  # from a line's start, if one is near
        self.dropped, kept = self.dropped + cut, kept[cut:]
        with open(self.path, "rb") as f:
            last = f.read()
        note = f"[autotune: the first {self.dropped} bytes of this log were dropped (--log-limit {self.limit})]\n"
        with open(self.path + ".tmp", "wb") as f:
            f.write(note.encode() + kept + last)
        os.replace(self.path + ".tmp", self.path)
        os.unlink(old)


def pump(pipes: dict[int, TailLog], timeout: float) -> None:
    """Move what the trial wrote into its logs, waiting up to ``timeout`` for something to arrive; a pipe at
    its end (every writer gone) is closed and forgotten."""
    if not pipes:
        time.sleep(timeout)
        return
    ready, _, _ = select.select(list(pipes), [], [], timeout)
    for fd in ready:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        if data:
            pipes[fd].write(data)
        else:
            os.close(fd)
            pipes.pop(fd).close()


def drain(pipes: dict[int, TailLog]) -> None:
    """Everything left in the pipes once every writer is gone, then the logs closed."""
    deadline = time.monotonic() + 10.0  # a writer that escaped every kill must not hold the shim forever
    while pipes and time.monotonic() < deadline:
        pump(pipes, 0.1)
    for fd, log in pipes.items():
        os.close(fd)
        log.close()
    pipes.clear()


def wait_trial(pid: int, grace: float, pipes: dict[int, TailLog]) -> tuple[int, resource.struct_rusage, bool]:
    """wait4 the trial's main process, moving its output into its logs and stopping it if asked to:
    (status, rusage, stopped)."""
    kill_at: float | None = None
    while True:
        got, status, usage = os.wait4(pid, os.WNOHANG)
        if got == pid:
            return status, usage, kill_at is not None
        if _stop_request is not None:
            now = time.monotonic()
            if kill_at is None:
                signal_all(signal.SIGTERM)
                kill_at = now + (grace if _stop_request == signal.SIGUSR1 else 0.0)
            if _stop_request == signal.SIGTERM:
                kill_at = min(kill_at, now)  # the tuner died during the grace period: no more waiting
            if now >= kill_at:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        pump(pipes, 0.02)


def start_trial(argv: list[str], shim_pid: int, outputs: tuple[int, int]) -> int:
    """Fork and exec the trial; ``outputs``: the write ends of its stdout and stderr pipes."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.dup2(outputs[0], 1)
        os.dup2(outputs[1], 2)
        os.setsid()
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != shim_pid:
            os._exit(EXIT_EXEC_FAILED)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        umask = os.environ.get("AUTOTUNE_TRIAL_UMASK", "")  # the user's, under the tuner's private one
        if umask.isdigit():
            os.umask(int(umask, 8))
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, f"autotune: cannot start {argv[0]!r}: {e.strerror}\n".encode())
    os._exit(EXIT_EXEC_FAILED)


def main() -> None:
    result_path, tuner_pid, grace, log_limit = (
        sys.argv[1],
        int(sys.argv[2]),
        float(sys.argv[3]),
        int(sys.argv[4]),
    )
    argv = sys.argv[6:]
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    signal.signal(signal.SIGTERM, _on_stop)
    signal.signal(signal.SIGUSR1, _on_stop)
    signal.pthread_sigmask(
        signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGUSR1}
    )  # blocked by the tuner until now
    if os.getppid() != tuner_pid:  # the tuner died before PDEATHSIG was armed
        return
    folder = os.path.dirname(result_path)
    pipes, ends = {}, []
    for name in ("stdout.log", "stderr.log"):
        read, write = os.pipe()
        os.set_blocking(read, False)
        pipes[read] = TailLog(os.path.join(folder, name), log_limit)
        ends.append(write)
    pid = start_trial(argv, os.getpid(), (ends[0], ends[1]))
    for end in ends:
        os.close(end)  # the trial's processes hold the write ends now: EOF once they are all gone
    status, usage, stopped = wait_trial(pid, grace, pipes)
    kill_everything()
    drain(pipes)
    result = {
        "exit_code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "maxrss_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB
        "cpu_seconds": usage.ru_utime + usage.ru_stime,  # its own and its reaped children's
        "stopped": stopped,
    }
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)


if __name__ == "__main__":
    main()
