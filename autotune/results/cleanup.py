"""``autotune gc``: the trial folders of finished studies removed from the cache dir (issue 27: they
accumulated without end). What ``show`` and ``report`` point to is kept: the folders of trials that ended
with an error (their log is where the whole traceback is). Only folders this database's trials name, under
this cache dir's ``trials/``, are touched, and of those only a folder whose own file says that trial
measured there (autotune.search.optuna_trials.claim_folder): a trial's ``log_dir`` is a row any writer of
the database can point at another study's folder. Another database's trials, another host's, and a running
or open study's are left as they are."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from autotune.results.records import study_records
from autotune.search.optuna_trials import folder_claims
from autotune.storage import JobState, Store


@dataclass
class Collected:
    removed: int = 0  # trial folders removed (or, dry, that would be)
    bytes: int = 0  # what they held
    studies: int = 0  # finished studies whose folders were looked at
    kept: int = 0  # folders of trials that ended with an error: show and report point to their logs
    unfinished: list[str] = field(default_factory=list)  # studies still open or running: not touched


def collect(store: Store, cache: Path, dry_run: bool = False) -> Collected:
    """Remove the trial folders under ``cache``/trials of ``store``'s finished studies (the module
    docstring); with ``dry_run``, count them only."""
    trials = (cache / "trials").resolve()
    jobs = {job.study_name: job.state for job in store.jobs()}
    done = Collected()
    for study in store.studies():
        state = jobs.get(study.study_name)
        finished = state in (JobState.DONE, JobState.FAILED) or (
            state is None and store.best(study.study_name) is not None
        )
        if not finished:
            done.unfinished.append(study.study_name)
            continue
        done.studies += 1
        for record in study_records(store, study.study_name):
            folder = Path(record.log_dir).resolve() if record.log_dir else None
            if folder is None or folder.parent != trials or not folder.is_dir():
                continue
            if (study.study_name, record.number) not in folder_claims(folder):
                continue  # not provably this trial's (or measured before trials claimed their folders)
            if record.error:
                done.kept += 1
                continue
            done.removed += 1
            done.bytes += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            if not dry_run:
                shutil.rmtree(folder, ignore_errors=True)
    return done
