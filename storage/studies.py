"""Workloads, studies and their verified winners (``autotune_workloads``, ``autotune_studies``,
``autotune_best``)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from autotune.core.errors import DamagedData, StorageError
from autotune.storage import schema
from autotune.storage.base import (
    DamagedRow,
    Tables,
    json_of,
    now,
    number_of,
    plain_text_of,
    study_name_of,
    text_of,
    whole_of,
)
from autotune.storage.rows import BestRow, StudyRow, WorkloadRow


class StudyTables(Tables):
    def workload(self, fingerprint: str) -> WorkloadRow | None:
        with self._connect() as conn:
            row = conn.execute(
                sa.select(schema.workloads).where(schema.workloads.c.fingerprint == fingerprint)
            ).first()
        if row is None:
            return None
        r = row._mapping
        return WorkloadRow(
            r["fingerprint"], r["script"], r["command"], r["device"], r["details"], r["discovery"]
        )

    def add_workload(
        self, fingerprint: str, script: str, command: str, device: str, details: dict[str, Any]
    ) -> None:
        """Record a workload once (a second call for the same fingerprint changes nothing)."""
        if self.workload(fingerprint) is not None:
            return
        values = dict(
            fingerprint=fingerprint,
            script=script,
            command=command,
            device=device,
            details=details,
            created_at=now(),
        )
        self._insert_once(sa.insert(schema.workloads).values(**values))

    def set_discovery(
        self, fingerprint: str, candidates: list[dict[str, Any]], discovery: dict[str, Any]
    ) -> None:
        """Store what the workload's probe found: its candidates and report, as JSON."""
        with self._connect(write=True) as conn:
            conn.execute(
                sa.update(schema.workloads)
                .where(schema.workloads.c.fingerprint == fingerprint)
                .values(candidates=candidates, discovery=discovery)
            )

    def add_study(self, row: StudyRow) -> None:
        """Record a study once (a second call for the same name changes nothing)."""
        if self.study(row.study_name) is not None:
            return
        values = {k: v for k, v in row.__dict__.items() if k != "script"}
        self._insert_once(sa.insert(schema.studies).values(**values, created_at=now()))

    def _insert_once(self, insert: sa.Insert) -> None:
        """Insert a row that several workers may insert at once: the database's unique key lets one win,
        and the others find their row there (a check before the insert cannot settle it: two workers
        both saw no workload and the second died on the key, with 32 workers on SQLite)."""
        try:
            with self._connect(write=True) as conn:
                conn.execute(insert)
        except StorageError as e:
            if not isinstance(e.__cause__, sa.exc.IntegrityError):
                raise

    def studies(self, fingerprint: str | None = None) -> list[StudyRow]:
        """Every study (of one workload), oldest first. A damaged row (a name no study may have, a budget or
        space that is not autotune's) is skipped with one line on the ``autotune.storage`` log."""
        table = schema.studies
        query = (
            sa.select(
                *(table.c[c] for c in ("study_name", "fingerprint", "study_key", "budget_bytes", "headroom")),
                sa.cast(table.c.space, sa.Text).label("space"),  # parsed row by row, below
                schema.workloads.c.script,
            )
            .join(schema.workloads)
            .order_by(table.c.created_at)
        )
        if fingerprint is not None:
            query = query.where(table.c.fingerprint == fingerprint)
        with self._connect() as conn:
            rows = conn.execute(query).all()
        return self._checked(rows, _study, "study")

    def study(self, name: str) -> StudyRow | None:
        return next((row for row in self.studies() if row.study_name == name), None)

    def best(self, study_name: str) -> BestRow | None:
        with self._connect() as conn:
            row = conn.execute(sa.select(schema.best).where(schema.best.c.study_name == study_name)).first()
        if row is None:
            return None
        values = {k: v for k, v in row._mapping.items() if k != "created_at"}
        try:
            return _best(values)
        except DamagedRow as e:
            raise DamagedData(
                f"database {self.display_url}: the stored answer of study {study_name!r} is damaged: {e}"
            ) from None

    def save_best(self, row: BestRow) -> None:
        with self._connect(write=True) as conn:
            conn.execute(sa.delete(schema.best).where(schema.best.c.study_name == row.study_name))
            conn.execute(sa.insert(schema.best).values(**row.__dict__, created_at=now()))


def _best(values: dict[str, Any]) -> BestRow:
    """The row as a BestRow, every field checked: it is printed as a command line (``best --format``), put
    in a page (``report``) and answers every later run.

    Raises:
        DamagedRow: a field is not what autotune stores there.
    """
    study_name_of(values)
    whole_of(values, "trial_number")
    whole_of(values, "batch_size", 1)
    whole_of(values, "peak_bytes")
    whole_of(values, "verified_peak_bytes")
    whole_of(values, "readings", optional=True)
    number_of(values, "samples_per_sec")
    number_of(values, "verified_samples_per_sec")
    number_of(values, "samples_per_sec_low", optional=True)
    number_of(values, "samples_per_sec_high", optional=True)
    plain_text_of(values, "plan")
    plain_text_of(values, "certainty", optional=True)
    return BestRow(**values)


def _study(values: dict[str, Any]) -> StudyRow:
    """The row as a StudyRow, every field checked.

    Raises:
        DamagedRow: a field is not what autotune stores there.
    """
    name = study_name_of(values)
    budget, headroom, space = values["budget_bytes"], values["headroom"], json_of(values, "space")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
        raise DamagedRow(f"its budget {budget!r} is not a number of bytes")
    if not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise DamagedRow(f"its headroom {headroom!r} is not a fraction")
    if not isinstance(space, dict):
        raise DamagedRow("its search space is not a JSON object")
    return StudyRow(
        name,
        text_of(values, "fingerprint"),
        text_of(values, "study_key"),
        budget,
        float(headroom),
        space,
        text_of(values, "script"),
    )
