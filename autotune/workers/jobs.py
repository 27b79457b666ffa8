"""Tuning jobs as stored rows: what ``autotune submit`` records and what a worker rebuilds a spec from.

A job holds everything a worker on another host needs: the command with the script's absolute path, the
working directory, the search options, and the script's sha256. A worker whose copy of the script differs
refuses the job (its measurements would belong to another program).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.core.budget import parse_budget
from autotune.trials.command import TrialCommand
from autotune.core.errors import InputError

if TYPE_CHECKING:
    from autotune.storage import JobRow
    from autotune.workers.tune import TuneSpec


class JobRefused(InputError):
    """This worker cannot run this job (a different script, or a different device than the job's)."""


def script_sha256(command: TrialCommand) -> str | None:
    script = command.script_path()
    return hashlib.sha256(Path(script).read_bytes()).hexdigest() if script else None


def job_row(spec: TuneSpec, study_name: str, submitted_by: str, state: str) -> JobRow:
    """The stored form of ``spec`` (paths made absolute, so that any worker can find the script)."""
    from autotune.storage import JobRow

    command = spec.command
    words = list(command.words)
    if not command.is_template:
        words[0] = str(Path(words[0]).resolve())
    data = {
        "command": words,
        "is_template": command.is_template,
        "cwd": command.cwd or os.getcwd(),
        "budget": spec.budget.text,
        "trials": spec.trials,
        "batch_sizes": list(spec.batch_sizes),
        "plans": list(spec.plans) if spec.plans is not None else None,
        "settings": asdict(spec.settings),
        "headroom": spec.headroom,
        "seed": spec.seed,
        "backend": spec.backend,
    }
    return JobRow(study_name, words[0], script_sha256(command), data, state, submitted_by)


def spec_of(job: JobRow, storage: str, cache_dir: Path | None, device: str) -> TuneSpec:
    """The spec a worker runs ``job`` with, on ``device``.

    Raises:
        JobRefused: the script is missing here, or its bytes differ from the submitted script's.
    """
    from autotune.trials.measurement import TrialSettings
    from autotune.workers.tune import TuneSpec

    data: dict[str, Any] = job.spec
    words = tuple(data["command"])
    command = TrialCommand(
        words, bool(data["is_template"]), data["cwd"] if Path(data["cwd"]).is_dir() else None
    )
    if job.script_sha256 is not None:
        script = command.script_path()
        if script is None:
            raise JobRefused(f"job {job.study_name}: its script {job.script} is not on this host")
        if script_sha256(command) != job.script_sha256:
            raise JobRefused(
                f"job {job.study_name}: this host's {script} differs from the submitted script "
                f"(sha256 {job.script_sha256[:12]}...): copy the same script here, or submit it again"
            )
    return TuneSpec(
        command=command,
        budget=parse_budget(data["budget"]),
        trials=int(data["trials"]),
        batch_sizes=tuple(data["batch_sizes"]),
        plans=tuple(data["plans"]) if data["plans"] is not None else None,
        settings=TrialSettings(**data["settings"]),
        headroom=float(data["headroom"]),
        seed=data["seed"],
        device=device,
        cache_dir=cache_dir,
        storage=storage,
        study=job.study_name,
        backend=data["backend"],
    )


def spec_digest(spec: TuneSpec) -> str:
    """A name for a submitted job before any worker has seen a device: the spec's hash."""
    row = job_row(spec, "", "", "")
    data = {**row.spec, "script_sha256": row.script_sha256}
    data.pop("cwd")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
