"""What makes two tuning jobs the same: the workload fingerprint and the study key.

The *workload* is the script (its bytes and the argument template), the device (model and total memory)
and the software (torch, ONNX Runtime, NVIDIA driver versions) and backend. The *study key* adds what
the search was asked: budget, headroom, search space and trial lengths. The same study key is answered
from the database with zero trials; other budgets of the same workload share their measurements.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.trials.command import TrialCommand
from autotune.hardware.devices import Device
from autotune.core.errors import InputError

MAX_STUDY_NAME = 128
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Workload:
    fingerprint: str
    script: str  # the script's path as given, for display
    details: dict[str, Any]  # everything hashed into the fingerprint except the script bytes


def workload_of(command: TrialCommand, device: Device, backend: str) -> Workload:
    """The fingerprint of running ``command`` on ``device`` with ``backend`` and the installed software."""
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
        "backend": backend,
    }
    return Workload(_digest(details), script or command.words[0], details)


def study_key(
    workload: Workload, budget_bytes: int, headroom: float, space: dict[str, Any], steps: tuple[int, int]
) -> str:
    return _digest(
        {
            "workload": workload.fingerprint,
            "budget_bytes": budget_bytes,
            "headroom": headroom,
            "space": space,
            "steps": list(steps),
        }
    )


def default_study_name(workload: Workload, key: str) -> str:
    stem = _UNSAFE.sub("-", Path(workload.script).stem).strip("-.")[:64] or "study"
    return f"{stem}-{key[:12]}"


def check_study_name(name: str) -> str:
    """Validate a user-given study name (it must work on SQLite and PostgreSQL alike).

    Raises:
        InputError: control characters, '/', '..', or more than 128 characters.
    """
    if not name or len(name) > MAX_STUDY_NAME:
        raise InputError(f"study name must be 1 to {MAX_STUDY_NAME} characters, got {len(name)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in name) or "/" in name or ".." in name:
        raise InputError(f"invalid study name {name!r}: no control characters, '/' or '..'")
    return name


def _digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
