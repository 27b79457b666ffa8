"""Tuning jobs as stored rows: what ``autotune submit`` and ``autotune run`` record, and the spec a worker
rebuilds from one (TuneSpec.to_json / from_json are the serialisation).

A job holds everything a worker on another host needs: the command with the script's absolute path, the
working directory, the search options, and the script's sha256. A worker whose copy of the script differs
refuses the job (its measurements would belong to another program).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from autotune.core.errors import InputError
from autotune.search.spec import TuneSpec
from autotune.storage import JobRow, JobState
from autotune.trials.command import TrialCommand


class JobRefused(InputError):
    """This worker cannot run this job (a different script, or a different device than the job's)."""


def script_sha256(command: TrialCommand) -> str | None:
    script = command.script_path()
    return hashlib.sha256(Path(script).read_bytes()).hexdigest() if script else None


def job_row(spec: TuneSpec, study_name: str, submitted_by: str, state: JobState) -> JobRow:
    """The stored form of ``spec``."""
    data = spec.to_json()
    return JobRow(study_name, data["command"][0], script_sha256(spec.command), data, state, submitted_by)


def spec_of(job: JobRow, storage: str, cache_dir: Path | None, device: str) -> TuneSpec:
    """The spec a worker runs ``job`` with, on ``device``.

    Raises:
        JobRefused: the script is missing here, or its bytes differ from the submitted script's.
    """
    spec = TuneSpec.from_json(job.spec, study=job.study_name, device=device, storage=storage, cache=cache_dir)
    if job.script_sha256 is not None:
        script = spec.command.script_path()
        if script is None:
            raise JobRefused(f"job {job.study_name}: its script {job.script} is not on this host")
        if script_sha256(spec.command) != job.script_sha256:
            raise JobRefused(
                f"job {job.study_name}: this host's {script} differs from the submitted script "
                f"(sha256 {job.script_sha256[:12]}...): copy the same script here, or submit it again"
            )
    return spec


def spec_digest(spec: TuneSpec) -> str:
    """A name for a submitted job before any worker has seen a device: the spec's hash."""
    data = {**spec.to_json(), "script_sha256": script_sha256(spec.command)}
    data.pop("cwd")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
