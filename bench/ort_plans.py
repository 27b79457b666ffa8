"""The ONNX Runtime backend on examples/ort_transformer.py (CPU), through the real CLI: what
`autotune run --backend ort --budget B` chose and how many trials it spent, then, at the chosen batch size,
the peak and samples/s of no plan, ORT's level 1 and the chosen plan, measured side by side (interleaved),
with ORT's predicted saving of each cluster plan beside them.

    .venv/bin/python bench/ort_plans.py [--budget 1.5GiB] [--repeats 2]

Peaks are ORT's default behaviour, CPU arena on (what a user's training gets); a plan's measured saving
then includes arena fragmentation ORT's prediction leaves out (docs/architecture.md, "ONNX Runtime
backend"). tests/backends/test_ort.py compares prediction and measurement with the arena off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from autotune.core.budget import format_bytes

EXAMPLE = Path(__file__).parent.parent / "examples" / "ort_transformer.py"
ARGS = ["--seq", "256", "--d-model", "256", "--layers", "4"]
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))


def autotune(*args: str) -> dict:
    proc = subprocess.run([AUTOTUNE, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"autotune {' '.join(args[:3])} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", default="1.5GiB")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        common = ["--backend", "ort", "--device", "cpu", "--json", "--cache-dir", tmp]
        started = time.monotonic()
        chosen = autotune("run", "--budget", args.budget, *common, str(EXAMPLE), "--", *ARGS)
        minutes = (time.monotonic() - started) / 60
        trials = autotune("show", chosen["study"], "--json", "--cache-dir", tmp)["trials"]
        measured = [t for t in trials if t["kind"] == "measured"]
        fitting = [
            t for t in measured if t["outcome"] == "complete" and t["peak_bytes"] <= chosen["limit_bytes"]
        ]
        recompute = max(
            (t for t in fitting if t["plan"] != "none"), key=lambda t: t["samples_per_sec"], default=None
        )
        batch = chosen["batch_size"]
        probe = autotune("probe", "-b", str(batch), *common, str(EXAMPLE), "--", *ARGS)
        predicted = {row["plan"]: row["saving_bytes"] for row in probe["candidates"]}
        # the chosen plan, and the fastest fitting recompute plan the search measured when it is not that one
        plans = list(
            dict.fromkeys(["none", "level:1", chosen["plan"], *([recompute["plan"]] if recompute else [])])
        )
        runs: dict[str, list[tuple[int, float]]] = {plan: [] for plan in plans}
        for _ in range(args.repeats):
            for plan in plans:
                r = autotune(
                    "measure",
                    "-b",
                    str(batch),
                    "--plan",
                    plan,
                    "--steps",
                    "5",
                    "--warmup-steps",
                    "2",
                    *common,
                    str(EXAMPLE),
                    "--",
                    *ARGS,
                )
                runs[plan].append((r["peak_bytes"], r["samples_per_sec"]))
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores; examples/ort_transformer.py {' '.join(ARGS)}; "
        f"budget {args.budget}"
    )
    print(
        f"autotune run --backend ort: {chosen['plan']} at batch {batch}, peak {format_bytes(chosen['peak_bytes'])}, "
        f"{chosen['samples_per_sec']:.1f} samples/s (verified); {chosen['new_trials']} trials run, "
        f"{minutes:.1f} min; the study's rows by kind: {dict(Counter(t['kind'] for t in trials))}"
    )
    if recompute:
        print(
            f"fastest fitting recompute plan measured: {recompute['plan']} at batch {recompute['batch_size']}, "
            f"peak {format_bytes(recompute['peak_bytes'])}, {recompute['samples_per_sec']:.1f} samples/s"
        )
    print(f"at batch {batch}, medians of {args.repeats} interleaved runs of 2+5 steps:")
    none_peak = statistics.median(p for p, _ in runs["none"])
    print(f"{'plan':<48} {'peak':>11} {'saved':>11} {'predicted':>11} {'samples/s':>10}")
    for plan in plans:
        peak = statistics.median(p for p, _ in runs[plan])
        speed = statistics.median(s for _, s in runs[plan])
        clusters = plan.split(",") if plan not in ("none", "level:1", "level:2") else []
        guess = format_bytes(sum(predicted.get(c, 0) for c in clusters)) if clusters else "-"
        print(
            f"{plan:<48} {format_bytes(peak):>11} {format_bytes(none_peak - peak):>11} {guess:>11} {speed:>10.1f}"
        )


if __name__ == "__main__":
    main()
