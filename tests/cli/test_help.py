"""Every command's docstring is its --help: a command without one fails here."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from autotune.cli import cli

COMMANDS = sorted(cli.commands)


def help_gaps(group: click.Group, name: str) -> list[str]:
    """What ``autotune NAME --help`` lacks: the command's docstring shown as its help, an option's help."""
    command = group.commands[name]
    doc = command.callback.__doc__ if command.callback is not None else None
    if not doc:
        return [f"{name}: no docstring"]
    shown = CliRunner().invoke(group, [name, "--help"], terminal_width=200)
    gaps = [] if shown.exit_code == 0 else [f"{name}: --help exits {shown.exit_code}"]
    if doc.strip().splitlines()[0] not in " ".join(shown.output.split()):
        gaps.append(f"{name}: --help does not show the docstring")
    gaps += [
        f"{name} {p.opts[0]}: no help" for p in command.params if isinstance(p, click.Option) and not p.help
    ]
    return gaps


def test_every_command_is_listed() -> None:
    assert COMMANDS == [
        "best", "doctor", "gc", "keygen", "measure", "probe", "report", "run", "show", "studies", "submit",
        "worker",
    ]  # fmt: skip


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_has_a_docstring_that_is_its_help(name: str) -> None:
    assert help_gaps(cli, name) == []


def test_a_command_without_a_docstring_or_option_help_is_caught() -> None:
    """The same check on a group with an undocumented command and option: it must see both gaps."""

    @click.group()
    def group() -> None:
        """A group."""

    @group.command()
    @click.option("--quiet", is_flag=True)
    def bare(quiet: bool) -> None:
        pass

    @group.command()
    @click.option("--quiet", is_flag=True)
    def half(quiet: bool) -> None:
        """Documented, but its option is not."""

    assert help_gaps(group, "bare") == ["bare: no docstring"]
    assert help_gaps(group, "half") == ["half --quiet: no help"]
