"""The throughput model: samples/s over (batch, plan), beside the memory model, to know when a search has won.

A training step takes a fixed time ``t0`` (kernel launches, the optimizer step, synchronisation) plus ``t1``
per sample, so throughput ``b / (t0 + t1·b)`` rises with the batch size and saturates at ``1/t1``. A
recompute plan repeats part of the forward pass of every sample: its per-sample time is ``1 + overhead``
times as long, ``b / (t0 + t1·(1 + overhead)·b)``. ``t0`` and ``t1`` are fitted to the reference plan's
readings (``none`` when it was measured); a plan's overhead is measured once the plan has a reading, and
until then predicted from the probe: the share of the forward pass the plan repeats, times the share of
the per-sample work a forward pass is (about a third: backward costs about twice the forward).

Dominance follows: at equal batch size ``none`` is at least as fast as any recompute plan (an overhead is
never negative against ``none``), and a plan that recomputes everything another plan does
(autotune.core.plans.recomputes_at_least) is no faster than it; with throughput not falling with the batch,
a plan at a larger batch is at least as fast as one that recomputes at least as much at a smaller one
(:func:`dominates`). The exception is ``own:off`` for a script
that checkpoints by itself: none keeps the script's recompute and own:off drops it, so its overhead is
negative (the probe's share of the forward the script repeats, negative) and its bound is not none's. So
is a sharding plan that reshards FSDP2's blocks less than the script does (``fsdp:keep``, a smaller group):
it skips an all-gather per block in backward, a gain the probe does not time (bounded as own:off's); and a
ZeRO stage (``zero:1``), which may gather less than the script's own stage.

The search asks for an *optimistic* prediction, the most a configuration could reach given what was read
and how noisy the readings were: the fit plus the readings' noise; beyond the largest batch measured, the
flattest step-time line the noisy readings allow (with one batch size measured: throughput proportional to
the batch, which no real step beats); below a larger batch the plan was read at, no less than that reading
allows (throughput does not fall with the batch: the reading bounds every smaller one); for a plan, the smallest overhead its readings allow (and, on whichever line, no less than the seconds per sample its recompute was measured to add), or, unmeasured,
its probe's share times FORWARD_SHARE_OF_STEP, the least share of the work a forward pass takes, or times
the least that a plan measured here was found to cost per share (ThroughputModel.recompute_cost); an offload
plan, unmeasured, at least the time its saved bytes take to the host and back over the fastest link a GPU has
(``transfer``: seconds per sample, HOST_LINK_BYTES_PER_SECOND), beyond the per-sample time it could hide
behind. A
configuration whose optimistic prediction cannot beat the incumbent by more than the noise is not worth a
trial (autotune.search.propose).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.core.errors import InputError
from autotune.core.plans import parse_plan, recomputes_at_least
from autotune.core.stats import NOISE_FLOOR, Interval, pooled
from autotune.search.records import Configuration

FORWARD_SHARE_OF_STEP = 0.2  # the least share of a sample's work its forward pass takes: a bound
MAX_FORWARD_SHARE = (
    0.5  # the most (a forward without its backward's recompute): a bound on what own:off gains
)
EXPECTED_FORWARD_SHARE = 1 / 3  # what a prediction (not a bound) assumes
# the least forward share a plan's measured overhead is divided by to bound the others' (recompute_cost):
# below it the probe's timing of the few modules it repeats is too small to scale
MIN_SHARE_TO_SCALE = 0.02
PER_SAMPLE_SHARE_MIN = 0.05  # below this share of the step, per-sample time is too small to divide by


@dataclass(frozen=True)
class Reading:
    batch_size: int
    plan: str
    throughput: Interval  # samples/s
    busy: bool = False  # a busy machine took it (autotune.search.noise.disturbed): load only slows


@dataclass(frozen=True)
class Line:
    """Step time = t0 + t1·batch (seconds)."""

    t0: float
    t1: float

    def step(self, batch: int, overhead: float = 0.0) -> float:
        return self.t0 + self.t1 * (1 + overhead) * batch

    def speed(self, batch: int, overhead: float = 0.0) -> float:
        step = self.step(batch, overhead)
        return batch / step if step > 0 else float("inf")


@dataclass(frozen=True)
class ThroughputModel:
    reference: str | None = None  # the plan the lines were fitted to
    line: Line | None = None  # least squares (None: fewer than two batch sizes of the reference measured)
    flat: Line | None = None  # the flattest line the readings allow within their noise
    largest: int = 0  # the largest batch size of the reference plan that was measured
    noise: float = NOISE_FLOOR  # the reference plan's readings' median relative noise
    overhead: dict[str, Interval] = field(default_factory=dict)  # measured, per plan
    # what each measured plan's recompute adds to a step, in seconds per sample (see :meth:`least_extra`)
    extra: dict[str, Interval] = field(default_factory=dict)
    forward_shares: dict[str, float] = field(default_factory=dict)  # the probe's, per plan
    # an offload plan's least seconds per sample moving its saved tensors to the host and back
    transfer: dict[str, float] = field(default_factory=dict)
    pooled: dict[Configuration, Interval] = field(
        default_factory=dict
    )  # each configuration, all its readings
    between: float = NOISE_FLOOR  # relative spread of one configuration's readings between trials
    # configurations left out of the fit: a busy machine slowed their readings (autotune.search.noise.slowed),
    # or they are over the limit and their readings disagree (noise.unanswerable)
    slowed: frozenset[Configuration] = frozenset()
    # plans (not the reference) read only on a busy machine: their overhead is predicted from those
    # readings but bounds nothing (:meth:`least_overhead`)
    busy_plans: frozenset[str] = frozenset()

    @classmethod
    def fit(
        cls,
        readings: Sequence[Reading],
        forward_shares: dict[str, float] | None = None,
        transfer: dict[str, float] | None = None,
    ) -> ThroughputModel:
        shares = dict(forward_shares or {})
        moves = dict(transfer or {})
        grouped: dict[Configuration, list[Interval]] = defaultdict(list)
        for r in readings:
            grouped[Configuration(r.batch_size, r.plan)].append(r.throughput)
        configs = {key: p for key, values in grouped.items() if (p := pooled(values)) is not None}
        quiet = {r.plan for r in readings if not r.busy}
        by_plan: dict[str, dict[int, Interval]] = defaultdict(dict)
        for (batch, plan), speed in configs.items():
            by_plan[plan][batch] = speed
        if not by_plan:
            return cls(forward_shares=shares, transfer=moves)
        reference = "none" if "none" in by_plan else max(by_plan, key=lambda p: len(by_plan[p]))
        base = by_plan[reference]
        line, flat = _fit_lines(base)
        model = cls(
            reference=reference,
            line=line,
            flat=flat,
            largest=max(base),
            noise=float(np.median([s.noise for s in base.values()])),
            forward_shares=shares,
            transfer=moves,
            pooled=configs,
            between=between_trials(list(grouped.values())),
            busy_plans=frozenset(p for p in by_plan if p != reference and p not in quiet),
        )
        measured = {
            plan: found
            for plan, points in by_plan.items()
            if plan != reference and (found := model._measured_overhead(points)) is not None
        }
        return dataclasses.replace(
            model,
            overhead={plan: relative for plan, (relative, _) in measured.items()},
            extra={plan: seconds for plan, (_, seconds) in measured.items()},
        )

    def predict(self, batch: int, plan: str) -> float | None:
        """Expected samples/s of ``plan`` at ``batch`` (None before two batch sizes were measured)."""
        if self.line is None:
            return None
        speed = self.line.speed(batch, self._expected_overhead(plan))
        bound = self._copies_bound(plan)
        return speed if bound is None else min(speed, bound)

    def optimistic(self, batch: int, plan: str) -> float | None:
        """The most ``plan`` at ``batch`` could reach (see the module docstring); None with no reading. An
        offload plan not measured yet reaches no more than its copies allow (:meth:`_copies_bound`)."""
        value = self._optimistic(batch, plan)
        bound = self._copies_bound(plan)
        return value if value is None or bound is None else min(value, bound)

    def _copies_bound(self, plan: str) -> float | None:
        """Samples/s an unmeasured offload plan cannot beat however well it overlaps: one sample's saved
        tensors to the host and back per ``transfer`` seconds (a link's bound: GPT-2 medium's 2.56 GiB a
        sample, 11.6 samples/s over 64 GB/s; measured on an H200 at batch 7: 9.1)."""
        seconds = self.transfer.get(plan)
        return 1.0 / seconds if seconds and plan not in self.overhead else None

    def _optimistic(self, batch: int, plan: str) -> float | None:
        if self.reference is None or self.flat is None:
            return None
        # Below the largest batch measured, the flattest line is taken at it: throughput never falls with
        # a larger batch, so what it allows there bounds every smaller one.
        flat = self._least_speed(self.flat, max(batch, self.largest), plan)
        if self.line is None:
            value = flat
        else:
            fitted = self._least_speed(self.line, batch, plan) * (1 + max(self.noise, self.between))
            value = max(fitted, flat) if batch > self.largest else fitted
        # Throughput never falls with a larger batch: a reading of the plan at this or a larger one (over the
        # budget too) bounds it from above, and the bound is what it could reach. A line pulled down by one
        # slow reading at a small batch once valued a batch between two readings below both.
        above = [r.high for (b, p), r in self.pooled.items() if p == plan and b >= batch]
        if not above:
            return value
        value = max(value, min(above))
        if (
            self.reference == "none" and plan != "none" and not _may_beat_none(plan)
        ):  # nor above none's at its batch
            value = min(value, self.optimistic(batch, "none") or value)
        return value

    def _least_speed(self, line: Line, batch: int, plan: str) -> float:
        """The most samples/s ``plan`` reaches at ``batch`` on the reference's ``line``: its step no
        shorter than the line's with the plan's least relative overhead, nor than the line's plus the least
        time the plan's recompute was measured to add per sample (:meth:`least_extra`)."""
        step = line.step(batch, self.least_overhead(plan))
        if (extra := self.least_extra(plan)) is not None:
            step = max(step, line.step(batch) + extra * batch)
        return batch / step if step > 0 else float("inf")

    def least_extra(self, plan: str) -> float | None:
        """The least time ``plan``'s recompute adds to a step, in seconds per sample, as measured: its own
        readings against the reference's at the same batch size, and no less than a plan it recomputes at
        least as much as was measured to add; None with no such reading.

        A relative overhead is a multiple of the reference line's per-sample time: on the flattest line the
        readings allow (whose per-sample time may be a fraction of the fitted one's) it would shrink the
        measured recompute with it. The recompute's seconds were measured, not fitted: issue 31's CI run
        read none@1 15% slow under load (its step nearly as long as at 24), the flattest line then had
        almost no per-sample time, and B:1 at 4x the work was valued 1,147 samples/s at 128, above
        A:1@64's 985, and measured first."""
        found = [
            e.low
            for p, e in self.extra.items()
            if (p == plan or plan_recomputes_at_least(plan, p)) and p not in self.busy_plans
        ]
        if not found:
            return None
        least = max(found)
        return max(least, 0.0) if self.reference == "none" and not _may_beat_none(plan) else least

    def least_overhead(self, plan: str) -> float:
        """The smallest overhead ``plan`` may have against the reference plan: what its readings allow, no
        less than what a plan it recomputes at least as much as was measured at; unmeasured, or read only on
        a busy machine (``busy_plans``: load only slows, so such readings bound the overhead from above, not
        below; issue 42: examples/gpt.py's Block:0.25@32 read 79 beside four bursting neighbours), its probe's
        forward share times :attr:`recompute_cost`, and for a plan per rank the least of its entries' (every
        rank applying its lightest entry recomputes no more); 0 for the reference plan and anything unknown.
        Against ``none`` it is never negative."""
        if plan == self.reference:
            return 0.0
        bounding = {p: o for p, o in self.overhead.items() if p not in self.busy_plans}
        own = bounding.get(plan)
        # unknown for own:off: it may skip a whole forward's recompute (a bound, as FORWARD_SHARE_OF_STEP is);
        # a sharding that reshards less skips an all-gather per block in backward: the same bound
        share = self.forward_shares.get(plan, -1.0 if _may_beat_none(plan) else 0.0)
        # a plan that repeats less than none (own:off: negative share) could gain up to a forward's most
        least = (
            own.low if own is not None else share * (self.recompute_cost if share >= 0 else MAX_FORWARD_SHARE)
        )
        if own is None and "|" in plan:
            least = min(self.least_overhead(entry) for entry in dict.fromkeys(plan.split("|")))
        if own is None and plan in self.transfer:
            least = max(least, self._transfer_overhead(plan))
        for other, measured in bounding.items():
            if other != plan and plan_recomputes_at_least(plan, other):
                least = max(least, measured.low)
        return max(least, 0.0) if self.reference == "none" and not _may_beat_none(plan) else least

    @property
    def recompute_cost(self) -> float:
        """The least overhead an unmeasured plan pays per unit of the probe's forward share it repeats:
        FORWARD_SHARE_OF_STEP (the least share of a step a forward pass takes), or more where a plan measured
        here on a quiet machine says so: the least, over those plans, of the low end of their overhead over
        their forward share. What a recompute costs against its forward's share is the machine's and the
        model's (how long a backward takes beside the forward; on the CPU, what checkpointing adds to the
        repeated forward), not the plan's; the least of the measured keeps it a bound. Plans that move
        tensors to the host (their copies cost what no share says), that may beat ``none`` (own:off, a
        sharding), and those repeating less than MIN_SHARE_TO_SCALE of the forward scale nothing.

        Measured (#41): bench/gpt2_train.py's 4 x 256 GPT-2 on the CPU read GPT2Block:0.25@8 (forward share
        0.064, least overhead by FORWARD_SHARE_OF_STEP 1.3%) at 0.29 overhead (0.08-0.50: 1.27 times its share
        at least), then measured GPT2Block:1/save=matmul@8 (share 0.094, valued at 1.9% least: 12% at 1.27
        times), 20 s of a 107 s run, for an overhead of 0.44 and 2.4 samples/s against none@7's 3.5."""
        if self.reference != "none":
            return FORWARD_SHARE_OF_STEP
        ratios = [
            overhead.low / share
            for plan, overhead in self.overhead.items()
            if plan not in self.busy_plans
            and plan not in self.transfer
            and not _may_beat_none(plan)
            and (share := self.forward_shares.get(plan, 0.0)) >= MIN_SHARE_TO_SCALE
        ]
        return max(FORWARD_SHARE_OF_STEP, min(ratios)) if ratios else FORWARD_SHARE_OF_STEP

    def _transfer_overhead(self, plan: str) -> float:
        """The least overhead an offload plan's copies to the host and back cost: the part of their time per
        sample that the reference plan's compute could hide, at most its whole step's time per sample at
        its largest batch measured (the low end of that reading: a bound, whatever the step's fixed part).
        Issue 31: Block:1/offload ran 5x slower than Block:1 on an H100 (examples/gpt.py) and 4.6x on an
        H200 (GPT-2 medium, 9.1 samples/s at batch 7), proposed as if free; GPT-2 medium's 2.56 GiB a sample
        take at least 0.086 s over a 64 GB/s link and back, where a whole step took 0.038 s a sample at 2."""
        seconds = self.transfer.get(plan)
        reading = self.pooled.get(Configuration(self.largest, self.reference or ""))
        if not seconds or reading is None or reading.low <= 0:
            return 0.0
        return max(seconds * reading.low - 1.0, 0.0)

    def _expected_overhead(self, plan: str) -> float:
        if plan == self.reference:
            return 0.0
        own = self.overhead.get(plan)
        if own is not None:
            return own.mid
        expected = self.forward_shares.get(plan, 0.0) * max(EXPECTED_FORWARD_SHARE, self.recompute_cost)
        return max(expected, self._transfer_overhead(plan)) if plan in self.transfer else expected

    def _measured_overhead(self, points: dict[int, Interval]) -> tuple[Interval, Interval] | None:
        """A plan's overhead from its readings: how much longer its per-sample time is than the reference
        plan's at the same batch size (measured there, or fitted), with both readings' noise. Where the
        per-sample time is too small a share of the step to divide by, the whole step's ratio, which is
        smaller: an optimistic bound stays a bound. Beside it, the same difference in seconds per sample."""
        estimates = []
        seconds = []
        for batch, speed in points.items():
            ref = self.pooled.get(Configuration(batch, self.reference or ""))
            if ref is not None:
                ref_step, ref_noise = batch / ref.mid, ref.noise
            elif self.line is not None:
                ref_step, ref_noise = self.line.step(batch), self.noise
            else:
                continue
            step = batch / speed.mid
            noise = speed.noise + ref_noise
            per_sample = self.line.t1 * batch if self.line is not None else 0.0
            if per_sample < PER_SAMPLE_SHARE_MIN * ref_step:
                per_sample = ref_step  # the whole step's ratio
            extra = step - ref_step
            span = (extra - noise * step, extra, extra + noise * step)  # seconds a step, with the noise
            seconds.append(Interval(*(v / batch for v in span)))
            estimates.append(Interval(*(v / per_sample for v in span)))
        if not estimates:
            return None
        return _spanning(estimates), _spanning(seconds)


def _spanning(estimates: Sequence[Interval]) -> Interval:
    """From the lowest low to the highest high, about the median."""
    return Interval(
        min(e.low for e in estimates),
        float(np.median([e.mid for e in estimates])),
        max(e.high for e in estimates),
    )


def between_trials(readings: Sequence[Sequence[Interval]]) -> float:
    """The relative noise between two trials of one configuration: the median, over configurations read
    more than once, of their readings' half range over their median (NOISE_FLOOR when none was)."""
    spreads = [
        (max(r.mid for r in rs) - min(r.mid for r in rs)) / 2 / mid
        for rs in readings
        if len(rs) > 1 and (mid := float(np.median([r.mid for r in rs]))) > 0
    ]
    return max(float(np.median(spreads)), NOISE_FLOOR) if spreads else NOISE_FLOOR


def _fit_lines(points: dict[int, Interval]) -> tuple[Line | None, Line]:
    """The least-squares line (t0, t1 >= 0; None for one batch size) and the flattest line the readings'
    noise allows: through the slowest step the smallest batch's reading allows and the fastest the largest
    batch's allows. With one batch size: its fastest step as a fixed time, throughput proportional to the
    batch."""
    batches = sorted(points)
    low, high = batches[0], batches[-1]
    fast_at_high = high / points[high].high
    if len(batches) < 2:
        return None, Line(fast_at_high, 0.0)
    # readings that disagree wildly pool to an interval down to 0 samples/s: the slowest step is unbounded
    slow_at_low = low / points[low].low if points[low].low > 0 else float("inf")
    flat_t1 = max((fast_at_high - slow_at_low) / (high - low), 0.0)
    flat = Line(max(fast_at_high - flat_t1 * high, 0.0), flat_t1)
    b = np.array(batches, dtype=float)
    steps = np.array([x / points[x].mid for x in batches])
    t0, t1 = np.linalg.lstsq(np.stack([np.ones_like(b), b], axis=1), steps, rcond=None)[0]
    if t1 < 0:  # a step that gets faster with more samples is noise: a constant step time
        t0, t1 = float(np.mean(steps)), 0.0
    elif t0 < 0:  # no fixed cost: per-sample time only
        t0, t1 = 0.0, float(np.sum(steps * b) / np.sum(b * b))
    return Line(float(t0), float(t1)), flat


def _may_beat_none(plan: str) -> bool:
    """Whether ``plan`` may be faster than none: it turns the script's own checkpointing off, reshards
    FSDP2's blocks less than the script does (fsdp:keep, a smaller group), or sets a ZeRO stage (zero:N: it
    may gather less than the script's own)."""
    try:
        return any(
            entry.own_off or (entry.sharding is not None and entry.sharding.may_beat_own)
            for entry in parse_plan(plan).entries
        )
    except InputError:
        return False


def plan_recomputes_at_least(plan: str, other: str) -> bool:
    """recomputes_at_least on plan strings; False for a plan it cannot read (an ORT plan)."""
    try:
        return recomputes_at_least(parse_plan(plan), parse_plan(other))
    except InputError:
        return False


def dominates(config: tuple[int, str], other: tuple[int, str]) -> bool:
    """Whether ``config`` is at least as fast as ``other`` by the throughput model's structure: the same plan
    at a larger batch (throughput does not fall with the batch), or a plan that ``other``'s recomputes at
    least at the same or a larger batch (both at once: none@32 is no slower than none@24, which is no
    slower than Block:0.25@24)."""
    (batch, plan), (other_batch, other_plan) = config, other
    if plan == other_plan:
        return batch > other_batch
    return batch >= other_batch and plan_recomputes_at_least(other_plan, plan)


def outranks(config: tuple[int, str], other: tuple[int, str]) -> bool:
    """Whether ``config`` wins a tie with ``other`` by the throughput model's structure whatever their peaks:
    the same batch with a plan that ``other``'s recomputes at least (:func:`dominates` at one batch size).
    Where ``config`` fits, ``other`` can never be the answer (autotune.search.contenders.
    choose takes ``config`` from a tie, and a plan is never faster than one it recomputes at least of)."""
    (batch, plan), (other_batch, other_plan) = config, other
    return batch == other_batch and plan != other_plan and plan_recomputes_at_least(other_plan, plan)
