"""How much slower one training step runs beside bench/robustness.py's heavy load than on a quiet machine: the
floor under any search's time to answer there (issue 42's goal asks for <= 3x the quiet time under that
load). One configuration of examples/gpt.py measured by ``autotune measure`` (fixed steps), quiet and beside
HEAVY bursting neighbours, interleaved and repeated; with torch's default threads (one per core, as a user's
script runs) and with one thread (OMP_NUM_THREADS=1), to tell the load's fair share from what torch's threads
lose waiting for each other when a neighbour takes one of their cores.

    python bench/step_slowdown.py [--rounds 3] [--batch 32] [--steps 10] [--out bench/results/step-slowdown-cpu.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robustness import finish, header, neighbours

ROOT = Path(__file__).resolve().parents[1]
SETTLE = 3.0  # seconds the neighbours run before the measurement starts


def steps(batch: int, count: int, threads: str) -> list[float]:
    """The measured steps' seconds of one fresh trial (``threads``: "default" or "1")."""
    env = dict(os.environ)
    if threads == "1":
        env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "autotune", "measure", "--json", "-b", str(batch), "--steps", str(count),
            "--tight", "0", "--device", "cpu", str(ROOT / "examples" / "gpt.py")]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"autotune measure exited {proc.returncode}: {proc.stderr[-2000:]}")
    return list(json.loads(proc.stdout)["step_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = [
        header("step_slowdown.py"),
        f"# examples/gpt.py none@{args.batch}, {args.steps} measured steps a trial",
    ]
    medians: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for threads in ("default", "1"):
            for condition in ("quiet", "heavy"):
                load = neighbours(condition, seed=r)
                try:
                    if load:
                        time.sleep(SETTLE)
                    seconds = steps(args.batch, args.steps, threads)
                finally:
                    for neighbour in load:
                        neighbour.stop()
                median = statistics.median(seconds)
                medians.setdefault((threads, condition), []).append(median)
                lines.append(
                    f"round {r + 1} threads {threads:7} {condition:5}: median step {median:.3f} s "
                    f"(min {min(seconds):.3f}, max {max(seconds):.3f})"
                )
                print(lines[-1], flush=True)
    for threads in ("default", "1"):
        quiet, heavy = medians[(threads, "quiet")], medians[(threads, "heavy")]
        ratios = [h / q for q, h in zip(quiet, heavy, strict=True)]  # each round's heavy over its own quiet
        lines.append(
            f"threads {threads:7}: heavy / quiet median step {statistics.median(ratios):.2f}x "
            f"(rounds {min(ratios):.2f}-{max(ratios):.2f}); quiet {statistics.median(quiet):.3f} s"
        )
    finish(lines, args.out)


if __name__ == "__main__":
    main()
