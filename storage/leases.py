"""Leases (``autotune_leases``): which worker evaluates which configuration of a study.

A lease is inserted before its trial is asked for; its unique key (study, kind, batch size, plan, attempt)
lets exactly one worker win a configuration on any database. See schema.py for the table.
"""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa

from autotune.core.errors import DamagedData, StorageError
from autotune.storage import schema
from autotune.storage.base import (
    DamagedRow,
    Tables,
    now,
    plain_text_of,
    study_name_of,
    text_of,
    whole_of,
)
from autotune.storage.rows import Lease, LeaseKind, LeaseState


class LeaseTables(Tables):
    def __init__(self, engine: sa.Engine, display_url: str) -> None:
        super().__init__(engine, display_url)
        # The lease key this thread last tried to insert, until the insert is answered: tells a retried
        # insert (whose first try may have committed) from a first try. Per thread, because the device
        # threads of one worker share its worker id: a sibling's lease is not ours.
        self._inserting = threading.local()

    def claim(
        self, study: str, kind: LeaseKind, batch: int, plan: str, attempt: int, worker: str, device: str
    ) -> Lease | None:
        """Take the configuration for ``worker``: None if any worker has taken it before (unique key)."""
        return self._insert_lease(study, kind, batch, plan, attempt, LeaseState.RUNNING, worker, device, None)

    def claim_verification(self, study: str, batch: int, plan: str, worker: str, device: str) -> Lease | None:
        """Take the verification of (``batch``, ``plan``) for ``worker``: None if any worker has taken it
        before, or another verification of ``study`` is running, queued or done. One verification at a
        time: two runs of a study under load each found none running, then each claimed its own leader (two
        tied configurations) and verified it, the later answer overwriting the earlier. And none after one
        is done: a run that read no answer stored just before another run's verification stored it and
        ended found none running, and verified the next configuration (a loaded machine's two runs of one
        study). The check and the insert are one statement (SQLite runs a write statement alone), on
        PostgreSQL behind a lock on the study's verifications held to the commit (READ COMMITTED would let
        two inserts pass)."""
        kind, leases = LeaseKind.VERIFY, schema.leases
        lease = Lease(0, study, kind, batch, plan, 0, LeaseState.RUNNING, worker, device, None, 0, None)
        values = {**_columns(lease), "updated_at": now()}
        values.pop("id")
        ours = (leases.c.study_name == study, leases.c.kind == kind.value)
        busy = sa.exists().where(
            *ours,
            leases.c.state.in_([LeaseState.RUNNING.value, LeaseState.QUEUED.value, LeaseState.DONE.value]),
        )
        taken = sa.exists().where(
            *ours, leases.c.batch_size == batch, leases.c.plan == plan, leases.c.attempt == 0
        )
        row = sa.select(*(sa.literal(v, leases.c[k].type).label(k) for k, v in values.items()))
        try:
            with self._connect(write=True) as conn:
                if conn.dialect.name == "postgresql":
                    lock = f"autotune verification {study}"
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": lock})
                conn.execute(sa.insert(leases).from_select(list(values), row.where(~busy, ~taken)))
        except StorageError as e:
            if not isinstance(e.__cause__, sa.exc.IntegrityError):
                raise  # transient: a retry inserts nothing if this one committed, and finds it below
            return None
        # Ours: inserted now, or by this thread's earlier try that committed before its connection was lost;
        # a sibling device thread of this worker (same worker id) holds it under its own device.
        mine = self.lease(study, kind, batch, plan, 0)
        held = mine is not None and (mine.worker, mine.device, mine.state) == (
            worker,
            device,
            LeaseState.RUNNING,
        )
        return mine if held else None

    def take_slot(self, study: str, slots: int, worker: str) -> int | None:
        """One of the study's ``slots`` trial slots (kind ``slot``, numbered from 0), or None when every
        slot is taken: with several workers, ``--trials N`` means N, not N plus one per worker."""
        for _ in range(slots):
            taken = {x.batch_size for x in self.leases(study, kinds=(LeaseKind.SLOT,))}
            free = next((i for i in range(slots) if i not in taken), None)
            if free is None:
                return None
            slot = self._insert_lease(study, LeaseKind.SLOT, free, "", 0, LeaseState.DONE, worker, None, None)
            if slot is not None:
                return free
        return None

    def queue(self, study: str, kind: LeaseKind, batch: int, plan: str, attempt: int, note: str) -> bool:
        """Queue a configuration for any worker to take; False if that attempt exists already."""
        queued = self._insert_lease(study, kind, batch, plan, attempt, LeaseState.QUEUED, None, None, note)
        return queued is not None

    def _insert_lease(
        self,
        study: str,
        kind: LeaseKind,
        batch: int,
        plan: str,
        attempt: int,
        state: LeaseState,
        worker: str | None,
        device: str | None,
        note: str | None,
    ) -> Lease | None:
        kind = LeaseKind(kind)  # the value checked where it enters the table
        lease = Lease(0, study, kind, batch, plan, attempt, state, worker, device, None, 0, note)
        key = (study, kind, batch, plan, attempt, worker)
        retried = getattr(self._inserting, "key", None) == key
        self._inserting.key = key
        try:
            with self._connect(write=True) as conn:
                values = {**_columns(lease), "updated_at": now()}
                values.pop("id")
                inserted = conn.execute(sa.insert(schema.leases).values(**values)).inserted_primary_key
        except StorageError as e:
            if not isinstance(e.__cause__, sa.exc.IntegrityError):
                raise  # transient: the caller's retry comes back here with ``retried`` set
            self._inserting.key = None
            # Ours after all, if this thread's earlier try committed before its connection was lost.
            mine = self.lease(study, kind, batch, plan, attempt) if retried else None
            return mine if mine is not None and worker is not None and mine.worker == worker else None
        self._inserting.key = None
        if inserted is None:  # SQLAlchemy returns the key of every single-row insert on our dialects
            raise StorageError(f"database {self.display_url}: the new lease's id was not returned")
        return Lease(**{**lease.__dict__, "id": inserted[0]})

    def take_queued(
        self, study: str, worker: str, device: str, kinds: tuple[LeaseKind, ...] | None = None
    ) -> Lease | None:
        """Take the oldest queued lease of ``study``; None if there is none (or others took them first)."""
        for lease in self.leases(study, (LeaseState.QUEUED,), kinds):
            running = LeaseState.RUNNING
            with self._connect(write=True) as conn:
                taken = conn.execute(
                    sa.update(schema.leases)
                    .where(schema.leases.c.id == lease.id, schema.leases.c.state == LeaseState.QUEUED.value)
                    .values(state=running.value, worker=worker, device=device, updated_at=now())
                ).rowcount
            if taken == 1:
                return Lease(**{**lease.__dict__, "state": running, "worker": worker, "device": device})
        return None

    def leases(
        self,
        study: str,
        states: tuple[LeaseState, ...] | None = None,
        kinds: tuple[LeaseKind, ...] | None = None,
    ) -> list[Lease]:
        query = (
            sa.select(schema.leases).where(schema.leases.c.study_name == study).order_by(schema.leases.c.id)
        )
        if states is not None:
            query = query.where(schema.leases.c.state.in_([LeaseState(s).value for s in states]))
        if kinds is not None:
            query = query.where(schema.leases.c.kind.in_([LeaseKind(k).value for k in kinds]))
        with self._connect() as conn:
            rows = conn.execute(query).all()
        return [self._parsed(dict(r._mapping), study) for r in rows]

    def _parsed(self, values: dict[str, Any], study: str) -> Lease:
        """Raises DamagedData: a damaged lease costs its study's run or job (never a worker): no lease of
        the study can be trusted to say what runs, or what ran."""
        try:
            return _lease(values)
        except DamagedRow as e:
            raise DamagedData(
                f"database {self.display_url}: lease {values.get('id')!r} of study {study!r} is damaged: {e}"
            ) from None

    def lease(self, study: str, kind: LeaseKind, batch: int, plan: str, attempt: int) -> Lease | None:
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
                    schema.leases.c.kind == LeaseKind.SLOT.value,
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

    def end_lease(self, lease_id: int, state: LeaseState, note: str | None = None) -> bool:
        """A running lease ends (``done`` or ``failed``); False if it was not running (failed as stale)."""
        return self._update_lease(lease_id, LeaseState.RUNNING, state=LeaseState(state).value, note=note)

    def release(self, lease_id: int, note: str) -> bool:
        """Give a running lease back to the queue, same attempt (a worker stopping is not a fault)."""
        queued = LeaseState.QUEUED.value
        return self._update_lease(
            lease_id, LeaseState.RUNNING, state=queued, worker=None, device=None, note=note
        )

    def fail_if_silent(self, lease_id: int, beats: int, note: str) -> bool:
        """Fail a running lease whose beats are still ``beats``; False if it moved on or another worker
        failed it first. Exactly one caller wins."""
        with self._connect(write=True) as conn:
            failed = conn.execute(
                sa.update(schema.leases)
                .where(
                    schema.leases.c.id == lease_id,
                    schema.leases.c.state == LeaseState.RUNNING.value,
                    schema.leases.c.beats == beats,
                )
                .values(state=LeaseState.FAILED.value, note=note, updated_at=now())
            )
            return failed.rowcount == 1

    def beat(self, worker: str) -> int:
        """One heartbeat for every running lease of ``worker``; how many there were."""
        with self._connect(write=True) as conn:
            return conn.execute(
                sa.update(schema.leases)
                .where(schema.leases.c.worker == worker, schema.leases.c.state == LeaseState.RUNNING.value)
                .values(beats=schema.leases.c.beats + 1, updated_at=now())
            ).rowcount

    def _update_lease(self, lease_id: int, only_from: LeaseState | None, **values: Any) -> bool:
        query = sa.update(schema.leases).where(schema.leases.c.id == lease_id)
        if only_from is not None:
            query = query.where(schema.leases.c.state == only_from.value)
        with self._connect(write=True) as conn:
            return conn.execute(query.values(**values, updated_at=now())).rowcount == 1


def _columns(lease: Lease) -> dict[str, Any]:
    """A lease as column values (enums as the text the table holds)."""
    return {**lease.__dict__, "kind": lease.kind.value, "state": lease.state.value}


def _lease(values: dict[str, Any]) -> Lease:
    """A lease row as autotune wrote it.

    Raises:
        DamagedRow: a column is not what autotune stores there: a batch size that is not a whole number
            (a writer of the database set ``1; touch x``, which a shell template would have run), an unknown
            kind or state, a worker id or plan with control characters.
    """
    values.pop("updated_at", None)
    try:
        kind = LeaseKind(values["kind"])
    except ValueError:
        raise DamagedRow(f"its kind {values['kind']!r} is not a lease kind") from None
    try:
        state = LeaseState(values["state"])
    except ValueError:
        raise DamagedRow(f"its state {values['state']!r} is not a lease state") from None
    whole_of(values, "batch_size", 0 if kind is LeaseKind.SLOT else 1)  # a slot lease's is its slot number
    for column in ("id", "attempt", "beats"):
        whole_of(values, column)
    whole_of(values, "trial_number", optional=True)
    plain_text_of(values, "plan")
    plain_text_of(values, "worker", optional=True)
    plain_text_of(values, "device", optional=True)
    text_of(values, "note", optional=True)
    study_name_of(values)
    return Lease(**{**values, "kind": kind, "state": state})
