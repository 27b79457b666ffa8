"""One stored trial as autotune reads it: a view over an Optuna FrozenTrial's params and user attributes.

Every trial carries a :class:`TrialKind`; only ``measured`` trials count against ``--trials``, and of those
not a re-measurement (a configuration read again because a busy machine made its readings disagree: a
second opinion on a trial counted already, like a verification).

A configuration *fits* by the majority of its memory readings (:func:`peak_verdict`): RSS on a shared CPU
machine reads one configuration tens of MiB apart from trial to trial, so one reading under the limit among
three over it is not an answer, and one over among three under is not a failure, unless that one ran longer
and its peak had passed the limit still rising when it ended: then the others are shorter views of its climb.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from autotune.core.budget import fits, peak_phase, with_rise
from autotune.core.enums import TextEnum
from autotune.core.errors import first_line
from autotune.core.protocol import Outcome, RankResult
from autotune.core.stats import Interval
from autotune.core.text import invisible_in
from autotune.hardware.load import Load
from autotune.hardware.meters import HOST_METHODS

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

MiB = 2**20


class ProposedBy(TextEnum):
    """Why a trial ran (its ``proposed_by`` user attribute)."""

    CALIBRATION = "calibration"  # the memory model's first trials (autotune.search.calibration)
    FRONTIER = "frontier"  # a plan's largest batch size measured or predicted to fit
    CANDIDATE = "candidate"  # a configuration under a plan's frontier whose optimistic speed could win
    BETWEEN = "between"  # a batch between two readings of a plan that fall where they should rise
    REMEASURE = "re-measure"  # a configuration read again: its readings disagreed (autotune.search.noise)
    FRESH = "fresh"  # a warm process read it just over the limit: read again in a process of its own
    UNTRIED = "untried"  # the memory model could not be calibrated: what is left, smallest peak first
    SAMPLER = "sampler"  # Optuna's sampler (--exhaustive past the frontier, or an uncalibrated model)
    VERIFICATION = "verification"  # the winner re-run longer (autotune.search.verify)
    RETRY = "retry"  # a dead worker's configuration, run once more (autotune.search.recovery)
    RELEASED = "released"  # a configuration a stopping worker released before it ran, run here
    SWEEP = "sweep"  # the plans without a reading, measured at one batch in one process (search.sweep)


REMEASURE = ProposedBy.REMEASURE  # a re-measurement's ``proposed_by``
# what reads a configuration measured already: a second opinion, taking no slot of the study
SECOND_OPINIONS = (REMEASURE, ProposedBy.FRESH)


class TrialKind(TextEnum):
    """Why a trial is in the study (its ``kind`` user attribute)."""

    MEASURED = "measured"  # ran here, for this study
    VERIFICATION = "verification"  # the winner re-run longer
    WARM_START = "warm-start"  # measured for another budget of the same workload
    SKIPPED = "skipped"  # the memory model predicted it cannot fit: not run
    COPY = "copy"  # the sampler proposed a configuration measured already: not run


READINGS = (TrialKind.MEASURED, TrialKind.WARM_START, TrialKind.VERIFICATION)  # what reads a configuration
# readings this close to the fastest's (or within its noise, if less) tie: the smaller peak wins
# (autotune.search.contenders.choose), and a candidate that could beat the incumbent by no more is not worth a
# trial (autotune.search.propose.MIN_GAIN)
TIE = 0.025
# A warm process on the host reads a configuration up to this much over a process of its own, at the same
# or a larger batch than those before it (autotune.trials.warm: 2-4%; never a smaller one)
WARM_EXCESS = 0.04


class Configuration(NamedTuple):
    """One point of the search space: equal to (and hashed as) the plain tuple ``(batch_size, plan)``."""

    batch_size: int
    plan: str

    @property
    def label(self) -> str:
        """How a run names it to the user: ``plan@batch_size``."""
        return f"{self.plan}@{self.batch_size}"


@dataclass(frozen=True)
class TrialRecord:
    number: int
    state: str  # Optuna's: COMPLETE, FAIL, PRUNED, RUNNING, WAITING
    kind: TrialKind
    batch_size: int | None
    plan: str | None
    outcome: Outcome | None = None
    peak_bytes: int | None = None
    samples_per_sec: float | None = None
    predicted_peak_bytes: int | None = None
    proposed_by: str | None = None
    log_dir: str | None = None
    error: str | None = None
    worker: str | None = None
    device: str | None = None
    note: str | None = None
    verified_peak_bytes: int | None = None
    verified_samples_per_sec: float | None = None
    samples_per_sec_low: float | None = None  # the reading's interval (autotune.core.stats)
    samples_per_sec_high: float | None = None
    grad_accum: int | None = None  # micro-batches per optimizer step the trial asked for
    ranks: tuple[RankResult, ...] = ()  # a multi-process trial's ranks: each one's peak and end
    warmup_peak_bytes: int | None = None  # the largest sample of its warm-up (compilation, autotuning...)
    steady_peak_bytes: int | None = None  # the largest sample of its measured steps
    memory_method: str | None = None  # the meter's: "rss", "rss-tree", "nvml"
    tokens_per_sec: float | None = None  # for (B, T) token inputs
    lengths: tuple[int, int] | None = None  # the shortest and longest step's sequence length
    load: Load | None = None  # how busy the machine was while it ran
    # each phase of the job it ran after its steps (eval, save): its largest memory sample
    phase_peaks: dict[str, int] | None = None
    own_checkpointing: str | None = None  # the checkpointing the script does by itself (a plan adds to it)
    settled: str | None = None  # a verification that ran on until its peak settled: why it ended then
    rising_bytes: int | None = None  # ... its peak's rise per 10 steps at its end, where it had not settled
    shifted: str | None = None  # its measurement stopped lengthening: the load changed as it ran
    slow_start: str | None = None  # a slow start it measured past: its first steps became warm-up
    startup_seconds: float | None = None  # from its launch to the end of its first step
    measured_seconds: float | None = None  # its measured steps together
    # its peak as the meter read it, where peak_bytes was carried to the job's longest inputs
    # (--max-seq-len: autotune.search.longest)
    measured_peak_bytes: int | None = None
    process: int | None = None  # a sweep's: the trial whose process measured it (the first plan's)
    warm_run: int | None = None  # a warm process's: which of its configurations this was, from 1

    @classmethod
    def from_frozen(cls, trial: FrozenTrial) -> TrialRecord:
        """The trial as autotune stored it.

        Raises:
            DamagedTrial: a parameter or attribute is not what autotune stores there (the database was
                edited): an unknown kind or outcome, a batch size that is not a whole number, text with
                control characters where a plan is, a number that is not one.
        """
        attrs: dict[str, Any] = trial.user_attrs
        try:
            outcome = attrs.get("outcome")
            lengths = attrs.get("lengths")
            return cls(
                number=trial.number,
                state=trial.state.name,
                kind=TrialKind(attrs.get("kind", TrialKind.MEASURED)),
                batch_size=_checked_batch(trial.params.get("batch_size")),
                plan=_checked_plan(trial.params.get("plan")),
                outcome=Outcome(outcome) if outcome is not None else None,
                ranks=tuple(RankResult.from_dict(r) for r in attrs.get("ranks") or ()),
                load=Load.from_dict(attrs.get("load")),
                lengths=(_whole(lengths[0]), _whole(lengths[1])) if lengths else None,
                **{name: _checked_attr(name, attrs.get(name)) for name in _ATTRS},
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise DamagedTrial(f"{type(e).__name__}: {e}") from None

    @property
    def config(self) -> Configuration | None:
        """Its batch size and plan (None for a trial stored without them)."""
        if self.batch_size is None or self.plan is None:
            return None
        return Configuration(self.batch_size, self.plan)

    @property
    def counted(self) -> bool:
        """Ran to an end in this study (not skipped, copied, warm-started or interrupted), and not as a
        re-measurement; of a sweep's plans, the first (one process, one trial of --trials)."""
        return (
            self.kind is TrialKind.MEASURED
            and self.outcome is not None
            and not self.remeasured
            and self.process in (None, self.number)
        )

    @property
    def remeasured(self) -> bool:
        """A second (or third) reading of a configuration measured already (autotune.search.noise), or one
        read again in a process of its own after a warm process read it just over the limit."""
        return self.proposed_by in SECOND_OPINIONS

    @property
    def finished(self) -> bool:
        """Told: its attributes are all stored (a RUNNING trial's may be half written by another worker)."""
        return self.state in ("COMPLETE", "FAIL", "PRUNED")

    @property
    def measured(self) -> bool:
        """Its peak is a measurement (a complete trial), or a lower bound (out of memory, or stopped over the
        budget), here or for another budget."""
        measured = self.outcome is Outcome.COMPLETE or (
            self.outcome is not None and self.outcome.out_of_memory
        )
        return measured and self.peak_bytes is not None

    def fits(self, limit: int) -> bool:
        return fits(self.outcome, with_rise(self.peak_bytes, self.rising_bytes), limit)

    def outcome_text(self, limit: int | None) -> str:
        """How it ended, in a word or two: ``fits`` / ``over limit`` for a complete trial against ``limit``
        (the budget less headroom), else its outcome (``over-budget``: stopped as it passed the budget)."""
        if self.outcome is Outcome.COMPLETE and limit is not None and self.peak_bytes is not None:
            return "fits" if self.fits(limit) else "over limit"
        return str(self.outcome or self.state.lower())

    @property
    def peak_phase(self) -> str | None:
        """Which phase set its peak (``core.budget.peak_phase``)."""
        return peak_phase(self.warmup_peak_bytes, self.steady_peak_bytes, self.phase_peaks)

    @property
    def note_text(self) -> str:
        """Its note, else its error's one line; prefixed with its kind when it was not measured here."""
        note = self.note or first_line(self.error)
        if self.kind not in (TrialKind.MEASURED, TrialKind.VERIFICATION):
            note = f"{self.kind}: {note}" if note else str(self.kind)
        return note

    @property
    def throughput(self) -> Interval | None:
        """Its samples/s with the reading's interval (a trial stored before intervals were: ±NOISE_FLOOR)."""
        if not self.samples_per_sec:
            return None
        return Interval.stored(self.samples_per_sec, self.samples_per_sec_low, self.samples_per_sec_high)


_ATTRS = (
    "process",
    "peak_bytes",
    "samples_per_sec",
    "predicted_peak_bytes",
    "proposed_by",
    "log_dir",
    "error",
    "worker",
    "device",
    "note",
    "verified_peak_bytes",
    "verified_samples_per_sec",
    "samples_per_sec_low",
    "samples_per_sec_high",
    "grad_accum",
    "warmup_peak_bytes",
    "steady_peak_bytes",
    "memory_method",
    "tokens_per_sec",
    "phase_peaks",
    "own_checkpointing",
    "settled",
    "rising_bytes",
    "shifted",
    "slow_start",
    "startup_seconds",
    "measured_seconds",
    "warm_run",
)


class DamagedTrial(ValueError):
    """A stored trial that is not what autotune wrote: why, in a few words."""


_TEXT_ATTRS = {"proposed_by", "log_dir", "error", "worker", "device", "note", "memory_method", "own_checkpointing",
               "settled", "shifted", "slow_start"}  # fmt: skip


def _checked_attr(name: str, value: Any) -> Any:
    """An attribute of _ATTRS as autotune stores it: text, a number, or phase peaks (None: not stored)."""
    if value is None:
        return None
    if name in _TEXT_ATTRS:
        if not isinstance(value, str):
            raise TypeError(f"its {name} is not text")
        return value
    if name == "phase_peaks":
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise TypeError("its phase_peaks are not peaks by phase")
        return {k: _whole(v) for k, v in value.items()}
    if type(value) not in (int, float) or not math.isfinite(value):  # an interval's low edge may be < 0
        raise ValueError(f"its {name} {value!r} is not a number")
    return value


def _whole(value: Any, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise ValueError(f"{value!r} is not a whole number >= {low}")
    return value


def _checked_batch(value: Any) -> int | None:
    return _whole(value, 1) if value is not None else None


def _checked_plan(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or invisible_in(value) is not None):
        raise ValueError(f"its plan {value!r} is not a plan name")
    return value


def phase_peaks_of(records: Iterable[TrialRecord], config: tuple[int, str]) -> dict[str, int]:
    """Each phase of the job (eval, save) the trials of ``config`` ran: its largest peak over them."""
    peaks: dict[str, int] = {}
    for record in records:
        if (record.batch_size, record.plan) == config:
            for name, peak in (record.phase_peaks or {}).items():
                peaks[name] = max(peaks.get(name, 0), peak)
    return peaks


def lengths_of(records: Iterable[TrialRecord], config: tuple[int, str]) -> tuple[int, int] | None:
    """The shortest and longest sequence length the trials of ``config`` fed their model (token inputs)."""
    spans = [r.lengths for r in records if (r.batch_size, r.plan) == config and r.lengths is not None]
    if not spans:
        return None
    return min(low for low, _ in spans), max(high for _, high in spans)


def warm_on_host(record: TrialRecord) -> bool:
    """Whether ``record``'s peak was read on the host in a warm process, after another configuration: its
    heap keeps their history, and it reads up to WARM_EXCESS over a process of its own (autotune.trials.warm).
    A GPU's warm reading is its own (CUDA's cache is emptied between configurations)."""
    return (record.warm_run or 1) > 1 and record.memory_method in HOST_METHODS


def superseded(records: Iterable[TrialRecord], limit: int) -> set[int]:
    """The numbers of the warm host readings (:func:`warm_on_host`) over ``limit`` of configurations also
    read in a process of their own: such a reading is only an upper bound of the configuration's peak, and
    says nothing against a fresh one under the limit. (A warm reading under the limit stays: the fresh
    process's peak is no larger, and one fresh reading over it among such readings is the meter's noise as
    often as the configuration's: :func:`peak_verdict` takes their majority.)"""
    records = list(records)
    fresh = {r.config for r in records if r.measured and r.kind in READINGS and not warm_on_host(r)}
    return {r.number for r in records if warm_on_host(r) and r.config in fresh and not r.fits(limit)}


def best_record(records: Iterable[TrialRecord], limit: int) -> TrialRecord | None:
    """The fastest trial measured (here or for another budget) whose peak fits ``limit``, of a configuration
    that fits by its readings (:func:`peak_verdict`)."""
    records = list(records)
    candidates = [
        r for r in records if r.kind in (TrialKind.MEASURED, TrialKind.WARM_START) and r.fits(limit)
    ]
    fit = {c: peak_verdict(records, c, limit) is True for c in {(r.batch_size, r.plan) for r in candidates}}
    fitting = [r for r in candidates if fit[(r.batch_size, r.plan)]]
    return max(fitting, key=lambda r: r.samples_per_sec or 0.0, default=None)


def peak_verdict(
    records: Iterable[TrialRecord], config: tuple[int | None, str | None], limit: int
) -> bool | None:
    """Whether ``config`` fits ``limit`` by the majority of its memory readings (search trials, warm
    starts, verifications; an out-of-memory or over-budget one reads over; not a warm process's where a
    process of its own read it: :func:`superseded`): None with no reading, or as many over the limit as
    under it (measure it again). A reading whose peak passed the limit while still rising when it ended (a
    verification run to its cap: autotune.trials.settle.still_rising) decides alone: the shorter readings
    under the limit stopped where its own peak was still climbing, and say nothing against it. Measured
    (#42): examples/mlp.py at 700 MB on a busy machine read none@512 at 631.7 and 628.2 MiB in the search
    (5-7 steps; limit 634.2) and 665.6 in its verification (16 steps), still rising 36 MiB per 10 steps;
    two votes to one answered it. A peak under the limit that only its rise takes over is a forecast, and
    one vote: examples/gpt.py's none@32 verified at 882.3 MiB rising 171.5 per 10 steps (limit 972.8)
    reads 836 over 15 steps from one fresh process to the next (RSS steps up now and then, and stops)."""
    records = list(records)
    out = superseded(records, limit)
    readings = [
        r
        for r in records
        if (r.batch_size, r.plan) == config and r.kind in READINGS and r.measured and r.number not in out
    ]
    if any(
        r.rising_bytes and r.outcome is Outcome.COMPLETE and (r.peak_bytes or 0) > limit for r in readings
    ):
        return False
    verdicts = [r.fits(limit) for r in readings]
    under = sum(verdicts)
    over = len(verdicts) - under
    return None if under == over else under > over


def constraint_mib(peak_bytes: int, limit: int, complete: bool) -> float:
    """Optuna's constraint (<= 0 is feasible): MiB over the limit; an OOM is infeasible by at least 1 MiB."""
    over = (peak_bytes - limit) / MiB
    return over if complete else max(over, 1.0)


class KeptOut(NamedTuple):
    """A configuration faster than the answer that only the headroom kept out (:func:`kept_out_by_headroom`)."""

    config: Configuration
    speed: float  # the median of its readings, samples/s
    peak: int  # the median of its peaks, bytes
    headroom: float  # the most headroom it fits under, a whole percent (0.04: ``--headroom 4%``)


def kept_out_by_headroom(
    records: Iterable[TrialRecord], answer: Configuration, answer_speed: Interval, limit: int, budget: int
) -> KeptOut | None:
    """The fastest configuration read faster than the answer (beyond its interval and TIE) that the headroom
    alone kept out: over the limit by the majority of its peaks (:func:`peak_verdict`), each of them a
    complete trial's within the budget, their median (at least a still rising one's peak and rise) under a
    headroom of at least 1% (a whole percent less than the run's). The user decides what the headroom is for
    (the memory noise, a longer job's peak); the run only says what it cost. Measured (#42): examples/mlp.py
    at 700 MB reads none@384 at 620-661 MiB against a 634.2 MiB limit from one fresh process to the next;
    runs that read it over answered none@256 at 0.92 of its speed, and the table was the only place that
    said so."""
    records = list(records)
    out = superseded(records, limit)
    headroom = 1 - limit / budget
    bar = max(answer_speed.high, answer_speed.mid * (1 + TIE))
    found: list[KeptOut] = []
    for config in {r.config for r in records if r.config is not None and r.config != answer}:
        readings = [
            r
            for r in records
            if r.config == config and r.kind in READINGS and r.measured and r.number not in out
        ]
        peaks = [r.peak_bytes for r in readings if r.peak_bytes is not None]
        speeds = [r.samples_per_sec for r in readings if r.samples_per_sec]
        complete = all(r.outcome is Outcome.COMPLETE for r in readings)
        if not (peaks and speeds and complete) or peak_verdict(records, config, limit) is not False:
            continue
        # a reading still rising leaves room for its rise again (TrialRecord.fits): the least room it needs
        rising = [with_rise(r.peak_bytes, r.rising_bytes) or 0 for r in readings if r.rising_bytes]
        peak, speed = max([int(statistics.median(peaks)), *rising]), statistics.median(speeds)
        room = math.floor(round((1 - peak / budget) * 100, 6)) / 100  # 0.96 of it: 4%, not 3.99
        if max(peaks) <= budget and speed > bar and 0.01 <= room < headroom:
            found.append(KeptOut(Configuration(*config), speed, peak, room))
    return max(found, key=lambda k: (k.speed, -k.config.batch_size), default=None)
