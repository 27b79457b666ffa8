"""Workloads, studies and their verified winners (``autotune_workloads``, ``autotune_studies``,
``autotune_best``)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from autotune.storage import schema
from autotune.storage.base import Tables, now
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
        with self._connect(write=True) as conn:
            exists = conn.execute(
                sa.select(schema.workloads.c.fingerprint).where(schema.workloads.c.fingerprint == fingerprint)
            ).first()
            if not exists:
                conn.execute(
                    sa.insert(schema.workloads).values(
                        fingerprint=fingerprint,
                        script=script,
                        command=command,
                        device=device,
                        details=details,
                        created_at=now(),
                    )
                )

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
        with self._connect(write=True) as conn:
            exists = conn.execute(
                sa.select(schema.studies.c.study_name).where(schema.studies.c.study_name == row.study_name)
            ).first()
            if not exists:
                conn.execute(
                    sa.insert(schema.studies).values(
                        study_name=row.study_name,
                        fingerprint=row.fingerprint,
                        study_key=row.study_key,
                        budget_bytes=row.budget_bytes,
                        headroom=row.headroom,
                        space=row.space,
                        created_at=now(),
                    )
                )

    def studies(self, fingerprint: str | None = None) -> list[StudyRow]:
        """Every study (of one workload), oldest first."""
        query = (
            sa.select(schema.studies, schema.workloads.c.script)
            .join(schema.workloads)
            .order_by(schema.studies.c.created_at)
        )
        if fingerprint is not None:
            query = query.where(schema.studies.c.fingerprint == fingerprint)
        with self._connect() as conn:
            rows = conn.execute(query).all()
        return [
            StudyRow(r.study_name, r.fingerprint, r.study_key, r.budget_bytes, r.headroom, r.space, r.script)
            for r in rows
        ]

    def study(self, name: str) -> StudyRow | None:
        return next((row for row in self.studies() if row.study_name == name), None)

    def best(self, study_name: str) -> BestRow | None:
        with self._connect() as conn:
            row = conn.execute(sa.select(schema.best).where(schema.best.c.study_name == study_name)).first()
        return BestRow(**{k: v for k, v in row._mapping.items() if k != "created_at"}) if row else None

    def save_best(self, row: BestRow) -> None:
        with self._connect(write=True) as conn:
            conn.execute(sa.delete(schema.best).where(schema.best.c.study_name == row.study_name))
            conn.execute(sa.insert(schema.best).values(**row.__dict__, created_at=now()))
