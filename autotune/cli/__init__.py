"""The ``autotune`` command line: commands and rendering only; every command is one library call."""

from autotune.cli.commands import cli, main

__all__ = ["cli", "main"]
