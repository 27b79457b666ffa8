"""Would readings taken with one thread under the heavy load rank configurations as quiet readings do?

bench/step_slowdown.py found that beside bench/robustness.py's heavy load (four bursting neighbours on two
cores) a GPT-2 step with torch's default threads runs 2.4-4.9x slower and swings within a trial, where with
one thread (OMP_NUM_THREADS=1) it runs as fast as on a quiet machine. Issue 42's time goal (heavy <= 3x quiet)
is out of reach while every reading costs ~3.6x and its noise widens the search (8 trials under that load
where a quiet run takes 3). A search that took its readings with one thread where the machine is busy would
pay neither, if one thread ranks the configurations as the user's threads do on a quiet machine: this bench
measures whether it does, before any search is built on it.

Each configuration of examples/gpt.py (1 GiB: its frontier and below) is measured by a fresh ``autotune
measure`` trial under four conditions: {default threads, one thread} x {quiet, heavy}, configurations in a
shuffled order each round, conditions interleaved, repeated. The truth is default threads on a quiet machine
(what the user's job gets). For each other condition: the configuration it ranks first and that one's
truth over the truth's best (what a search on those readings would answer at best), the rank correlation
with the truth, and the spread of each configuration's readings over the rounds (what the search's noise
model would see).

    python bench/thread_ranking.py [--rounds 2] [--steps 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robustness import finish, header, neighbours

ROOT = Path(__file__).resolve().parents[1]
SETTLE = 3.0  # seconds the neighbours run before the first measurement
CONFIGURATIONS = ((4, "none"), (16, "none"), (32, "none"), (48, "Block:0.5"), (64, "Block:1"))
CONDITIONS = (("default", "quiet"), ("1", "quiet"), ("default", "heavy"), ("1", "heavy"))
TRUTH = ("default", "quiet")


def samples_per_second(batch: int, plan: str, steps: int, threads: str) -> float:
    """One fresh trial's samples/s (``threads``: "default" or "1")."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads == "1":
        env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "autotune", "measure", "--json", "-b", str(batch), "-p", plan,
            "--steps", str(steps), "--tight", "0", "--device", "cpu", str(ROOT / "examples" / "gpt.py")]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"autotune measure exited {proc.returncode}: {proc.stderr[-2000:]}")
    return float(json.loads(proc.stdout)["samples_per_sec"])


def ranks(values: dict[str, float]) -> dict[str, int]:
    return {name: i for i, name in enumerate(sorted(values, key=values.__getitem__, reverse=True))}


def spearman(a: dict[str, float], b: dict[str, float]) -> float:
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((ra[k] - rb[k]) ** 2 for k in a) / (n * (n * n - 1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    names = [f"{plan}@{batch}" for batch, plan in CONFIGURATIONS]
    lines = [
        header("thread_ranking.py"),
        f"# examples/gpt.py, {args.steps} measured steps a trial; {', '.join(names)}",
    ]
    readings: dict[tuple[str, str], dict[str, list[float]]] = {c: {n: [] for n in names} for c in CONDITIONS}
    for r in range(args.rounds):
        order = list(CONDITIONS) if r % 2 == 0 else list(reversed(CONDITIONS))
        for threads, condition in order:
            configurations = list(CONFIGURATIONS)
            random.Random(r * 7 + len(threads)).shuffle(configurations)
            load = neighbours(condition, seed=r)
            try:
                if load:
                    time.sleep(SETTLE)
                for batch, plan in configurations:
                    value = samples_per_second(batch, plan, args.steps, threads)
                    readings[(threads, condition)][f"{plan}@{batch}"].append(value)
                    lines.append(
                        f"round {r + 1} threads {threads:7} {condition:5} {plan}@{batch}: {value:.1f} samples/s"
                    )
                    print(lines[-1], flush=True)
            finally:
                for neighbour in load:
                    neighbour.stop()
    medians = {c: {n: statistics.median(v) for n, v in by.items()} for c, by in readings.items()}
    truth = medians[TRUTH]
    best = max(truth.values())
    lines.append("")
    for condition in CONDITIONS:
        values = medians[condition]
        first = max(values, key=values.__getitem__)
        spreads = [max(v) / min(v) for v in readings[condition].values()]
        lines.append(
            f"threads {condition[0]:7} {condition[1]:5}: ranks first {first} (its truth {truth[first] / best:.3f} of the "
            f"best); rank correlation with the truth {spearman(values, truth):+.2f}; readings' spread over rounds "
            f"median {statistics.median(spreads):.2f}x (max {max(spreads):.2f}x); order: "
            + ", ".join(f"{n} {values[n]:.1f}" for n in sorted(values, key=values.__getitem__, reverse=True))
        )
    finish(lines, args.out)


if __name__ == "__main__":
    main()
