"""Sharding plans searched with the batch size and recompute, against a grid of the same space (CPU, gloo).

    .venv/bin/python bench/sharding.py [--ranks 2,4] [--rounds 1]

The job is tests/scripts/distributed.py under ``torchrun --nproc-per-node R``: four residual MLP blocks of
width 1024 (128 MiB of parameters: what the blocks' unsharded parameters add is comparable to their
activations), 8 tokens a sample, each block and then the root sharded with FSDP2's ``fully_shard`` as the script does.
The space: batch 2-16 x (``none``, ``fsdp:keep``, ``Block:1``, ``Block:1,fsdp:keep``, and on 4 ranks
``fsdp:2``).

For each rank count: every configuration measured once (the grid), then, for budgets chosen from the grid
so that each plan's fastest fitting configuration is the grid's best at one of them, the tuner on a fresh
database over the same space. Each answer is judged by the grid's own reading of it (the same run-to-run
noise for both), beside the grid's best at that budget and beside what ``fully_shard``'s defaults give (the
largest batch of ``none`` that fits: a batch-size finder's answer for the script as written). Offload is
left out: on the CPU it moves nothing (GPU only).

Machine-dependent: run it on the machine you report, quiet, and name the machine with the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import optuna

from autotune.core.budget import format_bytes, parse_budget
from autotune.core.plans import parse_plan
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.search.spec import TuneSpec
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import run_trial
from autotune.trials.settings import TrialSettings
from autotune.workers.tune import tune

optuna.logging.set_verbosity(optuna.logging.WARNING)

SCRIPT = Path(__file__).parent.parent / "tests" / "scripts" / "distributed.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
MODEL = ("--wrap", "fsdp", "--width", "1024", "--depth", "4", "--seq", "8")
BATCHES = (2, 4, 8, 16)
SETTINGS = TrialSettings(warmup_steps=1, measured_steps=3, startup_timeout=180, timeout=600, tight=0)
# glibc returns large blocks to the system as they are freed: a rank's RSS then follows its tensors (the
# tests' DETERMINISTIC_CPU_ALLOCATOR); without it the peaks of one configuration spread by ~50 MiB here,
# more than what fsdp:keep holds
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "65536"}
HEADROOM = 0.05
TRIALS = 10  # the tuner's cap: every trial run counted (probe, readings, re-measurements, verification)


def plans_for(ranks: int) -> tuple[str, ...]:
    return ("none", "fsdp:keep", "Block:1", "Block:1,fsdp:keep", *(("fsdp:2",) if ranks == 4 else ()))


def command(ranks: int) -> TrialCommand:
    return TrialCommand.parse([TORCHRUN, "--standalone", "--nproc-per-node", str(ranks), str(SCRIPT), *MODEL])


def grid(ranks: int, root: Path) -> dict[tuple[int, str], tuple[int, float]]:
    """(batch, plan) -> (peak bytes of the worst rank, samples/s), each measured once, plans interleaved."""
    out = {}
    for batch in BATCHES:
        for plan in plans_for(ranks):
            r = run_trial(
                command(ranks),
                batch,
                parse_plan(plan),
                cpu_device(),
                RssMeter(),
                SETTINGS,
                root,
                dict(os.environ),
            )
            if r.outcome.value != "complete":
                raise SystemExit(f"{plan}@{batch} on {ranks} ranks: {r.outcome.value}: {r.error}")
            out[(batch, plan)] = (r.peak_bytes, r.samples_per_sec or 0.0)
            print(
                f"  grid {plan:>20}@{batch:<3} {format_bytes(r.peak_bytes):>11} {r.samples_per_sec or 0:8.1f}/s",
                flush=True,
            )
    return out


def budgets(measured: dict[tuple[int, str], tuple[int, float]]) -> list[int]:
    """Budgets (bytes) at which the grid's best is each plan's fastest configuration in turn, where one is:
    for each configuration, the budget whose limit lies halfway between its peak and the next larger peak
    the grid read (the largest: its peak and 2 MiB more); kept where the grid's best there is a plan not yet
    kept. Halfway, because one configuration's peak moves by a MiB or two from run to run here: a limit just
    above a peak would make the grid's best a reading that fit by chance (it did: 0.05 MiB at b09346b)."""
    peaks = sorted({peak for peak, _ in measured.values()})
    out, seen = [], set()
    for peak, above in zip(peaks, [*peaks[1:], peaks[-1] + 2 * 2**20], strict=True):
        cap = (peak + above) // 2
        budget = -(-cap * 100 // round((1 - HEADROOM) * 100)) + 1  # limit(budget) >= cap
        best = best_at(measured, limit(budget))
        if best is not None and best[1] not in seen:
            seen.add(best[1])
            out.append(budget)
    return out


def limit(budget: int) -> int:
    return int(budget * (1 - HEADROOM))


def best_at(measured: dict[tuple[int, str], tuple[int, float]], cap: int) -> tuple[int, str] | None:
    fitting = [k for k, (peak, _) in measured.items() if peak <= cap]
    return max(fitting, key=lambda k: measured[k][1], default=None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="2,4")
    args = parser.parse_args()
    os.environ.update(ALLOCATOR)  # every trial's, the grid's and the tuner's
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, python {sys.version.split()[0]}; trial = "
        f"{SETTINGS.warmup_steps} warm-up + {SETTINGS.measured_steps} measured steps; headroom {HEADROOM:.0%}"
    )
    for ranks in (int(r) for r in args.ranks.split(",")):
        print(
            f"\n{ranks} ranks: distributed.py {' '.join(MODEL)}; plans {', '.join(plans_for(ranks))}",
            flush=True,
        )
        with tempfile.TemporaryDirectory() as tmp:
            started = time.monotonic()
            measured = grid(ranks, Path(tmp) / "grid")
            grid_seconds = time.monotonic() - started
            print(f"  grid: {len(measured)} trials in {grid_seconds:.0f} s")
            for index, budget in enumerate(budgets(measured)):
                cap = limit(budget)
                best = best_at(measured, cap)
                assert best is not None
                default = max((b for b in BATCHES if measured[(b, "none")][0] <= cap), default=None)
                spec = TuneSpec(
                    command=command(ranks),
                    budget=parse_budget(f"{budget}B"),
                    trials=TRIALS,
                    batch_sizes=BATCHES,
                    plans=plans_for(ranks),
                    settings=SETTINGS,
                    device="cpu",
                    cache_dir=Path(tmp) / f"tuner-{index}",
                    headroom=HEADROOM,
                )
                started = time.monotonic()
                result = tune(spec)
                seconds = time.monotonic() - started
                chosen = (result.best.batch_size, result.best.plan)
                ran = sum(r.outcome is not None for r in result.records)
                judged = measured.get(chosen, (0, 0.0))[1]
                top = measured[best][1]
                said = (
                    f"none@{default}: {measured[(default, 'none')][1] / top:.3f}x"
                    if default
                    else "none: none fits"
                )
                print(
                    f"  budget {format_bytes(budget)} (limit {format_bytes(cap)}): grid best {best[1]}@{best[0]} "
                    f"{top:.1f}/s; tuner {chosen[1]}@{chosen[0]} in {ran} trials, {seconds:.0f} s = "
                    f"{judged / top:.3f}x the grid's best by the grid's reading; fully_shard's defaults {said}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
