"""Tuning jobs as stored rows: what ``autotune submit`` and ``autotune run`` record, and the spec a worker
rebuilds from one (TuneSpec.to_json / from_json are the serialisation).

A job holds everything a worker on another host needs: the command with the script's absolute path, the
working directory, the search options, the sha256 of every script the command names, and the submitter's
signature over all of it (autotune.workers.signing). A worker runs a job only once the signature verifies
and its own copies of the scripts hash the same (its measurements would otherwise belong to another
program).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

from autotune.core.errors import InputError
from autotune.search.spec import TuneSpec
from autotune.storage import JobRow, JobState
from autotune.trials.command import TrialCommand, file_sha256, scripts_named
from autotune.workers.signing import JobKey, sign, signature_error


class JobRefused(InputError):
    """This worker cannot run this job (unsigned or tampered with, a different script, a damaged row, or a
    different device than the job's)."""


def script_sha256(command: TrialCommand) -> str | None:
    script = command.script_path()
    return file_sha256(Path(script)) if script else None


def job_row(
    spec: TuneSpec, study_name: str, submitted_by: str, state: JobState, key: JobKey | None, round: int = 0
) -> JobRow:
    """The stored form of ``spec``, signed with ``key`` for its ``round`` (unsigned without a key)."""
    data = json.loads(json.dumps(spec.to_json()))  # as the database gives it back: what is signed is read
    scripts = scripts_named(data["command"], data["cwd"])
    return JobRow(
        study_name,
        data["command"][0],
        script_sha256(spec.command),  # the first script's, as autotune before signed jobs stored it
        data,
        state,
        submitted_by,
        scripts=scripts,
        signature=sign(key, study_name, data, scripts, round) if key is not None else None,
    )


def spec_of(
    job: JobRow,
    storage: str,
    cache_dir: Path | None,
    device: str,
    key: JobKey | None,
    allow_unsigned: bool = False,
) -> tuple[TuneSpec, str]:
    """The spec a worker runs ``job`` with, on ``device``, and how far the job was verified (for the line
    that says what the worker runs).

    Raises:
        JobRefused: the job is unsigned (without ``allow_unsigned``), its signature does not verify, its
            stored spec is damaged, or a script it names is missing here or differs from the submitted one.
    """
    name = job.study_name
    trust = _verified(job, key, allow_unsigned)
    try:
        spec = TuneSpec.from_json(job.spec, study=name, device=device, storage=storage, cache=cache_dir)
    except (KeyError, TypeError, ValueError, AttributeError, InputError) as e:
        raise JobRefused(f"job {name}: its stored spec is damaged ({type(e).__name__}: {e})") from None
    cwd = str(job.spec.get("cwd", ""))
    for script, digest in _hashes(job, spec).items():
        path = Path(cwd) / script
        if not path.is_file():
            raise JobRefused(f"job {name}: its script {path} is not on this host")
        if file_sha256(path) != digest:
            raise JobRefused(
                f"job {name}: this host's {path} differs from the submitted script (sha256 "
                f"{digest[:12]}...): copy the same script here, or submit it again"
            )
    return spec, trust


def _verified(job: JobRow, key: JobKey | None, allow_unsigned: bool) -> str:
    """How the job was verified, in a few words.

    Raises:
        JobRefused: it is unsigned (without ``allow_unsigned``), or its signature does not verify.
    """
    if job.signature is None:
        if not allow_unsigned:
            raise JobRefused(
                f"job {job.study_name}: it is not signed (submitted without a job key): submit it again with "
                "the key this worker holds, or start the worker with --allow-unsigned on a database only "
                "you can write"
            )
        return "unsigned, run as --allow-unsigned says"
    if key is None:
        return "signed, not verified: this worker holds no key (--allow-unsigned)"
    why = signature_error(key, job.signature, job.study_name, job.spec, job.scripts)
    if why is not None:
        raise JobRefused(f"job {job.study_name}: {why}")
    return f"signature verified (key {key.key_id})"


def _hashes(job: JobRow, spec: TuneSpec) -> dict[str, str]:
    """The scripts to check on this host: every script the job names (a job stored before signed jobs: its
    first script)."""
    if job.scripts is not None:
        return job.scripts
    script = next((w for w in spec.command.words if w.endswith(".py")), None)
    return {script: job.script_sha256} if script is not None and job.script_sha256 is not None else {}


def command_line(job: JobRow) -> str:
    """What a worker runs for ``job``, as a shell would read it, and where."""
    words = job.spec.get("command")
    shown = shlex.join(str(w) for w in words) if isinstance(words, list) else repr(words)
    return f"{shown} (in {job.spec.get('cwd')})"


def spec_digest(spec: TuneSpec) -> str:
    """A name for a submitted job before any worker has seen a device: the spec's hash."""
    data = {**spec.to_json(), "script_sha256": script_sha256(spec.command)}
    data.pop("cwd")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
