"""Multi-process trials through a real torchrun (gloo, CPU): every rank measured on its own, the worst rank
against the budget, one rank's out-of-memory the trial's, every rank's samples counted.

The ranks run tests/scripts/synthetic.py (no torch, real memory): torchrun itself imports torch, the ranks
do not, so each trial takes ~2 s. ``make test-ranks`` runs them (a phase of .ci/run)."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import pytest

from autotune.core.budget import parse_budget
from autotune.core.plans import Plan, parse_plan
from autotune.core.protocol import Outcome
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import measure, measure_spec, run_trial
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

from conftest import SCRIPTS, SYNTHETIC, MiB, alive, trial_pids

pytestmark = pytest.mark.ranks

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def torchrun(*flags: str, ranks: int = 2) -> list[str]:
    return [TORCHRUN, "--nproc-per-node", str(ranks), str(SYNTHETIC), *flags]


def trial(
    cache: Path,
    words: list[str],
    batch: int = 4,
    plan: str = "none",
    ceiling: int | None = None,
    **settings: float,
) -> TrialResult:
    settings = {"warmup_steps": 1, "measured_steps": 4, "startup_timeout": 60, "timeout": 90, **settings}
    return run_trial(
        TrialCommand.parse(words),
        batch,
        parse_plan(plan),
        cpu_device(),
        RssMeter(),
        TrialSettings(**settings),  # type: ignore[arg-type]
        cache,
        dict(os.environ),
        ceiling=ceiling,
    )


def test_each_rank_is_measured_on_its_own_and_the_worst_rank_is_the_trial_s_peak(cache: Path) -> None:
    result = trial(cache, torchrun("--per-sample-mib", "30", "--rank-scale", "2,1", "--steps", "1000"))
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.world_size == 2
    assert [r.rank for r in result.ranks] == [0, 1]
    assert all(r.device == "cpu" and r.outcome is Outcome.COMPLETE for r in result.ranks)
    rank0, rank1 = (r.peak_bytes for r in result.ranks)
    # rank 0 holds 2 x 4 x 30 MiB, rank 1 4 x 30 MiB: 120 MiB apart (their interpreters are alike)
    assert abs((rank0 - rank1) - 120 * MiB) <= 8 * MiB, (rank0 - rank1) / MiB
    assert result.peak_bytes == rank0  # the worst rank, not the launcher's + both ranks' sum
    assert result.memory_method == "rss-rank"
    # every rank's samples: each measured step is 2 ranks x batch 4, over the slower rank's time
    assert result.samples_per_sec == pytest.approx(statistics.median(8 / s for s in result.step_seconds))


def test_ranks_another_launcher_starts_are_each_measured_on_their_own_and_held_to_the_budget(
    cache: Path,
) -> None:
    """A launcher autotune does not read (tests/scripts/launch_ranks.sh, as DeepSpeed's or mpirun start
    theirs: each rank's $RANK set) is measured like torchrun: each rank that reports itself on its own, the
    trial's peak the worst rank's, not the sum of the ranks and the launcher; and a budget that holds one
    rank but not the two together stops nothing."""
    words = [str(SCRIPTS / "launch_ranks.sh"), "2", sys.executable, str(SYNTHETIC), "--base-mib", "150"]
    words += ["--per-sample-mib", "10", "--rank-scale", "2,1", "--steps", "1000"]
    result = trial(cache, words)
    assert result.outcome is Outcome.COMPLETE, result.error
    assert result.memory_method == "rss-rank" and [r.rank for r in result.ranks] == [0, 1]
    rank0, rank1 = (r.peak_bytes for r in result.ranks)
    assert abs((rank0 - rank1) - 40 * MiB) <= 8 * MiB, (rank0 - rank1) / MiB  # 2 x 4 x 10 MiB against 4 x 10
    assert result.peak_bytes == rank0 and rank1 >= 150 * MiB
    held = trial(cache, words, ceiling=rank0 + 40 * MiB)  # the two ranks hold 150 MiB and more each
    assert held.outcome is Outcome.COMPLETE, held.error
    assert held.peak_bytes <= rank0 + 40 * MiB < rank0 + rank1


def test_accelerate_s_launcher_s_ranks_are_counted_for_a_global_batch_and_measured_each(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real ``accelerate launch --num_processes 2`` (its multi-process launcher, on the CPU): a global batch
    of 8 at batch 4 is shared by its two ranks, no accumulation, and each rank is measured on its own. Read as
    one rank, the trial asked for 2 micro-batches the script never accumulates, and failed."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no `accelerate config` of this machine's
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    words = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", str(SCRIPTS / "distributed.py")]
    words += ["--batch-size", "{batch_size}"]
    settings = TrialSettings(warmup_steps=1, measured_steps=3, startup_timeout=120, timeout=180)
    spec = measure_spec(words, 4, device="cpu", cache_dir=cache, global_batch=8, settings=settings)
    data = measure(spec).to_dict()
    assert data["outcome"] == "complete", data["error"]
    assert (data["world_size"], data["grad_accum"], data["memory_method"]) == (2, 1, "rss-rank")
    assert [(r["rank"], r["outcome"]) for r in data["ranks"]] == [(0, "complete"), (1, "complete")]
    assert data["peak_bytes"] == max(r["peak_bytes"] for r in data["ranks"])


def test_measure_json_lists_the_ranks(cache: Path) -> None:
    spec = measure_spec(
        torchrun("--per-sample-mib", "10", "--steps", "1000"), 4, device="cpu", cache_dir=cache
    )
    data = measure(spec).to_dict()
    assert [(r["rank"], r["device"], r["outcome"]) for r in data["ranks"]] == [
        (0, "cpu", "complete"),
        (1, "cpu", "complete"),
    ]
    assert data["peak_bytes"] == max(r["peak_bytes"] for r in data["ranks"])


def test_one_rank_s_out_of_memory_is_the_trial_s_and_ends_it_at_once(cache: Path) -> None:
    started = time.monotonic()
    result = trial(cache, torchrun("--fail-rank", "1", "--oom-at", "2", "--step-seconds", "0.2"))
    assert result.outcome is Outcome.OOM
    assert result.error == "rank 1 of 2: MemoryError: synthetic allocation failure at step 2"
    assert [(r.rank, r.outcome) for r in result.ranks] == [(0, None), (1, Outcome.OOM)]
    assert time.monotonic() - started < 10  # rank 0 would step on for minutes
    assert not [p for p in trial_pids(cache) if alive(p)]


def test_one_rank_s_error_keeps_its_message(cache: Path) -> None:
    result = trial(cache, torchrun("--fail-rank", "0", "--crash-at", "2", "--step-seconds", "0.2"))
    assert result.outcome is Outcome.FAILED
    assert result.error.splitlines()[0] == "rank 0 of 2: ValueError: synthetic crash at step 2"


@pytest.mark.parametrize("wrapper", [["env"], ["sh", "-c", 'exec "$0" "$@"']])
def test_a_trial_s_own_report_survives_a_wrapper_in_front_of_python(cache: Path, wrapper: list[str]) -> None:
    command = [*wrapper, sys.executable, str(SYNTHETIC)]
    oom = trial(cache, [*command, "--oom-at", "3"])
    assert (oom.outcome, oom.error) == (Outcome.OOM, "MemoryError: synthetic allocation failure at step 3")
    crash = trial(cache, [*command, "--crash-at", "3"])
    assert crash.outcome is Outcome.FAILED
    assert crash.error.splitlines()[0] == "ValueError: synthetic crash at step 3"


def test_a_rank_that_never_steps_times_the_trial_out_and_nothing_is_left(cache: Path) -> None:
    result = trial(
        cache, torchrun("--hang-rank", "1", "--hang-at", "0", "--steps", "1000"), startup_timeout=6
    )
    assert result.outcome is Outcome.TIMEOUT  # rank 0 stepped; the slowest rank counts
    assert result.error.startswith("no training step within 6s")
    assert not [p for p in trial_pids(cache) if alive(p)]


def test_a_rank_that_hangs_later_times_the_trial_out(cache: Path) -> None:
    result = trial(cache, torchrun("--hang-rank", "0", "--hang-at", "2", "--steps", "1000"), timeout=8)
    assert result.outcome is Outcome.TIMEOUT
    assert not [p for p in trial_pids(cache) if alive(p)]


def test_the_budget_holds_per_rank_and_stops_the_trial_when_one_rank_passes_it(cache: Path) -> None:
    flags = ("--base-mib", "20", "--per-sample-mib", "40", "--rank-scale", "2,1", "--steps", "1000")
    fits = trial(
        cache, torchrun(*flags), ceiling=250 * MiB
    )  # rank 0 ~ 20 + 320 MiB: over; the sum of all far more
    assert fits.outcome is Outcome.OVER_BUDGET
    assert (fits.ranks[0].rank, fits.ranks[0].outcome) == (0, Outcome.OVER_BUDGET)
    # the launcher's own memory (torch imported) is no rank's: a budget both ranks fit is not passed
    result = trial(cache, torchrun("--per-sample-mib", "10", "--steps", "1000"), ceiling=150 * MiB)
    assert result.outcome is Outcome.COMPLETE, result.error


def test_a_global_batch_is_shared_by_the_ranks(cache: Path) -> None:
    spec = measure_spec(torchrun("--steps", "1000"), 4, device="cpu", cache_dir=cache, global_batch=32)
    assert spec.grad_accum == 4  # 32 / (4 x 2 ranks)
    result = measure(spec)
    # each rank's optimizer step is 4 micro-batches of 4; two ranks: 32 samples per step
    assert result.samples_per_sec == pytest.approx(statistics.median(32 / s for s in result.step_seconds))


def test_torchrun_run_as_a_python_module_gets_the_runtime_in_every_rank(cache: Path) -> None:
    words = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        str(SYNTHETIC),
        "--steps",
        "1000",
    ]
    result = trial(cache, words)
    assert result.outcome is Outcome.COMPLETE, result.error
    assert [r.rank for r in result.ranks] == [0, 1]


def test_a_plan_per_rank_gives_each_rank_its_entry(cache: Path) -> None:
    flags = ("--per-sample-mib", "40", "--plan-effects", "A:1=0.5:0", "--steps", "1000")
    result = trial(cache, torchrun(*flags), batch=4, plan="A:1|none")
    assert result.outcome is Outcome.COMPLETE, result.error
    rank0, rank1 = (r.peak_bytes for r in result.ranks)
    assert abs((rank1 - rank0) - 80 * MiB) <= 8 * MiB  # rank 0 keeps half of its 160 MiB
    assert (
        Plan.per_rank([parse_plan("A:1"), parse_plan("none")]) == parse_plan(result.plan)
        or result.plan == "A:1|none"
    )


def test_budget_is_per_device_in_measure(cache: Path) -> None:
    spec = measure_spec(
        torchrun("--per-sample-mib", "10", "--steps", "1000"),
        4,
        device="cpu",
        cache_dir=cache,
        budget="150MiB",
    )
    assert spec.budget == parse_budget("150MiB")
    result = measure(spec)
    assert result.fits_budget is True
