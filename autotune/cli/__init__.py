"""The ``autotune`` command line: commands and rendering only; every command is one call into the library
(autotune.api). main.py holds the group and the error mapping; answer_commands.py, trial_commands.py and tuning_commands.py the commands; render*.py,
tables.py and console.py what they print."""

import os
import signal
from types import FrameType

from autotune.cli import answer_commands, trial_commands, tuning_commands
from autotune.cli.main import cli
from autotune.core.protocol import TRIAL_UMASK_ENV

__all__ = ["answer_commands", "cli", "main", "trial_commands", "tuning_commands"]


def main() -> None:
    """Console-script entry point. What autotune writes is private (issue 27): the cache dir's folders 0700,
    its database, logs and trial files 0600, whatever the umask; a trial's own files keep the user's umask
    (the launcher restores it: ``TRIAL_UMASK_ENV``)."""
    user = os.umask(0o077)
    os.umask(user | 0o077)
    os.environ.setdefault(TRIAL_UMASK_ENV, f"{user:03o}")
    # SIGTERM (what a batch scheduler sends) is a Ctrl-C: the running trial is stopped and recorded, exit 130
    # (before, `run` died at once, its trial left RUNNING). `worker` installs its own handler.
    signal.signal(signal.SIGTERM, _as_ctrl_c)
    cli(prog_name="autotune")


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    signal.raise_signal(signal.SIGINT)  # through whatever handles Ctrl-C now (autotune.trials.interrupts)
