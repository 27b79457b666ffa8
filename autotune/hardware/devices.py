"""Which device a trial is measured on: ``cpu``, ``cuda``, ``cuda:N``, ``auto``, or for a multi-GPU trial
(``--gpus-per-trial``) a group ``cuda:N+M+…``: the trial is given those GPUs in that order, and each is
measured on its own.

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

_SPEC = re.compile(r"auto|cpu|cuda(?::(\d+(?:\+\d+)*))?", re.ASCII)


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
    group: tuple[Device, ...] = ()  # a multi-GPU trial's devices, in order (this one is the first)

    @classmethod
    def of_group(cls, devices: tuple[Device, ...]) -> Device:
        """One trial's devices as one Device: the first's identity, the smallest memory (the budget is per
        device), every device pinned in order."""
        if len(devices) == 1:
            return devices[0]
        first = devices[0]
        return cls(
            kind=first.kind,
            name=first.name,
            total_bytes=min(d.total_bytes for d in devices),
            index=first.index,
            uuid=first.uuid,
            handle=first.handle,
            driver=first.driver,
            group=devices,
        )

    @property
    def members(self) -> tuple[Device, ...]:
        """The devices a trial on this Device is given: the group's, or this one."""
        return self.group or (self,)

    def __str__(self) -> str:
        if self.kind == "cpu":
            return "cpu"
        return "cuda:" + "+".join(str(d.index) for d in self.members)

    def child_env(self) -> dict[str, str]:
        """Environment that pins a trial to its devices, in order (and keeps a CPU trial off every GPU)."""
        if self.kind != "cuda":
            return {"CUDA_VISIBLE_DEVICES": ""}
        return {"CUDA_VISIBLE_DEVICES": ",".join(d.uuid for d in self.members if d.uuid)}


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
        raise InputError(
            f"invalid device {spec!r}: expected auto, cpu, cuda, cuda:N or cuda:N+M (a trial on several GPUs)"
        )
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
    indices = [int(i) for i in (match[1] or "0").split("+")]
    if len(set(indices)) != len(indices):
        raise InputError(f"invalid device {spec!r}: a GPU named twice")
    nvml = nvml_loader()
    return Device.of_group(tuple(_cuda_device(nvml, i, environ) for i in indices))


def resolve_trial_device(
    spec: str, per_trial: int, environ: Mapping[str, str], nvml_loader: Callable[[], Any] = load_nvml
) -> Device:
    """The device (group) one trial of a job with ``per_trial`` GPUs runs on: ``auto`` or ``cuda`` -> the first
    ``per_trial`` GPUs, ``cuda:K`` -> ``per_trial`` GPUs from K on, ``cuda:K+L`` as given.

    Raises:
        InputError: a CPU device, or a group of another size. DeviceError: too few GPUs.
    """
    if per_trial < 1:
        raise InputError(f"--gpus-per-trial must be a positive integer, got {per_trial}")
    if per_trial == 1:
        return resolve_device(spec, environ, nvml_loader)
    text = spec.strip().lower()
    if text == "cpu":
        raise InputError(f"--gpus-per-trial {per_trial} needs GPUs, and --device is cpu")
    if text in ("auto", "cuda"):
        count = gpu_count(environ, nvml_loader)
        if count < per_trial:
            raise DeviceError(f"--gpus-per-trial {per_trial}: this machine shows {count} GPU(s)")
        text = "cuda:" + "+".join(str(i) for i in range(per_trial))
    elif text.startswith("cuda:") and "+" not in text and text[5:].isdigit():
        first = int(text[5:])
        text = "cuda:" + "+".join(str(first + i) for i in range(per_trial))
    device = resolve_device(text, environ, nvml_loader)
    if len(device.members) != per_trial:
        raise InputError(
            f"--device {spec} names {len(device.members)} GPU(s), but --gpus-per-trial is {per_trial}"
        )
    return device


def gpus_in(spec: str) -> int:
    """How many GPUs a device spec gives one trial (``cuda:0+1`` -> 2; ``cpu``, ``auto`` -> 1)."""
    return len(spec.split("+")) if spec.strip().lower().startswith("cuda") else 1


def device_groups(devices: list[str], per_trial: int) -> list[str]:
    """``--gpus-per-trial``: ``devices`` (``cuda:N`` each) in consecutive groups of ``per_trial``
    (``cuda:0+1``), one trial at a time on each group.

    Raises:
        InputError: ``per_trial`` is not positive, the devices are not GPUs, or they do not divide evenly.
    """
    if per_trial < 1:
        raise InputError(f"--gpus-per-trial must be a positive integer, got {per_trial}")
    if per_trial == 1:
        return list(devices)
    if any(not d.startswith("cuda:") for d in devices):
        raise InputError(
            f"--gpus-per-trial {per_trial} needs GPUs; the devices here are {', '.join(devices)}"
        )
    if len(devices) % per_trial:
        raise InputError(
            f"--gpus-per-trial {per_trial} does not divide the {len(devices)} GPU(s) {', '.join(devices)} "
            "into whole trials"
        )
    return [
        "cuda:" + "+".join(d.split(":", 1)[1] for d in devices[i : i + per_trial])
        for i in range(0, len(devices), per_trial)
    ]


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
