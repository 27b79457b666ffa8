"""What names a study: the study key (the workload plus what the search was asked: budget, headroom,
search space, trial lengths) and the study-name rules. The same study key is answered from the database
with zero trials."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from autotune.core.names import check_study_name
from autotune.trials.workload import Workload, digest

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def study_key(
    workload: Workload,
    budget_bytes: int,
    headroom: float,
    space: dict[str, Any],
    steps: tuple[int, int],
    phases: tuple[str, ...] = (),
) -> str:
    """The key; phases a trial runs after its steps (--with-eval, --with-save) join it only when asked, so
    the keys of the studies that ran none stay as they were."""
    asked: dict[str, Any] = {
        "workload": workload.fingerprint,
        "budget_bytes": budget_bytes,
        "headroom": headroom,
        "space": space,
        "steps": list(steps),
    }
    if phases:
        asked["phases"] = sorted(phases)
    return digest(asked)


def default_study_name(workload: Workload, key: str) -> str:
    """``<script stem>-<key[:12]>``: readable, and stable for identical jobs."""
    stem = _UNSAFE.sub("-", Path(workload.script).stem).strip("-.")[:64] or "study"
    return f"{stem}-{key[:12]}"


def job_study_name(script: str, digest: str) -> str:
    """The study name of a submitted job, before any worker has seen a device: ``<stem>-<digest[:12]>``."""
    stem = Path(script).stem[:64] or "job"
    return check_study_name(f"{stem}-{digest[:12]}")
