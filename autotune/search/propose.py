"""The search's algorithm, as small free functions over trial records: fit the models, propose the next
configuration (calibration, then the configurations that could still win), decide when the search has won
or the budget is hopeless. No Optuna, no database.

- *Calibration* (autotune.search.calibration): the first plan at the smallest batch size, then about 4x
  its largest, until its peaks rise above the memory noise (bisecting below a failure). If the first plan
  does not fit at the smallest batch size, the plan expected to save the most takes its place, then the
  next; once every plan was measured not to fit there, the budget is hopeless. No plan's measurement
  bounds another's: memory is not assumed monotonic across plans or in a plan parameter (a ratio,
  torch.compile's budget), so only a plan's own measurements rule it out.
- *Re-measurement* (autotune.search.noise): a configuration whose readings disagree is measured again
  before anything is concluded from it, and so is one read once whose reading breaks an order no step
  breaks (a longer step at a smaller batch of one plan, none slower than a recompute plan): load only
  slows, so the slower reading is the suspect (not in an exhaustive search, which extrapolates nothing).
  A smaller batch slower than a larger batch of its plan that fits is left out of the throughput model
  instead, and not measured again: it can never be the answer (autotune.search.noise.slowed); so is a
  configuration over the limit whose readings disagree (noise.unanswerable).
- *Candidates*: every configuration not measured yet whose batch size the memory model says fits its plan
  (autotune.search.memory_model) and that is not moot (:meth:`_Valuation.moot`: a configuration that
  fits is answered over it whatever it reads: the same batch size with a plan that recomputes less, where
  measuring it would not show how far its plan reaches; its plan at a larger batch read on a busy
  machine), valued by the throughput model's optimistic prediction
  (autotune.search.throughput_model). The most promising is proposed: for each plan that is its largest
  fitting batch size, the frontier.
- *Plans per rank*: in a multi-process trial whose ranks' measured peaks differ (a pipeline's first stage
  keeps more activations than its last), the space's plans per rank join the candidates, each rank's entry
  judged by that rank's own memory model (:func:`rank_frontier`), valued like any plan (a plan per rank is
  no faster than its lightest entry applied everywhere).
- *Stopping rule*: once a configuration fits (the incumbent), a candidate is measured only if its
  optimistic prediction beats the incumbent by more than the incumbent's noise; when none does, the
  search has won (:class:`Finished`), once two questions are answered: a reading lower at a larger batch
  than at a smaller one is probed between (:func:`_between`), and the readings that decide the stop are
  measured again if a busy machine took them (autotune.search.noise.unsettled). ``exhaustive`` searches keep today's behaviour instead: every plan's
  frontier, then the sampler until ``--trials``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from autotune.core.plans import parse_plan
from autotune.core.protocol import Outcome
from autotune.core.stats import Interval
from autotune.search.calibration import next_calibration
from autotune.search.memory_model import MemoryModel, Observation, bisect
from autotune.search.noise import (
    busy_anchor,
    contradicted,
    disturbed,
    in_flight,
    next_attempt,
    out_of_order,
    outrun,
    overruled,
    read_busy,
    slowed,
    unanswerable,
    unsettled,
)
from autotune.search.records import (
    READINGS,
    TIE,
    WARM_EXCESS,
    Configuration,
    ProposedBy,
    TrialKind,
    TrialRecord,
    best_record,
    peak_verdict,
    superseded,
    warm_on_host,
)
from autotune.search.space import SearchSpace
from autotune.search.throughput_model import Reading, ThroughputModel, dominates, outranks

UNBALANCED = 0.9  # ranks differ once the lightest rank's peak is below this share of the heaviest's
# A candidate is worth a trial only if, at the most it could reach, it beats the incumbent by more than this
# share of its speed (verification's widest tie, TIE: the smaller peak wins within it). Less is no gain a
# reading can show: two quiet trials of one configuration differ by 4.8% (sd) between runs on the 2-core
# CPU (autotune.search.noise.BETWEEN_FLOOR). Issue 41's GPT-2 there, with none@7 fitting at 2.9 samples/s
# (±1%), measured GPT2Block:0.25@7, GPT2Block:1/save=matmul@8 and GPT2MLP:1@7 (55 s of the run's 147) for
# at most 2.95, 2.94 and 2.93 (0.6, 0.2 and 0.06% above the incumbent's interval); each read slower.
MIN_GAIN = TIE


@dataclass(frozen=True)
class Proposal:
    batch_size: int
    plan: str
    why: ProposedBy
    # configurations (this one included) the models say could still beat the incumbent: the stop rule's view
    # of what is left; None while calibrating or past the frontier of an exhaustive search
    contenders: int | None = field(default=None, compare=False)
    attempt: int = 0  # the lease's: 0 for a first trial, REMEASURE_ATTEMPT and up for a re-measurement


@dataclass(frozen=True)
class Finished:
    """Nothing left could beat the incumbent: the search has won."""

    reason: str


def model_of(
    records: Iterable[TrialRecord],
    savings: dict[str, float] | None = None,
    host_limit: int | None = None,
    limit: int | None = None,
    fixed_savings: dict[str, float] | None = None,
) -> MemoryModel:
    """The memory model fitted to every measured peak (an OOM's peak as a lower bound), but, given the
    ``limit``, a warm process's over it where a process of its own read the configuration
    (records.superseded); ``host_limit``: the host budget an offload plan's pinned memory must stay within;
    ``savings`` and ``fixed_savings``: the probe's (see MemoryModel)."""
    records = list(records)
    out = superseded(records, limit) if limit is not None else set()
    return MemoryModel.fit(
        [
            Observation(r.batch_size, r.plan, r.peak_bytes, r.outcome is Outcome.COMPLETE, r.memory_method)
            for r in records
            if r.measured
            and r.batch_size is not None
            and r.plan is not None
            and r.peak_bytes is not None
            and r.number not in out
        ],
        savings,
        host_limit,
        fixed_savings,
    )


def speed_of(
    records: Iterable[TrialRecord],
    forward_shares: dict[str, float] | None = None,
    transfer: dict[str, float] | None = None,
    limit: int | None = None,
) -> ThroughputModel:
    """The throughput model fitted to every completed reading, fitting or not (a configuration over the
    budget still says how fast its batch size runs), but those its side-by-side verifications overrule
    (autotune.search.noise.overruled) and, given the ``limit``, those of a configuration a busy machine
    slowed below a larger batch of its plan that fits (autotune.search.noise.slowed) and those of a
    configuration over the limit whose readings disagree (noise.unanswerable): the model's ``slowed``; nor
    a search reading that load slowed below a steadier or quieter one of its configuration (noise.outrun)."""
    records = list(records)
    out = overruled(records) | outrun(records)
    busy = disturbed(records)
    found = [
        Reading(r.batch_size, r.plan, speed, r.number in busy)
        for r in records
        if r.number not in out
        and r.kind in (TrialKind.MEASURED, TrialKind.WARM_START, TrialKind.VERIFICATION)
        and r.outcome is Outcome.COMPLETE
        and r.batch_size is not None
        and r.plan is not None
        and (speed := r.throughput) is not None
    ]
    model = ThroughputModel.fit(found, forward_shares, transfer)
    if limit is None:
        return model
    fitting = {r.config for r in records if r.config is not None and r.fits(limit)}
    busy_only = {c for c in model.pooled if all(r.busy for r in found if (r.batch_size, r.plan) == c)}
    left_out = slowed(model.pooled, fitting, busy_only) | unanswerable(records, limit)
    if not left_out:
        return model
    kept = [r for r in found if Configuration(r.batch_size, r.plan) not in left_out]
    return dataclasses.replace(ThroughputModel.fit(kept, forward_shares, transfer), slowed=left_out)


def propose(
    records: list[TrialRecord],
    model: MemoryModel,
    speed: ThroughputModel,
    space: SearchSpace,
    limit: int,
    taken: Iterable[Configuration] = (),
    exhaustive: bool = False,
) -> Proposal | Finished | None:
    """The next configuration to measure; Finished when nothing left could win; None to let the sampler
    choose (an exhaustive search past its frontier, or a memory model that could not be calibrated).

    ``taken``: configurations leased by any worker (running, queued or ended)."""
    tried = _tried(records, taken)
    if not (model.calibrated and model.resolved):
        calibration = next_calibration(records, model, space, limit, tried)
        if calibration is not None:
            return Proposal(*calibration, ProposedBy.CALIBRATION)
        if not model.calibrated:
            return None
    # an exhaustive search reads every configuration as it is, a dominated one too
    if (again := contradicted(records, () if exhaustive else speed.slowed)) is not None:
        return Proposal(*again, ProposedBy.REMEASURE, attempt=next_attempt(records, again))
    incumbent = best_record(records, limit)
    near = warm_near_limit(records, limit, speed, _bar(speed, incumbent))
    if near is not None and exhaustive:  # an exhaustive search measures every frontier anyway
        return Proposal(*near, ProposedBy.FRESH, attempt=next_attempt(records, near))
    frontier = {plan: model.largest_fitting(plan, space.batch_sizes, limit) for plan in space.uniform_plans}
    untried = [Configuration(b, p) for p, b in frontier.items() if b is not None and (b, p) not in tried]
    if exhaustive:  # each plan's frontier in the space's order, then the sampler
        return Proposal(*untried[0], ProposedBy.FRONTIER) if untried else None
    per_rank = rank_frontier(records, model, space, limit)
    frontier.update({plan: largest for plan, (largest, _) in per_rank.items()})
    fitting = _fitting(records, limit)
    value = _Valuation(
        speed,
        space,
        _reach(frontier, per_rank, model, space, limit),
        _bar(speed, incumbent),
        frozenset(fitting),
        frozenset(read_busy(records) & fitting),
    )
    if near is not None:
        below = _frontier_below(near, frontier, tried, value)
        if below is not None:
            return Proposal(*below, ProposedBy.FRONTIER)
        return Proposal(*near, ProposedBy.FRESH, attempt=next_attempt(records, near))
    # what the throughput model extrapolates from (an exhaustive search measures every frontier anyway)
    if (again := out_of_order(records, speed.pooled)) is not None:
        return Proposal(*again, ProposedBy.REMEASURE, attempt=next_attempt(records, again))
    left = _candidates(frontier, space, tried)
    candidates = [c for c in left if not value.moot(c)]
    # The first plan's frontier first: it anchors the throughput curve at a large batch size, which is
    # what rules the recompute plans in or out.
    # And measured whatever the fitted curve says where it dominates the incumbent by the model's structure
    # (a larger batch of its plan): samples/s does not fall with the batch, and a curve that falls was
    # fitted to readings a busy machine took (issue 42: the demo beside two bursting neighbours read none@1
    # at 41, none@2 and none@4 at 2-24, never measured none@32, and answered none@1 at half its speed).
    first = next((c for c in untried if c.plan == space.uniform_plans[0] and not value.moot(c)), None)
    anchor = first is not None and (
        value.worth(first)
        or (incumbent is not None and (i := incumbent.config) is not None and dominates(first, i))
    )
    contenders = sum(value.worth(c) for c in {*candidates, *([first] if first else [])})
    if first is not None and anchor:
        return Proposal(*first, ProposedBy.FRONTIER, max(contenders, 1))
    best = max(candidates, key=value.promise, default=None)
    if best is not None and value.worth(best):
        # valued on the line's extrapolation (another plan, or past the reference's largest batch): a
        # reading that shapes the line and only a busy machine took is read again first
        extrapolated = best.plan != speed.reference or best.batch_size > speed.largest
        again = busy_anchor(records, speed.reference, speed.largest, speed.slowed) if extrapolated else None
        if again is not None:
            return Proposal(*again, ProposedBy.REMEASURE, attempt=next_attempt(records, again))
        why = ProposedBy.FRONTIER if best.batch_size == frontier[best.plan] else ProposedBy.CANDIDATE
        return Proposal(*best, why, contenders)
    if incumbent is None:  # nothing fits yet, and nothing left is predicted to
        return Finished("no configuration left is predicted to fit")
    moot = len(left) - len(candidates)
    return _before_stopping(records, model, speed, space, limit, tried, incumbent, value, best, moot)


def warm_near_limit(
    records: list[TrialRecord], limit: int, speed: ThroughputModel, bar: Interval | None
) -> Configuration | None:
    """A configuration to read again in a process of its own: read only by warm processes on the host, over
    the limit by no more than what their heaps add (WARM_EXCESS), and faster by its readings than the
    incumbent could be (above ``bar``), so that fitting would make it the answer. The mlp example at 700 MB:
    none@256 read 635.6 MiB warm against a 634.2 MiB limit (a fresh process of it, ~600), and the run
    answered batch 128 at 0.95 of its speed, with every larger batch of ``none`` bounded by that reading."""
    for config in sorted({r.config for r in records if r.config is not None}, key=lambda c: -c.batch_size):
        rs = [r for r in records if r.config == config and r.kind in READINGS and r.measured]
        if not rs or not all(warm_on_host(r) for r in rs) or in_flight(records, config):
            continue
        over = [r for r in rs if not r.fits(limit)]
        near = all(
            r.outcome is Outcome.COMPLETE and (r.peak_bytes or 0) <= limit * (1 + WARM_EXCESS) for r in over
        )
        reading = speed.pooled.get(config)
        if over and near and reading is not None and (bar is None or reading.mid > bar.high):
            return config
    return None


def _frontier_below(
    near: Configuration, frontier: dict[str, int | None], tried: set[Configuration], value: _Valuation
) -> Configuration | None:
    """The frontier of ``near``'s plan below it, where it is not measured yet and could beat the incumbent:
    measured before ``near`` is read again in a process of its own (the same cost in processes on the CPU,
    where a smaller batch starts a warm process of its own, whose larger batches then run in it). The fresh
    reading is a bet that the warm heap's excess put ``near`` over; the frontier below is the answer if that
    bet is lost, and a run's last trials go to the answer first (issue 42: examples/mlp.py at 700 MB, ``--trials 10``,
    read none@512 at 652.7 MiB warm and 647.3 fresh against the 634.2 MiB limit, then none@256 with its
    last search trial, and answered none@256 at 0.945 of none@384, which was never measured)."""
    largest = frontier.get(near.plan)
    if largest is None or largest >= near.batch_size:
        return None
    below = Configuration(largest, near.plan)
    return below if below not in tried and not value.moot(below) and value.worth(below) else None


def _fitting(records: list[TrialRecord], limit: int) -> set[Configuration]:
    """The configurations that fit by the majority of their memory readings (records.peak_verdict)."""
    configs = {r.config for r in records if r.config is not None and r.kind in READINGS and r.fits(limit)}
    return {c for c in configs if peak_verdict(records, c, limit) is True}


def _candidates(
    frontier: dict[str, int | None], space: SearchSpace, tried: set[Configuration]
) -> list[Configuration]:
    """Every configuration not tried under its plan's frontier."""
    return [
        Configuration(batch, plan)
        for plan, largest in frontier.items()
        if largest is not None
        for batch in space.batch_sizes
        if batch <= largest and (batch, plan) not in tried
    ]


def _reach(
    frontier: dict[str, int | None],
    per_rank: dict[str, tuple[int | None, int | None]],
    model: MemoryModel,
    space: SearchSpace,
    limit: int,
) -> dict[Configuration, int]:
    """Each plan's frontier, valued at the largest batch size the plan could fit: measuring a frontier also
    shows how far the plan reaches (one not measured yet may save more than the model assumes)."""
    return {
        Configuration(largest, plan): max(
            largest,
            (
                per_rank[plan][1]
                if plan in per_rank
                else model.largest_possible(plan, space.batch_sizes, limit)
            )
            or largest,
        )
        for plan, largest in frontier.items()
        if largest is not None
    }


@dataclass(frozen=True)
class _Valuation:
    """What a configuration left is worth to the search: the throughput model's optimistic speed for it (a
    frontier's at the batch size its plan could reach), against the incumbent's readings (``bar``)."""

    speed: ThroughputModel
    space: SearchSpace
    reach: dict[Configuration, int]
    bar: Interval | None
    fitting: frozenset[Configuration] = frozenset()  # the configurations that fit by their readings
    busy: frozenset[Configuration] = frozenset()  # those of them a busy machine took a reading of

    def optimistic(self, config: Configuration) -> float | None:
        return self.speed.optimistic(self.reach.get(config, config.batch_size), config.plan)

    def worth(self, config: Configuration) -> bool:
        """Whether it could beat the incumbent's interval, and by more than MIN_GAIN of its speed (anything
        could, before an incumbent or a reading)."""
        value = self.optimistic(config)
        return self.bar is None or value is None or value > max(self.bar.high, self.bar.mid * (1 + MIN_GAIN))

    def moot(self, config: Configuration) -> bool:
        """Whether measuring ``config`` can change nothing: a configuration that fits (``fitting``) is
        answered over it whatever its reading says (autotune.search.contenders.choose).

        Never where ``config`` is worth more than its own speed: a plan's frontier valued at a larger batch
        than its own shows how far the plan reaches (at first, at the batch size of ``none``'s frontier,
        while the memory model knows nothing of its savings: measured, it may reach twice the batch).

        - One outranks it (throughput_model.outranks: the same batch size with a plan that ``config``'s
          recomputes at least, so no slower, and a tie goes to the plan that recomputes less whatever the
          peaks). Measured (#41): bench/time_to_answer.py's GPT-2 at 2337 MiB, with none@7 fitting at 2.9
          samples/s, measured GPT2Block:0.25@7 (2.8) in a process of its own once GPT2Block:0.25@8 read
          over the limit: 20.7 s of the run's 151.
        - One dominates it (throughput_model.dominates: its plan, or one it recomputes at least of, at a
          larger batch too) and a busy machine took a reading of that one (``busy``): the verification then
          measures the dominating one beside any leader it dominates and drops the dominated one whatever
          the readings (contenders.dominating, contenders.choose: under contention a larger batch reads slower than
          it runs). Measured (#42): beside four bursting neighbours, examples/gpt.py's runs measured
          none@24, none@7, none@12, Block:0.25@24, MLP:1@24 and MLP:1@16 with none@32 fitting and read
          under load, none of them answerable.

        A verification that finds the fitting one over the limit sends the search on without it, and
        ``config`` is a candidate again."""
        if self.reach.get(config, config.batch_size) > config.batch_size:
            return False  # it shows how far its plan reaches
        return any(outranks(other, config) for other in self.fitting) or any(
            dominates(other, config) for other in self.busy
        )

    def promise(self, config: Configuration) -> tuple[float, int, int]:
        """Optimistic throughput (unknown before any reading: the space's plan order), then the larger batch."""
        return (self.optimistic(config) or 0.0, -self.space.plans.index(config.plan), config.batch_size)


def _before_stopping(
    records: list[TrialRecord],
    model: MemoryModel,
    speed: ThroughputModel,
    space: SearchSpace,
    limit: int,
    tried: set[Configuration],
    incumbent: TrialRecord,
    value: _Valuation,
    best: Configuration | None,
    moot: int = 0,
) -> Proposal | Finished:
    """Nothing left is worth a trial: the readings that decide the stop are settled first (the incumbent's,
    and the reference plan's largest batch, which bounds every other configuration's climb), and a plan
    whose reading falls at a larger batch is probed between; then Finished, with the reason (and how many
    configurations left were ``moot``: :meth:`_Valuation.moot`)."""
    assert incumbent.batch_size is not None and incumbent.plan is not None
    leader = Configuration(incumbent.batch_size, incumbent.plan)
    # A leader that a fitting configuration dominates is no decider: the verification reads the two side
    # by side and answers the dominating one whatever the readings (contenders.choose), and a leader's
    # busy reading only lowers the bar, which keeps the search going, never stops it. Measured (#42, beside
    # four bursting neighbours): none@4 read once busy at 65.6 with none@32 fitting, read again in a
    # process of its own (on the CPU a warm process takes no smaller batch) for 18 s of the run's 79.
    deciders = [] if any(dominates(other, leader) for other in value.fitting) else [leader]
    if speed.reference is not None and (speed.largest, speed.reference) in speed.pooled:
        deciders.append(Configuration(speed.largest, speed.reference))
    if (again := unsettled(records, deciders)) is not None:
        return Proposal(*again, ProposedBy.REMEASURE, attempt=next_attempt(records, again))
    if (question := _between(speed, model, space, limit, tried, value)) is not None:
        return question
    name = f"{incumbent.plan}@{incumbent.batch_size}"
    reason = (
        f"no remaining configuration is predicted to beat {name} ({value.bar} samples/s) by more than its "
        f"noise and {MIN_GAIN:.1%}"
    )
    if moot:
        reason += (
            f"; {moot} configuration{'s' if moot > 1 else ''} left could change nothing (a fitting one is "
            "answered over each, whatever it reads)"
        )
    if best is None:
        every = "every other" if moot else "every"
        return Finished(f"{reason}; {every} configuration that could fit has been measured")
    at_most = value.optimistic(best) or 0.0
    return Finished(f"{reason}; the closest, {best.label}, could reach at most {at_most:,.1f}")


def _tried(records: Iterable[TrialRecord], taken: Iterable[Configuration]) -> set[Configuration]:
    """What is not proposed again: anything that ended (a failure too: a broken plan is not proposed again)
    or is under way, and the configurations leased by any worker (``taken``)."""
    ended = {
        r.config for r in records if r.config and (r.outcome is not None or r.state in ("RUNNING", "WAITING"))
    }
    return ended | set(taken)


def unbalanced(records: Iterable[TrialRecord]) -> bool:
    """Whether a completed multi-process trial's lightest rank peaked below UNBALANCED of its heaviest."""
    for record in records:
        peaks = [r.peak_bytes for r in record.ranks]
        if record.outcome is Outcome.COMPLETE and len(peaks) > 1 and min(peaks) < UNBALANCED * max(peaks):
            return True
    return False


def rank_models(
    records: Iterable[TrialRecord],
    world_size: int,
    savings: dict[str, float],
    fixed_savings: dict[str, float] | None = None,
) -> list[MemoryModel]:
    """A memory model per rank, fitted to that rank's own peaks under the plan it applied. A rank that was
    stopped because another ended the trial says nothing about its own fit and is left out."""
    seen: list[list[Observation]] = [[] for _ in range(world_size)]
    for record in records:
        if not record.measured or record.batch_size is None or record.plan is None:
            continue
        for rank in record.ranks:
            if rank.outcome is None or not 0 <= rank.rank < world_size:
                continue
            entry = str(parse_plan(record.plan).for_rank(rank.rank))
            seen[rank.rank].append(
                Observation(record.batch_size, entry, rank.peak_bytes, rank.outcome is Outcome.COMPLETE)
            )
    return [MemoryModel.fit(observations, savings, fixed_savings=fixed_savings) for observations in seen]


def rank_frontier(
    records: list[TrialRecord], model: MemoryModel, space: SearchSpace, limit: int
) -> dict[str, tuple[int | None, int | None]]:
    """For each plan per rank, the largest batch size it fits and the largest it could fit (see
    MemoryModel.largest_possible), every rank by its own model: only once the ranks' measured peaks differ
    (a balanced job gains nothing from plans that differ by rank)."""
    if not space.rank_plans or not unbalanced(records):
        return {}
    models = rank_models(records, space.world_size, model.savings, model.fixed_savings)
    if not all(m.calibrated for m in models):
        return {}
    frontier: dict[str, tuple[int | None, int | None]] = {}
    for plan in space.rank_plans:
        entries = [str(entry) for entry in parse_plan(plan).entries]
        fitting = [models[r].largest_fitting(e, space.batch_sizes, limit) for r, e in enumerate(entries)]
        possible = [models[r].largest_possible(e, space.batch_sizes, limit) for r, e in enumerate(entries)]
        frontier[plan] = (_least(fitting), _least(possible))
    return frontier


def predict_peak(
    records: list[TrialRecord], model: MemoryModel, space: SearchSpace, batch: int, plan: str
) -> float | None:
    """The predicted peak of ``plan`` at ``batch``: for a plan per rank, its heaviest rank's by the ranks'
    own models (once each is calibrated), else the trial's model."""
    if "|" in plan and space.world_size > 1:
        models = rank_models(records, space.world_size, model.savings, model.fixed_savings)
        entries = parse_plan(plan).entries
        if len(entries) == len(models) and all(m.calibrated for m in models):
            return max(m.predict(batch, str(e)) or 0.0 for m, e in zip(models, entries, strict=True))
    return model.predict(batch, plan)


def _least(batches: list[int | None]) -> int | None:
    """The batch size every rank reaches (None if one reaches none)."""
    return None if None in batches else min(b for b in batches if b is not None)


def _bar(speed: ThroughputModel, incumbent: TrialRecord | None) -> Interval | None:
    """The incumbent's throughput as all its readings say, with their noise: what a candidate must beat."""
    if incumbent is None or incumbent.batch_size is None or incumbent.plan is None:
        return None
    return speed.pooled.get(Configuration(incumbent.batch_size, incumbent.plan)) or incumbent.throughput


def _between(
    speed: ThroughputModel,
    model: MemoryModel,
    space: SearchSpace,
    limit: int,
    tried: set[Configuration],
    value: _Valuation,
) -> Proposal | None:
    """A batch size between two readings of one plan where the larger batch read slower beyond both
    intervals, and the smaller one is near the top (its interval reaches the incumbent's, ``value.bar``):
    the throughput curve does not fall, so the drop is a question (the machine, or a cliff), not a plateau.
    The ladder's log midpoint, if it is predicted to fit, not tried, and not moot (:meth:`_Valuation.moot`:
    a larger batch of its plan that fits was read on a busy machine, and the answer is that one whatever
    the midpoint reads)."""
    bar = value.bar
    by_plan: dict[str, list[tuple[int, Interval]]] = {}
    for (batch, plan), reading in speed.pooled.items():
        by_plan.setdefault(plan, []).append((batch, reading))
    for plan, points in by_plan.items():
        points.sort()
        for (low, at_low), (high, at_high) in itertools.pairwise(points):
            if at_high.high >= at_low.low or (bar is not None and at_low.high < bar.low):
                continue
            middle = bisect(space.batch_sizes, low, high)
            largest = model.largest_fitting(plan, space.batch_sizes, limit) if plan in space.plans else None
            if (
                middle is not None
                and (middle, plan) not in tried
                and largest is not None
                and middle <= largest
                and not value.moot(Configuration(middle, plan))
            ):
                return Proposal(middle, plan, ProposedBy.BETWEEN)
    return None


def untried(
    records: list[TrialRecord],
    model: MemoryModel,
    space: SearchSpace,
    limit: int,
    taken: Iterable[Configuration],
    margin: float,
) -> list[Configuration]:
    """Every configuration of the space not measured or under way that could fit (not predicted over the
    limit by more than ``margin``, below its plan's ceiling), the largest batch sizes first."""
    tried = _tried(records, taken)
    left = []
    for plan in space.plans:
        ceiling = model.ceiling(plan, limit)
        for batch in space.batch_sizes:
            predicted = predict_peak(records, model, space, batch, plan)
            if (batch, plan) in tried or (ceiling is not None and batch >= ceiling):
                continue
            if predicted is None or predicted <= limit * (1 + margin):
                left.append(Configuration(batch, plan))
    return sorted(left, key=lambda c: (-c.batch_size, space.plans.index(c.plan)))
