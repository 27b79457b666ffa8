"""FAKE NVML, for machines without an NVIDIA GPU (this project's CI has none).

A stand-in for nvidia-ml-py's ``pynvml`` module with the handful of calls autotune makes. The fake device's
used memory is ``idle_used`` plus what a trial process declares in ``usage_file`` (``"<pid> <bytes>"``), so a
trial script can drive "GPU memory" over time and the real NvmlMeter, launcher and device resolution run
unchanged against it. The real NVML path is covered by tests marked ``gpu`` where a GPU exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

nvmlMemory_v2 = 0x02000028


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str
    name: str = "FAKE NVIDIA H100 80GB HBM3"
    total: int = 80 * 2**30
    idle_used: int = 512 * 2**20
    usage_file: Path | None = None


@dataclass
class FakeNvml:
    """Module-like: pass it where autotune takes an ``nvml`` module."""

    gpus: list[FakeGpu] = field(default_factory=list)
    mig: dict[str, FakeGpu] = field(default_factory=dict)  # MIG UUID -> its (separate) memory
    calls: int = 0

    NVMLError = NVMLError
    nvmlMemory_v2 = nvmlMemory_v2

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in [*self.gpus, *self.mig.values()]:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError("Not Found")

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def _declared(self, handle: FakeGpu) -> dict[int, int]:
        """What the trial processes declared, one ``<pid> <bytes>`` line each (processes sharing the device);
        nothing of one that has exited (a real GPU frees its memory)."""
        found = {}
        try:
            lines = handle.usage_file.read_text().splitlines()  # type: ignore[union-attr]
        except (AttributeError, OSError):
            return {}
        for line in lines:
            try:
                pid, used = line.split()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, ValueError):
                continue
            if state != "Z":
                found[int(pid)] = int(used)
        return found

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> SimpleNamespace:
        self.calls += 1
        used = handle.idle_used + sum(self._declared(handle).values())
        return SimpleNamespace(total=handle.total, used=used, free=handle.total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used)
            for pid, used in self._declared(handle).items()
            if used
        ]

    def nvmlSystemGetDriverVersion(self) -> str:
        return "999.99 (FAKE)"


@dataclass
class NodeFakeNvml(FakeNvml):
    """FAKE NVML for a node of the tests' local Ray cluster (tests/cluster): built by a test, it is sent to
    each node with the trial (pickled), and there its GPUs are the node's own: the UUIDs in the node's
    ``FAKE_NVML_GPUS`` (comma-separated), each declaring its memory in ``$FAKE_GPU_USAGE_DIR/<UUID>``."""

    def __setstate__(self, state: dict[str, object]) -> None:
        import os

        self.__dict__.update(state)
        folder = Path(os.environ["FAKE_GPU_USAGE_DIR"])
        self.gpus = [
            FakeGpu(uuid, usage_file=folder / uuid) for uuid in os.environ["FAKE_NVML_GPUS"].split(",")
        ]
