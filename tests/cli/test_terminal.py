"""The terminal a run leaves behind (#44 item 3): under a pseudo-terminal, where rich draws its spinner and
hides the cursor, every way out of a run (Ctrl-C, an error) shows the cursor again and prints its message on
a line of its own, and an interrupted run says that the same command resumes it. (Issue 44: the stream
ended on ESC[?25l, and "...0sInterrupted: the running trial was stopped." was glued to the spinner.)"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC

OPTIONS = "--budget 300MiB --plans none --batch-sizes 1-8 --steps 2 --warmup-steps 1 --device cpu".split()
HIDE, SHOW = "\x1b[?25l", "\x1b[?25h"
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def in_a_terminal(cache: Path, *script_args: str, interrupt_at: str | None = None) -> tuple[int, str]:
    """Run ``autotune run`` on a pseudo-terminal of 100 columns; with ``interrupt_at``, send SIGINT (what
    Ctrl-C sends) once the output shows that text and the spinner. Its exit code and all it wrote."""
    main, side = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "LINES": "40", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    env.pop("CI", None)  # rich draws no spinner where it sees CI
    command = [AUTOTUNE, "run", *OPTIONS, "--cache-dir", str(cache), str(SYNTHETIC), "--", *script_args]
    proc = subprocess.Popen(command, stdin=side, stdout=side, stderr=side, env=env, close_fds=True)
    os.close(side)
    output, sent, end = b"", False, time.monotonic() + 120
    while time.monotonic() < end:
        ready, _, _ = select.select([main], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the other side closed: every process holding it has exited
                break
            if not chunk:
                break
            output += chunk
        text = output.decode(errors="replace")
        if interrupt_at and not sent and interrupt_at in text and HIDE in text:
            proc.send_signal(signal.SIGINT)
            sent = True
    os.close(main)
    assert proc.wait(timeout=60) is not None
    return proc.returncode, output.decode(errors="replace")


def line_of(text: str, start: str) -> str:
    """The line of the output, its escape codes taken out, that holds ``start``: all of it from its start."""
    plain = ESCAPE.sub("", text).replace("\r\n", "\n")
    for line in re.split(r"[\r\n]", plain):
        if start in line:
            return line
    raise AssertionError(f"no line with {start!r} in {plain!r}")


def test_ctrl_c_under_the_spinner_restores_the_terminal_and_says_how_to_resume(tmp_path: Path) -> None:
    code, out = in_a_terminal(tmp_path, "--base-mib", "10", "--step-seconds", "2", interrupt_at="probe")
    assert code == 130, out
    assert out.rindex(SHOW) > out.rindex(HIDE)  # the cursor is shown again
    line = line_of(out, "Interrupted:")
    assert line == (
        "Interrupted: the running trial was stopped. The same command resumes the run: the trials that "
        "finished are stored."
    )


def test_an_error_under_the_spinner_restores_the_terminal(tmp_path: Path) -> None:
    code, out = in_a_terminal(tmp_path, "--base-mib", "10", "--crash-at", "1", "--step-seconds", "0.5")
    assert code != 0, out
    assert HIDE in out and out.rindex(SHOW) > out.rindex(HIDE)
    assert line_of(out, "Error:").startswith("Error: ")  # on a line of its own, not after the spinner's
