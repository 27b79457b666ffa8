"""Every command's docstring is its --help: a command without one fails here."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from autotune.cli import cli

COMMANDS = sorted(cli.commands)


def test_every_command_is_listed() -> None:
    assert COMMANDS == ["best", "doctor", "measure", "probe", "run", "show", "studies", "submit", "worker"]


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_has_a_docstring_that_is_its_help(name: str) -> None:
    command = cli.commands[name]
    assert command.callback is not None and command.callback.__doc__, f"autotune {name} has no docstring"
    first_line = command.callback.__doc__.strip().splitlines()[0]
    shown = CliRunner().invoke(cli, [name, "--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert first_line in " ".join(shown.output.split())
    assert all(p.help for p in command.params if isinstance(p, click.Option)), (
        f"an option of {name} has no help"
    )


def test_a_command_without_a_docstring_is_caught() -> None:
    """The check above on a command built without one: it must see the gap (a test that cannot fail
    would pass here too)."""

    @click.command()
    def undocumented() -> None:
        pass

    assert not (undocumented.callback and undocumented.callback.__doc__)
