"""The phases of a job inside the frameworks (#26): a Hugging Face Trainer and a Lightning trainer that know
nothing of autotune (examples/) evaluate and save a checkpoint once after a trial's measured steps when it
asks (--with-eval, --with-save), each phase measured on its own; their own periodic evaluation is measured
too; the trial's checkpoint never lands in the user's output directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "transformers", reason="the compatibility suite needs the test extra: pip install -e '.[test]'"
)
pytest.importorskip(
    "lightning", reason="the compatibility suite needs the test extra: pip install -e '.[test]'"
)

from autotune import api
from autotune.core.protocol import Outcome
from autotune.search.spec import tune_spec
from autotune.trials.measurement import measure_spec
from autotune.trials.result import TrialResult, misconfigured
from autotune.trials.settings import TrialSettings

from conftest import DETERMINISTIC_CPU_ALLOCATOR, MiB

pytestmark = pytest.mark.compat

EXAMPLES = Path(__file__).parents[2] / "examples"
SETTINGS = dict(warmup_steps=1, measured_steps=2, tight=0)  # fixed lengths: what each phase holds


def trainer(tmp_path: Path, phases: tuple[str, ...], *options: str) -> TrialResult:
    command = [sys.executable, str(EXAMPLES / "hf_trainer.py"), "--seq", "64"]
    command += ["--per_device_train_batch_size", "{batch_size}", "--output_dir", str(tmp_path / "output")]
    command += ["--per_device_eval_batch_size", "64", "--eval_samples", "512", *options]  # the last one wins
    return _measure(tmp_path, phases, command)


def lightning(tmp_path: Path, phases: tuple[str, ...], *options: str) -> TrialResult:
    command = [
        sys.executable,
        str(EXAMPLES / "lightning_module.py"),
        "--seq",
        "64",
        "--batch-size",
        "{batch_size}",
    ]
    return _measure(tmp_path, phases, [*command, *options])


def _measure(tmp_path: Path, phases: tuple[str, ...], command: list[str]) -> TrialResult:
    """One trial; glibc returns what the evaluation freed to the system at once (by default it may keep it
    for the next steps, whose samples would then read the evaluation's memory)."""
    settings = TrialSettings(**SETTINGS, phases=phases)
    spec = measure_spec(command, 8, device="cpu", cache_dir=tmp_path / "cache", settings=settings)
    return api.measure(spec, environ={**os.environ, **DETERMINISTIC_CPU_ALLOCATOR})


def test_a_trainer_evaluates_and_saves_once_after_the_steps_each_measured_outside_the_user_s_folder(
    tmp_path: Path,
) -> None:
    result = trainer(tmp_path, ("eval", "save"))
    assert result.outcome is Outcome.COMPLETE, result.error
    assert set(result.phase_seconds or {}) == {"eval", "save"}
    assert result.phase_peaks is not None and "eval" in result.phase_peaks
    # the evaluation gathers every logit of 512 held-out samples (512 x 64 tokens x 512 classes x 4 bytes)
    assert result.phase_peaks["eval"] > (result.steady_peak_bytes or 0) + 32 * MiB
    assert result.peak_phase == "eval"
    assert not (tmp_path / "output").exists() or not any((tmp_path / "output").glob("checkpoint-*"))
    assert not (Path(result.log_dir) / "checkpoint").exists()  # the trial's own checkpoint, deleted


def test_a_trainer_s_own_evaluation_every_n_steps_is_measured(tmp_path: Path) -> None:
    result = trainer(tmp_path, (), "--eval_steps", "2")
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.phase_peaks is not None and set(result.phase_peaks) == {"eval"}
    assert result.phase_peaks["eval"] > (result.steady_peak_bytes or 0) + 32 * MiB


def test_a_trainer_with_no_held_out_set_fails_with_eval_saying_so(tmp_path: Path) -> None:
    result = trainer(tmp_path, ("eval",), "--eval_samples", "0")
    why = misconfigured(result)
    assert why is not None and why.startswith(
        "--with-eval: the Trainer has no eval_dataset to evaluate on: give it one (Trainer(eval_dataset=...)) "
        "or leave --with-eval out"
    ), result.error


def test_lightning_validates_and_saves_once_after_the_steps_each_measured(tmp_path: Path) -> None:
    result = lightning(tmp_path, ("eval", "save"), "--val-batches", "4")
    assert result.outcome is Outcome.COMPLETE, result.error
    assert set(result.phase_seconds or {}) == {"eval", "save"}
    assert not (Path(result.log_dir) / "checkpoint").exists()


def test_lightning_without_a_validation_set_fails_with_eval_saying_so(tmp_path: Path) -> None:
    result = lightning(tmp_path, ("eval",))
    why = misconfigured(result)
    assert why is not None and why.startswith(
        "--with-eval: the Lightning trainer has no validation to run (no val_dataloader, or "
        "limit_val_batches=0): give the module a val_dataloader or leave --with-eval out"
    ), result.error


def test_a_search_with_eval_answers_a_batch_whose_evaluation_fits_too(tmp_path: Path) -> None:
    """A loop of its own whose evaluation holds 6 MiB per sample, its steps 1: without --with-eval the
    answer is the batch whose steps fit, and its evaluation would pass the limit; with it, every trial's
    evaluation is measured and the answer's fits."""
    script = [str(Path(__file__).parents[1] / "scripts" / "phases.py")]
    script += ["--train-mib", "10", "--per-sample-mib", "1", "--eval-mib", "0", "--eval-per-sample-mib", "6"]
    answers = {}
    for phases in ((), ("eval",)):
        spec = tune_spec(
            script, "200MiB", batch_sizes="1-64", trials=10, device="cpu", cache_dir=tmp_path / str(phases),
            settings=TrialSettings(**SETTINGS, phases=phases),
        )  # fmt: skip
        result = api.tune(spec)
        answers[phases] = result
    plain, with_eval = answers[()], answers[("eval",)]
    limit = with_eval.limit_bytes
    assert plain.best.batch_size >= 64 // 2  # steps alone: ~36 MiB + 1 MiB a sample
    assert with_eval.best.batch_size < plain.best.batch_size
    config = (with_eval.best.batch_size, with_eval.best.plan)
    ran = [r for r in with_eval.records if (r.batch_size, r.plan) == config and r.phase_peaks]
    assert ran and all(r.phase_peaks and r.phase_peaks["eval"] <= limit for r in ran)
    assert with_eval.study_name != plain.study_name  # the phases are part of the study's key
