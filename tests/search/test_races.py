"""Workers racing on one trial, in one process with a storage (engine and Optuna cache) per worker, as
separate worker processes have: failing a dead worker's trials, and a result told after its trial was
failed as stale. Both once took a worker down with UpdateFinishedTrialError (a CI run of the killed-worker
test in test_daemon.py: two workers failed the dead worker's trial at once). The orders in which two
workers can fail a dead worker's lease and its trial all end in the same database."""

from __future__ import annotations

import threading

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from autotune.core.protocol import Outcome
from autotune.search.optuna_trials import fail_trial, tell_result
from autotune.search.recovery import Recovered, Recovery, failure_note
from autotune.storage import LeaseKind, Store, open_store
from autotune.trials.result import TrialResult

MiB = 1 << 20
SPACE = {"batch_size": CategoricalDistribution((8, 16)), "plan": CategoricalDistribution(("none", "all"))}
AT_16_ALL = {"batch_size": CategoricalDistribution((16,)), "plan": CategoricalDistribution(("all",))}


def study_of(store: Store) -> optuna.Study:
    return optuna.create_study(
        study_name="races", storage=store.optuna, direction="maximize", load_if_exists=True
    )


def worker_s_view(url: str) -> optuna.Study:
    """The study as one worker sees it: its own store, engine and trial cache."""
    return study_of(open_store(url))


def test_two_workers_failing_the_same_trials_at_once_both_carry_on(storage) -> None:
    asker = worker_s_view(storage)
    numbers = [asker.ask(SPACE).number for _ in range(40)]
    views = [worker_s_view(storage), worker_s_view(storage)]
    start = threading.Barrier(2)
    errors: list[BaseException] = []
    failed: list[list[bool]] = [[], []]

    def fail_all(i: int) -> None:
        start.wait()
        try:
            for n in numbers:
                failed[i].append(fail_trial(views[i], n, f"failed by worker {i}"))
        except BaseException as e:  # the assertion below shows it
            errors.append(e)

    threads = [threading.Thread(target=fail_all, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    assert [len(f) for f in failed] == [40, 40]
    assert all(a or b for a, b in zip(*failed, strict=True))  # every trial failed by one of them at least
    trials = worker_s_view(storage).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL] * 40
    assert {t.user_attrs["note"] for t in trials} <= {"failed by worker 0", "failed by worker 1"}
    assert fail_trial(views[0], numbers[0], "again") is False  # finished: left as it is
    assert worker_s_view(storage).trials[0].user_attrs["note"] != "again"


def result(outcome: Outcome, peak_mib: int, samples_per_sec: float | None) -> TrialResult:
    return TrialResult(
        outcome=outcome,
        batch_size=16,
        plan="all",
        device="cpu",
        device_name="cpu",
        peak_bytes=peak_mib * MiB,
        memory_method="rss",
        samples_per_sec=samples_per_sec,
        step_seconds=(0.1, 0.1),
        wall_seconds=2.0,
        log_dir="/logs/trial-0",
        error=None if outcome is Outcome.COMPLETE else "RuntimeError: boom\n",
    )


def test_a_measurement_told_after_its_trial_was_failed_as_stale_is_kept_as_a_late_trial(storage) -> None:
    mine, theirs = worker_s_view(storage), worker_s_view(storage)
    trial = mine.ask(AT_16_ALL)
    trial.set_user_attr("worker", "host-a:1:1")
    # Another worker took this one for dead (its heartbeats stalled) while it was still measuring.
    assert fail_trial(theirs, trial.number, "worker host-a:1:1 stopped heartbeating for 60s") is True

    tell_result(mine, trial, result(Outcome.COMPLETE, 150, 123.5), limit=200 * MiB)

    stale, late = worker_s_view(storage).get_trials()
    assert (stale.number, stale.state, stale.user_attrs["note"]) == (
        0,
        TrialState.FAIL,
        "worker host-a:1:1 stopped heartbeating for 60s",
    )
    assert (late.number, late.state, late.value, late.params) == (
        1,
        TrialState.COMPLETE,
        123.5,
        {"batch_size": 16, "plan": "all"},
    )
    assert late.constraints == {"0": -50.0}  # one constraint, in the list form optuna-dashboard reads
    assert {
        k: late.user_attrs[k] for k in ("worker", "outcome", "peak_bytes", "samples_per_sec", "note")
    } == {
        "worker": "host-a:1:1",
        "outcome": "complete",
        "peak_bytes": 150 * MiB,
        "samples_per_sec": 123.5,
        "note": "late result of trial 0, failed as stale",
    }


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.TIMEOUT])
def test_a_failure_told_after_its_trial_was_failed_as_stale_adds_nothing(storage, outcome) -> None:
    mine, theirs = worker_s_view(storage), worker_s_view(storage)
    trial = mine.ask(SPACE)
    fail_trial(theirs, trial.number, "worker host-a:1:1 died")

    tell_result(mine, trial, result(outcome, 30, None), limit=200 * MiB)

    (stale,) = worker_s_view(storage).get_trials()
    assert (stale.state, stale.user_attrs["note"]) == (TrialState.FAIL, "worker host-a:1:1 died")


def test_a_retried_tell_whose_first_attempt_committed_stores_one_trial(storage) -> None:
    """The storage retries a write whose answer was lost: the second tell finds the trial told."""
    mine = worker_s_view(storage)
    trial = mine.ask(SPACE)
    tell_result(mine, trial, result(Outcome.COMPLETE, 150, 99.0), limit=200 * MiB)
    tell_result(mine, trial, result(Outcome.COMPLETE, 150, 99.0), limit=200 * MiB)

    (told,) = worker_s_view(storage).get_trials()
    assert (told.state, told.value, told.constraints) == (TrialState.COMPLETE, 99.0, {"0": -50.0})


def a_worker(url: str, name: str) -> Recovery:
    """Another live worker's view of the study's leases; a lease is dead once its beats stop (grace 0)."""
    store = open_store(url)
    return Recovery(study_of(store), store, name, grace=0.0)


def a_dead_worker_s_trial(url: str) -> tuple[int, int]:
    """A trial measured by a worker on another host that died (its lease beats no more): (trial, lease)."""
    store = open_store(url)
    lease = store.claim("races", LeaseKind.TRIAL, 16, "all", 0, "host-b:7:7", "cuda:0")
    assert lease is not None
    trial = worker_s_view(url).ask(AT_16_ALL)
    trial.set_user_attr("worker", "host-b:7:7")
    trial.set_user_attr("lease", lease.id)
    store.set_lease_trial(lease.id, trial.number)
    return trial.number, lease.id


NOTE = "worker host-b:7:7 stopped heartbeating for 0s; retried once"


def after(url: str, number: int, lease_id: int) -> tuple[str, str, str | None, list[tuple[str, int]]]:
    store = open_store(url)
    trial = worker_s_view(url).trials[number]
    leases = store.leases("races")
    failed = next(x for x in leases if x.id == lease_id)
    return (
        trial.state.name,
        trial.user_attrs["note"],
        failed.note,
        [(x.state, x.attempt) for x in leases if x.id != lease_id],
    )


def test_the_worker_that_fails_a_dead_lease_fails_its_trial_with_the_same_note(storage) -> None:
    number, lease_id = a_dead_worker_s_trial(storage)
    other = a_worker(storage, "host-a:1:1")
    assert other.recover() == Recovered(trials=0, retries=0)  # first sight of the lease's beats
    assert other.recover() == Recovered(trials=1, retries=1)  # unchanged since: dead

    assert after(storage, number, lease_id) == ("FAIL", NOTE, NOTE, [("queued", 1)])


def test_a_worker_that_finds_the_trial_orphaned_first_leaves_the_same_database(storage) -> None:
    """Worker A fails the lease; before A fails the trial, worker B finds it orphaned and fails it."""
    number, lease_id = a_dead_worker_s_trial(storage)
    a, b = a_worker(storage, "host-a:1:1"), a_worker(storage, "host-a:2:2")
    lease = next(x for x in a.store.leases("races") if x.id == lease_id)
    why = "worker host-b:7:7 stopped heartbeating for 0s"
    assert a.store.fail_if_silent(lease.id, lease.beats, failure_note(lease, why))  # A's recover, part 1
    assert b.recover() == Recovered(trials=1, retries=0)  # B: a RUNNING trial whose lease ended
    a._after_failure(lease, failure_note(lease, why))  # A's recover, part 2: the trial is failed already

    assert after(storage, number, lease_id) == ("FAIL", NOTE, NOTE, [("queued", 1)])


def test_a_worker_that_died_before_asking_its_trial_leaves_a_retry_and_no_trial_to_fail(storage) -> None:
    """A worker claimed a configuration and died before asking its trial (a driver killed between the
    two: a CI run of tests/cluster/test_ray_cluster.py's resume test said "3 interrupted trial(s)" where
    two trials had failed). The count says what was failed and what was queued, each as it is."""
    store = open_store(storage)
    lease = store.claim("races", LeaseKind.TRIAL, 8, "none", 0, "host-b:7:7", "cuda:0")
    assert lease is not None
    number, _ = a_dead_worker_s_trial(storage)
    other = a_worker(storage, "host-a:1:1")
    assert other.recover() == Recovered(trials=0, retries=0)  # first sight of the leases' beats

    recovered = other.recover()

    assert recovered == Recovered(trials=1, retries=2)
    assert str(recovered) == "1 interrupted trial(s) failed; 2 configuration(s) queued for one retry"
    assert str(Recovered(trials=2, retries=2)) == "2 interrupted trial(s) failed and queued for one retry"
    assert worker_s_view(storage).trials[number].state is TrialState.FAIL
    queued = [(x.batch_size, x.plan, x.attempt) for x in store.leases("races") if x.state == "queued"]
    assert sorted(queued) == [(8, "none", 1), (16, "all", 1)]
