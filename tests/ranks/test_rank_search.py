"""`autotune run` on torchrun jobs (gloo, CPU): the worst rank against the budget, and plans per rank for a
pipeline whose first stage keeps twice the activations of its second (tests/scripts/synthetic.py
--rank-scale 2,1 --pipeline: each stage's recompute lies on the critical path, so a plan that recomputes
only on the heavy rank is faster than any plan every rank applies)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import optuna
import pytest

from autotune import api
from autotune.core.plans import parse_plan
from autotune.core.protocol import Outcome
from autotune.search.records import TrialKind, TrialRecord
from autotune.search.space import rank_plans
from autotune.search.spec import tune_spec
from autotune.trials.measurement import measure, measure_spec

from conftest import SYNTHETIC, MiB

pytestmark = pytest.mark.ranks

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
PIPELINE = (
    "--steps", "100000", "--base-mib", "20", "--per-sample-mib", "10", "--rank-scale", "2,1", "--pipeline",
    "--plan-effects", "A:1=0.6:1.0,A:0.5=0.3:0.5", "--step-seconds", "0.05", "--per-sample-seconds", "0.01",
)  # fmt: skip
PLANS = "none;A:0.5;A:1;A:0.5|none;A:1|none"


def command(*flags: str) -> list[str]:
    return [TORCHRUN, "--nproc-per-node", "2", str(SYNTHETIC), *flags]


def run(tmp_path: Path, flags: tuple[str, ...], budget: str, plans: str = PLANS):
    spec = tune_spec(
        command(*flags), budget, batch_sizes="2,4,8", plans=[plans], headroom=0.0, device="cpu",
        cache_dir=tmp_path, trials=12,
    )  # fmt: skip
    return spec, api.tune(spec, environ=dict(os.environ))


def measured(result) -> list[TrialRecord]:
    return [r for r in result.records if r.kind is TrialKind.MEASURED and r.outcome is not None]


def test_an_unbalanced_pipeline_wins_with_a_plan_per_rank_faster_than_any_uniform_plan(
    tmp_path: Path,
) -> None:
    _, result = run(tmp_path, PIPELINE, "170MiB")
    best = result.best
    assert best.plan == "A:0.5|none" and best.batch_size == 8
    winner = next(r for r in result.records if (r.batch_size, r.plan) == (8, "A:0.5|none") and r.ranks)
    # the worst rank fits; rank 0 (twice the activations) is the heavy one
    assert max(r.peak_bytes for r in winner.ranks) == winner.peak_bytes <= 170 * MiB
    assert winner.ranks[0].peak_bytes > winner.ranks[1].peak_bytes + 20 * MiB
    # the uniform plan at the winner's batch size fits too (measured here): the answer is the per-rank plan
    # for its speed, not for want of a uniform one. Its step is 0.15 s against A:0.5's 0.17 (the script's
    # sleeps: each stage's recompute on the critical path); the readings that chose it are the search's.
    # No speed is asserted here: on CI, beside the compatibility phase, the winner's median read 82.6
    # samples/s against a uniform reading of 91.9 taken at another moment (issue 42: readings taken apart
    # on a busy machine order nothing).
    rival = measure(measure_spec(command(*PIPELINE), 8, plan="A:0.5", device="cpu", cache_dir=tmp_path))
    assert rival.outcome is Outcome.COMPLETE and rival.peak_bytes <= 170 * MiB
    # best --env gives the plan per rank for autotune.prepare in every rank
    answer = api.best(command(*PIPELINE), budget="170MiB", device="cpu", cache_dir=tmp_path)
    assert answer.env()["AUTOTUNE_PLAN"] == "A:0.5|none"


def test_a_balanced_job_never_measures_a_plan_per_rank(tmp_path: Path) -> None:
    flags = tuple("1,1" if f == "2,1" else f for f in PIPELINE)
    _, result = run(tmp_path, flags, "130MiB")
    assert result.best.plan in ("none", "A:0.5", "A:1")
    assert not [r for r in measured(result) if "|" in (r.plan or "")]


def test_the_worst_rank_decides_what_fits(tmp_path: Path) -> None:
    """No plan per rank offered: batch 8 of none fits rank 1 (~115 MiB) but not rank 0 (~195 MiB)."""
    _, result = run(tmp_path, PIPELINE, "170MiB", plans="none")
    assert result.best.batch_size == 4
    over = [r for r in measured(result) if r.batch_size == 8]
    assert over and all(not r.fits(result.limit_bytes) for r in over)
    assert all(r.ranks[0].outcome is Outcome.OVER_BUDGET for r in over if r.outcome is Outcome.OVER_BUDGET)
    stored = optuna.load_study(study_name=result.study_name, storage=f"sqlite:///{tmp_path}/autotune.db")
    assert all("ranks" in t.user_attrs for t in stored.trials if t.user_attrs.get("kind") == "measured")


def test_the_default_space_of_a_two_rank_job_holds_plans_per_rank() -> None:
    plans = ("none", "Block:1", "Block:1/save=matmul", "Block:0.25", "Block:0.5", "Block:0.75")
    per_rank = rank_plans(plans, 2)
    assert len(per_rank) == 20  # 5 levels, every ordered pair of two different ones
    assert per_rank[:2] == ("Block:0.25|none", "none|Block:0.25")  # the least recompute first
    assert all(len(parse_plan(p).ranks) == 2 for p in per_rank)
    assert rank_plans(("none",), 2) == ()
    assert len(rank_plans(plans, 4)) == 3 * 20
