"""A Hugging Face Trainer script that knows nothing of autotune (examples/hf_trainer.py), measured through a
command template with gradient accumulation: every optimizer step counts all of its samples."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "transformers", reason="the compatibility suite needs the test extra: pip install -e '.[test]'"
)

from autotune import api
from autotune.core.protocol import Outcome
from autotune.trials.measurement import measure_spec
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

pytestmark = pytest.mark.compat

TRAINER = str(Path(__file__).parents[2] / "examples" / "hf_trainer.py")


def measure(accumulation_option: str, **accumulation: int) -> TrialResult:
    command = [sys.executable, TRAINER, "--seq", "64", "--per_device_train_batch_size", "{batch_size}"]
    command += ["--gradient_accumulation_steps", accumulation_option]
    spec = measure_spec(
        command,
        8,
        device="cpu",
        settings=TrialSettings(warmup_steps=1, measured_steps=3, tight=0),
        **accumulation,
    )
    return api.measure(spec)


def samples_per_step(result: TrialResult) -> float:
    """The median samples/s times the median step time: exact for an odd count of steps; for an even one
    (a trial measures on until its reading is tight: any count) the two middle steps' times differ, and a
    loaded machine read 32.002. Asserted to 5%: 32 apart from 8 or 16 (the samples of one micro-batch, or
    of a half-counted step), whatever the load."""
    assert result.samples_per_sec is not None
    return result.samples_per_sec * statistics.median(result.step_seconds)


def test_a_global_batch_accumulates_through_the_template_and_counts_every_sample() -> None:
    result = measure("{grad_accum}", global_batch=32)
    assert result.outcome is Outcome.COMPLETE, result.error
    assert (result.grad_accum, result.micro_batches) == (4, 4) and samples_per_step(result) == pytest.approx(
        32, rel=0.05
    )


def test_the_trainer_s_own_accumulation_is_counted() -> None:
    result = measure("4")
    assert result.outcome is Outcome.COMPLETE, result.error
    assert (result.grad_accum, result.micro_batches) == (None, 4)
    assert samples_per_step(result) == pytest.approx(32, rel=0.05)


def test_a_trainer_that_ignores_the_asked_accumulation_fails_saying_so() -> None:
    result = measure("1", global_batch=32)
    assert result.outcome is Outcome.FAILED and result.error is not None
    assert result.error.splitlines()[0] == (
        "AccumulationIgnored: the trial asked for gradient accumulation over 4 micro-batches of 8, but the "
        "script stepped its optimizer after one forward: pass {grad_accum} to its accumulation option "
        "(--gradient_accumulation_steps {grad_accum} for a Trainer) or accumulate autotune.grad_accum() "
        "micro-batches"
    )


def test_a_trainer_s_own_gradient_checkpointing_is_said_and_kept_in_the_answer(tmp_path: Path) -> None:
    """The user's gradient_checkpointing=True (the Trainer calls gradient_checkpointing_enable()): the trial
    and the answer say so, and best --format hf keeps it on (it printed gradient_checkpointing=False)."""
    from autotune.results.formats import hf_vocabulary, render
    from autotune.search.spec import tune_spec

    command = [sys.executable, TRAINER, "--seq", "64", "--per_device_train_batch_size", "{batch_size}"]
    command.append("--gradient_checkpointing")
    spec = tune_spec(
        command, "4GiB", batch_sizes="2", plans=["none"], trials=2, device="cpu", cache_dir=tmp_path,
        settings=TrialSettings(warmup_steps=1, measured_steps=2, tight=0),
    )  # fmt: skip
    result = api.tune(spec)
    owns = {r.own_checkpointing for r in result.records if r.outcome is Outcome.COMPLETE}
    assert len(owns) == 1 and next(iter(owns), "").startswith(
        "gradient_checkpointing_enable() on the model ("
    ), owns
    answer = api.best(study=result.study_name, cache_dir=tmp_path)
    assert (
        answer.own_checkpointing == "gradient_checkpointing_enable() on the model"
    )  # the probe's, uncounted
    assert f"{hf_vocabulary()[0]}=True" in render(answer, "hf").splitlines()  # in the installed one's words


def test_a_trainer_with_its_own_gradient_checkpointing_is_offered_turning_it_off(tmp_path: Path) -> None:
    """The probe offers own:off right after none, checked against no plan (the same loss and gradients);
    a trial of it runs the layers plainly, and its answer is gradient_checkpointing=False."""
    from autotune.backends.probe import default_plans
    from autotune.results.best import BestAnswer
    from autotune.results.formats import hf_vocabulary, render

    command = [sys.executable, TRAINER, "--seq", "64", "--per_device_train_batch_size", "{batch_size}"]
    command.append("--gradient_checkpointing")
    probed = api.probe(command, batch_size=2, device="cpu", cache_dir=tmp_path)
    assert probed.outcome is Outcome.COMPLETE and probed.probe is not None, probed.error
    assert probed.probe.own_checkpointing == "gradient_checkpointing_enable() on the model"
    plans, excluded = default_plans(probed.probe)
    assert plans[:2] == ("none", "own:off"), excluded
    assert [c.ok for c in probed.probe.checks if c.plan == "own:off"] == [True]
    spec = measure_spec(
        command, 2, plan="own:off", device="cpu", cache_dir=tmp_path,
        settings=TrialSettings(warmup_steps=1, measured_steps=2, tight=0),
    )  # fmt: skip
    off = api.measure(spec)
    assert off.outcome is Outcome.COMPLETE and off.plan == "own:off", off.error
    assert off.own_checkpointing == (
        "gradient_checkpointing_enable() on the model (0 torch.utils.checkpoint calls a step)"
    )
    answer = BestAnswer(
        "s", TRAINER, 2, "own:off", off.peak_bytes, 10.0, 2**32, True, "verified",
        own_checkpointing=probed.probe.own_checkpointing,
    )  # fmt: skip
    assert f"{hf_vocabulary()[0]}=False" in render(answer, "hf").splitlines()
