"""The phases of a job (#26): a trial asked for an evaluation and a checkpoint save runs them once after its
measured steps and measures each on its own; a script that does not run one fails saying how. Real trials
of tests/scripts/phases.py (no torch, real memory); the Trainer and Lightning cases are in tests/compat."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune import api
from autotune.core.protocol import Outcome
from autotune.trials.measurement import measure_spec
from autotune.trials.result import misconfigured
from autotune.trials.settings import TrialSettings

from conftest import MiB

SCRIPT = Path(__file__).parents[1] / "scripts" / "phases.py"


def _measure(tmp_path: Path, phases: tuple[str, ...], *args: str):
    spec = measure_spec(
        [str(SCRIPT), *args], 4, device="cpu", cache_dir=tmp_path,
        settings=TrialSettings(warmup_steps=1, measured_steps=2, tight=0, phases=phases),
    )  # fmt: skip
    return api.measure(spec)


def test_eval_and_save_are_measured_and_the_eval_sets_the_peak(tmp_path: Path) -> None:
    result = _measure(tmp_path, ("eval", "save"))
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.phase_peaks is not None and set(result.phase_peaks) == {"eval", "save"}
    assert set(result.phase_seconds or {}) == {"eval", "save"}
    assert result.steady_peak_bytes is not None
    # eval holds 120 MiB more than a step's 20, a save 60 more: each phase's own peak shows it
    assert result.phase_peaks["eval"] - result.steady_peak_bytes > 80 * MiB
    assert 20 * MiB < result.phase_peaks["save"] - result.steady_peak_bytes < result.phase_peaks["eval"]
    assert result.peak_phase == "eval"
    assert result.peak_bytes >= result.phase_peaks["eval"]
    assert len(result.step_seconds) == 2  # the phases took no measured step's time


def test_without_phases_asked_the_trial_ends_after_its_steps_and_the_peak_is_the_steps(
    tmp_path: Path,
) -> None:
    result = _measure(tmp_path, ())
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.phase_peaks is None and result.phase_seconds is None
    assert result.peak_bytes < result.steady_peak_bytes + 40 * MiB  # no evaluation ran: 120 MiB never held


def test_an_evaluation_of_the_script_s_own_during_the_steps_is_measured_apart(tmp_path: Path) -> None:
    result = _measure(tmp_path, (), "--eval-every", "2")
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.phase_peaks is not None and set(result.phase_peaks) == {"eval"}
    assert result.phase_peaks["eval"] - (result.steady_peak_bytes or 0) > 80 * MiB


@pytest.mark.parametrize(
    ("phase", "said"),
    [
        ("eval", "--with-eval: the script trained 8 steps past its measured ones and did not evaluate: "),
        (
            "save",
            "--with-save: the script trained 8 steps past its measured ones and did not save a checkpoint: ",
        ),
    ],
)
def test_a_script_that_never_runs_a_phase_asked_fails_saying_how(
    tmp_path: Path, phase: str, said: str
) -> None:
    result = _measure(tmp_path, ("eval", "save"), "--never", phase)
    assert result.outcome is Outcome.FAILED
    why = misconfigured(result)
    assert why is not None and why.startswith(said), why
    assert f"autotune.due('{phase}')" in why


def test_a_script_that_ends_before_a_phase_asked_fails_saying_so(tmp_path: Path) -> None:
    result = _measure(tmp_path, ("eval",), "--never", "eval", "--steps", "4")
    why = misconfigured(result)
    assert why is not None and why.startswith("--with-eval: the script ended and did not evaluate: "), why
