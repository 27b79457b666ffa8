"""Memory meters: the peak memory of one trial, measured from outside the trial.

Every meter samples in a background thread of the tuner between ``start(processes)`` and
``stop(main_maxrss_bytes)``; ``processes()`` lists the trial's processes at each sample (the launcher
passes the shim's descendants: the meters know nothing of how a trial is started).

- :class:`RssMeter` (CPU): the trial's resident memory. One process: the kernel's own high-water mark of
  that process (``wait4``'s ``ru_maxrss``, through the shim), which no sampling can miss. Several
  processes (DataLoader workers, say): the largest *sum* of their proportional set sizes (``Pss`` from
  ``/proc/PID/smaps_rollup``) sampled at 20 Hz, labelled ``rss-tree``: a page the processes share (what
  a forked worker inherits and never writes) is counted once, split among them, not once per process
  (summed RSS read a timm ViT with two workers 30% high); where the kernel has no smaps_rollup, their RSS.
  Pss is read every PSS_EVERY samples (it costs a torch process ~2.5 ms, RSS 0.01), each process's RSS
  less what it shared then in between.
  Never less than the main process's own high-water mark. (20 Hz keeps the meter under 1% of a core:
  bench/measurement.py.)
- :class:`NvmlMeter` (GPU): what nvidia-smi shows for the device (CUDA context, allocator cache and
  fragmentation included), sampled at 100 Hz, minus what the device used before the trial started.

A multi-process trial (torchrun, or another launcher whose processes each have a ``$RANK``) is measured
rank by rank: ``ranks()`` maps the pid of each rank that has started to its identity. On the CPU a rank's
peak is its own process tree's (the rank and its DataLoader workers; the launcher belongs to no rank), the
largest sum sampled and never less than the rank's own high-water mark (``VmHWM``). On GPUs it is the peak
of the rank's device: every device of the trial is sampled, and a rank is on the device NVML lists its pid
on (before NVML has listed it: the device of its local rank, in the order the trial was given its
devices); ranks sharing a device share its peak. The trial's peak is its worst rank's: the budget is per
device.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autotune.core.protocol import RankIdentity
from autotune.hardware.devices import Device

Processes = Callable[[], Iterable[int]]  # the trial's process ids, now


class Ranks(Protocol):
    """The pids of the trial's ranks that have started, now, each with its identity. ``declared``: the
    command is a launcher autotune reads (torchrun), so the trial is its ranks from its start (the launcher's
    own memory is no rank's, before a rank starts too); otherwise the ranks are whatever processes report
    one (``$RANK``: DeepSpeed's launcher, Accelerate's, mpirun), and until one does the trial is measured
    whole."""

    declared: bool

    def __call__(self) -> Mapping[int, RankIdentity]: ...


# where the trial is now: the steps it has finished and the phase it is in (core.protocol.read_position)
PhaseSource = Callable[[], "tuple[int, str | None]"]


@dataclass(frozen=True)
class RankPeak:
    """One rank's measured peak: its own processes' on the CPU, its device's on a GPU."""

    rank: int
    device: str
    peak_bytes: int


HOST_METHODS = ("rss", "rss-tree")  # the methods whose reading is host memory (the CPU's meters)


@dataclass(frozen=True)
class MemoryReading:
    """The measured peak of one trial."""

    peak_bytes: int
    method: str  # "rss", "rss-tree" or "nvml"
    samples: int
    processes: int  # the most trial processes seen at once
    note: str | None = None
    ranks: tuple[RankPeak, ...] = ()  # a multi-process trial's ranks (peak_bytes is the largest of them)
    # the largest sample taken while the trial had finished k steps, by k (as the launcher told the meter)
    by_step: dict[int, int] = field(default_factory=dict)
    # the largest sample taken while the trial was in a phase (eval, save: core.protocol.PHASES), by phase;
    # those samples are in no step's
    by_phase: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The peak checked against the limit is the largest any phase sampled: a step's or a phase's peak
        # above it (481.18 vs 481.07 MiB: a sample above the kernel's lazily updated high-water mark) must
        # not be possible. (A multi-process trial's peak is its worst rank's, a quantity its samples of the
        # whole tree, launcher included, do not measure: its ranks' own peaks are kept.)
        if not self.ranks:
            largest = max([self.peak_bytes, *self.by_step.values(), *self.by_phase.values()])
            object.__setattr__(self, "peak_bytes", largest)

    def phase_peaks(self, warmup_steps: int | None) -> tuple[int | None, int | None]:
        """The largest sample of warm-up (steps 1 to ``warmup_steps``, start-up included) and of the steps
        after it; None for a phase with no sample."""
        if warmup_steps is None or not self.by_step:
            return None, None
        warm = [peak for step, peak in self.by_step.items() if step < warmup_steps]
        steady = [peak for step, peak in self.by_step.items() if step >= warmup_steps]
        return max(warm, default=None), max(steady, default=None)


class MemoryMeter(Protocol):
    """Measures the peak memory of the processes ``processes()`` lists while the trial runs; with a
    ``ceiling``, sets ``over`` as soon as a sample passes it (the launcher then stops the trial)."""

    over: threading.Event
    samples: int  # taken so far for the trial

    def start(
        self,
        processes: Processes,
        ceiling: int | None = None,
        ranks: Ranks | None = None,
        phase: PhaseSource | None = None,
    ) -> None:
        """``phase``: read at every sample, the steps the trial has finished and the phase it is in (None:
        training), so that a sample is filed under the step or phase it was taken in, not the one the
        launcher last saw."""

    def stop(self, main_maxrss_bytes: int) -> MemoryReading: ...

    def at_step(self, steps: int) -> None:
        """The trial has finished ``steps`` steps: later samples count towards that step (where ``start``
        was given no ``phase`` source, which tells the step and phase at each sample)."""

    def peaks_by_step(self) -> dict[int, int]:
        """The largest sample so far while the trial had finished k steps, by k."""

    def split(self) -> tuple[dict[int, int], dict[str, int]]:
        """The largest samples by step and by phase since the start or the last split, and new ones from
        now: a warm process's configurations each get their own (autotune.trials.warm)."""

    @property
    def method(self) -> str:
        """What the meter reads now: "rss" (one process), "rss-tree" or "nvml"."""

    def current(self) -> int:
        """The trial's memory at the last sample (its heaviest rank's, in a multi-process trial)."""


def make_meter(device: Device, nvml: Any = None) -> MemoryMeter:
    """The meter for ``device``: NVML on a GPU, RSS on the CPU. ``nvml``: the module (tests pass a fake)."""
    if device.kind == "cuda":
        if nvml is None:
            from autotune.hardware.nvml import load_nvml

            nvml = load_nvml()
        return NvmlMeter(nvml, [d.handle for d in device.members], [str(d) for d in device.members])
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
        self._step = 0
        self._by_step: dict[int, int] = {}
        self._by_phase: dict[str, int] = {}
        self._phase_source: PhaseSource | None = None
        self._recent: collections.deque[tuple[float, int]] = collections.deque()  # (time, bytes) samples

    def at_step(self, steps: int) -> None:
        self._step = steps

    def peaks_by_step(self) -> dict[int, int]:
        return dict(self._by_step)  # one C-level copy: the sampling thread may add a step meanwhile

    def split(self) -> tuple[dict[int, int], dict[str, int]]:
        # each swap is one store: a sample the thread is filing now lands in the old dict or the new one
        by_step, self._by_step = self._by_step, {}
        by_phase, self._by_phase = self._by_phase, {}
        return dict(by_step), dict(by_phase)

    def start(
        self,
        processes: Processes,
        ceiling: int | None = None,
        ranks: Ranks | None = None,
        phase: PhaseSource | None = None,
    ) -> None:
        """Measure a new trial (see MemoryMeter.start): the meter's state for it, then the sampling."""
        self.reset(processes, ranks)
        self.start_sampling(ceiling, phase)

    def reset(self, processes: Processes, ranks: Ranks | None) -> None:
        """The meter's own state for a new trial of ``processes``."""
        raise NotImplementedError

    def start_sampling(self, ceiling: int | None, phase: PhaseSource | None = None) -> None:
        self._done = threading.Event()  # a meter measures one trial after another: nothing carries over
        self.over = threading.Event()
        self._ceiling = ceiling
        self.samples = 0
        self._step, self._by_step, self._by_phase = 0, {}, {}
        self._recent = collections.deque()
        self._phase_source = phase
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
            # where the trial was as this sample was taken (its progress file, read now), else as the
            # launcher last told: a step shorter than the launcher's poll would lend its sample to the next
            step, phase = self._phase_source() if self._phase_source is not None else (self._step, None)
            if phase is not None:
                self._by_phase[phase] = max(self._by_phase.get(phase, 0), self.current())
            else:
                self._by_step[step] = max(self._by_step.get(step, 0), self.current())
            if self._ceiling is not None and self.sampled_peak() > self._ceiling:
                self.over.set()
            self._done.wait(self._next_wait())

    def _next_wait(self) -> float:
        """How long until the next sample (:func:`next_wait`), from the samples of the last GROWTH_WINDOW."""
        now, current = time.monotonic(), self.current()
        self._recent.append((now, current))
        while len(self._recent) > 2 and now - self._recent[1][0] >= GROWTH_WINDOW:
            self._recent.popleft()
        return next_wait(self.interval, self._ceiling, self._recent)

    def sample(self) -> None:
        raise NotImplementedError

    def sampled_peak(self) -> int:
        """The trial's peak so far, as sampled (what a ceiling is compared with)."""
        raise NotImplementedError

    def current(self) -> int:
        """The trial's memory at the last sample (its heaviest rank's, in a multi-process trial)."""
        raise NotImplementedError


PSS_SECONDS = 0.5  # a tree's proportional set sizes are read this often (every 10th sample at 20 Hz)
NEAR_INTERVAL = 0.002  # the shortest interval: a trial growing toward its ceiling is sampled this often
GROWTH_WINDOW = 0.1  # a trial's growth is read over the samples of this many seconds


def next_wait(interval: float, ceiling: int | None, recent: Sequence[tuple[float, int]]) -> float:
    """The seconds until the next sample: ``interval``, shorter only while the trial grows fast enough
    (over ``recent``, its (time, bytes) samples of the last GROWTH_WINDOW) to pass ``ceiling`` within two
    intervals; then a quarter of the time it would take to reach it, down to NEAR_INTERVAL. A runaway
    growing 1 GiB/s passes an 800 MB budget by ~50 MB in one 20 Hz interval, by ~2 MB in NEAR_INTERVAL.

    Sampling every NEAR_INTERVAL past half the ceiling, as the meter once did, slowed a trial near its
    budget that was not growing at all: examples/gpt.py at batch 32 (~800 of 1024 MiB) read 94-95
    samples/s against 100-111 without a ceiling, the sampler's 500 wake-ups a second taking a core from
    torch's two threads (its steps' CPU pressure 0.08 against 0.02): the configurations nearest the
    budget, often the answer, read slowest."""
    if ceiling is None or len(recent) < 2:
        return interval
    (then, before), (now, current) = recent[0], recent[-1]
    growth = (current - before) / (now - then) if now > then else 0.0
    if growth <= 0:
        return interval
    reach = max(ceiling - current, 0) / growth  # seconds until the ceiling at this growth
    if reach > 2 * interval:
        return interval
    return min(interval, max(NEAR_INTERVAL, reach / 4))


class RssMeter(_Sampler):
    """CPU memory of a trial (see the module docstring)."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(interval)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._pids: Processes = tuple
        self._ranks: Ranks | None = None
        self._peak = 0
        self._processes = 0
        self._rank_peaks: dict[int, int] = {}
        self._shared: dict[int, int] = {}  # bytes of each process's RSS it shares (RSS - Pss, last read)
        self._pss_read = 0.0  # when the tree's Pss was last read (time.monotonic())
        self._now = 0

    def reset(self, processes: Processes, ranks: Ranks | None) -> None:
        """``ranks``: a multi-process trial (torchrun); its ceiling is then a rank's, its launcher no rank."""
        self._pids, self._ranks, self._peak, self._processes, self._rank_peaks = processes, ranks, 0, 0, {}
        self._shared, self._pss_read = {}, 0.0

    def sampled_peak(self) -> int:
        if self._rank_peaks or (self._ranks is not None and self._ranks.declared):
            return max(self._rank_peaks.values(), default=0)  # the launcher's own memory is no rank's
        return self._peak

    def sample(self) -> None:
        sizes: dict[int, int] = {}
        pids = list(self._pids())
        refresh = time.monotonic() - self._pss_read >= PSS_SECONDS
        if refresh and len(pids) > 1:
            self._pss_read = time.monotonic()
        for pid in pids:
            resident = resident_bytes(pid, self._page)
            if resident is None:
                continue  # exited between listing and reading
            # A tree: each process's share of the pages (Pss), so that what a fork shares with its parent is
            # counted once. Pss costs ~2.5 ms a torch process to read, RSS 0.01: it is read every PSS_EVERY
            # samples (and for a process not seen yet), and in between a process is its RSS less what it
            # shared then.
            if len(pids) > 1 and (refresh or pid not in self._shared):
                proportional = proportional_bytes(pid)
                self._shared[pid] = max(resident - proportional, 0) if proportional is not None else 0
            sizes[pid] = resident - self._shared.get(pid, 0) if len(pids) > 1 else resident
        self._peak = max(self._peak, sum(sizes.values()))
        self._now = sum(sizes.values())
        self._processes = max(self._processes, len(sizes))
        ranks = self._ranks() if self._ranks is not None else {}
        if ranks:
            self._sample_ranks(sizes, {pid: identity.rank for pid, identity in ranks.items()})

    def current(self) -> int:
        return self._now

    @property
    def method(self) -> str:
        return "rss-tree" if self._processes > 1 else "rss"

    def _sample_ranks(self, sizes: dict[int, int], rank_of: dict[int, int]) -> None:
        """Each rank's tree: its process and every descendant that no other rank owns."""
        totals = dict.fromkeys(rank_of.values(), 0)
        parents = {pid: _parent(pid) for pid in sizes if pid not in rank_of}
        for pid, size in sizes.items():
            owner, seen = pid, 0
            while owner not in rank_of and owner in parents and seen < 64:
                owner, seen = parents[owner], seen + 1
            if owner in rank_of:
                totals[rank_of[owner]] += size
        self._now = max(totals.values(), default=0)  # the launcher's own memory is no rank's
        for pid, rank in rank_of.items():
            totals[rank] = max(totals[rank], _high_water(pid))
            self._rank_peaks[rank] = max(self._rank_peaks.get(rank, 0), totals[rank])

    def stop(self, main_maxrss_bytes: int) -> MemoryReading:
        self.stop_sampling()
        if self._rank_peaks:
            ranks = tuple(RankPeak(rank, "cpu", peak) for rank, peak in sorted(self._rank_peaks.items()))
            return MemoryReading(
                max(r.peak_bytes for r in ranks),
                "rss-rank",
                self.samples,
                self._processes,
                ranks=ranks,
                by_step=dict(self._by_step),
                by_phase=dict(self._by_phase),
            )
        if self._processes > 1:
            return MemoryReading(
                max(self._peak, main_maxrss_bytes),
                "rss-tree",
                self.samples,
                self._processes,
                by_step=dict(self._by_step),
                by_phase=dict(self._by_phase),
            )
        # The kernel's high-water mark, or a sample above it: the hiwater counter is updated lazily, and a
        # sample once read 0.15 MiB more (a phase's peak must never exceed the peak checked against the limit)
        return MemoryReading(
            max(main_maxrss_bytes, self._peak),
            "rss",
            self.samples,
            max(self._processes, 1),
            by_step=dict(self._by_step),
            by_phase=dict(self._by_phase),
        )


def resident_bytes(pid: int, page: int) -> int | None:
    """A process's resident set size in bytes (None: it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * page
    except (OSError, IndexError, ValueError):
        return None


def proportional_bytes(pid: int) -> int | None:
    """A process's proportional set size in bytes: its private pages and its share of each page it shares
    (None: gone, or a kernel without smaps_rollup)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return None
    return None


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _high_water(pid: int) -> int:
    """The process's own peak resident memory (``VmHWM``; 0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


class NvmlMeter(_Sampler):
    """GPU memory of a trial: each of its devices' used memory (NVML v2 struct) above its level before the
    trial; the trial's peak is its most loaded device's."""

    PROCESS_EVERY = 25  # the process list costs ~4.5 ms a call: attribute at 4 Hz, not 100 Hz
    # After a trial (a killed one above all) the driver may free its memory a moment after the process is
    # gone; the next trial's baseline would then include it and its peak read too low. So a stop waits,
    # up to SETTLE_SECONDS, for the device to come back within SETTLE_BYTES of the level before the trial.
    SETTLE_SECONDS = 10.0
    SETTLE_BYTES = 32 * 2**20

    def __init__(
        self, nvml: Any, handles: Any, labels: Sequence[str] | None = None, interval: float = 0.01
    ) -> None:
        """``handles``: one NVML device handle, or the trial's devices' in order (``labels``: their names)."""
        super().__init__(interval)
        self._nvml = nvml
        self._handles = list(handles) if isinstance(handles, (list, tuple)) else [handles]
        self._labels = list(labels) if labels else [f"cuda:{i}" for i in range(len(self._handles))]
        self._pids: Processes = tuple
        self._ranks: Ranks | None = None
        self._baseline = [0] * len(self._handles)
        self._peaks = [0] * len(self._handles)
        self._trial_pids: set[int] = set()
        self._foreign_pids: set[int] = set()
        self._device_of: dict[int, int] = {}  # pid -> index of the device NVML listed it on
        self._now = 0

    def current(self) -> int:
        return self._now

    @property
    def method(self) -> str:
        return "nvml"

    def _used(self, index: int = 0) -> int:
        memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handles[index], version=self._nvml.nvmlMemory_v2)
        return int(memory.used)

    def reset(self, processes: Processes, ranks: Ranks | None) -> None:
        self._pids, self._ranks = processes, ranks
        self._peaks = [0] * len(self._handles)
        self._trial_pids, self._foreign_pids, self._device_of = set(), set(), {}
        self._baseline = [self._used(i) for i in range(len(self._handles))]

    def _above(self, index: int) -> int:
        return max(self._peaks[index] - self._baseline[index], 0)

    def sampled_peak(self) -> int:
        return max(self._above(i) for i in range(len(self._handles)))

    def sample(self) -> None:
        used = [self._used(i) for i in range(len(self._handles))]
        self._now = max(max(u - b, 0) for u, b in zip(used, self._baseline, strict=True))
        for i in range(len(self._handles)):
            self._peaks[i] = max(self._peaks[i], used[i])
        if self.samples % self.PROCESS_EVERY == 0:
            ours = set(self._pids())
            for i, handle in enumerate(self._handles):
                for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    (self._trial_pids if proc.pid in ours else self._foreign_pids).add(proc.pid)
                    self._device_of.setdefault(proc.pid, i)

    def stop(self, main_maxrss_bytes: int) -> MemoryReading:
        self.stop_sampling()
        note = None
        if self._foreign_pids - self._trial_pids and not self._trial_pids:
            note = (
                "NVML listed no process of the trial (PIDs of another namespace?); the devices must be idle"
            )
        elif self._foreign_pids:
            note = f"other processes used the device during the trial: {sorted(self._foreign_pids)}"
        else:
            note = self._settle()
        ranks = tuple(
            RankPeak(identity.rank, self._labels[index], self._above(index))
            for identity, index in sorted(self._rank_devices(), key=lambda item: item[0].rank)
        )
        return MemoryReading(
            self.sampled_peak(),
            "nvml",
            self.samples,
            max(len(self._trial_pids), 1),
            note,
            ranks,
            by_step=dict(self._by_step),
            by_phase=dict(self._by_phase),
        )

    def _rank_devices(self) -> list[tuple[RankIdentity, int]]:
        """Each rank that started, with its device: where NVML listed it, else its local rank's."""
        return [
            (identity, self._device_of.get(pid, identity.local_rank % len(self._handles)))
            for pid, identity in (self._ranks() if self._ranks is not None else {}).items()
        ]

    def _settle(self) -> str | None:
        """Wait until the devices are back at their level before the trial; a note if one does not come back."""
        deadline = time.monotonic() + self.SETTLE_SECONDS
        for i in range(len(self._handles)):
            while (above := self._used(i) - self._baseline[i]) > self.SETTLE_BYTES:
                if time.monotonic() > deadline:
                    which = "the device" if len(self._handles) == 1 else self._labels[i]
                    return (
                        f"{which} stayed {above / 2**20:.0f} MiB above its level before the trial "
                        f"for {self.SETTLE_SECONDS:g}s after it ended: the next trial's peak is measured from there"
                    )
                time.sleep(0.05)
        return None
