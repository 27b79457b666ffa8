"""The README and docs/ stay true to what is built (issue 44): every link and anchor resolves, every
``autotune`` command in a code block parses against the CLI as it is now (an option renamed or dropped
fails here), and every Python block compiles and runs, unless a comment right above it says why it cannot
(``<!-- not run: needs your train.py -->``). The site itself is built with ``mkdocs build --strict`` by
``make docs`` (CI's docs phase)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from autotune.cli import cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
NOT_RUN = re.compile(r"<!-- not run: (?P<why>[^>]+?) -->\s*$")
SHELLS = {"", "bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    not_run: str | None  # why it is not run, from the comment right above it

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        why = NOT_RUN.search(before)
        body = "\n".join(line[len(m["indent"]) :] for line in m["body"].splitlines())
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, m["lang"], body, why and why["why"]))
    return found


def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's toc): what the site's links go to."""
    value = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())  # a "# comment" in a code block is no heading
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def test_every_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue  # the web: not reachable from CI
            path, _, anchor = target.partition("#")
            goal = (page.parent / path).resolve() if path else page
            if not goal.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert broken == []


def commands(block: Block) -> list[list[str]]:
    """The ``autotune`` command lines of a shell block, each as its words: continuation lines joined,
    comments dropped, the command inside ``eval "$(...)"`` taken out, ``[--json]`` (an optional part)
    read as given."""
    text = block.body.replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = re.sub(r'^eval "\$\((.*)\)"', r"\1", line.strip())
        line = re.sub(r"\[(--?[\w-]+[^\]]*)\]", r"\1", line)  # show STUDY [--json] -> show STUDY --json
        if not line.startswith(("autotune ", ".venv/bin/autotune ")):
            continue
        words = shlex.split(line, comments=True)
        found.append(words[1:])
    return found


SHELL_BLOCKS = [b for page in PAGES for b in blocks(page) if b.lang in SHELLS]
COMMANDS = [(str(b), words) for b in SHELL_BLOCKS for words in commands(b)]


def test_the_pages_show_commands() -> None:
    assert len(COMMANDS) >= 20  # the check below is not vacuous: the pages are full of commands


@pytest.mark.parametrize(("where", "words"), COMMANDS, ids=[f"{w}:{' '.join(c)[:40]}" for w, c in COMMANDS])
def test_every_autotune_command_on_the_pages_parses(where: str, words: list[str]) -> None:
    """Parsed by the CLI itself (options, their types, required ones, the command's arguments), not run:
    most of them tune a train.py the reader has and CI has not."""
    name, *rest = words
    assert name in cli.commands, f"{where}: autotune has no command {name}"
    try:
        cli.commands[name].make_context(name, rest)
    except click.exceptions.Exit:
        pass  # --help, --version
    except click.UsageError as e:
        pytest.fail(f"{where}: autotune {shlex.join(words)}: {e.format_message()}")


PYTHON_BLOCKS = [b for page in PAGES for b in blocks(page) if b.lang == "python"]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=str)
def test_every_python_block_compiles_and_runs_or_says_why_not(block: Block, tmp_path: Path) -> None:
    compile(block.body, str(block), "exec")
    if block.not_run is not None:
        return
    run = subprocess.run(
        [sys.executable, "-c", block.body], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"{block}: {run.stderr[-2000:]}"


def test_an_unrunnable_block_is_marked_and_a_bad_command_is_caught(tmp_path: Path) -> None:
    """The checks above on a page made to fail them: a stale option, a marked block."""
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nautotune run --budget 4GB --no-such-option train.py\n```\n\n"
        "<!-- not run: needs your train.py -->\n```python\nimport train\n```\n"
    )
    shell, python = blocks(page)
    ((name, *rest),) = commands(shell)
    with pytest.raises(click.NoSuchOption):
        cli.commands[name].make_context(name, rest)
    assert python.not_run == "needs your train.py"
