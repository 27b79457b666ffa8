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

    def _declared(self, handle: FakeGpu) -> tuple[int | None, int]:
        """What the trial process declared; nothing once it has exited (a real GPU frees its memory)."""
        try:
            pid, used = handle.usage_file.read_text().split()  # type: ignore[union-attr]
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (AttributeError, OSError, ValueError):
            return None, 0
        return (int(pid), int(used)) if state != "Z" else (None, 0)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> SimpleNamespace:
        self.calls += 1
        used = handle.idle_used + self._declared(handle)[1]
        return SimpleNamespace(total=handle.total, used=used, free=handle.total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        pid, used = self._declared(handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used)] if pid is not None and used else []

    def nvmlSystemGetDriverVersion(self) -> str:
        return "999.99 (FAKE)"
