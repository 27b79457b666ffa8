"""Soaks: one long-lived tuner process runs N real subprocess trials (default 500); its open file
descriptors, RSS and zombie children are sampled from outside as the trials land.

    .venv/bin/python bench/soak.py [TRIALS] [JOBS] [sqlite|postgresql://...]    # a worker, J jobs (20)
    .venv/bin/python bench/soak.py --run [TRIALS]                                # one `autotune run`

The worker soak spreads the trials over J submitted jobs (each its own workload, 25 batch sizes x a few
plans); the run soak is one `autotune run` whose study holds them all.

Prints the figures at 10% of the trials and at the end, and their ratios (docs/reliability.md: stable
within 5%). tests/workers/test_daemon.py runs the same soak with fewer trials.

Many jobs is a daemon's life, and what tells a leak (memory kept per trial or per job) from the data of
the study being tuned: Optuna holds every trial of an open study in memory (its sampler reads them all),
about 15 KiB of RSS a trial on this machine, so `bench/soak.py 500 1` (one 500-trial study) grows by
~7% while its study is open; a worker drops a job's state when the job is done, so many jobs stay flat.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
# the submitters' and worker's job key (autotune.workers.signing): the caller's, else one for this soak
ENV = {**os.environ, "AUTOTUNE_JOB_KEY": os.environ.get("AUTOTUNE_JOB_KEY") or secrets.token_hex(32)}
SYNTHETIC = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "synthetic.py"


@dataclass
class Sample:
    trials: int
    fds: int
    rss_kib: int
    zombies: int


def soak(
    trials: int, cache: Path, storage: str | None = None, jobs: int = 20
) -> tuple[list[Sample], float, int]:
    """Run the soak: ``jobs`` submitted jobs (different workloads) of ``trials / jobs`` trials each.

    Returns the samples (one per new finished trial), the seconds it took and the worker's exit code.
    """
    storage = storage or f"sqlite:///{cache / 'autotune.db'}"
    per_job = -(-trials // jobs)
    batches, plans = space_for(per_job)
    submitting = []
    for job in range(jobs):  # submitted all at once: the first starts race to create the schema, as they may
        argv = [
            AUTOTUNE,
            "submit",
            "--budget",
            "2GiB",
            "--trials",
            str(per_job),
            "--exhaustive",
            "--study",
            f"soak-{job}",
        ]
        argv += ["--plans", plans, "--batch-sizes", batches, "--steps", "1", "--warmup-steps", "1"]
        argv += ["--storage", storage, str(SYNTHETIC), "--", "--base-mib", "8", "--per-sample-mib", "0.01"]
        argv += ["--step-seconds", f"{0.01 + job / 10000:.4f}"]  # a workload of its own: no warm start
        submitting.append(
            subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
        )
    for proc in submitting:
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"autotune submit failed: {err.strip()}")
    return _sampled(
        [AUTOTUNE, "worker", "--once", "--devices", "cpu", "--storage", storage, "--cache-dir", str(cache)],
        cache,
    )


def run_soak(trials: int, cache: Path) -> tuple[list[Sample], float, int]:
    """One `autotune run` of ``trials`` counted trials (a space of twice as many configurations, so the
    sampler rarely proposes one measured already); returns its samples, seconds and exit code."""
    batches, plans = space_for(2 * trials)
    argv = [
        AUTOTUNE,
        "run",
        "--budget",
        "2GiB",
        "--trials",
        str(trials),
        "--exhaustive",
        "--study",
        "run-soak",
        "--device",
        "cpu",
    ]
    argv += ["--plans", plans, "--batch-sizes", batches, "--steps", "1", "--warmup-steps", "1"]
    argv += ["--cache-dir", str(cache), str(SYNTHETIC), "--", "--base-mib", "8", "--per-sample-mib", "0.01"]
    argv += ["--step-seconds", "0.01"]
    return _sampled(argv, cache)


def _sampled(argv: list[str], cache: Path) -> tuple[list[Sample], float, int]:
    """Start the tuner ``argv`` and sample it each time a trial report lands under ``cache`` until it exits.
    Its output goes to <cache>/tuner.log (a pipe nobody reads while it runs would fill and stop it)."""
    log = open(cache / "tuner.log", "w")  # noqa: SIM115  (closed when the tuner has exited)
    tuner = subprocess.Popen(argv, stdout=log, stderr=log, text=True, env=ENV)
    started = time.monotonic()
    samples: list[Sample] = []
    seen = 0
    trials_dir = cache / "trials"
    while tuner.poll() is None:
        done = _reports(trials_dir)
        if done > seen:
            seen = done
            sample = _sample(tuner.pid, done)
            if sample is not None:
                samples.append(sample)
        time.sleep(0.05)
    log.close()
    if tuner.returncode != 0:
        print((cache / "tuner.log").read_text()[-4000:], file=sys.stderr)
    return samples, time.monotonic() - started, tuner.returncode


def _reports(trials_dir: Path) -> int:
    """Trial reports landed: a trial process's ``report.json``, a warm process's ``report-K.json`` each."""
    if not trials_dir.exists():
        return 0
    return sum(
        (d / "report.json").exists() + sum(1 for _ in d.glob("report-*.json")) for d in trials_dir.iterdir()
    )


def space_for(trials: int) -> tuple[str, str]:
    """A search space of more than ``trials`` configurations shaped like a user's: 25 batch sizes x
    enough plans (`none`, `L1`, `L2`, ...: the synthetic script ignores classes it has no effect for)."""
    plans = ["none"] + [f"L{i}" for i in range(1, -(-(trials + 1) // 25) + 1)]
    return ",".join(str(b) for b in range(1, 26)), ";".join(plans)


def _lasting_fds(pid: int, reads: int = 3) -> int:
    """The worker's open fds, the fewest of a few reads 20 ms apart: a file held for an instant (the
    meter's /proc reads at 20 Hz, a trial's log as it starts) is no leak. One read once counted 9 fds early
    and 8 at the end (a fresh-clone CI run) and failed the soak for an fd that was not kept."""
    counts = []
    for _ in range(reads):
        counts.append(len(os.listdir(f"/proc/{pid}/fd")))
        time.sleep(0.02)
    return min(counts)


def _sample(pid: int, trials: int) -> Sample | None:
    try:
        fds = _lasting_fds(pid)
        rss = next(
            int(line.split()[1])
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (OSError, StopIteration):
        return None
    zombies = 0
    for child in children:
        with contextlib.suppress(OSError):  # reaped meanwhile
            zombies += Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return Sample(trials, fds, rss, zombies)


def steady(samples: list[Sample], total: int) -> tuple[Sample, Sample]:
    """The sample at 10% of the trials (after warm-up: imports, caches) and the last one."""
    early = next(s for s in samples if s.trials >= max(total // 10, 5))
    return early, samples[-1]


def main() -> None:
    args = sys.argv[1:]
    run = bool(args) and args[0] == "--run"
    args = args[1:] if run else args
    trials = int(args[0]) if args else 500
    jobs = int(args[1]) if len(args) > 1 else 20
    storage = args[2] if len(args) > 2 and args[2] != "sqlite" else None
    with tempfile.TemporaryDirectory() as tmp:
        samples, seconds, code = (
            run_soak(trials, Path(tmp)) if run else soak(trials, Path(tmp), storage, jobs)
        )
    early, last = steady(samples, trials)
    what = "run soak: one `autotune run`," if run else f"worker soak: {jobs} job(s),"
    print(f"{what} {trials} trials, {seconds:.0f} s ({seconds / trials * 1000:.0f} ms a trial), exit {code}")
    print(
        f"  at {early.trials:4d} trials: {early.fds} fds, RSS {early.rss_kib / 1024:.1f} MiB, {early.zombies} zombies"
    )
    print(
        f"  at {last.trials:4d} trials: {last.fds} fds, RSS {last.rss_kib / 1024:.1f} MiB, {last.zombies} zombies"
    )
    print(f"  ratios end/early: fds {last.fds / early.fds:.3f}, RSS {last.rss_kib / early.rss_kib:.3f}")
    print(f"  max zombies seen: {max(s.zombies for s in samples)}")


if __name__ == "__main__":
    main()
