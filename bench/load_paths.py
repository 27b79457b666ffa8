"""Does a busy machine change the search's path? The six-trial study of tests/search/test_tuning.py (the
synthetic trial script: none, A:1 and B:1, the winner A:1@48 known exactly), tuned by this checkout and by
an earlier commit, interleaved (this, that, that, this, ...), quiet and beside a bursty neighbour.

    .venv/bin/python bench/load_paths.py [--against 951a640] [--rounds 10]

The earlier commit is checked out in a temporary git worktree and run by this venv's interpreter with that
worktree first on sys.path (the editable install's finder taken out), so both run with the same
dependencies; trial processes import the runtime from this venv (the trial side is the same code in both).
The neighbour: two processes each burning a core for 1-4 s, then sleeping 0.3-2 s (seeded), over the loaded
rounds only.

Per version and condition: right answers, configurations measured (re-measurements apart: a busy machine's
second opinions), re-measurements, and wall seconds; then the wall ratio (this / that) per round, median
and range. Results go to bench/results/load-paths-cpu.txt with the machine named.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "tests/scripts/synthetic.py"
ARGS = [
    *[
        "--base-mib",
        "20",
        "--per-sample-mib",
        "8",
        "--step-seconds",
        "0.05",
        "--per-sample-seconds",
        "0.0005",
    ],
    *("--plan-effects", "A=0.5:0.25,B=0.75:4"),
]
OPTIONS = [
    "--plans",
    "none;A;B",
    "--batch-sizes",
    "1-128",
    "--steps",
    "3",
    "--warmup-steps",
    "1",
    "--device",
    "cpu",
]
WINNER = (48, "A:1")
BOOT = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '')"
    ".startswith('__editable__')]; sys.path.insert(0, {src!r}); import autotune; "
    "assert autotune.__file__.startswith({src!r}), autotune.__file__; from autotune.cli import cli; cli()"
)


def tune(src: Path) -> tuple[bool, int, int, float]:
    """One run of the study by the autotune under ``src``: (right answer, configurations, re-measurements,
    wall seconds)."""
    with tempfile.TemporaryDirectory() as cache:
        argv = [
            sys.executable,
            "-c",
            BOOT.format(src=str(src)),
            "run",
            "--budget",
            "290MiB",
            "--trials",
            "10",
        ]
        argv += [*OPTIONS, "--json", "--study", "s", "--cache-dir", cache, str(ROOT / SCRIPT), "--", *ARGS]
        start = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - start
        assert done.returncode == 0, done.stderr[-2000:]
        answer = json.loads(done.stdout)
        trials = optuna.load_study(study_name="s", storage=f"sqlite:///{cache}/autotune.db").trials
    measured = [t for t in trials if t.user_attrs.get("kind") == "measured"]
    again = sum(t.user_attrs.get("proposed_by") == "re-measure" for t in measured)
    return (answer["batch_size"], answer["plan"]) == WINNER, len(measured) - again, again, wall


def burn(seed: int) -> None:
    pace = random.Random(seed)
    while True:
        until = time.monotonic() + pace.uniform(1, 4)
        while time.monotonic() < until:
            pass
        time.sleep(pace.uniform(0.3, 2))


def rounds(versions: dict[str, Path], n: int) -> dict[str, list[tuple[bool, int, int, float]]]:
    found: dict[str, list[tuple[bool, int, int, float]]] = {name: [] for name in versions}
    names = list(versions)
    for i in range(n):
        for name in names if i % 2 == 0 else names[::-1]:
            found[name].append(tune(versions[name]))
    return found


def report(condition: str, found: dict[str, list[tuple[bool, int, int, float]]]) -> list[str]:
    lines = []
    for name, runs in found.items():
        right = sum(r[0] for r in runs)
        configs = sorted(r[1] for r in runs)
        again = sorted(r[2] for r in runs)
        walls = [r[3] for r in runs]
        lines.append(
            f"{condition:>6} {name:>5}: right {right}/{len(runs)}; configurations {configs}; "
            f"re-measurements {again}; wall median {statistics.median(walls):.1f} s"
        )
    this, that = found.values()
    ratios = sorted(a[3] / b[3] for a, b in zip(this, that, strict=True))
    lines.append(
        f"{condition:>6} wall this/that: median {statistics.median(ratios):.2f} "
        f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}, {len(ratios)} rounds)"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="951a640", help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per condition")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp, "earlier")
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(worktree), args.against], cwd=ROOT, check=True
        )
        try:
            versions = {"this": ROOT, "that": worktree}
            lines = [
                f"# .venv/bin/python bench/load_paths.py --against {args.against} --rounds {args.rounds}",
                f"# this: {head.stdout.strip()} (and what is uncommitted); that: {args.against}",
                f"# {platform.machine()}, {mp.cpu_count()} CPUs, Python {platform.python_version()}, "
                f"{time.strftime('%Y-%m-%d')}",
            ]
            lines += report("quiet", rounds(versions, args.rounds))
            neighbours = [mp.Process(target=burn, args=(seed,), daemon=True) for seed in range(2)]
            for p in neighbours:
                p.start()
            try:
                lines += report("loaded", rounds(versions, args.rounds))
            finally:
                for p in neighbours:
                    p.terminate()
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
