"""What a warm process and a fresh one read of bench/time_to_answer.py's GPT-2 on the CPU, side by side.

    python bench/warm_vs_fresh.py [--rounds 2] [--out bench/results/warm-vs-fresh-cpu.txt]

Three questions issue 41's time to answer raised, each measured on the same model (4 x 256, sequence 256):

1. Speed between runs: none@7 in a process of its own, then none@4, none@7, none@7 in one warm process,
   interleaved, ``--rounds`` times: each reading's median step time. How far quiet readings of one
   configuration differ between runs is what autotune.search.noise.BETWEEN_FLOOR must cover, and whether a
   warm reading is faster than a fresh one (a verification reads the answer fresh).
2. The probe in the warm process (autotune.trials.warm): the probe, then none@1 and none@4 in the process it
   started, against the probe alone and none@1 and none@4 in a warm process of their own, interleaved: the
   resident memory at each rest and the two readings' peaks.
3. A verification's peak: none@7 in a process of its own for 24 measured steps, the running peak the meter
   read at each step (what autotune.trials.settle watches).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from autotune.core.plans import Backend, parse_plan
from autotune.core.protocol import Rest
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import RssMeter
from autotune.search.runner import TrialRunner
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import run_trial
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

ROOT = Path(__file__).resolve().parent.parent
MODEL = ["--device", "cpu", "--layers", "4", "--width", "256", "--seq", "256"]
MiB = 2**20


def command() -> TrialCommand:
    return TrialCommand.parse(
        [sys.executable, str(ROOT / "bench" / "gpt2_train.py"), *MODEL, "--batch-size", "{batch_size}"]
    )


def runner(settings: TrialSettings, root: Path) -> TrialRunner:
    return TrialRunner(
        command(), Backend.TORCH, cpu_device(), RssMeter(), settings, root, dict(os.environ), warm=True
    )


def step_median(result: TrialResult) -> float:
    return statistics.median(result.step_seconds)


def speeds(rounds: int, say) -> None:
    settings = TrialSettings(2, 8, 300, 600, tight=0)
    fresh, warm_ = [], []
    for r in range(1, rounds + 1):
        root = Path(tempfile.mkdtemp(prefix="autotune-wvf-"))
        alone = run_trial(
            command(), 7, parse_plan("none"), cpu_device(), RssMeter(), settings, root, dict(os.environ)
        )
        fresh.append(step_median(alone))
        tuner = runner(settings, root)
        try:
            seq = [tuner(batch, "none") for batch in (4, 7, 7)]
        finally:
            tuner.close()
        warm_ += [step_median(x) for x in seq[1:]]
        say(
            f"   round {r}: fresh none@7 {step_median(alone):.3f} s a step ({alone.peak_bytes / MiB:.0f} MiB); "
            "warm none@4, none@7, none@7 "
            + ", ".join(f"{step_median(x):.3f} s ({x.peak_bytes / MiB:.0f} MiB)" for x in seq)
        )
    every = fresh + warm_
    spread = statistics.stdev(every) / statistics.fmean(every) if len(every) > 1 else 0.0
    say(
        f"   none@7: fresh median {statistics.median(fresh):.3f} s, warm median {statistics.median(warm_):.3f} s; "
        f"all {len(every)} readings {min(every):.3f}-{max(every):.3f} s, sd {100 * spread:.1f}% between runs"
    )


def probe_rest(rounds: int, say) -> None:
    settings = TrialSettings(2, 5, 300, 600, tight=0)
    for r in range(1, rounds + 1):
        for probe_warm in (True, False):
            root = Path(tempfile.mkdtemp(prefix="autotune-wvf-"))
            if probe_warm:
                tuner = runner(settings, root)
                probe = tuner(1, "none", probe=True)
            else:  # the probe in a process of its own, as before it started the warm process
                probe = run_trial(
                    command(), 1, parse_plan("none"), cpu_device(), RssMeter(), settings, root, dict(os.environ),
                    probe=True,
                )  # fmt: skip
                tuner = runner(settings, root)
            try:
                first, second = tuner(1, "none"), tuner(4, "none")
            finally:
                tuner.close()
            at_rest = [Rest.read(p).rss_bytes / MiB for p in sorted(root.glob("trials/*/rest-*.json"))]
            say(
                f"   round {r}, probe {'in the warm process' if probe_warm else 'alone'} ({probe.outcome.value}): "
                f"none@1 {first.peak_bytes / MiB:.0f} MiB (run {first.warm_run}), none@4 "
                f"{second.peak_bytes / MiB:.0f} MiB (run {second.warm_run}); rests "
                + ", ".join(f"{m:.1f}" for m in at_rest)
                + " MiB"
            )


def settling(say) -> None:
    meter = RssMeter()
    root = Path(tempfile.mkdtemp(prefix="autotune-wvf-"))
    result = run_trial(
        command(),
        7,
        parse_plan("none"),
        cpu_device(),
        meter,
        TrialSettings(2, 24, 300, 600, tight=0),
        root,
        dict(os.environ),
    )
    peak, running = 0, []
    for step, p in sorted(meter.peaks_by_step().items()):
        peak = max(peak, p)
        running.append(f"{step}:{peak / MiB:.0f}")
    say(f"   {result.outcome.value}, running peak (step:MiB): {' '.join(running)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(
        f"# bench/warm_vs_fresh.py on {platform.node()} ({os.cpu_count()} cores), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `python {' '.join(sys.argv)}`"
    )
    say("1. speed between runs, none@7 (median step seconds of 8 measured steps)")
    speeds(args.rounds, say)
    say("2. the probe in the warm process against alone: the next readings' peaks, the rests")
    probe_rest(args.rounds, say)
    say("3. a fresh none@7 for 24 measured steps: the running peak")
    settling(say)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
