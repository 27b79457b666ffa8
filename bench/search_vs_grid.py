"""Trials used by the search against an exhaustive grid of the same space, on the example models (CPU).

    .venv/bin/python bench/search_vs_grid.py

For each example: measure every (batch size, plan) of the space once (the grid), then run the tuner on a
fresh database with --trials N over the same space. Prints the trials each used, the grid's best fitting
configuration and the tuner's choice, both judged by the grid's own measurements (the same run-to-run
noise for both), and the ratio of their samples/s.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune.core.budget import format_bytes, parse_budget
from autotune.core.plans import parse_plan
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.search.space import parse_batch_sizes
from autotune.search.spec import TuneSpec
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import run_trial
from autotune.trials.settings import TrialSettings
from autotune.workers.tune import tune

optuna.logging.set_verbosity(optuna.logging.WARNING)

EXAMPLES = Path(__file__).parent.parent / "examples"
SETTINGS = TrialSettings(warmup_steps=2, measured_steps=4, startup_timeout=120, timeout=600)


@dataclass(frozen=True)
class Case:
    script: str
    args: tuple[str, ...]
    budget: str
    batch_sizes: str
    plans: tuple[str, ...]
    trials: int


CASES = (
    Case(
        "gpt.py",
        ("--n-layer", "4", "--n-embd", "128", "--block-size", "128"),
        "800MiB",
        "4-64",
        ("none", "Block:1", "Block:0.25", "Block:0.5", "Block:0.75", "CausalSelfAttention:1", "MLP:1"),
        10,
    ),
    Case(
        "mlp.py",
        (),
        "600MiB",
        "128-4096",
        ("none", "ResidualLayer:1", "ResidualLayer:0.25", "ResidualLayer:0.5", "ResidualLayer:0.75"),
        10,
    ),
)


def grid(
    case: Case, command: TrialCommand, root: Path, limit: int
) -> dict[tuple[int, str], tuple[int, float]]:
    results = {}
    for plan in case.plans:
        for batch in parse_batch_sizes(case.batch_sizes):
            r = run_trial(
                command, batch, parse_plan(plan), cpu_device(), RssMeter(), SETTINGS, root, dict(os.environ)
            )
            results[(batch, plan)] = (
                r.peak_bytes if r.outcome.value == "complete" else 2**62,
                r.samples_per_sec or 0.0,
            )
            if r.outcome.value != "complete" or r.peak_bytes > limit * 1.3:
                break  # larger batches of this plan only use more memory
    return results


def main() -> None:
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores; trial = {SETTINGS.warmup_steps} warm-up + "
        f"{SETTINGS.measured_steps} measured steps"
    )
    for case in CASES:
        command = TrialCommand.parse([str(EXAMPLES / case.script), *case.args])
        budget = parse_budget(case.budget).resolve(None)
        limit = int(budget * 0.95)
        with tempfile.TemporaryDirectory() as tmp:
            started = time.monotonic()
            measured = grid(case, command, Path(tmp), limit)
            grid_seconds = time.monotonic() - started
            fitting = {k: v for k, v in measured.items() if v[0] <= limit}
            grid_best = max(fitting, key=lambda k: fitting[k][1])
            started = time.monotonic()
            spec = TuneSpec(
                command=command,
                budget=parse_budget(case.budget),
                trials=case.trials,
                batch_sizes=parse_batch_sizes(case.batch_sizes),
                plans=case.plans,
                settings=SETTINGS,
                device="cpu",
                cache_dir=Path(tmp) / "tuner",
            )
            result = tune(spec)
            tune_seconds = time.monotonic() - started
        chosen = (result.best.batch_size, result.best.plan)
        ran = sum(
            r.kind in ("discovery", "measured", "verification") and r.outcome is not None
            for r in result.records
        )
        grid_of_chosen = measured.get(chosen, (0, 0.0))[1]
        print(
            f"\n{case.script} {' '.join(case.args)}  budget {case.budget} (limit {format_bytes(limit)}), "
            f"{len(case.plans)} plans x {len(parse_batch_sizes(case.batch_sizes))} batch sizes"
        )
        print(
            f"  grid:  {len(measured)} trials in {grid_seconds:.0f}s; best fitting {grid_best} at "
            f"{fitting[grid_best][1]:.1f} samples/s, peak {format_bytes(fitting[grid_best][0])}"
        )
        print(
            f"  tuner: {ran} trials (incl. discovery and verification) in {tune_seconds:.0f}s; chose {chosen}, "
            f"verified {result.best.verified_samples_per_sec:.1f} samples/s, peak "
            f"{format_bytes(result.best.verified_peak_bytes)}"
        )
        print(
            f"  the tuner's choice as measured in the grid: {grid_of_chosen:.1f} samples/s = "
            f"{grid_of_chosen / fitting[grid_best][1]:.3f} x the grid's best, with {ran / len(measured):.0%} of its trials"
        )


if __name__ == "__main__":
    main()
