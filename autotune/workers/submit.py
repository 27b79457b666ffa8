"""``autotune submit``: record a tuning job for workers and return at once."""

from __future__ import annotations

import dataclasses

from autotune.core.errors import InputError
from autotune.leases.identity import worker_id
from autotune.search.naming import job_study_name
from autotune.search.spec import TuneSpec
from autotune.storage import JobRow, JobState, open_store
from autotune.workers.jobs import job_row, spec_digest


def submit(spec: TuneSpec) -> JobRow:
    """Record ``spec`` as an open job (or return the same job submitted before) and return at once.

    Raises:
        InputError: a different job of the same name exists. StorageError: the database.
    """
    store = open_store(spec.storage_url)
    name = spec.study or job_study_name(
        spec.command.script_path() or spec.command.words[0], spec_digest(spec)
    )
    row = job_row(spec, name, worker_id(), JobState.OPEN)
    stored = store.submit_job(row)
    if stored.spec != row.spec:
        raise InputError(
            f"a different job named {name!r} exists in {store.display_url}: choose another --study"
        )
    if spec.force and stored.state in (JobState.DONE, JobState.FAILED):
        store.forget_study(name)
        store.set_job_state(name, JobState.OPEN)
        stored = dataclasses.replace(stored, state=JobState.OPEN, error=None)
    return stored
