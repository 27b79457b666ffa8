"""``autotune submit``: record a tuning job for workers and return at once."""

from __future__ import annotations

import dataclasses

from autotune.core.errors import InputError
from autotune.leases.identity import worker_id
from autotune.search.naming import job_study_name
from autotune.search.spec import TuneSpec
from autotune.storage import JobRow, JobState, open_store
from autotune.workers.jobs import job_row, spec_digest
from autotune.workers.signing import JobKey, signature_round


def submit(spec: TuneSpec, key: JobKey | None, unsigned: bool = False) -> JobRow:
    """Record ``spec`` as an open job signed with ``key`` (or return the same job submitted before) and
    return at once. Workers run it only if they hold the same key (autotune.workers.signing); ``unsigned``
    stores it unsigned, for workers started with --allow-unsigned.

    Raises:
        InputError: no key and not ``unsigned``; a different job of the same name exists. StorageError: the
            database.
    """
    if key is None and not unsigned:
        raise InputError(
            "autotune submit signs the job for workers and holds no job key: set AUTOTUNE_JOB_KEY or "
            "AUTOTUNE_JOB_KEY_FILE (autotune keygen writes one; workers need the same), or pass --unsigned "
            "for workers started with --allow-unsigned"
        )
    store = open_store(spec.storage_url)
    name = spec.study or job_study_name(
        spec.command.script_path() or spec.command.words[0], spec_digest(spec)
    )
    row = job_row(spec, name, worker_id(), JobState.OPEN, None if unsigned else key)
    stored = store.submit_job(row)
    if stored.spec != row.spec:
        raise InputError(
            f"a different job named {name!r} exists in {store.display_url}: choose another --study"
        )
    if stored.signature != row.signature:  # the same job, signed again (another key, or unsigned before)
        store.replace_job(row)
        stored = dataclasses.replace(stored, scripts=row.scripts, signature=row.signature)
    # --force tunes again from scratch: a job not running now (an open one too: a finished job a database
    # writer set back to open is refused by the workers that ran it, until its submitter says this)
    if spec.force and stored.state in (JobState.DONE, JobState.FAILED, JobState.OPEN):
        if key is not None and not unsigned:  # a new round: workers that ran the last one run this one
            again = job_row(
                spec, name, worker_id(), JobState.OPEN, key, signature_round(stored.signature) + 1
            )
            store.replace_job(again)
            stored = dataclasses.replace(stored, signature=again.signature)
        store.forget_study(name)
        store.set_job_state(name, JobState.OPEN)
        stored = dataclasses.replace(stored, state=JobState.OPEN, error=None)
    return stored
