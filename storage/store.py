"""The Store: Optuna's RDB storage plus autotune's tables, in one database."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import optuna
import sqlalchemy as sa

from autotune.errors import StorageError
from autotune.storage import database, schema
from autotune.storage.migrate import migrate


@dataclass(frozen=True)
class StudyRow:
    study_name: str
    fingerprint: str
    study_key: str
    budget_bytes: int
    headroom: float
    space: dict[str, Any]
    script: str = ""


@dataclass(frozen=True)
class BestRow:
    study_name: str
    trial_number: int
    batch_size: int
    plan: str
    peak_bytes: int
    samples_per_sec: float
    verified_peak_bytes: int
    verified_samples_per_sec: float


class Store:
    """One database. ``optuna`` is the RDBStorage that studies are created and loaded with."""

    def __init__(self, optuna_storage: optuna.storages.RDBStorage, display_url: str) -> None:
        self.optuna = optuna_storage
        self.display_url = display_url
        self._engine: sa.Engine = optuna_storage.engine

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sa.Connection]:
        try:
            with self._engine.begin() if write else self._engine.connect() as conn:
                yield conn
        except sa.exc.SQLAlchemyError as e:
            raise StorageError(f"database {self.display_url}: {_first_line(e)}") from e

    # Workloads ---------------------------------------------------------------------------------------
    def workload(self, fingerprint: str) -> dict[str, Any] | None:
        with self._connect() as conn:
            row = conn.execute(
                sa.select(schema.workloads).where(schema.workloads.c.fingerprint == fingerprint)
            ).first()
        return dict(row._mapping) if row else None

    def add_workload(
        self, fingerprint: str, script: str, command: str, device: str, details: dict[str, Any]
    ) -> None:
        values = dict(
            fingerprint=fingerprint,
            script=script,
            command=command,
            device=device,
            details=details,
            created_at=_now(),
        )
        with self._connect(write=True) as conn:
            exists = conn.execute(
                sa.select(schema.workloads.c.fingerprint).where(schema.workloads.c.fingerprint == fingerprint)
            ).first()
            if not exists:
                conn.execute(sa.insert(schema.workloads).values(**values))

    def set_discovery(
        self, fingerprint: str, candidates: list[dict[str, Any]], discovery: dict[str, Any]
    ) -> None:
        with self._connect(write=True) as conn:
            conn.execute(
                sa.update(schema.workloads)
                .where(schema.workloads.c.fingerprint == fingerprint)
                .values(candidates=candidates, discovery=discovery)
            )

    # Studies -----------------------------------------------------------------------------------------
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
                        created_at=_now(),
                    )
                )

    def studies(self, fingerprint: str | None = None) -> list[StudyRow]:
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

    def forget_study(self, name: str) -> None:
        """Delete a study, its trials and its best plan (``--force``)."""
        with self._connect(write=True) as conn:
            conn.execute(sa.delete(schema.best).where(schema.best.c.study_name == name))
            conn.execute(sa.delete(schema.studies).where(schema.studies.c.study_name == name))
        with suppress(KeyError):  # no Optuna study of that name: nothing to delete
            optuna.delete_study(study_name=name, storage=self.optuna)

    # Best plans --------------------------------------------------------------------------------------
    def best(self, study_name: str) -> BestRow | None:
        with self._connect() as conn:
            row = conn.execute(sa.select(schema.best).where(schema.best.c.study_name == study_name)).first()
        return BestRow(**{k: v for k, v in row._mapping.items() if k != "created_at"}) if row else None

    def save_best(self, row: BestRow) -> None:
        with self._connect(write=True) as conn:
            conn.execute(sa.delete(schema.best).where(schema.best.c.study_name == row.study_name))
            conn.execute(sa.insert(schema.best).values(**row.__dict__, created_at=_now()))


def open_store(url: str) -> Store:
    """Open (creating or migrating if needed) the database at SQLAlchemy ``url``.

    Raises:
        StorageError: a bad URL, an unreadable or corrupt file, or an incompatible schema; one line
            that names the database with its password hidden.
    """
    parsed = database.parse_url(url)
    display = database.redact(parsed)
    path = database.sqlite_path(parsed)
    try:
        with database.creation_lock(parsed):
            if path is not None:
                database.prepare_sqlite(path)
            storage = optuna.storages.RDBStorage(
                database.escape_for_optuna(parsed.render_as_string(hide_password=False)),
                engine_kwargs=database.engine_kwargs(parsed),
            )
            migrate(storage.engine, path)
    except sa.exc.SQLAlchemyError as e:
        raise StorageError(f"cannot open the database {display}: {_first_line(e)}") from e
    except RuntimeError as e:  # Optuna: its own schema is older or newer than the installed optuna
        raise StorageError(f"database {display}: {_first_line(e)}") from e
    except OSError as e:
        raise StorageError(f"cannot open the database {display}: {e}") from e
    return Store(storage, display)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__
