"""autotune.find_batch_size: the search inside the caller's process, on a real model, real memory (each
case runs tests/scripts/finder_train.py in a subprocess of its own: the hooks go into that process's torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import autotune
from autotune.core.errors import InputError
from autotune.hardware.devices import resolve_trial_device
from autotune.hardware.nvml import nvml_loader

from conftest import AUTOTUNE, SCRIPTS, finder_options

SCRIPT = SCRIPTS / "finder_train.py"


def found(tmp_path: Path, **options: Any) -> tuple[dict[str, Any], str]:
    """Run the decorated function with ``options``; what it wrote, and its stderr."""
    out = tmp_path / "out.json"
    options = finder_options(tmp_path / "cache", options)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), json.dumps(options), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stderr


def test_the_decorator_searches_in_its_process_then_trains_at_the_answer_with_its_plan(
    tmp_path: Path,
) -> None:
    first, lines = found(tmp_path, budget="900MB", batch_sizes="8", plans=["Block:1"])
    assert (first["batch"], first["plan"], first["cached"]) == (8, "Block:1", False)
    assert first["returned"] == 8.0 and first["calls"][-1] == 8  # the last call trains at the answer
    assert first["applied"] == "Block:1"  # applied to the model the function built, at its first forward
    assert first["first_step"] == first["plain_first_step"]  # the same loss and gradients as no plan's
    assert all(r[2] == "complete" for r in first["records"])
    assert first["trial_env"] == {}  # no trial left behind for a process the training starts
    assert "autotune: batch 8, plan Block:1: " in lines and "budget 900MB" in lines
    listed = subprocess.run(
        [AUTOTUNE, "studies", "--json", "--cache-dir", str(tmp_path / "cache")],
        capture_output=True,
        text=True,
    )
    (study,) = json.loads(listed.stdout)  # a study of its own, said to be searched in the script's process
    assert study["command"].startswith("[in process: __main__.train] ") and study["state"] == "done"
    again, lines = found(tmp_path, budget="900MB", batch_sizes="8", plans=["Block:1"])
    assert again["cached"] and again["calls"] == [8]  # zero trials: the answer from the database
    assert "from the database, zero trials" in lines


def test_a_configuration_over_the_budget_is_stopped_inside_the_process_which_goes_on(tmp_path: Path) -> None:
    result, lines = found(tmp_path, budget="520MB", batch_sizes="4,512", plans=["none"])
    assert "error" not in result, (result["error"], lines[-3000:])
    over = [r for r in result["records"] if r[0] == 512]
    assert over and all(r[2] == "over-budget" and r[3] > result["limit_bytes"] for r in over)
    assert (result["batch"], result["plan"]) == (4, "none")
    assert result["peak"] < result["limit_bytes"] and result["returned"] == 4.0


def test_without_a_budget_the_budget_is_the_devices_memory(tmp_path: Path) -> None:
    result, lines = found(tmp_path, batch_sizes="4", plans=["none"])
    device = resolve_trial_device("auto", 1, os.environ, nvml_loader(None))
    assert result["budget_bytes"] == device.total_bytes
    assert "(budget: the device's memory, " in lines


def test_a_function_that_fails_is_one_error_after_its_first_call(tmp_path: Path) -> None:
    result, _ = found(tmp_path, budget="900MB", batch_sizes="4", plans=["none"], mode="fail")
    assert result["error"].startswith("ScriptError: ")
    assert "ValueError: the data set is empty" in result["error"]
    assert result["calls"] == [4]  # the probe's: no trial after it


def test_an_unknown_option_is_refused_as_the_function_is_decorated() -> None:
    with pytest.raises(InputError, match="find_batch_size: unknown option 'budgett'"):
        autotune.find_batch_size(budgett="1GB")
    with pytest.raises(
        InputError, match=r"find_batch_size takes its options by name \(budget=...\), got '12GB'"
    ):
        autotune.find_batch_size("12GB")


def test_under_autotune_measure_the_decorated_function_runs_at_the_trials_batch_size(
    tmp_path: Path, cache: Path
) -> None:
    """A script with a decorated function is still a script `autotune run` and `measure` can tune: in their
    trial the function runs once at the trial's batch size, with no search inside the search."""
    inner = tmp_path / "inner-cache"
    options = json.dumps({"budget": "900MB", "cache_dir": str(inner)})
    argv = [AUTOTUNE, "measure", "-b", "8", "--device", "cpu", "--json", "--cache-dir", str(cache)]
    done = subprocess.run(
        [*argv, str(SCRIPT), "--", options, str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    trial = json.loads(done.stdout)
    assert (trial["outcome"], trial["batch_size"]) == ("complete", 8)
    assert not inner.exists()  # no search of its own: nothing stored in the finder's cache dir
