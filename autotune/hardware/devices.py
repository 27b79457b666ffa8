"""Which device a trial is measured on: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.

``cuda:N`` counts the devices in ``CUDA_VISIBLE_DEVICES`` when it is set (entries may be indices, GPU
UUIDs or MIG UUIDs, as CUDA accepts them), else NVML's indices (PCI bus order, as nvidia-smi numbers
them). Whatever the spec, the trial is pinned to the device by its UUID, so the device that is measured
is always the device the trial runs on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core.errors import DeviceError, InputError
from autotune.hardware.nvml import load_nvml

_SPEC = re.compile(r"auto|cpu|cuda(?::(\d+))?", re.ASCII)


@dataclass(frozen=True)
class Device:
    """A resolved device: what it is, how much memory it has, and how to pin a trial to it."""

    kind: str  # "cpu" or "cuda"
    name: str
    total_bytes: int
    index: int | None = None
    uuid: str | None = None
    handle: Any = None  # NVML handle (cuda only)
    driver: str | None = None  # NVIDIA driver version (cuda only): part of a workload's fingerprint

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def child_env(self) -> dict[str, str]:
        """Environment that pins a trial to this device (and keeps a CPU trial off every GPU)."""
        return {"CUDA_VISIBLE_DEVICES": self.uuid if self.kind == "cuda" and self.uuid else ""}


def resolve_device(
    spec: str,
    environ: Mapping[str, str],
    nvml_loader: Callable[[], Any] = load_nvml,
) -> Device:
    """Resolve a device spec against this machine.

    Raises:
        InputError: the spec is malformed.
        DeviceError: a GPU was asked for and NVML cannot provide it.
    """
    spec = spec.strip().lower()
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise InputError(f"invalid device {spec!r}: expected auto, cpu, cuda or cuda:N")
    if spec == "cpu":
        return cpu_device()
    if spec == "auto":
        try:
            nvml = nvml_loader()
        except DeviceError:
            return cpu_device()
        if nvml.nvmlDeviceGetCount() == 0:
            return cpu_device()
        return _cuda_device(nvml, 0, environ)
    return _cuda_device(nvml_loader(), int(match[1] or 0), environ)


def gpu_count(environ: Mapping[str, str], nvml_loader: Callable[[], Any] = load_nvml) -> int:
    """The GPUs visible here: the entries of CUDA_VISIBLE_DEVICES when it is set, else every GPU NVML sees;
    0 where NVML is not available (no driver, no bindings).

    Raises:
        DeviceError: NVML is there but fails to count its devices.
    """
    try:
        nvml = nvml_loader()
    except DeviceError:
        return 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    try:
        return int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as e:
        raise DeviceError(f"NVML cannot count the GPUs: {e}") from e


def cpu_device() -> Device:
    return Device(kind="cpu", name="cpu", total_bytes=_host_memory_limit())


def _cuda_device(nvml: Any, index: int, environ: Mapping[str, str]) -> Device:
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    try:
        if visible is None:
            if index >= nvml.nvmlDeviceGetCount():
                raise DeviceError(f"no device cuda:{index}: NVML sees {nvml.nvmlDeviceGetCount()} GPU(s)")
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        else:
            entries = [e.strip() for e in visible.split(",") if e.strip()]
            if index >= len(entries):
                raise DeviceError(
                    f"no device cuda:{index}: CUDA_VISIBLE_DEVICES={visible!r} lists {len(entries)}"
                )
            handle = _handle_for_entry(nvml, entries[index])
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return Device(
            kind="cuda",
            name=_text(nvml.nvmlDeviceGetName(handle)),
            total_bytes=int(memory.total),
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            handle=handle,
            driver=_text(nvml.nvmlSystemGetDriverVersion()),
        )
    except nvml.NVMLError as e:
        raise DeviceError(f"cannot open cuda:{index} through NVML: {e}") from e


def _handle_for_entry(nvml: Any, entry: str) -> Any:
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    if entry.startswith(("GPU-", "MIG-")):
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    raise DeviceError(f"CUDA_VISIBLE_DEVICES entry {entry!r} is neither an index nor a GPU-/MIG- UUID")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _host_memory_limit() -> int:
    """Physical memory, or the container's memory limit if lower (cgroup v2 or v1)."""
    total = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total
