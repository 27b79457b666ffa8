"""Everything that can be checked is checked before a trial (issue 27): each bad input below is one line and
exit 2, with no trial run (no trial folder in the cache dir) and, for the commands that only answer,
nothing created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import AUTOTUNE, SYNTHETIC


def autotune(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [AUTOTUNE, *argv], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def refused(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> str:
    """The one line a refusal printed; no trial ran."""
    done = autotune(tmp_path, *argv, env=env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert not (tmp_path / "trials").exists()
    return lines[0]


def run(tmp_path: Path, *command: str) -> tuple[str, ...]:
    return ("run", "--device", "cpu", "--budget", "1GiB", "--cache-dir", str(tmp_path), "--", *command)


@pytest.mark.parametrize(
    ("word", "message"),
    [
        ("{batch_sise}", "Error: unknown placeholder {batch_sise} in the command ('{batch_sise}'): autotune fills "
                         "{batch_size} and {grad_accum}"),
        ("{batch_size", "Error: unclosed placeholder {batch_size in the command ('{batch_size'): write {batch_size}"),
    ],
)  # fmt: skip
def test_a_template_s_placeholders_are_checked(tmp_path: Path, word: str, message: str) -> None:
    assert refused(tmp_path, *run(tmp_path, "python", str(SYNTHETIC), "--batch-size", word)) == message


def test_json_in_a_command_is_no_placeholder(tmp_path: Path) -> None:
    done = autotune(
        tmp_path, "measure", "-b", "2", "--device", "cpu", "--steps", "1", "--warmup-steps", "1", "--cache-dir",
        str(tmp_path), "--", "python", str(SYNTHETIC), "--batch-size", "{batch_size}", "--extra-mib", '{"a": 1}',
    )  # fmt: skip
    assert "placeholder" not in done.stderr


def test_a_script_that_does_not_compile_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = (\n")
    expected = f"Error: {script}:2: the script does not compile: '(' was never closed"
    assert (
        refused(
            tmp_path, "run", "--device", "cpu", "--budget", "1GiB", "--cache-dir", str(tmp_path), str(script)
        )
        == expected
    )
    assert refused(tmp_path, *run(tmp_path, sys.executable, str(script), "--bs", "{batch_size}")) == expected


@pytest.mark.parametrize(
    ("name", "value"),
    [("AUTOTUNE_HEARTBEAT_GRACE", "abc"), ("AUTOTUNE_HEARTBEAT_GRACE", "0"), ("AUTOTUNE_BUSY_TIMEOUT", "-1")],
)
def test_a_bad_setting_in_the_environment_is_refused_not_replaced(
    tmp_path: Path, name: str, value: str
) -> None:
    line = refused(
        tmp_path, *run(tmp_path, "python", str(SYNTHETIC), "--batch-size", "{batch_size}"), env={name: value}
    )
    assert line.startswith(f"Error: {name} must be a positive number of seconds (") and line.endswith(
        f"got {value!r}"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--trials", "0", "--budget", "1GiB", "x.py"],
         "Error: Invalid value for '--trials': 0 is not in the range x>=2. (see autotune run --help)"),
        (["measure", "--steps", "0", "-b", "1", "x.py"],
         "Error: Invalid value for '--steps': 0 is not in the range x>=1. (see autotune measure --help)"),
        (["run", "--frobnicate"], "Error: No such option '--frobnicate'. Did you mean '--force'? (see autotune run --help)"),
    ],
)  # fmt: skip
def test_a_usage_error_is_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    assert refused(tmp_path, *argv) == message


def test_best_on_a_cache_dir_that_does_not_exist_says_so_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for argv in (["best"], ["best", "--study", "x"], ["best", "--budget", "1GiB", str(SYNTHETIC)]):
        line = refused(tmp_path, *argv, "--cache-dir", str(missing))
        assert (
            line == f"Error: no autotune database at {missing / 'autotune.db'}: nothing was tuned there yet "
            "(autotune run creates it)"
        )
        assert not missing.exists()


def test_plans_for_a_script_with_no_torch_module_are_said_to_be_its_own(tmp_path: Path) -> None:
    done = autotune(
        tmp_path, "run", "--device", "cpu", "--budget", "300MiB", "--trials", "2", "--plans", "none;Foo:1",
        "--cache-dir", str(tmp_path), str(SYNTHETIC), "--", "--step-seconds", "0.01",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "the probe saw the script train no torch module: plans Foo:1 reach it only as AUTOTUNE_PLAN, which "
        "autotune can neither check nor apply (a script that reads it applies them itself)"
    ) in " ".join(done.stderr.split())
