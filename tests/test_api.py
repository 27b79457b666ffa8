"""The library API from Python, as a notebook would call it, against a real SQLite file and real trials:
autotune.tune / best / studies / show / submit / measure / probe / doctor, and the lazy package front."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import autotune
from autotune.core.errors import InputError, NoFitError
from autotune.core.protocol import Outcome
from autotune.search.records import TrialKind
from autotune.storage import JobState
from autotune.trials.settings import TrialSettings

from conftest import SYNTHETIC, MiB, in_a_fresh_interpreter

# The synthetic script holds 20 MiB + 8 MiB per sample; A:1 keeps half of the per-sample memory and takes
# three times as long per sample (at equal batch size ~40% slower: no rival to re-measure, even under load).
ARGS = "--base-mib 20 --per-sample-mib 8 --step-seconds 0.02 --per-sample-seconds 0.0005".split()
ARGS += ["--plan-effects", "A=0.5:2"]
QUICK = autotune.TrialSettings(warmup_steps=1, measured_steps=2, tight=0)  # fixed lengths


def spec(cache: Path, budget: str = "290MiB", **options: object) -> autotune.TuneSpec:
    return autotune.tune_spec(
        [str(SYNTHETIC), *ARGS],
        budget,
        batch_sizes="1-64",
        plans=["none;A"],
        trials=6,  # the probe's run, 4 search trials, the verification's 1
        settings=QUICK,
        device="cpu",
        cache_dir=cache,
        **options,
    )


def test_importing_autotune_loads_neither_torch_nor_optuna() -> None:
    in_a_fresh_interpreter("import autotune; autotune.tune_spec; autotune.best", ("torch", "optuna", "numpy"))


def test_tune_then_best_studies_and_show(tmp_path: Path) -> None:
    result = autotune.tune(spec(tmp_path, study="api"))
    assert (result.study_name, result.cached, result.budget_bytes) == ("api", False, 290 * MiB)
    assert result.limit_bytes == int(290 * MiB * 0.95)
    assert result.best.verified_peak_bytes <= result.limit_bytes
    assert sum(r.counted for r in result.records) == 4
    assert [r.kind for r in result.records].count(TrialKind.VERIFICATION) == 1

    answer = autotune.best([str(SYNTHETIC), *ARGS], budget="290MiB", device="cpu", cache_dir=tmp_path)
    assert (answer.study, answer.verified) == ("api", True)
    assert (answer.batch_size, answer.plan) == (result.best.batch_size, result.best.plan)
    assert answer.env()["AUTOTUNE_BATCH_SIZE"] == str(result.best.batch_size)

    (summary,) = autotune.studies(cache_dir=tmp_path)
    assert (summary.name, summary.trials, summary.state) == ("api", 4, JobState.DONE)
    report = autotune.show("api", cache_dir=tmp_path)
    assert report.limit_bytes == result.limit_bytes
    assert [r.number for r in report.records] == [r.number for r in result.records]

    again = autotune.tune(spec(tmp_path, study="api"))
    assert (again.cached, again.new_trials) == (True, 0)


def test_bad_input_raises_before_any_trial(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="invalid budget '40XB'"):
        spec(tmp_path, budget="40XB")
    with pytest.raises(InputError, match="invalid headroom 'lots'"):
        spec(tmp_path, headroom="lots")
    with pytest.raises(InputError, match="no study named 'nope'"):
        autotune.show("nope", cache_dir=tmp_path)
    assert not (tmp_path / "trials").exists()


def test_best_without_a_verified_winner_answers_from_the_measured_trials(tmp_path: Path) -> None:
    autotune.tune(spec(tmp_path, study="small"))
    answer = autotune.best([str(SYNTHETIC), *ARGS], budget="200MiB", device="cpu", cache_dir=tmp_path)
    assert answer.verified is False
    assert answer.peak_bytes <= int(200 * MiB * 0.95)
    with pytest.raises(NoFitError, match=r"no stored trial fits 10\.00 MiB"):
        autotune.best([str(SYNTHETIC), *ARGS], budget="10MiB", device="cpu", cache_dir=tmp_path)


def test_submit_records_an_open_job_once(tmp_path: Path) -> None:
    job = autotune.submit(spec(tmp_path, study="queued"))
    assert (job.study_name, job.state) == ("queued", JobState.OPEN)
    assert autotune.submit(spec(tmp_path, study="queued")) == job
    (summary,) = autotune.studies(cache_dir=tmp_path)
    assert (summary.name, summary.state, summary.budget_text) == ("queued", JobState.OPEN, "290MiB")


def test_measure_resolves_its_budget_before_the_trial(tmp_path: Path) -> None:
    command = [str(SYNTHETIC), *ARGS]
    trial = autotune.measure(
        autotune.measure_spec(
            command, 8, plan="A", budget="100MiB", settings=QUICK, device="cpu", cache_dir=tmp_path
        )
    )
    assert (trial.outcome, trial.batch_size, trial.plan, trial.budget_bytes) == (
        Outcome.COMPLETE,
        8,
        "A:1",
        100 * MiB,
    )
    assert trial.fits_budget is (trial.peak_bytes <= 100 * MiB)
    with pytest.raises(InputError, match="is more than the device has"):
        autotune.measure(
            autotune.measure_spec(command, 8, budget="1000TiB", device="cpu", cache_dir=tmp_path)
        )


TINY = (
    "import torch\n"
    "class Block(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.a, self.b = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)\n"
    "    def forward(self, x):\n"
    "        return x + self.b(torch.nn.functional.gelu(self.a(x)))\n"
    "model = torch.nn.Sequential(Block(), Block(), Block())\n"
    "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
    "while True:\n"
    "    model(torch.randn(8, 16)).pow(2).mean().backward()\n"
    "    opt.step()\n"
    "    opt.zero_grad()\n"
)


def test_probe_reports_the_repeated_modules(tmp_path: Path) -> None:
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    result = autotune.probe([str(script)], batch_size=8, device="cpu", cache_dir=tmp_path)
    assert result.outcome is Outcome.COMPLETE
    assert result.probe is not None and result.probe.batch_size == 8
    assert [(c.cls, c.count, c.outermost) for c in result.probe.candidates] == [("Block", 3, True)]


def test_a_run_s_probe_ends_once_its_probe_is_done(tmp_path: Path) -> None:
    """A probe's steps are no reading (issue 41: five measured steps after its checks, 2.5 s of the GPT-2's
    12 s probe on the CPU): with a run's two warm-up and five measured steps asked, the probe, attached in
    step 1's forward, records step 3's, times step 4's and checks the plans after it, and the trial ends."""
    from autotune.trials.measurement import measure

    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    spec = autotune.measure_spec([str(script)], 8, device="cpu", cache_dir=tmp_path,
                                 settings=TrialSettings(warmup_steps=2, measured_steps=5))  # fmt: skip
    result = measure(spec, dict(os.environ), probe=True)
    assert result.outcome is Outcome.COMPLETE and result.probe is not None
    assert len(result.step_seconds) == 2 and result.probe.forward_seconds > 0
    assert [c.plan for c in result.probe.checks if c.ok] == ["Block:1", "Block:1/save=matmul"]
    # a script whose model first runs after four optimizer steps that saw no forward: the probe waits for it
    late = TINY.replace("while True:", "for _ in range(4):\n    opt.step()\nwhile True:", 1)
    script.write_text(late)
    result = measure(spec, dict(os.environ), probe=True)
    assert result.outcome is Outcome.COMPLETE and result.probe is not None
    assert [c.plan for c in result.probe.checks if c.ok] == ["Block:1", "Block:1/save=matmul"]


def test_doctor_says_whether_torch_works_here() -> None:
    seen: list[str] = []
    listed = autotune.doctor(on_check=lambda c: seen.append(c.name))  # the CLI prints each line then
    assert seen == [c.name for c in listed]
    found = {check.name: check for check in listed}
    assert found["torch"].ok and found["torch"].required
    assert found["SQLite (default storage)"].ok


def test_the_cli_and_the_library_agree_on_defaults() -> None:
    """The CLI's option defaults are read from the library's dataclasses, not written twice."""
    from autotune.cli import cli

    defaults = {p.name: p.default for p in cli.commands["run"].params}
    settings = autotune.TrialSettings()
    assert (defaults["warmup_steps"], defaults["steps"]) == (settings.warmup_steps, settings.measured_steps)
    assert (defaults["startup_timeout"], defaults["timeout"]) == (settings.startup_timeout, settings.timeout)
    assert defaults["trials"] == autotune.TuneSpec.trials
    assert autotune.tune_spec([str(SYNTHETIC)], "1GB", headroom=defaults["headroom"]).headroom == 0.05
    assert defaults["seed"] == autotune.TuneSpec.seed
    probe = {p.name: p.default for p in cli.commands["probe"].params}
    assert (probe["timeout"], probe["batch_size"]) == (settings.timeout, autotune.api.PROBE_BATCH_SIZE)
