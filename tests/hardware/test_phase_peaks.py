"""A trial's memory by phase: the meter files each sample under the steps the trial had finished, so warm-up
(start-up, compilation, autotuning) and the measured steps have their own peaks."""

from __future__ import annotations

import subprocess
import sys
import time

from autotune.hardware.meters import MemoryReading, RankPeak, RssMeter


def test_phase_peaks_split_the_samples_at_the_end_of_warm_up() -> None:
    reading = MemoryReading(900, "rss", 10, 1, by_step={0: 500, 1: 900, 2: 600, 3: 650})
    assert reading.phase_peaks(2) == (900, 650)  # steps 0-1 finished: warm-up; from 2 on: measured
    assert reading.phase_peaks(None) == (None, None)
    assert MemoryReading(1, "rss", 1, 1).phase_peaks(2) == (None, None)


def test_a_real_process_s_samples_are_filed_under_the_step_the_launcher_reported() -> None:
    """A process that holds 200 MiB, then frees it: told "step 1" after the free, the meter has the large
    samples under step 0 and the small ones under step 1."""
    code = (
        "import time\n"
        "held = bytearray(200 * 2**20)\n"
        "print('held', flush=True)\n"
        "time.sleep(0.6)\n"
        "del held\n"
        "print('freed', flush=True)\n"
        "time.sleep(0.6)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    meter = RssMeter(interval=0.02)
    meter.start(lambda: [proc.pid])
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    assert proc.stdout.readline().strip() == "freed"
    time.sleep(0.1)
    meter.at_step(1)
    proc.wait()
    reading = meter.stop(0)
    warm, steady = reading.phase_peaks(1)
    assert warm is not None and steady is not None
    assert warm > 200 * 2**20 > steady


def test_the_peak_checked_against_the_limit_is_never_below_a_phase_s() -> None:
    """Issue 32: `peak memory 729.64 MiB` beside `steady 729.79 MiB (sampled)`: the kernel's high-water mark
    is updated lazily, and a sample of the process can read above it. The peak is the larger of the two."""
    code = "import time\nheld = bytearray(100 * 2**20)\nprint('held', flush=True)\ntime.sleep(0.5)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    meter = RssMeter(interval=0.02)
    meter.start(lambda: [proc.pid])
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    time.sleep(0.1)
    reading = meter.stop(main_maxrss_bytes=1)  # a high-water mark that lags every sample
    proc.wait()
    assert reading.method == "rss"
    assert reading.peak_bytes == max(reading.by_step.values()) > 100 * 2**20


def test_no_meter_s_peak_is_below_a_step_s_or_a_phase_s_sample() -> None:
    """Issue 29: an eval peak of 481.18 MiB beside a trial peak of 481.07: whatever the meter, the reading's
    peak is the largest sample any step or phase took."""
    for method in ("rss", "rss-tree", "nvml"):
        assert MemoryReading(100, method, 3, 1, by_step={0: 90, 1: 101}).peak_bytes == 101
        assert MemoryReading(100, method, 3, 1, by_step={0: 90}, by_phase={"eval": 105}).peak_bytes == 105
        assert MemoryReading(100, method, 3, 1, by_step={0: 90}, by_phase={"save": 99}).peak_bytes == 100
    # a multi-process trial's peak is its worst rank's; its samples are of the whole tree (torchrun included)
    ranks = (RankPeak(0, "cpu", 60), RankPeak(1, "cpu", 100))
    assert MemoryReading(100, "rss-rank", 3, 3, ranks=ranks, by_step={0: 290}).peak_bytes == 100
