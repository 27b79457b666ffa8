"""What autotune reports for a Hugging Face Trainer under a fixed global batch, against what the Trainer
itself reports: `autotune run --global-batch 32` on examples/hf_trainer.py, then the winner trained outside
autotune from `autotune best --env`, its `train_samples_per_second` read from the script's own output.

    .venv/bin/python bench/global_batch.py [--budget 1.2GiB] [--repeats 3] [--steps 24]

The winner is then run standalone --repeats times, each round interleaved with `autotune measure` of the
same configuration: printed are the run's answer (samples/s verified over a longer run) over the median of
the script's figures, and the per-round ratio of measure to script with its spread (a load that changes
between rounds cancels out). The Trainer's figure averages its whole run, setup and first step included:
--steps keeps that share small. (A single standalone run right after the tuning once read 15.8 samples/s
against 38.9 for the next three: one reading of a shared machine is not a figure.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
SCRIPT = str(ROOT / "examples" / "hf_trainer.py")
TEMPLATE = [sys.executable, SCRIPT, "--per_device_train_batch_size", "{batch_size}"]
TEMPLATE += ["--gradient_accumulation_steps", "{grad_accum}"]


def standalone(env: dict[str, str], steps: int) -> float:
    argv = [sys.executable, SCRIPT, "--per_device_train_batch_size", env["AUTOTUNE_BATCH_SIZE"]]
    argv += ["--gradient_accumulation_steps", env["AUTOTUNE_GRAD_ACCUM"], "--max_steps", str(steps)]
    argv += ["--recompute", env["AUTOTUNE_PLAN"]]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=clean).stdout
    found = re.search(r"train_samples_per_second=([\d.]+)", out)
    assert found, out
    return float(found[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", default="1.2GiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU"
    )
    with tempfile.TemporaryDirectory() as cache:
        common = ["--device", "cpu", "--cache-dir", cache]
        run = [
            AUTOTUNE,
            "run",
            "--json",
            "--budget",
            args.budget,
            "--global-batch",
            "32",
            *common,
            "--",
            *TEMPLATE,
        ]
        result = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
        best = [AUTOTUNE, "best", "--json", "--budget", args.budget, *common, "--", *TEMPLATE]
        answer = json.loads(subprocess.run(best, capture_output=True, text=True, check=True).stdout)
        env = answer["env"]
        print(
            f"autotune run --global-batch 32 --budget {args.budget}: {result['new_trials']} trials; winner batch "
            f"{env['AUTOTUNE_BATCH_SIZE']} x accumulation {env['AUTOTUNE_GRAD_ACCUM']}, plan "
            f"{env['AUTOTUNE_PLAN']}: {answer['samples_per_sec']:.1f} samples/s "
            f"({answer['samples_per_sec_low']:.1f}-{answer['samples_per_sec_high']:.1f})"
        )
        ratios, measured, scripts = [], [], []
        for _ in range(args.repeats):
            measure = [
                AUTOTUNE,
                "measure",
                "--json",
                "-b",
                env["AUTOTUNE_BATCH_SIZE"],
                "--global-batch",
                "32",
            ]
            measure += ["--plan", env["AUTOTUNE_PLAN"], "--steps", "10", *common, "--", *TEMPLATE]
            speed = json.loads(subprocess.run(measure, capture_output=True, text=True, check=True).stdout)
            measured.append(speed["samples_per_sec"])
            scripts.append(standalone(env, args.steps))
            ratios.append(measured[-1] / scripts[-1])
        own = statistics.median(scripts)
        print(
            f"the script's own train_samples_per_second ({args.steps} steps, median of {args.repeats}: "
            f"{', '.join(f'{s:.1f}' for s in scripts)}): {own:.1f}; autotune's answer / script: "
            f"{answer['samples_per_sec'] / own:.3f}"
        )
        print(
            f"interleaved x{args.repeats}: autotune measure {statistics.median(measured):.1f} samples/s; "
            f"measure / script per round: median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
