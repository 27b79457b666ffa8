"""Every command's docstring is its --help: a command without one fails here."""

from __future__ import annotations

import re

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


@pytest.mark.parametrize("name", ["run", "submit"])
def test_run_s_help_at_80_columns_starts_with_budget_and_examples(name: str) -> None:
    """Issue 44: ``run --help`` was 110 lines, --budget (the one required option) tenth, and no example. Now
    the everyday options come first, the rest in sections, every line within 80 columns."""
    shown = CliRunner().invoke(cli, [name, "--help"], terminal_width=80)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    options = [m.group(1) for line in lines if (m := re.match(r"  (?:-\w, )?(--[\w-]+)", line))]
    assert options[:3] == ["--budget", "--trials", "--time-limit"]
    assert [line for line in lines if line and not line.startswith(" ")][1:] == [
        "Options:", "Each trial:", "The search:", "Sharing the work:",
    ]  # fmt: skip
    every = {p.opts[-1] for p in cli.commands[name].params if isinstance(p, click.Option)} | {"--help"}
    assert set(options) == every  # none left out
    if name == "run":
        assert "    autotune run --budget 40GB train.py" in lines
