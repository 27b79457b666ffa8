"""The Store: Optuna's RDB storage plus autotune's tables, in one database."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

from autotune.core.errors import StorageError
from autotune.storage import database, schema
from autotune.storage.database import retried
from autotune.storage.migrate import current_revision, migrate

if TYPE_CHECKING:
    from optuna.storages import RDBStorage


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
class JobRow:
    study_name: str
    script: str
    script_sha256: str | None
    spec: dict[str, Any]
    state: str  # schema.JOB_STATES
    submitted_by: str
    error: str | None = None


@dataclass(frozen=True)
class Lease:
    id: int
    study_name: str
    kind: str  # schema.LEASE_KINDS
    batch_size: int
    plan: str
    attempt: int
    state: str  # schema.LEASE_STATES
    worker: str | None
    device: str | None
    trial_number: int | None
    beats: int
    note: str | None


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
    """One database: autotune's tables, read and written here, and ``optuna``, the RDBStorage that studies
    are created and loaded with.

    Every method is retried while the database is locked or unreachable (see RetryingRDBStorage)."""

    def __init__(self, engine: sa.Engine, display_url: str, optuna_storage: Callable[[], RDBStorage]) -> None:
        """``optuna_storage`` returns Optuna's storage of this database; called once, on first use."""
        self.display_url = display_url
        self._engine = engine
        self._optuna_storage = optuna_storage
        self._optuna: RDBStorage | None = None
        self._optuna_lock = threading.Lock()
        # The lease key this thread last tried to insert, until the insert is answered: tells a retried
        # insert (whose first try may have committed) from a first try. Per thread, because the device
        # threads of one worker share its worker id: a sibling's lease is not ours.
        self._inserting = threading.local()

    @property
    def optuna(self) -> RDBStorage:
        with self._optuna_lock:
            if self._optuna is None:
                self._optuna = self._optuna_storage()
            return self._optuna

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
        """Delete a study, its trials, leases and best plan (``--force``)."""
        with self._connect(write=True) as conn:
            conn.execute(sa.delete(schema.leases).where(schema.leases.c.study_name == name))
            conn.execute(sa.delete(schema.best).where(schema.best.c.study_name == name))
            conn.execute(sa.delete(schema.studies).where(schema.studies.c.study_name == name))
        import optuna

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

    # Jobs --------------------------------------------------------------------------------------------
    def submit_job(self, row: JobRow) -> JobRow:
        """Record ``row`` unless a job of that name exists; either way, the stored job."""
        now = _now()
        try:
            with self._connect(write=True) as conn:
                conn.execute(sa.insert(schema.jobs).values(**row.__dict__, created_at=now, updated_at=now))
        except StorageError as e:
            if not isinstance(e.__cause__, sa.exc.IntegrityError):
                raise
        found = self.job(row.study_name)
        assert found is not None
        return found

    def job(self, name: str) -> JobRow | None:
        return next(iter(self.jobs(name=name)), None)

    def jobs(self, states: tuple[str, ...] | None = None, name: str | None = None) -> list[JobRow]:
        query = sa.select(schema.jobs).order_by(schema.jobs.c.created_at)
        if states is not None:
            query = query.where(schema.jobs.c.state.in_(states))
        if name is not None:
            query = query.where(schema.jobs.c.study_name == name)
        with self._connect() as conn:
            rows = conn.execute(query).all()
        return [JobRow(**{k: v for k, v in r._mapping.items() if k not in _TIMES}) for r in rows]

    def set_job_state(
        self, name: str, state: str, error: str | None = None, only_from: tuple[str, ...] | None = None
    ) -> bool:
        """Move a job to ``state`` (only from one of ``only_from``, if given); False if it was not there."""
        query = sa.update(schema.jobs).where(schema.jobs.c.study_name == name)
        if only_from is not None:
            query = query.where(schema.jobs.c.state.in_(only_from))
        with self._connect(write=True) as conn:
            return conn.execute(query.values(state=state, error=error, updated_at=_now())).rowcount == 1

    # Leases ------------------------------------------------------------------------------------------
    def claim(
        self, study: str, kind: str, batch: int, plan: str, attempt: int, worker: str, device: str
    ) -> Lease | None:
        """Take the configuration for ``worker``: None if any worker has taken it before (unique key)."""
        return self._insert_lease(study, kind, batch, plan, attempt, "running", worker, device, None)

    def take_slot(self, study: str, slots: int, worker: str) -> int | None:
        """One of the study's ``slots`` trial slots (kind ``slot``, numbered from 0), or None when every
        slot is taken: with several workers, ``--trials N`` means N, not N plus one per worker."""
        for _ in range(slots):
            taken = {x.batch_size for x in self.leases(study, kinds=("slot",))}
            free = next((i for i in range(slots) if i not in taken), None)
            if free is None:
                return None
            if self._insert_lease(study, "slot", free, "", 0, "done", worker, None, None) is not None:
                return free
        return None

    def queue(self, study: str, kind: str, batch: int, plan: str, attempt: int, note: str) -> bool:
        """Queue a configuration for any worker to take; False if that attempt exists already."""
        return self._insert_lease(study, kind, batch, plan, attempt, "queued", None, None, note) is not None

    def _insert_lease(
        self,
        study: str,
        kind: str,
        batch: int,
        plan: str,
        attempt: int,
        state: str,
        worker: str | None,
        device: str | None,
        note: str | None,
    ) -> Lease | None:
        values = dict(
            study_name=study,
            kind=kind,
            batch_size=batch,
            plan=plan,
            attempt=attempt,
            state=state,
            worker=worker,
            device=device,
            beats=0,
            note=note,
            updated_at=_now(),
        )
        key = (study, kind, batch, plan, attempt, worker)
        retried = getattr(self._inserting, "key", None) == key
        self._inserting.key = key
        try:
            with self._connect(write=True) as conn:
                inserted = conn.execute(sa.insert(schema.leases).values(**values)).inserted_primary_key
                assert inserted is not None
                lease_id = inserted[0]
        except StorageError as e:
            if not isinstance(e.__cause__, sa.exc.IntegrityError):
                raise  # transient: the caller's retry comes back here with ``retried`` set
            self._inserting.key = None
            # Ours after all, if this thread's earlier try committed before its connection was lost.
            mine = self.lease(study, kind, batch, plan, attempt) if retried else None
            return mine if mine is not None and worker is not None and mine.worker == worker else None
        self._inserting.key = None
        return Lease(id=lease_id, trial_number=None, **_without(values, "updated_at"))

    def take_queued(
        self, study: str, worker: str, device: str, kinds: tuple[str, ...] | None = None
    ) -> Lease | None:
        """Take the oldest queued lease of ``study``; None if there is none (or others took them first)."""
        for lease in self.leases(study, ("queued",), kinds):
            with self._connect(write=True) as conn:
                taken = conn.execute(
                    sa.update(schema.leases)
                    .where(schema.leases.c.id == lease.id, schema.leases.c.state == "queued")
                    .values(state="running", worker=worker, device=device, updated_at=_now())
                ).rowcount
            if taken == 1:
                return Lease(**{**lease.__dict__, "state": "running", "worker": worker, "device": device})
        return None

    def leases(
        self, study: str, states: tuple[str, ...] | None = None, kinds: tuple[str, ...] | None = None
    ) -> list[Lease]:
        query = (
            sa.select(schema.leases).where(schema.leases.c.study_name == study).order_by(schema.leases.c.id)
        )
        if states is not None:
            query = query.where(schema.leases.c.state.in_(states))
        if kinds is not None:
            query = query.where(schema.leases.c.kind.in_(kinds))
        with self._connect() as conn:
            rows = conn.execute(query).all()
        return [Lease(**_without(dict(r._mapping), "updated_at")) for r in rows]

    def lease(self, study: str, kind: str, batch: int, plan: str, attempt: int) -> Lease | None:
        return next(
            (
                x
                for x in self.leases(study, kinds=(kind,))
                if (x.batch_size, x.plan, x.attempt) == (batch, plan, attempt)
            ),
            None,
        )

    def forget_slot(self, study: str, slot: int) -> None:
        with self._connect(write=True) as conn:
            conn.execute(
                sa.delete(schema.leases).where(
                    schema.leases.c.study_name == study,
                    schema.leases.c.kind == "slot",
                    schema.leases.c.batch_size == slot,
                )
            )

    def forget_lease(self, lease_id: int) -> None:
        with self._connect(write=True) as conn:
            conn.execute(sa.delete(schema.leases).where(schema.leases.c.id == lease_id))

    def forget_leases(self, study: str) -> None:
        with self._connect(write=True) as conn:
            conn.execute(sa.delete(schema.leases).where(schema.leases.c.study_name == study))

    def set_lease_trial(self, lease_id: int, number: int) -> None:
        self._update_lease(lease_id, None, trial_number=number)

    def end_lease(self, lease_id: int, state: str, note: str | None = None) -> bool:
        """A running lease ends (``done`` or ``failed``); False if it was not running (failed as stale)."""
        return self._update_lease(lease_id, "running", state=state, note=note)

    def release(self, lease_id: int, note: str) -> bool:
        """Give a running lease back to the queue, same attempt (a worker stopping is not a fault)."""
        return self._update_lease(lease_id, "running", state="queued", worker=None, device=None, note=note)

    def fail_if_silent(self, lease_id: int, beats: int, note: str) -> bool:
        """Fail a running lease whose beats are still ``beats``; False if it moved on or another worker
        failed it first. Exactly one caller wins."""
        with self._connect(write=True) as conn:
            return (
                conn.execute(
                    sa.update(schema.leases)
                    .where(
                        schema.leases.c.id == lease_id,
                        schema.leases.c.state == "running",
                        schema.leases.c.beats == beats,
                    )
                    .values(state="failed", note=note, updated_at=_now())
                ).rowcount
                == 1
            )

    def beat(self, worker: str) -> int:
        """One heartbeat for every running lease of ``worker``; how many there were."""
        with self._connect(write=True) as conn:
            return conn.execute(
                sa.update(schema.leases)
                .where(schema.leases.c.worker == worker, schema.leases.c.state == "running")
                .values(beats=schema.leases.c.beats + 1, updated_at=_now())
            ).rowcount

    def _update_lease(self, lease_id: int, only_from: str | None, **values: Any) -> bool:
        query = sa.update(schema.leases).where(schema.leases.c.id == lease_id)
        if only_from is not None:
            query = query.where(schema.leases.c.state == only_from)
        with self._connect(write=True) as conn:
            return conn.execute(query.values(**values, updated_at=_now())).rowcount == 1


_TIMES = ("created_at", "updated_at")


def _without(values: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k not in names}


def _retry_every_method(cls: type[Store]) -> None:
    for name, method in list(vars(cls).items()):
        if callable(method) and not name.startswith("_"):
            setattr(cls, name, retried(method))


_retry_every_method(Store)


def open_store(url: str, *, answering: bool = False) -> Store:
    """Open (creating or migrating if needed) the database at SQLAlchemy ``url``.

    ``answering``: for the commands that only answer from the database (best, studies, show). A database
    whose autotune tables are current opens without the creation lock, and Optuna's storage is built on
    first use: importing Optuna and building its storage was ~0.5 s of a 0.75 s ``autotune best``, which
    answers a verified winner from autotune's tables alone.

    Raises:
        StorageError: a bad URL, an unreadable or corrupt file, or an incompatible schema; one line
            that names the database (a SQLite file by its path, other URLs with the password hidden).
    """
    parsed = database.parse_url(url)
    display = database.redact(parsed)
    path = database.sqlite_path(parsed)
    name = str(path) if path is not None else display
    with _one_line_errors(name):
        if answering:
            engine = _engine_if_current(parsed, path)
            if engine is not None:
                return Store(engine, display, lambda: _optuna_storage(parsed, name))
        with database.creation_lock(parsed):
            if path is not None:
                database.prepare_sqlite(path)
            storage = _rdb_storage(parsed)
            migrate(storage.engine, path)
    return Store(storage.engine, display, lambda: storage)


def _engine_if_current(parsed: URL, path: Path | None) -> sa.Engine | None:
    """An engine on the database if its autotune tables are at HEAD (it needs no creation or migration)."""
    if path is not None and not path.exists():
        return None
    engine = sa.create_engine(parsed, **database.engine_kwargs(parsed))
    if current_revision(engine) == schema.HEAD_REVISION:
        return engine
    engine.dispose()
    return None


def _optuna_storage(parsed: URL, name: str) -> RDBStorage:
    """Optuna's storage of a database opened for answering: built under the creation lock, since Optuna
    creates its tables where they are missing."""
    with _one_line_errors(name), database.creation_lock(parsed):
        return _rdb_storage(parsed)


def _rdb_storage(parsed: URL) -> RDBStorage:
    from autotune.storage.optuna_storage import RetryingRDBStorage

    return RetryingRDBStorage(
        database.escape_for_optuna(parsed.render_as_string(hide_password=False)),
        engine_kwargs=database.engine_kwargs(parsed),
    )


@contextmanager
def _one_line_errors(name: str) -> Iterator[None]:
    try:
        yield
    except sa.exc.SQLAlchemyError as e:
        raise StorageError(f"cannot open the database {name}: {_first_line(e)}") from e
    except RuntimeError as e:  # Optuna: its own schema is older or newer than the installed optuna
        raise StorageError(f"database {name}: {_first_line(e)}") from e
    except OSError as e:
        raise StorageError(f"cannot open the database {name}: {e}") from e


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__
