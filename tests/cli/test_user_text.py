"""User text is never markup (issue 27, item 3): a trial's error, a plan, a name or a command from a user, a
script or the database prints as it is. Before, a trial error containing ``[/data/train.csv]`` crashed
``autotune run`` and ``autotune show`` with a Rich markup error (the job left running), and ``[bold]st[red]``
printed as ``st``."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import AUTOTUNE, SYNTHETIC

MESSAGE = "no [/data/train.csv], [bold]st[red], [link=https://x.invalid]x[/link]"


def test_a_trial_error_that_looks_like_markup_prints_as_it_is(tmp_path: Path) -> None:
    script = ["--crash-at", "1", "--crash-above", "4", "--crash-message", MESSAGE]
    run = subprocess.run(
        [AUTOTUNE, "run", "--device", "cpu", "--budget", "300MiB", "--batch-sizes", "1,4,8", "--plans", "none",
         "--exhaustive", "--trials", "5", "--steps", "2", "--warmup-steps", "1", "--cache-dir", str(tmp_path),
         "--study", "marked", "--", "python", str(SYNTHETIC), *script],
        capture_output=True, text=True, timeout=300, env={"COLUMNS": "400", **_env()},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (
        "failed: ValueError: no [/data/train.csv], [bold]st[red], [link=" in run.stderr
    )  # clipped for its log
    show = subprocess.run(
        [AUTOTUNE, "show", "marked", "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", **_env()},
    )  # fmt: skip
    assert show.returncode == 0, show.stderr
    assert f"ValueError: {MESSAGE}" in show.stdout


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "COLUMNS"}


def test_the_report_s_commands_are_shell_quoted_as_the_terminal_s_are() -> None:
    """A study named ``demo;touch pwned;true``: the report's ``autotune best --study ...`` lines, pasted, ran
    ``touch pwned`` (issue 27, item 4). Each command now reads back as one study name."""
    import html
    import re
    import shlex

    from autotune.results.best import BestAnswer
    from autotune.results.report import _answer_blocks

    name = "demo;touch pwned;true"
    answer = BestAnswer(name, "train.py", 8, "none", 2**20, 10.0, 2**30, True, "test")
    commands = [html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", _answer_blocks(answer, []))]
    assert len(commands) == 4
    for command in commands:
        words = shlex.split(command.removeprefix('eval "$(').removesuffix(')"'))
        assert words[words.index("--study") + 1] == name, command


def test_the_hints_carry_a_cache_dir_that_is_not_the_default_and_work_as_printed(tmp_path: Path) -> None:
    """Issue 27, item 4: the printed "use it" and "see it" commands dropped --cache-dir, so they failed for a
    database anywhere but the default. Each hint of a run in a cache dir with a space, pasted, answers."""
    import shlex

    cache = tmp_path / "my cache"
    done = subprocess.run(
        [AUTOTUNE, "run", "--device", "cpu", "--budget", "300MiB", "--trials", "2", "--cache-dir", str(cache),
         str(SYNTHETIC), "--", "--step-seconds", "0.01"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    hints = [line.split(":  ", 1)[1].strip() for line in lines if line.startswith(("use it:", "see it:"))]
    hints += [line.strip() for line in lines if line.startswith(" " * 9) and " best --study " in line]
    assert len(hints) == 3, done.stdout
    use, see, formats = hints
    commands = [
        shlex.split(use.removeprefix('eval "$(').removesuffix(')"')),
        shlex.split(see),
        shlex.split(formats.split("  #")[0]),
    ]
    for words in commands:
        assert words[words.index("--cache-dir") + 1] == str(cache), words
        if words[1] == "report":
            words += ["-o", str(tmp_path / "r.html")]
        pasted = subprocess.run(words, capture_output=True, text=True, timeout=120)
        assert pasted.returncode == 0, (words, pasted.stderr)
