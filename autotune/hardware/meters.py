"""Memory meters: the peak memory of one trial, measured from outside the trial.

Every meter samples in a background thread of the tuner between ``start(processes)`` and
``stop(main_maxrss_bytes)``; ``processes()`` lists the trial's processes at each sample (the launcher
passes the shim's descendants: the meters know nothing of how a trial is started).

- :class:`RssMeter` (CPU): the trial's resident memory. One process: the kernel's own high-water mark of
  that process (``wait4``'s ``ru_maxrss``, through the shim), which no sampling can miss. Several
  processes (DataLoader workers, say): the largest *sum* of their RSS sampled at 20 Hz, labelled
  ``rss-tree`` — pages shared between them are counted once per process, so the figure errs on the safe
  side of a budget. (20 Hz keeps the meter under 1% of a core: bench/measurement.py.)
- :class:`NvmlMeter` (GPU): what nvidia-smi shows for the device (CUDA context, allocator cache and
  fragmentation included), sampled at 100 Hz, minus what the device used before the trial started.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from autotune.hardware.devices import Device

Processes = Callable[[], Iterable[int]]  # the trial's process ids, now


@dataclass(frozen=True)
class MemoryReading:
    """The measured peak of one trial."""

    peak_bytes: int
    method: str  # "rss", "rss-tree" or "nvml"
    samples: int
    processes: int  # the most trial processes seen at once
    note: str | None = None


class MemoryMeter(Protocol):
    """Measures the peak memory of the processes ``processes()`` lists while the trial runs; with a
    ``ceiling``, sets ``over`` as soon as a sample passes it (the launcher then stops the trial)."""

    over: threading.Event

    def start(self, processes: Processes, ceiling: int | None = None) -> None: ...

    def stop(self, main_maxrss_bytes: int) -> MemoryReading: ...


def make_meter(device: Device, nvml: Any = None) -> MemoryMeter:
    """The meter for ``device``: NVML on a GPU, RSS on the CPU. ``nvml``: the module (tests pass a fake)."""
    if device.kind == "cuda":
        if nvml is None:
            from autotune.hardware.nvml import load_nvml

            nvml = load_nvml()
        return NvmlMeter(nvml, device.handle)
    return RssMeter()


class _Sampler:
    """Calls ``sample()`` every ``interval`` seconds in a daemon thread until stopped."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.samples = 0
        self.over = threading.Event()
        self._ceiling: int | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start_sampling(self, ceiling: int | None) -> None:
        self._done = threading.Event()  # a meter measures one trial after another: nothing carries over
        self.over = threading.Event()
        self._ceiling = ceiling
        self.samples = 0
        self._thread = threading.Thread(target=self._run, name="autotune-meter", daemon=True)
        self._thread.start()

    def stop_sampling(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._done.is_set():
            self.sample()
            self.samples += 1
            if self._ceiling is not None and self.sampled_peak() > self._ceiling:
                self.over.set()
            self._done.wait(self.interval)

    def sample(self) -> None:
        raise NotImplementedError

    def sampled_peak(self) -> int:
        """The trial's peak so far, as sampled (what a ceiling is compared with)."""
        raise NotImplementedError


class RssMeter(_Sampler):
    """CPU memory of a trial (see the module docstring)."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(interval)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._pids: Processes = tuple
        self._peak = 0
        self._processes = 0

    def start(self, processes: Processes, ceiling: int | None = None) -> None:
        self._pids, self._peak, self._processes = processes, 0, 0
        self.start_sampling(ceiling)

    def sampled_peak(self) -> int:
        return self._peak

    def sample(self) -> None:
        total, count = 0, 0
        for pid in self._pids():
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * self._page
                count += 1
            except (OSError, IndexError, ValueError):
                continue  # exited between listing and reading
        self._peak = max(self._peak, total)
        self._processes = max(self._processes, count)

    def stop(self, main_maxrss_bytes: int) -> MemoryReading:
        self.stop_sampling()
        if self._processes > 1:
            return MemoryReading(
                max(self._peak, main_maxrss_bytes), "rss-tree", self.samples, self._processes
            )
        return MemoryReading(main_maxrss_bytes, "rss", self.samples, max(self._processes, 1))


class NvmlMeter(_Sampler):
    """GPU memory of a trial: the device's used memory (NVML v2 struct) above its level before the trial."""

    PROCESS_EVERY = 25  # the process list costs ~4.5 ms a call: attribute at 4 Hz, not 100 Hz
    # After a trial (a killed one above all) the driver may free its memory a moment after the process is
    # gone; the next trial's baseline would then include it and its peak read too low. So a stop waits,
    # up to SETTLE_SECONDS, for the device to come back within SETTLE_BYTES of the level before the trial.
    SETTLE_SECONDS = 10.0
    SETTLE_BYTES = 32 * 2**20

    def __init__(self, nvml: Any, handle: Any, interval: float = 0.01) -> None:
        super().__init__(interval)
        self._nvml = nvml
        self._handle = handle
        self._pids: Processes = tuple
        self._baseline = 0
        self._peak = 0
        self._trial_pids: set[int] = set()
        self._foreign_pids: set[int] = set()

    def _used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle, version=self._nvml.nvmlMemory_v2).used)

    def start(self, processes: Processes, ceiling: int | None = None) -> None:
        self._pids, self._peak = processes, 0
        self._trial_pids, self._foreign_pids = set(), set()
        self._baseline = self._used()
        self.start_sampling(ceiling)

    def sampled_peak(self) -> int:
        return max(self._peak - self._baseline, 0)

    def sample(self) -> None:
        self._peak = max(self._peak, self._used())
        if self.samples % self.PROCESS_EVERY == 0:
            ours = set(self._pids())
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
                (self._trial_pids if proc.pid in ours else self._foreign_pids).add(proc.pid)

    def stop(self, main_maxrss_bytes: int) -> MemoryReading:
        self.stop_sampling()
        note = None
        if self._foreign_pids - self._trial_pids and not self._trial_pids:
            note = "NVML listed no process of the trial (PIDs of another namespace?); the device must be idle"
        elif self._foreign_pids:
            note = f"other processes used the device during the trial: {sorted(self._foreign_pids)}"
        else:
            note = self._settle()
        return MemoryReading(
            max(self._peak - self._baseline, 0), "nvml", self.samples, max(len(self._trial_pids), 1), note
        )

    def _settle(self) -> str | None:
        """Wait until the device is back at its level before the trial; a note if it does not come back."""
        deadline = time.monotonic() + self.SETTLE_SECONDS
        while (above := self._used() - self._baseline) > self.SETTLE_BYTES:
            if time.monotonic() > deadline:
                return (
                    f"the device stayed {above / 2**20:.0f} MiB above its level before the trial for "
                    f"{self.SETTLE_SECONDS:g}s after it ended: the next trial's peak is measured from there"
                )
            time.sleep(0.05)
        return None
