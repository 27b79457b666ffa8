"""Two commits of autotune side by side: `autotune run` of one example from each, interleaved (the order
alternating round by round), under one load condition of bench/robustness.py (quiet, loaded, heavy), a fresh
cache each run: each run's wall, answer, trial runs and processes, and the medians. What a change to the
search costs or saves, measured in one sitting rather than against figures from another day.

    python bench/commits.py --before REV [--after HEAD] [--condition heavy] [--rounds 3]
        [--script examples/gpt.py] [--script-args ARGS] [--budget 1GiB] [--trials 10] [--out bench/results/...]

``--script-args``: the script's own arguments, one string (``{batch_size}`` as autotune run reads it), e.g.
``--script bench/gpt2_train.py --script-args "--device cpu --layers 4 --width 256 --seq 256 --batch-size
{batch_size}" --budget 2337MiB``: issue 41's GPT-2 on the CPU.

Each commit is checked out into a temporary git worktree and run with this checkout's Python environment
(PYTHONPATH set to the worktree): the same torch, optuna and interpreter for both.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robustness import finish, header, neighbours

ROOT = Path(__file__).resolve().parents[1]


def worktree(rev: str, into: Path) -> tuple[Path, str]:
    """``rev`` checked out at ``into`` (detached), and its short hash."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev], check=True,
                   capture_output=True)  # fmt: skip
    short = subprocess.run(["git", "-C", str(into), "rev-parse", "--short", "HEAD"], check=True,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return into, short


def run(tree: Path, args: argparse.Namespace, seed: int) -> dict:
    cache = tempfile.mkdtemp(prefix="autotune-commits-")
    argv = [sys.executable, "-m", "autotune", "run", "--json", "--device", "cpu", "--budget", args.budget,
            "--trials", str(args.trials), "--cache-dir", cache]  # fmt: skip
    script = str(tree / args.script)
    argv += ["--", sys.executable, script, *shlex.split(args.script_args)] if args.script_args else [script]
    load = neighbours(args.condition, seed)
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=tree,
                              env={**os.environ, "PYTHONPATH": str(tree)})  # fmt: skip
    finally:
        for neighbour in load:
            neighbour.stop()
    wall = time.monotonic() - started
    if proc.returncode != 0:
        return {"wall": round(wall, 1), "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    data = json.loads(proc.stdout)
    trials = [t for t in data["trials"] if t.get("outcome")]
    return {
        "wall": round(wall, 1),
        "answer": f"{data['plan']}@{data['batch_size']}",
        "samples_per_sec": round(data["samples_per_sec"], 1),
        "trial_runs": len(trials),
        "processes": len({t.get("log_dir") for t in trials}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--condition", default="heavy", choices=["quiet", "loaded", "heavy"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--script", default="examples/gpt.py")
    parser.add_argument("--script-args", default="", help="the script's arguments, one string")
    parser.add_argument("--budget", default="1GiB")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = [header("commits.py")]
    with tempfile.TemporaryDirectory(prefix="autotune-commits-") as tmp:
        trees = [worktree(args.before, Path(tmp) / "before"), worktree(args.after, Path(tmp) / "after")]
        try:
            script = " ".join([args.script, *([args.script_args] if args.script_args else [])])
            lines.append(f"# {script} at {args.budget}, --trials {args.trials}, {args.condition}: "
                         f"before {trees[0][1]}, after {trees[1][1]}")  # fmt: skip
            walls: dict[str, list[float]] = {"before": [], "after": []}
            for r in range(args.rounds):
                order = [("before", trees[0]), ("after", trees[1])]
                for name, (tree, short) in order if r % 2 == 0 else order[::-1]:
                    result = run(tree, args, seed=r)
                    walls[name].append(result["wall"])
                    lines.append(f"round {r + 1} {name:6} ({short}): {json.dumps(result)}")
                    print(lines[-1], flush=True)
            ratios = [a / b for a, b in zip(walls["after"], walls["before"], strict=True)]
            lines.append(
                f"median wall: before {statistics.median(walls['before']):.0f} s, after "
                f"{statistics.median(walls['after']):.0f} s; after / before {statistics.median(ratios):.2f}x "
                f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
            )
        finally:
            for tree, _ in trees:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)  # fmt: skip
    finish(lines, args.out)


if __name__ == "__main__":
    main()
