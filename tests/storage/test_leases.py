"""Leases at the storage level, on SQLite and on a real PostgreSQL server: a configuration goes to exactly
one claimer, also between the device threads of one worker (which share its worker id), and a claim whose
first try committed before its connection was lost is still recognised as its own when retried."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import sqlalchemy as sa

from autotune.core.errors import StorageError
from autotune.storage import LeaseKind, LeaseState, Store, open_store

WORKER = "host:1234:5678"


def test_sibling_threads_of_one_worker_never_share_a_claim(storage) -> None:
    store = open_store(storage)
    barrier = threading.Barrier(4)
    won: list[object] = []

    def claim(device: str) -> None:
        barrier.wait()
        for batch in range(1, 21):
            lease = store.claim("s", LeaseKind.TRIAL, batch, "none", 0, WORKER, device)
            if lease is not None:
                won.append((batch, device))

    threads = [threading.Thread(target=claim, args=(f"cuda:{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(batch for batch, _ in won) == list(range(1, 21))  # each configuration exactly once
    assert {(x.batch_size, x.device) for x in store.leases("s")} == set(won)


def lose_the_first_commit(monkeypatch) -> None:
    """The first write commits, then its answer is lost with the connection (the store retries it)."""
    real = Store._connect
    calls = {"n": 0}

    @contextmanager
    def commit_then_lose_the_connection(self: Store, write: bool = False):  # type: ignore[no-untyped-def]
        with real(self, write) as conn:
            yield conn
        calls["n"] += 1
        if write and calls["n"] == 1:
            lost = sa.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))
            raise StorageError("connection lost") from lost

    monkeypatch.setattr(Store, "_connect", commit_then_lose_the_connection)


def test_a_retried_claim_that_had_committed_is_its_own(storage, monkeypatch) -> None:
    store = open_store(storage)
    lose_the_first_commit(monkeypatch)
    lease = store.claim("s", LeaseKind.TRIAL, 8, "none", 0, WORKER, "cuda:0")
    assert lease is not None and (lease.batch_size, lease.worker, lease.state) == (
        8,
        WORKER,
        LeaseState.RUNNING,
    )
    assert len(store.leases("s")) == 1
    # A first try that meets the row is never its own, even for the same worker id (another thread's).
    assert store.claim("s", LeaseKind.TRIAL, 8, "none", 0, WORKER, "cuda:1") is None


def test_one_verification_of_a_study_at_a_time(storage) -> None:
    """Two runs of one study under load each found no verification running, then claimed their own leader
    (none@48 and A:1@48 tied) and verified it: twice the work, and the later answer overwrote the earlier.
    Eight threads racing to verify eight configurations: exactly one wins; the others wait for it to end."""
    store = open_store(storage)
    barrier = threading.Barrier(8)
    won: list[object] = []

    def claim(batch: int) -> None:
        barrier.wait()
        lease = store.claim_verification("s", batch, "none", f"host:{batch}:1", "cpu")
        if lease is not None:
            won.append(lease)

    threads = [threading.Thread(target=claim, args=(batch,)) for batch in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    (first,) = won
    assert [(x.batch_size, x.state) for x in store.leases("s")] == [(first.batch_size, LeaseState.RUNNING)]
    other = 9 - first.batch_size
    assert store.claim_verification("s", other, "none", WORKER, "cpu") is None  # still running
    assert store.claim_verification("s", first.batch_size, "none", WORKER, "cpu") is None  # its own
    store.end_lease(first.id, LeaseState.FAILED, "verification: over the limit")
    second = store.claim_verification("s", other, "none", WORKER, "cpu")
    assert second is not None and (second.batch_size, second.worker, second.state) == (
        other,
        WORKER,
        LeaseState.RUNNING,
    )
    assert store.claim_verification("s", first.batch_size, "none", WORKER, "cpu") is None  # verified once
    assert store.claim_verification("t", first.batch_size, "none", WORKER, "cpu") is not None  # another study
    # Once one is done, the study is answered: a run that read no answer just before it was stored claims
    # none (two runs of one study under load verified two leaders, the later answer overwriting the first).
    store.end_lease(second.id, LeaseState.DONE)
    third = next(b for b in range(1, 9) if b not in (first.batch_size, other))
    assert store.claim_verification("s", third, "none", WORKER, "cpu") is None


def test_sibling_threads_of_one_worker_never_share_a_verification(storage) -> None:
    store = open_store(storage)
    barrier = threading.Barrier(4)
    won: list[str] = []

    def claim(device: str) -> None:
        barrier.wait()
        if store.claim_verification("s", 8, "none", WORKER, device) is not None:
            won.append(device)

    threads = [threading.Thread(target=claim, args=(f"cuda:{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and [x.device for x in store.leases("s")] == won


def test_a_retried_verification_claim_that_had_committed_is_its_own(storage, monkeypatch) -> None:
    store = open_store(storage)
    lose_the_first_commit(monkeypatch)
    lease = store.claim_verification("s", 8, "none", WORKER, "cpu")
    assert lease is not None and (lease.batch_size, lease.kind, lease.worker) == (8, LeaseKind.VERIFY, WORKER)
    assert len(store.leases("s")) == 1
