"""Tuning jobs (``autotune_jobs``): what ``autotune submit`` and ``autotune run`` record for workers."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from autotune.core.errors import StorageError
from autotune.storage import schema
from autotune.storage.base import Tables, now
from autotune.storage.rows import JobRow, JobState


class JobTables(Tables):
    def submit_job(self, row: JobRow) -> JobRow:
        """Record ``row`` unless a job of that name exists; either way, the stored job."""
        stamp = now()
        values = {**row.__dict__, "state": JobState(row.state).value}
        try:
            with self._connect(write=True) as conn:
                conn.execute(sa.insert(schema.jobs).values(**values, created_at=stamp, updated_at=stamp))
        except StorageError as e:
            if not isinstance(e.__cause__, sa.exc.IntegrityError):
                raise
        found = self.job(row.study_name)
        if found is None:  # deleted between the insert and the read: report it as the storage error it is
            raise StorageError(
                f"database {self.display_url}: job {row.study_name!r} vanished as it was stored"
            )
        return found

    def job(self, name: str) -> JobRow | None:
        return next(iter(self.jobs(name=name)), None)

    def jobs(self, states: tuple[JobState, ...] | None = None, name: str | None = None) -> list[JobRow]:
        query = sa.select(schema.jobs).order_by(schema.jobs.c.created_at)
        if states is not None:
            query = query.where(schema.jobs.c.state.in_([JobState(s).value for s in states]))
        if name is not None:
            query = query.where(schema.jobs.c.study_name == name)
        with self._connect() as conn:
            rows = conn.execute(query).all()
        return [_job(dict(r._mapping)) for r in rows]

    def set_job_state(
        self,
        name: str,
        state: JobState,
        error: str | None = None,
        only_from: tuple[JobState, ...] | None = None,
    ) -> bool:
        """Move a job to ``state`` (only from one of ``only_from``, if given); False if it was not there."""
        query = sa.update(schema.jobs).where(schema.jobs.c.study_name == name)
        if only_from is not None:
            query = query.where(schema.jobs.c.state.in_([JobState(s).value for s in only_from]))
        with self._connect(write=True) as conn:
            updated = conn.execute(query.values(state=JobState(state).value, error=error, updated_at=now()))
            return updated.rowcount == 1


def _job(values: dict[str, Any]) -> JobRow:
    return JobRow(
        study_name=values["study_name"],
        script=values["script"],
        script_sha256=values["script_sha256"],
        spec=values["spec"],
        state=JobState(values["state"]),
        submitted_by=values["submitted_by"],
        error=values["error"],
    )
