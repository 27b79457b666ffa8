"""What autotune reports for a Hugging Face Trainer under a fixed global batch, against what the Trainer
itself reports: `autotune run --global-batch 32` on examples/hf_trainer.py, then the winner trained outside
autotune from `autotune best --env`, its `train_samples_per_second` read from the script's own output.

    .venv/bin/python bench/global_batch.py [--budget 1.2GiB] [--repeats 3] [--steps 24]

The run's answer (samples/s verified over a longer run) is compared with the script's figure; then, to
separate noise from bias, the winner is measured again by `autotune measure` and run standalone, interleaved
--repeats times, and the per-round ratio printed with its spread. The Trainer's figure includes its first
(slow) step in its average: --steps keeps that share small.
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
        own = standalone(env, args.steps)
        print(f"the script's own train_samples_per_second ({args.steps} steps): {own:.1f}")
        print(f"autotune / script: {answer['samples_per_sec'] / own:.3f}")
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
        print(
            f"interleaved x{args.repeats}: autotune measure {statistics.median(measured):.1f} samples/s, the "
            f"script {statistics.median(scripts):.1f}; ratio median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
