"""Measurement accuracy and cost of the CPU meter, side by side in one run.

    .venv/bin/python bench/measurement.py

Prints (1) the measured peak of trials holding 0/100/300/600 MiB, minus the idle trial, with and without a
1 GiB ballast in the tuner (target: within ±3% or ±8 MiB); (2) the tuner's CPU use during a trial with the
meter and with a meter that samples nothing, in % of one core (target: the meter adds < 1%); (3) the
trial's throughput with and without sampling (target: < 0.5% apart; on 2 cores run-to-run noise is
about that size, so read it over several runs).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from autotune.core.plans import Plan
from autotune.hardware.devices import cpu_device
from autotune.hardware.meters import MemoryReading, RssMeter
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import run_trial
from autotune.trials.settings import TrialSettings

SYNTHETIC = Path(__file__).parent.parent / "tests" / "scripts" / "synthetic.py"
MiB = 2**20


class NoMeter:
    """Samples nothing: the control for the throughput comparison."""

    def start(self, root_pid: int) -> None:
        pass

    def stop(self, main_maxrss_bytes: int) -> MemoryReading:
        return MemoryReading(main_maxrss_bytes, "rss", 0, 1)


def trial(root: Path, *flags: str, meter=None, measured: int = 3):
    command = TrialCommand.parse([str(SYNTHETIC), *flags])
    return run_trial(
        command,
        1,
        Plan.none(),
        cpu_device(),
        meter or RssMeter(),
        TrialSettings(1, measured, 60, 600),
        root,
        dict(os.environ),
    )


def accuracy(root: Path) -> None:
    print("1. peak above the idle trial (MiB): held -> measured, error")
    for label, ballast_mib in (("no ballast", 0), ("1 GiB ballast in the tuner", 1024)):
        ballast = bytearray(b"\x01") * (ballast_mib * MiB)
        idle = trial(root).peak_bytes
        cells = []
        for mib in (0, 100, 300, 600):
            got = (trial(root, "--base-mib", str(mib)).peak_bytes - idle) / MiB
            cells.append(f"{mib}->{got:.1f} ({got - mib:+.1f})")
        print(f"   {label:<28} idle {idle / MiB:.1f} MiB | " + " | ".join(cells))
        del ballast


def tuner_cpu_percent(root: Path, meter) -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    before, started = usage.ru_utime + usage.ru_stime, time.monotonic()
    trial(root, "--step-seconds", "0.5", meter=meter, measured=10)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return 100 * (usage.ru_utime + usage.ru_stime - before) / (time.monotonic() - started)


def cost(root: Path) -> None:
    cpu = {
        label: statistics.median(tuner_cpu_percent(root, make()) for _ in range(3))
        for label, make in (("sampling", RssMeter), ("control", NoMeter))
    }
    print(
        f"2. tuner CPU during a 5.5 s trial, median of 3 (% of one core): with the 20 Hz RSS meter "
        f"{cpu['sampling']:.2f}%, without {cpu['control']:.2f}% -> the meter costs {cpu['sampling'] - cpu['control']:+.2f}%"
    )
    rates: dict[str, list[float]] = {"sampling": [], "control": []}
    for _ in range(3):
        for label, meter in (("sampling", RssMeter()), ("control", NoMeter())):
            result = trial(root, "--base-mib", "200", "--step-seconds", "0", meter=meter, measured=400)
            rates[label].append(result.samples_per_sec)
    on, off = statistics.median(rates["sampling"]), statistics.median(rates["control"])
    print(
        f"3. trial throughput, median of 3: sampling {on:,.0f} steps/s, control {off:,.0f} steps/s, "
        f"ratio {on / off:.4f}"
    )


def main() -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        accuracy(Path(tmp))
        cost(Path(tmp))


if __name__ == "__main__":
    main()
