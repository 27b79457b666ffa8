"""A trial the kernel kills is an outcome, never the tuner's end (issue 31): a training script that, above
some batch size, sends SIGKILL to its launcher and then to itself (what a cgroup's out-of-memory kill does to
the whole group; an offload trial pinning ~69 GB did it on an H100 host) is recorded as ``killed`` with the
likely cause, its configuration is not run again (on resume neither), and its plan is not proposed again at a
batch as large. Before, the run printed "the trial launcher exited with code -9 and left no result", exited
3 and left the trial RUNNING, and every later run of the study ended there.

The host budget stops a trial before the kernel does: a trial whose processes hold more host memory than
``--host-budget`` is stopped at once and recorded ``killed`` with its reading."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import optuna

from autotune.core.protocol import Outcome, TrialReport
from autotune.trials.launcher import ProcessExit
from autotune.trials.result import classify
from autotune.trials.settings import TrialSettings

from conftest import AUTOTUNE, SYNTHETIC, MiB, trial_pids

KILLED_ABOVE = 8
SCRIPT = [
    "--base-mib",
    "20",
    "--per-sample-mib",
    "2",
    "--plan-effects",
    "A=0.5:1.3",
    "--step-seconds",
    "0.02",
]


def run(cache: Path, *options: str, script: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    argv = [AUTOTUNE, "run", "--json", "--device", "cpu", "--steps", "3", "--warmup-steps", "1", "--cache-dir",
            str(cache), "--study", "killed", *options, "--", "python", str(SYNTHETIC), *SCRIPT, *script]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def trials(cache: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="killed", storage=f"sqlite:///{cache / 'autotune.db'}").trials


def test_a_trial_killed_with_its_launcher_is_recorded_and_the_study_goes_on_and_resumes(
    tmp_path: Path,
) -> None:
    options = ("--budget", "400MiB", "--batch-sizes", "1-64", "--plans", "none;A", "--trials", "8")
    script = ("--kill-launcher-above", str(KILLED_ABOVE))
    first = run(tmp_path, *options, script=script)
    assert first.returncode == 0, first.stderr[-3000:]
    answer = json.loads(first.stdout)
    assert answer["batch_size"] <= KILLED_ABOVE

    stored = trials(tmp_path)
    assert all(t.state is optuna.trial.TrialState.COMPLETE for t in stored)  # nothing left RUNNING
    measured = [t for t in stored if t.user_attrs.get("kind") in ("measured", "verification")]
    killed = [t for t in measured if t.user_attrs["outcome"] == "killed"]
    assert killed and all(t.params["batch_size"] > KILLED_ABOVE for t in killed)
    assert all(
        t.user_attrs["outcome"] == "complete" for t in measured if t.params["batch_size"] <= KILLED_ABOVE
    )
    for t in killed:
        assert t.user_attrs["error"].startswith(
            "SIGKILL ended its launcher and it before it reported: most likely the kernel's out-of-memory killer: "
            "its processes held up to "
        ), t.user_attrs["error"]
    # no killed configuration is run again, nor its plan at a batch size as large after it
    for t in killed:
        later = [u for u in measured if u.number > t.number and u.params["plan"] == t.params["plan"]]
        assert all(u.params["batch_size"] < t.params["batch_size"] for u in later), (t.params, later)
    assert trial_pids(tmp_path) == []

    again = run(tmp_path, *options, script=script)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "zero trials" in again.stderr
    assert len(trials(tmp_path)) == len(stored)
    assert (json.loads(again.stdout)["batch_size"], json.loads(again.stdout)["plan"]) == (
        answer["batch_size"],
        answer["plan"],
    )


def test_a_trial_passing_the_host_budget_is_stopped_before_the_kernel_does(tmp_path: Path) -> None:
    """Batch 64 holds 20 + 64 x 4 MiB of host memory; the device budget (the CPU's, 2 GiB) allows it, the
    host budget (200 MiB) does not: it is stopped as it passes 200 MiB, not at its end."""
    options = ("--budget", "2GiB", "--host-budget", "200MiB", "--batch-sizes", "4,64", "--plans", "none",
               "--exhaustive", "--trials", "4")  # fmt: skip
    result = run(tmp_path, *options, script=("--per-sample-mib", "4", "--steps", "100000"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["batch_size"] == 4
    at_64 = [t for t in trials(tmp_path) if t.params.get("batch_size") == 64 and "outcome" in t.user_attrs]
    assert [t.user_attrs["outcome"] for t in at_64] == ["killed"]
    error = at_64[0].user_attrs["error"]
    # stopped as the watch saw it pass, or (a busy machine: the trial ended between two of its samples) read
    # past it by the meter
    assert re.match(r"(stopped as )?its host memory passed the host budget \(", error), error
    assert "budget 200 MiB" in error
    assert at_64[0].user_attrs["peak_bytes"] < 2**30  # stopped near 200 MiB, not at its 276 MiB or its end


def test_a_bad_host_budget_is_one_line_before_any_trial(tmp_path: Path) -> None:
    result = run(tmp_path, "--budget", "1GiB", "--host-budget", "900TiB")
    assert result.returncode != 0
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("Error: --host-budget '900TiB' is more than this host")
    )
    assert not (tmp_path / "trials").exists()


def test_a_trial_that_passed_the_host_budget_between_two_samples_is_no_answer() -> None:
    """The host watch samples every quarter second; on CI's busy machine batch 64 above allocated its 276 MiB
    and ended between two samples, and was recorded complete, then verified as the winner. Where the meter
    reads host memory (the CPU's), its peak past the host budget makes the trial ``killed`` too."""
    ended = ProcessExit(0, None, 0, 0.4, None, False, host_peak_bytes=30 * MiB, host_budget=200 * MiB)
    report = TrialReport(Outcome.COMPLETE, 4, (0.02,) * 3, (64,) * 3)
    outcome, error = classify(ended, report, TrialSettings(), host_read=276 * MiB)
    assert outcome is Outcome.KILLED
    assert error == (
        "its host memory passed the host budget (276 MiB, budget 200 MiB: --host-budget) between two of the "
        "host watch's samples; a longer run would have been stopped"
    )
    assert classify(ended, report, TrialSettings(), host_read=199 * MiB) == (Outcome.COMPLETE, None)
    assert classify(ended, report, TrialSettings(), host_read=None) == (Outcome.COMPLETE, None)  # a GPU's
