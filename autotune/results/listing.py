"""``autotune studies`` and ``autotune show``: what is stored, and how the probe's predictions compare
with what the trials measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.backends.probe import saving_per_sample
from autotune.backends.probe_report import ProbeReport, probe_report_from_json
from autotune.core.budget import Limit
from autotune.core.errors import InputError
from autotune.results.records import study_records
from autotune.search.records import TrialKind, TrialRecord
from autotune.storage import BestRow, JobState, Store, StudyRow


@dataclass(frozen=True)
class StudySummary:
    name: str
    script: str
    budget_bytes: int
    trials: int  # counted trials
    best_samples_per_sec: float | None
    state: JobState  # the job's; a study without a job: done (winner stored) or open
    budget_text: str = ""  # as submitted, for a job no worker has started yet (budget_bytes 0)
    # the command as the user gave it (a template's ``python train.py --bs {batch_size}``, a script's
    # ``train.py --epochs 1``): two studies of one script read apart (issue 44); the script where unknown
    command: str = ""


@dataclass(frozen=True)
class PlanCheck:
    """The probe's predicted saving of a plan beside the saving its measured trials show (bytes per sample)."""

    plan: str
    predicted: float
    measured: float | None  # None until the plan (and none) have been measured
    flagged: bool  # measured and more than FLAG_TOLERANCE away from the prediction

    @property
    def verdict(self) -> str:
        """In a word or two: ``ok``, ``FAR FROM PREDICTION``, or ``-`` before a trial of it."""
        return "FAR FROM PREDICTION" if self.flagged else ("ok" if self.measured is not None else "-")


FLAG_TOLERANCE = 0.25
FLAG_MEANING = (
    f"FAR FROM PREDICTION: the plan's measured saving per sample is more than {FLAG_TOLERANCE:.0%} away from "
    "what the probe predicted from the activations it saw. The search goes by measured peaks, so the answer "
    "stands; only the probe's estimate for that plan is not to be trusted (memory the probe cannot see, such "
    "as workspaces, or a recompute that keeps more than it frees). `autotune report` shows the trials behind "
    "each measured saving."
)


def not_run_line(records: Sequence[TrialRecord]) -> str | None:
    """What the search proposed but did not run, counted (None when it ran everything it proposed)."""
    skipped = sum(r.kind is TrialKind.SKIPPED for r in records)
    copies = sum(r.kind is TrialKind.COPY for r in records)
    parts = [
        f"{skipped} proposal(s) the memory model predicted cannot fit" if skipped else "",
        f"{copies} re-proposal(s) of a configuration measured already" if copies else "",
    ]
    return "not run: " + ", ".join(p for p in parts if p) if skipped or copies else None


def studies(store: Store) -> list[StudySummary]:
    """Every study, and every submitted job that no worker has started yet."""
    jobs = {job.study_name: job for job in store.jobs()}
    summaries = []
    for row in store.studies():
        records = study_records(store, row.study_name)
        stored = store.best(row.study_name)
        job = jobs.pop(row.study_name, None)
        workload = store.workload(row.fingerprint)
        summaries.append(
            StudySummary(
                row.study_name,
                row.script,
                row.budget_bytes,
                sum(r.counted for r in records),
                stored.verified_samples_per_sec if stored else None,
                job.state if job is not None else (JobState.DONE if stored else JobState.OPEN),
                command=workload.command if workload is not None and workload.command else row.script,
            )
        )
    for job in jobs.values():
        budget = job.spec.get("budget")  # a row's spec is whatever JSON object was stored: read, not trusted
        command = (
            " ".join(str(w) for w in words) if isinstance(words := job.spec.get("command"), list) else ""
        )
        summaries.append(
            StudySummary(
                job.study_name, job.script, 0, 0, None, job.state, str(budget or "?"), command or job.script
            )
        )
    return summaries


@dataclass(frozen=True)
class StudyReport:
    """What ``autotune show`` prints: a study, its trials, and each plan's predicted vs measured saving."""

    row: StudyRow
    records: list[TrialRecord]
    checks: list[PlanCheck]
    best: BestRow | None = None  # the verified winner, once there is one

    @property
    def limit_bytes(self) -> int:
        return Limit(self.row.budget_bytes, self.row.headroom).bytes


def show(store: Store, name: str) -> StudyReport:
    """A study's trials, and the honesty check of the probe's predictions against them.

    Raises:
        InputError: no study of that name.
    """
    row = store.study(name)
    if row is None:
        raise InputError(f"no study named {name!r} in {store.display_url}")
    records = study_records(store, name)
    workload = store.workload(row.fingerprint)
    discovery = workload.discovery if workload is not None and workload.discovery else {}
    probe = probe_report_from_json(discovery.get("probe"))
    return StudyReport(row, records, plan_checks(probe, records, row.space["plans"]), store.best(name))


def plan_checks(probe: ProbeReport | None, records: list[TrialRecord], plans: list[str]) -> list[PlanCheck]:
    """Each plan's saving per sample as the probe predicted it, beside what its trials measured."""
    if probe is None:
        return []
    from autotune.search.propose import model_of  # numpy: only show needs the fitted model

    model = model_of(records)
    checks = []
    for plan in plans:
        if plan == "none":
            continue
        predicted = saving_per_sample(probe, plan)
        measured = model.measured_saving(plan)
        flagged = measured is not None and abs(predicted - measured) > FLAG_TOLERANCE * max(
            abs(measured), 2**20
        )
        checks.append(PlanCheck(plan, predicted, measured, flagged))
    return checks
