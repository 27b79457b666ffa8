"""The memory model: peak(batch, plan) ≈ fixed + batch x per_sample(plan), fitted to measured trials.

``fixed`` (weights, gradients, optimizer state, runtime, CUDA context) is shared by every plan; each plan
has its own per-sample slope. One plan measured at two batch sizes calibrates ``fixed``; every other plan
then needs one measurement. A plan not measured yet takes ``none``'s slope minus the saving per sample the
probe predicted for it (``savings``) times the share of their predicted savings the plans measured so far
realized (:meth:`MemoryModel.realized`; REALIZED_PRIOR before any, never above 1), or else the largest known
slope: without a prediction it errs on the side of fitting less. The probe's saving is a prior: on an H100,
GPT-2 medium's plans realized 65-88% of it (the logits and the block being recomputed stay at the peak),
and every plan's first trial, proposed on the full prediction, was over the budget (issue 31).

Memory readings are noisy (RSS moves by tens of MiB between two trials of one configuration: glibc's arenas,
threads), and a small model's per-sample memory can hide under that noise at small batch sizes. The model
estimates the noise (:func:`memory_noise`) and calls a plan's slope *resolved* only once its peaks have
risen by RESOLVE times it; until then the search grows the calibration batch geometrically, faster while
the peaks have not risen by one noise (:meth:`MemoryModel.calibration_batch`). A trial stopped over the budget
or out of memory is a censored observation: its peak is a lower bound, which raises its plan's slope wherever
the fit falls below it.

An offload plan keeps what it saves in pinned host memory: about its saving per sample x the batch size
(measured, else the probe's). No proposal of it takes a batch size whose pinned memory would pass the host
budget (:meth:`MemoryModel.host_cap`): the kernel's out-of-memory killer, not the device, would end it.

No proposal reaches further than EXTRAPOLATION times the largest batch size measured with its plan, and
below a batch size that failed a proposal bisects (in the ladder's log scale) between the largest batch
that fitted and the failure, never one rung at a time (:meth:`MemoryModel.reach`).

A sharding plan (FSDP2's ``fsdp:...``, DeepSpeed's ``zero:...``) changes what a rank holds whatever the batch
size (parameters, gradients, optimizer state), not what a sample keeps: its peak is modelled as its
recompute part's (``none`` for ``zero:2``) plus an offset of its own (:meth:`MemoryModel.offset`). Its
readings share that part's slope in the fit and give the offset, once the part has readings of its own;
before any reading it is the probe's (what the plan frees a rank, or holds more: ``fixed_savings``), so a
ZeRO stage that frees the optimizer state is proposed at the batch sizes it may fit, not judged as none.

Measurement always overrules the model: a configuration that was measured is judged by its measurement,
and a batch that was measured over the limit (or ran out of memory) bounds the larger batch sizes of its
own plan. Nothing is assumed across plans: a plan predicted (or even measured, at other batch sizes) to
save more per sample than another may still peak higher at some batch size, and the physical peak of a
plan parameter is not monotonic (torch.compile's budget: pytorch issue 197838). The model orders
candidates; only a measurement, or a larger batch of the same plan, rules one out.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.core.budget import fits
from autotune.core.plans import offloads, recompute_part
from autotune.core.protocol import Outcome

MIN_SLOPE_SHARE = 0.05  # no plan keeps less than this share of the activations per sample
REALIZED_PRIOR = 0.7  # the share of its predicted saving a plan is assumed to realize, before any did
SAVING_DOUBT = 2.0  # an optimistic bound takes the probe's predicted saving as up to this many times too low
RESOLVE = 4.0  # a slope is resolved once its plan's peaks rose by this many times the memory noise
GROWTH = 4  # an unresolved calibration's next batch size: about this many times its largest
# ... and this many times where its peaks have not risen by one memory noise over two batch sizes or more: the
# slope is below what a step of GROWTH could show (calibration_batch)
LOST_GROWTH = GROWTH * GROWTH
EXTRAPOLATION = 8  # no proposal beyond this many times the largest batch size measured with its plan
# A batch size a plan's own readings put over the limit by less than this many standard errors of the
# line's prediction there is still a candidate (:meth:`MemoryModel.doubt`): one-sided, about 95% with the
# few readings a search has.
PREDICTION_DOUBT = 2.0
MiB = 2**20
# The noise a meter's readings have before any repeat shows more, as (share of the smallest peak, least
# bytes): RSS moved ±35 MiB at ~500 MiB between two trials here (docs/reliability.md); NVML readings of one
# configuration agree to the allocator's 2 MiB granularity. Repeats and contradictions widen it.
NOISE_PRIOR = {"rss": (0.02, 4 * MiB), "rss-tree": (0.02, 4 * MiB), "nvml": (0.002, 2 * MiB)}


@dataclass(frozen=True)
class Observation:
    batch_size: int
    plan: str
    peak_bytes: int
    complete: bool  # False: the trial ran out of memory, so the peak is only a lower bound
    method: str | None = None  # the meter's ("rss", "rss-tree", "nvml"): what noise its readings have

    @property
    def outcome(self) -> Outcome:
        return Outcome.COMPLETE if self.complete else Outcome.OOM


@dataclass(frozen=True)
class MemoryModel:
    fixed: float | None = None
    per_sample: dict[str, float] = field(default_factory=dict)
    observations: tuple[Observation, ...] = ()
    savings: dict[str, float] = field(default_factory=dict)  # predicted saving per sample vs none (the probe)
    noise: float = 0.0  # bytes: the half-width of one reading's noise (see memory_noise)
    bounds: dict[str, float] = field(default_factory=dict)  # least slope per plan its censored peaks allow
    host_limit: int | None = None  # bytes of host memory a trial may hold (None: unbounded)
    # the probe's: bytes a sharding plan frees a rank whatever the batch size (negative: holds more)
    fixed_savings: dict[str, float] = field(default_factory=dict)
    offsets: dict[str, float] = field(default_factory=dict)  # fitted: bytes a sharding plan adds to fixed
    # the fit's columns (a slope per plan with readings, then a sharding plan's offset), the pseudo-inverse
    # of its normal matrix and its residuals' standard deviation: what a prediction's error is (doubt)
    columns: tuple[str, ...] = ()
    inverse: tuple[tuple[float, ...], ...] = field(default=(), compare=False)
    residual_sd: float = 0.0

    @classmethod
    def fit(
        cls,
        observations: Sequence[Observation],
        savings: dict[str, float] | None = None,
        host_limit: int | None = None,
        fixed_savings: dict[str, float] | None = None,
    ) -> MemoryModel:
        complete = [o for o in observations if o.complete]
        plans = sorted({o.plan for o in complete})
        calibrated = any(len({o.batch_size for o in complete if o.plan == p}) >= 2 for p in plans)
        noise = memory_noise(observations)
        model = cls(
            observations=tuple(observations),
            savings=dict(savings or {}),
            noise=noise,
            host_limit=host_limit,
            fixed_savings=dict(fixed_savings or {}),
        )
        if not calibrated:
            return model
        # Least squares on [fixed, slope(plan_1), ..., slope(plan_k), offset(sharded_1), ...]: a sharding
        # plan whose recompute part has readings of its own shares that part's slope and has an offset;
        # any other plan a slope of its own (a sharding plan's then carries its offset at its batch sizes).
        parts = {p: recompute_part(p) for p in plans}
        shared = {p: part for p, part in parts.items() if part in plans and parts[part] is None}
        sloped = [p for p in plans if p not in shared]
        sharded = sorted(shared)
        rows = np.zeros((len(complete), 1 + len(sloped) + len(sharded)))
        rows[:, 0] = 1.0
        for i, o in enumerate(complete):
            rows[i, 1 + sloped.index(shared.get(o.plan, o.plan))] = o.batch_size
            if o.plan in shared:
                rows[i, 1 + len(sloped) + sharded.index(o.plan)] = 1.0
        peaks = np.array([o.peak_bytes for o in complete], dtype=float)
        solution = np.linalg.lstsq(rows, peaks, rcond=None)[0]
        residuals = peaks - rows @ solution
        freedom = len(complete) - np.linalg.matrix_rank(rows)
        slopes = {
            plan: max(float(s), 1.0) for plan, s in zip(sloped, solution[1 : 1 + len(sloped)], strict=True)
        }
        slopes.update({plan: slopes[part] for plan, part in shared.items()})
        offsets = {plan: float(x) for plan, x in zip(sharded, solution[1 + len(sloped) :], strict=True)}
        model = dataclasses.replace(
            model,
            fixed=max(float(solution[0]), 0.0),
            per_sample=slopes,
            offsets=offsets,
            columns=(*sloped, *(f"offset:{plan}" for plan in sharded)),
            inverse=tuple(tuple(map(float, row)) for row in np.linalg.pinv(rows.T @ rows)),
            residual_sd=float(np.sqrt(residuals @ residuals / freedom)) if freedom > 0 else 0.0,
        )
        bounds: dict[str, float] = {}
        for o in observations:  # a censored peak: the plan's slope is at least what reaches it
            if not o.complete and o.batch_size > 0:
                above = o.peak_bytes - (model.fixed or 0.0) - model.offset(o.plan)
                reached = above / o.batch_size
                bounds[o.plan] = max(bounds.get(o.plan, 0.0), reached)
        return dataclasses.replace(model, bounds=bounds)

    @property
    def calibrated(self) -> bool:
        """A fit exists: one plan was measured at two batch sizes (see :attr:`resolved` for whether its
        slope means anything)."""
        return self.fixed is not None

    @property
    def resolved(self) -> bool:
        """Some plan's peaks rose above the noise: from its smallest batch size measured to a larger one
        that completed, or to a censored peak (out of memory, over the budget), by RESOLVE x the noise."""
        return any(
            self.rise(plan) >= max(RESOLVE * self.noise, 1.0) for plan in {o.plan for o in self.observations}
        )

    def rise(self, plan: str) -> float:
        """Bytes ``plan``'s peaks rose from its smallest complete batch size to its largest reading."""
        own = [o for o in self.observations if o.plan == plan]
        complete = [o for o in own if o.complete]
        if not complete:
            return 0.0
        base = min(complete, key=lambda o: (o.batch_size, o.peak_bytes))
        above = [o.peak_bytes for o in own if o.batch_size > base.batch_size]
        return max(above, default=base.peak_bytes) - base.peak_bytes

    def predict(self, batch_size: int, plan: str) -> float | None:
        """Predicted peak in bytes, or None before calibration."""
        if self.fixed is None:
            return None
        return self.fixed + self.offset(plan) + batch_size * self.slope(plan)

    def doubt(self, batch_size: int, plan: str) -> float:
        """Bytes by which ``plan``'s peak at ``batch_size`` may lie below its prediction: PREDICTION_DOUBT
        standard errors of the fitted line's prediction there (a reading's own error, the larger of the
        residuals' and half the memory noise, and the fit's, which grows with the distance from the batch
        sizes measured); 0 for a plan without readings of its own (or of its recompute part's), whose slope
        is a prior.

        A line through RSS readings can put the next batch size over the limit while that batch fits:
        examples/mlp.py at 700 MB read none@1..256 at 501-613 MiB warm (residuals of 14 MiB: glibc's heap
        grows in steps), the line put none@384 at 660 MiB against the 634.2 MiB limit, and it peaks at
        609-623. Three runs of six answered none@256 at 0.90 of none@384's speed without measuring it."""
        if self.fixed is None or not self.inverse:
            return 0.0
        row = np.zeros(len(self.columns) + 1)
        row[0] = 1.0
        sloped = plan if plan in self.columns else recompute_part(plan)
        if sloped not in self.columns:
            return 0.0
        row[1 + self.columns.index(sloped)] = batch_size
        if f"offset:{plan}" in self.columns:
            row[1 + self.columns.index(f"offset:{plan}")] = 1.0
        leverage = float(row @ np.array(self.inverse) @ row)
        sd = max(self.residual_sd, self.noise / 2)
        return PREDICTION_DOUBT * sd * math.sqrt(1.0 + max(leverage, 0.0))

    def offset(self, plan: str) -> float:
        """Bytes ``plan`` adds to ``fixed`` whatever the batch size (negative: it frees them): a sharding
        plan's, fitted where it shares its recompute part's slope, else (not measured) the probe's; 0 for a
        plan without a sharding, and for one measured with a slope of its own, which carries it."""
        if plan in self.offsets:
            return self.offsets[plan]
        if plan in self.per_sample:
            return 0.0
        return -self.fixed_savings.get(plan, 0.0)

    def optimistic_offset(self, plan: str) -> float:
        """The least ``plan`` may add to ``fixed``: fitted, else the probe's where it frees memory, else 0
        (what the probe says a sharding holds more is its estimate of an "up to": it may hold less)."""
        if plan in self.offsets or plan in self.per_sample:
            return self.offset(plan)
        return min(self.offset(plan), 0.0)

    def slope(self, plan: str) -> float:
        """Bytes per sample of ``plan``: measured, else none's minus the predicted saving, else the largest;
        never less than its censored peaks allow."""
        return max(self._slope(plan), self.bounds.get(plan, 0.0))

    def _measured_slope(self, plan: str) -> float | None:
        """``plan``'s fitted slope, else its recompute part's (a sharding keeps that part's activations a
        sample); None if neither was measured."""
        part = recompute_part(plan)
        return self.per_sample.get(plan, self.per_sample.get(part) if part is not None else None)

    def _slope(self, plan: str) -> float:
        measured = self._measured_slope(plan)
        if measured is not None:
            return measured
        if "none" in self.per_sample and plan in self.savings:
            return max(
                self.per_sample["none"] - self.realized * self.savings[plan],
                MIN_SLOPE_SHARE * self.per_sample["none"],
            )
        return max(self.per_sample.values())

    @property
    def realized(self) -> float:
        """The share of the probe's predicted saving the plans measured so far realized: the median over
        them of measured / predicted (a plan stopped over the budget bounds its share from above), within
        [MIN_SLOPE_SHARE, 1]; REALIZED_PRIOR before any plan with a prediction was measured."""
        none = self.per_sample.get("none")
        if none is None:
            return REALIZED_PRIOR
        shares = []
        for plan, predicted in self.savings.items():
            if predicted <= 0 or plan == "none":
                continue
            if plan in self.per_sample:
                shares.append((none - max(self.per_sample[plan], self.bounds.get(plan, 0.0))) / predicted)
            elif plan in self.bounds and (none - self.bounds[plan]) / predicted < REALIZED_PRIOR:
                shares.append((none - self.bounds[plan]) / predicted)  # saves at most this: below the prior
        if not shares:
            return REALIZED_PRIOR
        return min(max(float(np.median(shares)), MIN_SLOPE_SHARE), 1.0)

    def measured_saving(self, plan: str) -> float | None:
        """Bytes per sample ``plan`` saves against ``none``, from measurements alone (None if either is unmeasured)."""
        if plan not in self.per_sample or "none" not in self.per_sample:
            return None
        return self.per_sample["none"] - self.per_sample[plan]

    def saving(self, plan: str) -> float | None:
        """Bytes per sample ``plan`` saves against ``none``: measured, else the probe's prediction (None if
        neither is known)."""
        if plan == "none":
            return 0.0
        measured = self.measured_saving(plan)
        return measured if measured is not None else self.savings.get(plan)

    def host_cap(self, plan: str) -> int | None:
        """The largest batch size whose pinned host memory ``plan`` keeps within the host budget: an offload
        plan's saving per sample (measured, else predicted) x the batch size; None for a plan that offloads
        nothing, or where either is unknown."""
        if self.host_limit is None or not offloads(plan):
            return None
        saving = self.saving(plan)
        # whole bytes: a fitted slope carries the fit's rounding (20 MiB came out 7e-8 bytes over, and 1000
        # MiB held 49 of it on one BLAS and 50 on another)
        per_sample = round(saving) if saving is not None else 0
        if per_sample <= 0:
            return None
        return self.host_limit // per_sample

    def ceiling(self, plan: str, limit: int) -> int | None:
        """The smallest batch size measured not to fit with ``plan``: no batch size from there up can fit
        ``plan`` (a plan's peak grows with its batch size; no other plan's measurement bounds it)."""
        bounding = [
            o.batch_size
            for o in self.observations
            if o.plan == plan and not fits(o.outcome, o.peak_bytes, limit)
        ]
        return min(bounding, default=None)

    def optimistic_slope(self, plan: str) -> float:
        """The fewest bytes per sample ``plan`` may take: measured, else none's minus SAVING_DOUBT times the
        probe's predicted saving, else (nothing known) MIN_SLOPE_SHARE of the smallest slope measured."""
        measured = self._measured_slope(plan)
        if measured is not None:
            return measured
        floor = MIN_SLOPE_SHARE * min(self.per_sample.values())
        if "none" in self.per_sample and plan in self.savings:
            return max(self.per_sample["none"] - SAVING_DOUBT * self.savings[plan], floor)
        return floor

    def largest_possible(self, plan: str, batch_sizes: Sequence[int], limit: int) -> int | None:
        """The largest batch size ``plan`` could fit below its ceiling with its optimistic slope: how far a
        plan not measured yet might reach (what the stopping rule values it at)."""
        if self.fixed is None:
            return None
        ceiling = self.ceiling(plan, limit)
        host = self.host_cap(plan)
        fitting = [
            b
            for b in batch_sizes
            if (ceiling is None or b < ceiling)
            and (host is None or b <= host)
            and self.fixed + self.optimistic_offset(plan) + b * self.optimistic_slope(plan) <= limit
        ]
        return max(fitting, default=None)

    def largest_fitting(self, plan: str, batch_sizes: Sequence[int], limit: int) -> int | None:
        """The largest batch size for ``plan`` that was measured to fit, or is predicted to fit, lies below
        its ceiling (see :meth:`ceiling`) and within its reach (see :meth:`reach`); once that one was
        measured, the one after it where the prediction puts it over the limit by less than its
        :meth:`doubt` (one rung: measuring it settles the question, and a reading over the limit becomes
        the plan's ceiling). Not before: a line through two small batch sizes is doubtful far from them,
        and a proposal past its prediction would fail and bisect back."""
        measured = {o.batch_size for o in self.observations if o.plan == plan}
        ceiling = self.ceiling(plan, limit)
        reach = self.reach(plan, batch_sizes, limit)
        host = self.host_cap(plan)
        best, following = None, None
        for batch in batch_sizes:
            if (ceiling is not None and batch >= ceiling) or (reach is not None and batch > reach):
                break
            if host is not None and batch > host and batch not in measured:
                break
            predicted = self.predict(batch, plan)
            if batch in measured or (predicted is not None and predicted <= limit):
                best, following = batch, None
            elif following is None:
                following = batch
        if best in measured and following is not None:
            predicted = self.predict(following, plan)
            if predicted is not None and predicted - self.doubt(following, plan) <= limit:
                return following
        return best

    def fitting_batches(self, plan: str, limit: int) -> list[int]:
        """The batch sizes ``plan`` was measured to fit at, smallest first."""
        return sorted(
            {
                o.batch_size
                for o in self.observations
                if o.plan == plan and o.complete and o.peak_bytes <= limit
            }
        )

    def reach(self, plan: str, batch_sizes: Sequence[int], limit: int) -> int | None:
        """The largest batch size a proposal for ``plan`` may take (None: no bound). Below a batch size that
        failed, the ladder's log midpoint between the largest one that fitted (of ``plan``, else of any plan,
        else the smallest) and the failure: a bisection, never one rung down at a time. Otherwise
        EXTRAPOLATION x the largest batch size measured with ``plan`` (with any plan, before it has one)."""
        ceiling = self.ceiling(plan, limit)
        if ceiling is not None:
            below = [b for b in self.fitting_batches(plan, limit) if b < ceiling]
            if not below:
                below = [
                    b
                    for p in {o.plan for o in self.observations}
                    for b in self.fitting_batches(p, limit)
                    if b < ceiling
                ]
            low = max(below, default=batch_sizes[0] if batch_sizes and batch_sizes[0] < ceiling else None)
            if low is None:
                return None
            return bisect(batch_sizes, low, ceiling) or low
        own = [o.batch_size for o in self.observations if o.plan == plan]
        anyone = [o.batch_size for o in self.observations if o.complete]
        largest = max(own or anyone, default=None)
        return None if largest is None else EXTRAPOLATION * largest

    def calibration_batch(self, plan: str, batch_sizes: Sequence[int], limit: int) -> int | None:
        """The next batch size that calibrates ``plan``: its smallest, then about GROWTH x its largest that
        fitted, bisecting below a failure; None once nothing is left between (the slope stays unresolved:
        what fits was measured) or the ladder ends. Where two batch sizes or more were measured and the
        peaks have not risen by one memory noise (:meth:`rise`), LOST_GROWTH x: a step of GROWTH would show
        at most about four times a rise the noise hides, and RESOLVE wants four noises. Measured (issue 42):
        examples/mlp.py at 700 MB read 501-563 MiB at batch 1 and 504-560 at 4, 16 and 64 (a rise of -51 to
        +8 MiB against a noise of 10-26); its ladder 1, 4, 16, 64, 256 and 1024 (over the budget) took six
        of --trials 10's runs, and the verification had one run left for its contenders."""
        fitting = self.fitting_batches(plan, limit)
        if not fitting:
            return batch_sizes[0] if batch_sizes else None
        top = fitting[-1]
        ceiling = self.ceiling(plan, limit)
        measured = {o.batch_size for o in self.observations if o.plan == plan and o.complete}
        growth = LOST_GROWTH if len(measured) >= 2 and self.rise(plan) < self.noise else GROWTH
        grown = next((b for b in batch_sizes if b >= growth * top), None)
        if grown is None:  # the ladder ends before that step: its last batch size, if larger
            grown = batch_sizes[-1] if batch_sizes and batch_sizes[-1] > top else None
        if ceiling is not None and (grown is None or grown >= ceiling):
            return bisect(batch_sizes, top, ceiling)
        return grown


def bisect(batch_sizes: Sequence[int], low: int, high: int) -> int | None:
    """The batch size strictly between ``low`` and ``high`` nearest their geometric mean (the smaller of
    two as near); None if there is none."""
    between = [b for b in batch_sizes if low < b < high]
    if not between:
        return None
    middle = math.log(low * high) / 2
    return min(between, key=lambda b: (abs(math.log(b) - middle), b))


def memory_noise(observations: Sequence[Observation]) -> float:
    """The half-width of one peak reading's noise, in bytes: the meter's prior (NOISE_PRIOR), widened by
    what the readings themselves show: half the spread of repeated readings of one configuration, and half
    of any fall in peak from a smaller batch size of a plan to a larger one (a plan's peak does not fall
    with its batch size; only noise makes it read so)."""
    complete = [o for o in observations if o.complete]
    noise = 0.0
    if complete:
        smallest = min(o.peak_bytes for o in complete)
        for o in complete:
            share, least = NOISE_PRIOR.get(o.method or "", (0.0, 0))
            noise = max(noise, least, share * smallest)
    by_plan: dict[str, list[Observation]] = defaultdict(list)
    for o in complete:
        by_plan[o.plan].append(o)
    for readings in by_plan.values():
        for low in readings:
            fall = max(
                (
                    low.peak_bytes - o.peak_bytes
                    for o in readings
                    if o is not low and o.batch_size >= low.batch_size
                ),
                default=0,
            )
            noise = max(noise, fall / 2)
    return noise
