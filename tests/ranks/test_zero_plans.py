"""ZeRO plans (``zero:...``) in a real DeepSpeed job under torchrun (gloo, CPU): the config the script passes
to its own ``deepspeed.initialize`` takes the plan's stage and offload with no change to the script, on every
rank, as DeepSpeed's engine reports it (not autotune's records), whether the config comes as a dict or a file
in the script's args; the numbers stay the script's own; a script that does not train with DeepSpeed is told
so; the probe offers the other stages and a search measures them; outside a trial ``autotune.prepare`` checks
the engine against the plan. DeepSpeed trains on this CPU (its shared-memory collectives built by ninja on
first use): ``make test-deepspeed`` installs it and runs these (``make test-ranks`` skips them without it)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune import api
from autotune.backends.probe import default_plans, rows
from autotune.core.protocol import Outcome
from autotune.search.records import TrialKind
from autotune.search.reporting import SilentReporter
from autotune.search.spec import tune_spec
from autotune.trials.measurement import measure, measure_spec
from autotune.trials.settings import TrialSettings

from conftest import SCRIPTS, torchrun

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="DeepSpeed is not installed: make test-deepspeed",
    ),
]

SCRIPT = str(SCRIPTS / "deepspeed_job.py")
DISTRIBUTED = str(SCRIPTS / "distributed.py")


def trial(tmp_path: Path, plan: str, *script: str) -> tuple[object, dict, list[dict]]:
    """A 2-rank trial of deepspeed_job.py at batch 4 under ``plan``: its result, rank 0's first loss and full
    gradients, and what each rank's engine runs after the first step."""
    out = tmp_path / plan.replace(":", "_").replace("+", "_")
    out.mkdir()
    words = torchrun(SCRIPT, "--grads", str(out / "numbers.pt"), "--zero-state", str(out), *script)
    spec = measure_spec(
        words,
        4,
        plan=plan,
        device="cpu",
        cache_dir=tmp_path / "cache",
        settings=TrialSettings(1, 2, 180, 300, tight=0),
    )
    result = measure(spec)
    if result.outcome is not Outcome.COMPLETE:
        return result, {}, []
    states = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    return result, torch.load(out / "numbers.pt"), states


def test_under_deepspeed_s_own_launcher_a_zero_plan_reaches_every_rank_and_each_rank_is_measured(
    tmp_path: Path,
) -> None:
    """``deepspeed train.py`` (DeepSpeed's launcher, not torchrun: its ranks are whatever report a $RANK):
    the plan's stage is what both ranks' engines run, and each rank is measured on its own (the launcher and
    the two ranks summed read 3.70 GiB here; one rank ~410 MiB, as under torchrun)."""
    out = tmp_path / "state"
    out.mkdir()
    launcher = str(Path(sys.executable).with_name("deepspeed"))
    words = [launcher, "--num_accelerators", "2", "--no_local_rank", SCRIPT, "--zero-state", str(out)]
    spec = measure_spec(
        words,
        4,
        plan="zero:2",
        device="cpu",
        cache_dir=tmp_path,
        settings=TrialSettings(1, 2, 180, 300, tight=0),
    )
    result = measure(spec)
    assert result.outcome is Outcome.COMPLETE, result.error
    assert [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)] == [engine(2, None)] * 2
    assert result.memory_method == "rss-rank" and [r.rank for r in result.ranks] == [0, 1]
    assert result.peak_bytes == max(r.peak_bytes for r in result.ranks)


def engine(stage: int, optimizer: str = "cpu", param: str | None = None) -> dict:
    kind = {
        0: "AdamW",
        1: "DeepSpeedZeroOptimizer",
        2: "DeepSpeedZeroOptimizer",
        3: "DeepSpeedZeroOptimizer_Stage3",
    }
    return {"stage": stage, "offload_optimizer": optimizer, "offload_param": param, "optimizer": kind[stage]}


def test_each_zero_plan_reaches_every_rank_s_engine_and_keeps_the_numbers(tmp_path: Path) -> None:
    """The script's own config says stage 0; each plan's stage and offload are what DeepSpeed's engine runs
    on both ranks. Rank 0's first loss and gradients (gathered by DeepSpeed) equal stage 0's bit for bit at
    stage 2 (stage 1 read the same, by hand: its trials are left out of CI's time); at stage 3 the loss and
    the gradients to float32's rounding (stage 3 gathers each parameter into buffers of its own for the
    forward: the loss read one ulp off, 7e-8 of it, on one of this project's CPUs and equal on another; it
    reduce-scatters each gradient, a sum taken in another order: 3e-7 of the largest)."""
    expected = {
        "none": engine(0, None),
        "zero:2+offload": engine(2),
        "zero:3+offload": engine(3, param="cpu"),
    }
    numbers = {}
    for plan, state in expected.items():
        result, numbers[plan], states = trial(tmp_path, plan)
        assert result.outcome is Outcome.COMPLETE, result.error
        assert result.plan == plan and result.world_size == 2
        assert states == [state, state], plan  # every rank, as DeepSpeed's engine runs it
    own = numbers["none"]
    assert len(own["grads"]) == 4 * 6 + 2
    for plan in ("zero:2+offload", "zero:3+offload"):
        if plan.startswith("zero:3"):  # one float32 ulp off on one CPU here, equal on another
            assert float((numbers[plan]["loss"] - own["loss"]).abs()) <= 1e-6 * float(own["loss"].abs()), plan
        else:
            assert torch.equal(numbers[plan]["loss"], own["loss"]), plan
        assert numbers[plan]["grads"].keys() == own["grads"].keys()
        for name, grad in own["grads"].items():
            if plan.startswith("zero:3"):
                largest = float(grad.abs().max())
                assert float((numbers[plan]["grads"][name] - grad).abs().max()) <= 1e-6 * largest, (
                    plan,
                    name,
                )
            else:
                assert torch.equal(numbers[plan]["grads"][name], grad), (plan, name)


def test_a_config_file_in_the_script_s_args_takes_the_plan_and_keeps_what_the_plan_does_not_name(
    tmp_path: Path,
) -> None:
    """The config as a JSON file in ``args.deepspeed_config`` (DeepSpeed's own examples): zero:2 sets the
    stage; the script's own offload, which the plan does not name, stays."""
    result, _, states = trial(
        tmp_path, "zero:2", "--config-file", str(tmp_path / "ds.json"), "--stage", "1", "--offload"
    )
    assert result.outcome is Outcome.COMPLETE, result.error
    assert states == [engine(2), engine(2)]


def test_a_zero_plan_for_a_script_that_does_not_train_with_deepspeed_is_one_line(tmp_path: Path) -> None:
    words = torchrun(DISTRIBUTED, "--wrap", "ddp")
    spec = measure_spec(
        words,
        4,
        plan="zero:2",
        device="cpu",
        cache_dir=tmp_path,
        settings=TrialSettings(1, 2, 120, 240, tight=0),
    )
    result = measure(spec)
    assert result.outcome is Outcome.FAILED
    assert (
        "plan zero:2: the script made no deepspeed.initialize call before its model's first forward; zero plans "
        "are for scripts that train with DeepSpeed"
    ) in (result.error or "")


def test_a_stage_below_3_for_a_model_built_partitioned_is_one_line(tmp_path: Path) -> None:
    """A model built inside deepspeed.zero.Init (the script's config says stage 3) trains at stage 3 only (a
    zero:3+offload trial of it trained, by hand: left out of CI's time)."""
    result, _, _ = trial(tmp_path, "zero:2", "--stage", "3", "--partitioned")
    assert result.outcome is Outcome.FAILED
    assert (
        "plan zero:2: the script built its model inside deepspeed.zero.Init (ZeRO stage 3's partitioned "
        "construction), which only stage 3 trains; zero plans other than zero:3 do not apply"
    ) in (result.error or "")


def test_the_probe_of_a_deepspeed_job_offers_the_other_stages_and_a_search_measures_them(
    tmp_path: Path,
) -> None:
    """The probe sees the script's engine at stage 0 over 2 ranks, its parameters' and AdamW's bytes, and
    offers stages 1-3 with what a rank holds less; offload left out on this CPU. A search at batch 4 over
    none and zero:2 measures both (four trial runs: the probe, two plans, the verification; all four stages
    measured alike by hand) and answers one it measured; the probe's check tries neither (a sharding is the
    script's own deepspeed.initialize's to take, and the plan has nothing else)."""
    words = torchrun(SCRIPT, "--width", "128", "--batch-size", "{batch_size}")
    probed = api.probe(words, batch_size=4, device="cpu", cache_dir=tmp_path)
    assert probed.outcome is Outcome.COMPLETE, probed.error
    report = probed.probe
    parameters = 4 * 4 * (2 * 128 + 2 * 128 * 512 + 512 + 128) + 4 * 129  # blocks, then the head
    assert (report.zero_stage, report.zero_ranks, report.zero_parameter_bytes) == (0, 2, parameters)
    assert (
        report.zero_optimizer_bytes == 2 * parameters + 4 * 26
    )  # AdamW: two moments and a float32 step each
    table = {row.plan: row for row in rows(report)}
    assert (
        table["zero:1"].detail
        == f"{report.zero_optimizer_bytes / 2 / 2**20:.2f} MiB less a rank than stage 0"
    )
    assert table["zero:1+offload"].excluded.startswith("GPU only")
    plans, excluded = default_plans(report)
    assert plans[:4] == ("none", "zero:1", "zero:2", "zero:3") and "zero:1+offload" in excluded
    spec = tune_spec(
        words, "4GiB", batch_sizes="4", plans=["none;zero:2"], device="cpu", cache_dir=tmp_path,
        trials=4, settings=TrialSettings(1, 2, 180, 300, tight=0),
    )  # fmt: skip
    notes = Notes()
    result = api.tune(spec, environ=dict(os.environ), reporter=notes)
    measured = {
        r.plan for r in result.records if r.kind is TrialKind.MEASURED and r.outcome is Outcome.COMPLETE
    }
    assert measured == {"none", "zero:2"}, [(r.plan, r.kind, r.outcome) for r in result.records]
    assert not [line for line in notes.lines if line.startswith("checking ")], notes.lines
    assert result.best.plan in measured


class Notes(SilentReporter):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, text: str) -> None:
        self.lines.append(text)


def test_outside_a_trial_prepare_passes_an_engine_that_runs_the_plan_and_names_the_config_for_one_that_does_not(
    tmp_path: Path,
) -> None:
    """The answer applied with AUTOTUNE_PLAN and autotune.prepare(engine): an engine whose config says the
    plan's stage trains; one that runs another stage is one line naming the config to write."""
    words = torchrun(SCRIPT, "--steps", "1", "--prepare")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}
    env["AUTOTUNE_PLAN"] = "zero:2"
    done = subprocess.run([*words, "--stage", "2"], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    refused = subprocess.run([*words, "--stage", "1"], env=env, capture_output=True, text=True, timeout=240)
    assert refused.returncode != 0
    assert (
        "plan zero:2: the script's DeepSpeed engine runs ZeRO stage 1 without offload; DeepSpeed takes ZeRO only "
        'in its config: set "zero_optimization": {"stage": 2} in the config the script passes to deepspeed.initialize'
    ) in refused.stderr
