"""Peak memory and samples/s of the example transformer under no recompute, full block checkpointing and
the selective operator-level plan, at one batch size (CPU), with the probe's predicted savings beside them;
then the selective plan's speed against full checkpointing on a wider, shallower variant, as a ratio.

    .venv/bin/python bench/plans.py [--batch-size 32] [--repeats 3]

Each plan is measured --repeats times, interleaved; medians are printed (a short CPU run's peak varies by
about ±5% from run to run with glibc's default heap, its samples/s by about ±10%). The speed ratio is
per round (selective and full measured back to back), so a load that changes between rounds cancels out.

Whether the selective plan is faster than full checkpointing depends on the machine and the model: it
keeps the matmul outputs that `all` recomputes, but dispatches every op of the block through a Python
policy. Here on the CPU, where matmuls of width 256 dominate, it is faster; on an H100 the tiny default
model is launch-bound and the selective plan was the slowest of the three (bench/results/gpu-h100.txt).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from autotune.backends.probe import predicted_saving
from autotune.core.budget import format_bytes
from autotune.core.plans import parse_plan
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import run_trial
from autotune.trials.settings import TrialSettings

GPT = Path(__file__).parent.parent / "examples" / "gpt.py"
SELECTIVE = "Block:1/save=attention+matmul"
PLANS = ("none", "all", SELECTIVE)
WIDE = ("--n-layer", "2", "--n-embd", "256")  # matmuls weigh as in real models; batch 16
SETTINGS = TrialSettings(warmup_steps=2, measured_steps=6, startup_timeout=120, timeout=600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    command = TrialCommand.parse([str(GPT)])
    with tempfile.TemporaryDirectory() as tmp:
        root, env = Path(tmp), dict(os.environ)
        probe = run_trial(
            command,
            args.batch_size,
            parse_plan("none"),
            cpu_device(),
            RssMeter(),
            SETTINGS,
            root,
            env,
            probe=True,
        ).probe
        runs: dict[str, list[tuple[int, float]]] = {plan: [] for plan in PLANS}
        for _ in range(args.repeats):
            for plan in PLANS:
                r = run_trial(
                    command, args.batch_size, parse_plan(plan), cpu_device(), RssMeter(), SETTINGS, root, env
                )
                runs[plan].append((r.peak_bytes, r.samples_per_sec or 0.0))
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores; examples/gpt.py defaults, batch {args.batch_size}, "
        f"medians of {args.repeats} interleaved runs of {SETTINGS.warmup_steps}+{SETTINGS.measured_steps} steps"
    )
    none_peak = statistics.median(p for p, _ in runs["none"])
    print(f"{'plan':<32} {'peak':>11} {'saved':>11} {'predicted':>11} {'samples/s':>10}")
    for plan in PLANS:
        peak = statistics.median(p for p, _ in runs[plan])
        speed = statistics.median(s for _, s in runs[plan])
        predicted = predicted_saving(probe, parse_plan(plan)) if probe else 0
        print(
            f"{plan:<32} {format_bytes(peak):>11} {format_bytes(none_peak - peak):>11} {format_bytes(predicted):>11} "
            f"{speed:>10.1f}"
        )
    selective_vs_full(args.repeats)


def selective_vs_full(repeats: int) -> None:
    """samples/s of the selective plan over full checkpointing, per interleaved round, on the wide variant."""
    command = TrialCommand.parse([str(GPT), *WIDE])
    ratios: list[float] = []
    speeds: dict[str, list[float]] = {"all": [], SELECTIVE: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for plan in speeds:
                r = run_trial(
                    command,
                    16,
                    parse_plan(plan),
                    cpu_device(),
                    RssMeter(),
                    SETTINGS,
                    Path(tmp),
                    dict(os.environ),
                )
                speeds[plan].append(r.samples_per_sec or 0.0)
            ratios.append(speeds[SELECTIVE][-1] / speeds["all"][-1])
    print(
        f"\n{' '.join(WIDE)}, batch 16: {SELECTIVE} / all samples/s = {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f} over {repeats} rounds; "
        f"selective {statistics.median(speeds[SELECTIVE]):.1f}, all {statistics.median(speeds['all']):.1f})"
    )


if __name__ == "__main__":
    main()
