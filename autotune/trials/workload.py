"""What makes two trials' measurements comparable: the workload and its fingerprint.

The *workload* is the script (its bytes and the argument template), the device (model and total memory;
for a multi-process trial, its ranks and devices)
and the software (torch, ONNX Runtime, NVIDIA driver versions) and backend. Every budget of one workload
shares its measurements; the study key (autotune.search.naming) adds what a search was asked.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core.plans import Backend
from autotune.core.protocol import worst_case_enabled
from autotune.hardware.devices import Device
from autotune.trials.command import TrialCommand


@dataclass(frozen=True)
class Workload:
    fingerprint: str
    script: str  # the script's path as given, for display
    details: dict[str, Any]  # everything hashed into the fingerprint except the script bytes


def workload_of(
    command: TrialCommand, device: Device, backend: Backend | str, function: str | None = None
) -> Workload:
    """The fingerprint of running ``command`` on ``device`` with ``backend`` and the installed software;
    ``function``: a training function searched inside the script's own process (autotune.finder)."""
    script = command.script_path()
    details: dict[str, Any] = {
        "command": list(command.words) if command.is_template else list(command.words[1:]),
        "is_template": command.is_template,
        "script_sha256": hashlib.sha256(Path(script).read_bytes()).hexdigest() if script else None,
        "device": {"kind": device.kind, "name": device.name, "total_bytes": device.total_bytes},
        "versions": {
            "torch": _version("torch"),
            "onnxruntime-training": _version("onnxruntime-training"),
            "nvidia-driver": device.driver,
        },
        "backend": str(backend),
    }
    if function is not None:  # in the script's process: what it holds before the call is in every peak
        details["in_process"] = function
    if worst_case_enabled(os.environ):  # trials of the longest inputs measure another workload
        details["worst_case"] = True
    ranks = command.world_size(len(device.members))
    if ranks > 1 or len(device.members) > 1:  # a one-process, one-device workload keeps its fingerprint
        details["ranks"] = ranks
        details["devices"] = len(device.members)
    return Workload(digest(details), script or command.words[0], details)


def digest(data: dict[str, Any]) -> str:
    """A stable sha256 of JSON-ready ``data``."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@functools.cache  # every trial's environment names its workload's folders: read the metadata once
def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
