"""How long ``autotune best`` takes, end to end in fresh processes, beside what bounds it, in one run.

    .venv/bin/python bench/best_latency.py [--repeat 7]

Tunes the synthetic script once into a temporary cache (~20 s), then times fresh processes (medians):
the interpreter alone, ``autotune --help`` (the CLI's floor), ``autotune best --json SCRIPT`` answering a
verified winner (target: well under a second), ``best`` for a budget with no winner (answered from the
measured trials, so it reads them through Optuna), and opening the database the way a tuner does
(Optuna's storage built and checked), which is what ``best`` paid before it answered from autotune's
tables alone. Each ``best`` also says which heavy modules it imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "tests" / "scripts" / "synthetic.py"
ARGS = ["--", "--base-mib", "20", "--per-sample-mib", "8", "--step-seconds", "0.05"]
HEAVY = ("optuna", "numpy", "alembic", "torch", "pynvml")


def console_script() -> str:
    """The ``autotune`` users run (beside this interpreter, else on PATH), not ``python -m autotune``: from
    the repository root that imports the checkout, which only an editable install maps autotune.storage into."""
    beside = Path(sys.executable).with_name("autotune")
    found = str(beside) if beside.exists() else shutil.which("autotune")
    if found is None:
        sys.exit("no autotune console script beside this Python or on PATH")
    return found


def timed(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(repeat):
        started = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=env["AUTOTUNE_CACHE_DIR"], capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        out = proc.stdout
    return statistics.median(times), out


def imported(cli_args: list[str], env: dict[str, str]) -> list[str]:
    code = (
        "import sys\nfrom autotune.cli import cli\n"
        f"try:\n    cli({cli_args!r})\nexcept SystemExit:\n    pass\n"
        f"print('\\nheavy:', *(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=env["AUTOTUNE_CACHE_DIR"],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.rsplit("heavy:", 1)[1].split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    repeat = parser.parse_args().repeat
    autotune = [console_script()]
    cache = Path(tempfile.mkdtemp(prefix="autotune-best-"))
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(cache)}
    try:
        tune = [
            *autotune,
            "run",
            "--budget",
            "290MiB",
            "--trials",
            "6",
            "--plans",
            "none",
            "--batch-sizes",
            "1-64",
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--device",
            "cpu",
            str(SYNTHETIC),
            *ARGS,
        ]
        subprocess.run(tune, env=env, check=True, capture_output=True)
        # No --device: the device is resolved as users' commands resolve it (NVML first, then the CPU).
        best = ["best", "--budget", "290MiB", "--json", str(SYNTHETIC), *ARGS]
        unverified = ["best", "--budget", "200MiB", "--json", str(SYNTHETIC), *ARGS]
        url = f"sqlite:///{cache / 'autotune.db'}"
        full_open = f"from autotune.storage import open_store; open_store({url!r}).optuna"
        rows = [
            ("python -c pass", [sys.executable, "-c", "pass"], None),
            ("autotune --help", [*autotune, "--help"], None),
            ("autotune best (verified winner)", [*autotune, *best], best),
            ("autotune best (no winner: from trials)", [*autotune, *unverified], unverified),
            ("open the database as a tuner does", [sys.executable, "-c", full_open], None),
        ]
        print(f"{sys.platform}, Python {sys.version.split()[0]}, {os.cpu_count()} cores; medians of {repeat}")
        print(f"{'':40} {'seconds':>8}  heavy modules imported")
        measured = {}
        for label, argv, cli_args in rows:
            seconds, out = timed(argv, env, repeat)
            measured[label] = seconds
            if cli_args is best:
                answer = json.loads(out)
                assert answer["verified"], answer
            heavy = " ".join(imported(cli_args, env)) if cli_args else ""
            print(f"{label:40} {seconds:8.3f}  {heavy}")
        ratio = measured["autotune best (verified winner)"] / measured["open the database as a tuner does"]
        print(f"best (verified) / opening as a tuner: {ratio:.2f}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
