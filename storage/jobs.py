"""Tuning jobs (``autotune_jobs``): what ``autotune submit`` and ``autotune run`` record for workers."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from autotune.core.errors import StorageError
from autotune.storage import schema
from autotune.storage.base import DamagedRow, Tables, json_of, now, study_name_of, text_of
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
        """The jobs (in ``states``, or named ``name``), oldest first. A damaged row (a spec that is not a
        job's JSON, an unknown state, a name no study may have) is skipped with one line on the
        ``autotune.storage`` log, once per process: one bad row must not stop every worker reading the
        table."""
        table = schema.jobs
        query = sa.select(
            *(table.c[c] for c in _PLAIN),
            *(sa.cast(table.c[c], sa.Text).label(c) for c in _JSON),  # parsed row by row, below
        ).order_by(table.c.created_at)
        if states is not None:
            query = query.where(table.c.state.in_([JobState(s).value for s in states]))
        if name is not None:
            query = query.where(table.c.study_name == name)
        with self._connect() as conn:
            rows = conn.execute(query).all()
        return self._checked(rows, _job, "job")

    def replace_job(self, row: JobRow) -> None:
        """Store ``row``'s spec, scripts and signature over the job of its name (``autotune run`` re-signs
        its own job each time it runs it)."""
        values = {k: getattr(row, k) for k in ("script", "script_sha256", "spec", "scripts", "signature")}
        with self._connect(write=True) as conn:
            conn.execute(
                sa.update(schema.jobs)
                .where(schema.jobs.c.study_name == row.study_name)
                .values(**values, updated_at=now())
            )

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


_PLAIN = ("study_name", "script", "script_sha256", "state", "submitted_by", "error", "signature")
_JSON = ("spec", "scripts")


def _job(values: dict[str, Any]) -> JobRow:
    """The row as a JobRow, every field checked.

    Raises:
        DamagedRow: a field is not what autotune stores there.
    """
    name = study_name_of(values)
    try:
        state = JobState(values["state"])
    except ValueError:
        raise DamagedRow(f"its state {values['state']!r} is not a job state") from None
    spec = json_of(values, "spec")
    if not isinstance(spec, dict):
        raise DamagedRow("its spec is not a JSON object")
    scripts = json_of(values, "scripts") if values["scripts"] is not None else None
    if scripts is not None and not (
        isinstance(scripts, dict) and all(isinstance(v, str) for v in scripts.values())
    ):
        raise DamagedRow("its script hashes are not a JSON object of path to sha256")
    return JobRow(
        study_name=name,
        script=text_of(values, "script"),
        script_sha256=text_of(values, "script_sha256", optional=True),
        spec=spec,
        state=state,
        submitted_by=text_of(values, "submitted_by"),
        error=text_of(values, "error", optional=True),
        scripts=scripts,
        signature=text_of(values, "signature", optional=True),
    )
