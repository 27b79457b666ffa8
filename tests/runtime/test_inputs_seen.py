"""Samples counted from what the model saw (issue 26): real trials of tests/scripts/inputs.py, a small torch
script whose batch size is an argparse option, in the layouts real scripts feed their models."""

from __future__ import annotations

import json
import re
import sys

import pytest
from click.testing import CliRunner

import autotune
from autotune.cli import cli

from conftest import SCRIPTS

INPUTS = str(SCRIPTS / "inputs.py")
QUICK = ["--steps", "3", "--warmup-steps", "1", "--device", "cpu"]


def measure(batch: int, *command: str, as_json: bool = True):
    argv = ["measure", "-b", str(batch), *QUICK, *(["--json"] if as_json else []), "--", *command]
    return CliRunner().invoke(cli, argv)


def template(*args: str) -> list[str]:
    return [sys.executable, INPUTS, "--batch-size", "{batch_size}", *args]


def test_a_script_that_ignores_the_batch_size_fails_its_first_trial_with_the_fix(tmp_path) -> None:
    """The issue's argparse script (--batch-size, default 32), tuned without a {batch_size} template: every
    trial trained at 32, and the old answer was batch 65536 at 2048x the script's real speed, "verified"."""
    result = CliRunner().invoke(
        cli, ["run", "--budget", "2GiB", "--trials", "4", *QUICK, "--cache-dir", str(tmp_path), INPUTS]
    )
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1
    assert re.fullmatch(
        r"Error: the script trained on batches of 32 when the trial asked for (\d+): pass \{batch_size\} to "
        r"its batch-size option or read autotune\.batch_size\(\) \(where a sample is not a row of the model's "
        r"first input, count steps with autotune\.step\(samples\)\) \(trial log: .+\)",
        error[0],
    )
    assert "trial   0" not in result.output  # the probe's trial was the first, and the last


def test_a_template_that_omits_the_batch_size_fails_measure_with_exit_2() -> None:
    result = measure(64, sys.executable, INPUTS, "--batch-size", "8", as_json=False)
    assert result.exit_code == 2
    assert "Error: the script trained on batches of 8 when the trial asked for 64" in result.output


@pytest.mark.parametrize("layout", ["tokens", "kwargs"])
def test_token_inputs_count_tokens_beside_samples(layout: str) -> None:
    """(B, T) token ids, positional or as Hugging Face passes them (input_ids=...): tokens/s is T x samples/s."""
    result = measure(6, *template("--layout", layout))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["batch_seen"] == 6 and data["lengths"] == [12, 12]
    assert data["tokens_per_sec"] == pytest.approx(12 * data["samples_per_sec"], rel=1e-9)


def test_a_sequence_first_model_is_counted_by_its_batch_dimension() -> None:
    """An LSTM without batch_first sees (T, B, F): its leading dimension is the sequence, not the batch."""
    result = measure(5, *template("--layout", "seq-first"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["batch_seen"] == 5 and data["tokens_per_sec"] is None


def test_rows_are_samples_and_no_tokens() -> None:
    data = json.loads(measure(3, *template()).stdout)
    assert (data["outcome"], data["batch_seen"], data["tokens_per_sec"], data["lengths"]) == (
        "complete",
        3,
        None,
        None,
    )


def test_a_trial_whose_sequence_lengths_varied_says_so() -> None:
    result = measure(2, *template("--layout", "tokens", "--lengths", "8-64", "--seed", "3"), as_json=False)
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.lstrip().startswith("inputs"))
    low, high = (int(v) for v in re.search(r"varied from (\d+) to (\d+) between steps", line).groups())
    assert 8 <= low < high <= 64
    assert f"the peak is that of length {high} at most; the job's longest input may need more" in line


def test_worst_case_mode_feeds_the_longest_inputs_and_is_a_workload_of_its_own(monkeypatch) -> None:
    """AUTOTUNE_WORST_CASE=1: the script pads to its longest length (autotune.worst_case()), every step the
    same, and the trial says nothing varied; the workload's fingerprint is not that of the plain trials."""
    from autotune.hardware.devices import resolve_device
    from autotune.trials.command import TrialCommand
    from autotune.trials.workload import workload_of

    command = TrialCommand.parse((INPUTS,))
    plain = workload_of(command, resolve_device("cpu", {}), "torch").fingerprint
    monkeypatch.setenv("AUTOTUNE_WORST_CASE", "1")
    assert autotune.worst_case()
    data = json.loads(measure(2, *template("--layout", "tokens", "--lengths", "8-64")).stdout)
    assert data["lengths"] == [64, 64]
    assert workload_of(command, resolve_device("cpu", {}), "torch").fingerprint != plain
    monkeypatch.setenv("AUTOTUNE_WORST_CASE", "0")
    assert not autotune.worst_case()
