"""The ``autotune`` command line: commands and rendering only; every command is one call into the library
(autotune.api). main.py holds the group and the error mapping; *_commands.py the commands; render*.py,
tables.py and console.py what they print."""

from autotune.cli import answer_commands, trial_commands, tuning_commands
from autotune.cli.main import cli

__all__ = ["answer_commands", "cli", "main", "trial_commands", "tuning_commands"]


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="autotune")
