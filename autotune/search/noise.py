"""Noise between trials: which readings a busy machine disturbed, what must be measured again before
anything is concluded from it, and how sure an answer is.

A trial's steps agree to ±1% while two trials of one configuration on a shared machine have read 62.5 and
1.3 samples/s: the load that matters comes and goes between trials (docs/reliability.md). Each trial records
the kernel's CPU pressure over its run (autotune.hardware.load) and over each of its measured steps; its
speed is read from the steps a busy moment did not slow (autotune.core.pressure). A reading is *disturbed*
when the pressure over those steps was more than LOADED above the quietest reading's of the study (the
trial's own threads, the tuner's meter: what a quiet machine shows). A configuration's speed is the median
of all its readings (autotune.core.stats.pooled): with three, one that a burst slowed 48x does not move it.

Two readings of one configuration *disagree* when their intervals, each at least ±BETWEEN_FLOOR (about what
two quiet trials can differ by), do not overlap. Such a configuration is measured again, up to MAX_READINGS,
before the search concludes anything from it; and before the stop rule ends a search, the readings that
decide it (the incumbent's, and the reference plan's largest batch size, which bounds how far every other
configuration could climb) are measured again, interleaved, if a busy machine took them (or nothing says
it was quiet: a kernel without CPU pressure).

A verification's readings are longer and taken side by side with its rivals' (interleaved): a search
reading they contradict beyond both intervals was taken in a quiet gap or a burst, and no speed, front or
answer rests on it (:func:`overruled`). On a busy 2-core machine, one 103 samples/s reading of batch 4
taken in a quiet gap crowned it, verified at 10, over batch 32 read twice at 23.

Load only ever slows a trial. Where two configurations' readings contradict an order no training step
breaks (in one plan, a larger batch's step no shorter than a smaller one's; at one batch size, ``none`` no
slower than a plan that recomputes), the slower side, read once, is *out of order*: measured again before
the search concludes anything from it (:func:`out_of_order`). But a smaller batch whose step read longer
than a larger batch of its plan that fits can never be the answer, whatever another reading would say: it is
*slowed*, left out of the throughput model, and neither it nor its disagreeing readings are measured again
(:func:`slowed`). Nor is a configuration over the limit by its peaks whose readings disagree (:func:`unanswerable`):
it can never be the answer either, and its speed only shapes the line other configurations are valued on.

A reading whose own steps spread by more than SHAKY while a neighbour was at work is *shaky*
(:func:`is_shaky`): one of the reference plan below its largest batch, read once, is read again before the
search values another plan or a larger batch on the line through it (:func:`shaky`), and a shaky search
reading slower than a steady one of its configuration is left out, as is a busy reading slower beyond both
intervals than a quiet one of its configuration (:func:`outrun`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

from autotune.core.protocol import Outcome
from autotune.core.stats import Interval, pooled
from autotune.search.records import READINGS, Configuration, TrialKind, TrialRecord, peak_verdict
from autotune.search.throughput_model import plan_recomputes_at_least

LOADED = 0.05  # CPU pressure (a share of the trial's time) above the quietest trial's: a disturbed reading
# Two quiet trials of one configuration differ by up to about twice this much. Measured (#43 item 4): six
# quiet readings of bench/time_to_answer.py's GPT-2 none@7 on the 2-core CPU, fresh and warm, interleaved,
# took 2.16-2.47 s a step (sd 4.8% between runs); at 0.05, readings 10.5% apart disagreed (about one quiet
# pair in seven): the search's 3.01 samples/s and the verification's 2.69 sent the leader to rounds beside
# its rivals that the time limit could not pay for. At 0.07 two readings disagree beyond 2.9 sd of the
# between-run difference (one quiet pair in twenty); a burst's 2x and a quiet gap's 10x still do.
BETWEEN_FLOOR = 0.07
# An order no step breaks is questioned closer (see out_of_order): its cost is one short re-measurement of
# the smaller configuration, while a reading a busy machine slowed and left in bends the throughput model
# for every configuration it extrapolates to (issue 31: none@1 read 15% slow valued B:1's recompute as free).
ORDER_FLOOR = 0.05
# A reading whose own steps spread wider than this (relative half-width) on a busy machine is *shaky*: quiet
# readings of examples/gpt.py agree to ±1-3%; beside four bursting neighbours its none@1 read 13.7 ±21% and
# none@4 18.3 ±14%, a third and a quarter of their quiet speed (see :func:`busy_anchor`).
SHAKY = 0.10
MAX_READINGS = 3  # a configuration is measured at most this often before the search stops questioning it
REMEASURE_ATTEMPT = 2  # leases of re-measurements start here (0: the first trial, 1: its one retry)


def pressure(record: TrialRecord) -> float | None:
    """The CPU pressure over the steps its speed was read from (the busy ones left out: autotune.core.pressure),
    else over its whole trial."""
    return record.load.reading_pressure if record.load is not None else None


def disturbed(records: Iterable[TrialRecord]) -> set[int]:
    """The numbers of the trials whose CPU pressure was more than LOADED above the study's quietest while a
    neighbour was at work (autotune.hardware.load.Load.neighbour: pressure the trial's own processes make,
    a DataLoader's workers beside torch's threads, is no load: issue 43 found "7 of 10 trials ran while
    the machine was busy (CPU pressure up to 12%)" on an idle machine), and of those whose own steps read
    the load change as they ran (``shifted``: autotune.runtime.settling)."""
    records = list(records)
    shifted = {r.number for r in records if r.shifted}
    known = [(r, p) for r in records if (p := pressure(r)) is not None]
    if not known:
        return shifted
    quiet = min(p for _, p in known)
    return {
        r.number for r, p in known if p > quiet + LOADED and (r.load is None or r.load.neighbour)
    } | shifted


def taken_busy(records: Iterable[TrialRecord]) -> set[int]:
    """The numbers of the trials a busy machine took: :func:`disturbed`, or shaken by a neighbour
    (:func:`is_shaky`). A shaky reading counts even where the study has no quieter one to measure it
    against: beside four bursting neighbours every trial of an examples/gpt.py run at f886636 read at
    57-100% CPU pressure, none@32 at 16.8 ±100%, and it was no busier than the study's quietest, itself."""
    records = list(records)
    return disturbed(records) | {r.number for r in records if is_shaky(r)}


def read_busy(records: Iterable[TrialRecord]) -> set[Configuration]:
    """The configurations a reading of which (search, warm start, verification) a busy machine took
    (:func:`taken_busy`)."""
    records = list(records)
    busy = taken_busy(records)
    return {r.config for r in records if r.number in busy and r.kind in READINGS and r.config is not None}


def readings(records: Iterable[TrialRecord], config: Configuration) -> list[TrialRecord]:
    """The completed speed readings of ``config``: its search trials, warm starts and verifications."""
    return [
        r
        for r in records
        if (r.batch_size, r.plan) == config
        and r.kind in READINGS
        and r.outcome is Outcome.COMPLETE
        and r.throughput is not None
    ]


def disagree(intervals: Sequence[Interval]) -> bool:
    """Whether readings of one configuration disagree beyond their intervals (each at least ±BETWEEN_FLOOR)."""
    if len(intervals) < 2:
        return False
    half = [max(i.noise, BETWEEN_FLOOR) * i.mid for i in intervals]
    return max(i.mid - h for i, h in zip(intervals, half, strict=True)) > min(
        i.mid + h for i, h in zip(intervals, half, strict=True)
    )


def _intervals(rs: Sequence[TrialRecord]) -> list[Interval]:
    return [t for r in rs if (t := r.throughput) is not None]


def disagreeing(records: list[TrialRecord], config: Configuration) -> bool:
    """Whether ``config``'s readings disagree (see :func:`disagree`), those load slowed below a steadier or
    quieter one of it left out (:func:`outrun`)."""
    out = outrun(records)
    return disagree(_intervals([r for r in readings(records, config) if r.number not in out]))


def overruled(records: Iterable[TrialRecord]) -> set[int]:
    """The numbers of the search readings (measured or warm-started) of a configuration that its own
    verification readings, pooled, contradict (:func:`disagree`): they stand for a moment of the machine's
    load, not for the configuration. Only where those verification readings agree among themselves: two
    that disagree (one taken in a burst) say no more than the search's reading, and the median of all
    three decides (pooled, the slower two's range would overrule a fast search reading that the faster
    verification confirms, and the answer be the mean of a burst and a quiet run)."""
    records = list(records)
    out: set[int] = set()
    for config in {r.config for r in records if r.kind is TrialKind.VERIFICATION and r.config is not None}:
        rs = readings(records, config)
        checks = _intervals([r for r in rs if r.kind is TrialKind.VERIFICATION])
        verified = pooled(checks)
        if verified is None or disagree(checks):  # none completed, or they contradict each other
            continue
        searched = [r for r in rs if r.kind is not TrialKind.VERIFICATION]
        out |= {r.number for r in searched if disagree([*_intervals([r]), verified])}
    return out


def in_flight(records: Iterable[TrialRecord], config: Configuration) -> bool:
    return any((r.batch_size, r.plan) == config and r.state in ("RUNNING", "WAITING") for r in records)


def contradicted(records: list[TrialRecord], skip: Iterable[Configuration] = ()) -> Configuration | None:
    """A configuration whose readings disagree and that may be measured again (fewest readings first); not
    one in ``skip`` (:func:`slowed`: a larger batch of its plan is faster whatever its readings say)."""
    configs = {r.config for r in records if r.config is not None} - set(skip)
    out = outrun(records)
    found = []
    for config in configs:
        rs = [r for r in readings(records, config) if r.number not in out]
        if 2 <= len(rs) < MAX_READINGS and disagree(_intervals(rs)) and not in_flight(records, config):
            found.append((len(rs), config))
    return min(found)[1] if found else None


def is_shaky(record: TrialRecord) -> bool:
    """Whether its own steps spread by more than SHAKY while a neighbour kept the machine busy (CPU pressure
    over LOADED): a reading of the neighbour as much as of the configuration. Not where no pressure is
    known (a kernel without it): nothing says the spread was the load's."""
    speed, busy = record.throughput, pressure(record)
    if speed is None or speed.noise <= SHAKY or busy is None or record.load is None:
        return False
    return busy > LOADED and record.load.neighbour


def outrun(records: Iterable[TrialRecord]) -> set[int]:
    """The numbers of the search readings that load slowed below another reading of their configuration:
    a shaky one (:func:`is_shaky`) slower than one that is not, and one a busy machine took
    (:func:`disturbed`, or shaky) that disagrees with, and is slower than, another reading of it
    (:func:`disagree`), quiet or busy itself. Load only slows, so the faster one stands for the configuration;
    the two are no disagreement to measure a third time, nor a spread between trials that widens every
    other configuration's hopes (ThroughputModel.between). A verification's readings are never left out:
    side by side, they are what :func:`overruled` and contenders.choose rest on.

    Measured (issue 42, beside four bursting neighbours): examples/gpt.py's none@32 read 9.3 samples/s
    (±2%, steady, its steps all slowed alike), 94.7 in a quiet moment and 17.8 ±29%; the median of the
    three, 17.8, put none@32 below none@4's 63.2, their spread (2.4x) made every plan at batch 48 look able
    to win, and the search measured two of them (12-15 s each) before its verification read none@32 again.
    Two busy readings that disagree say the same of the slower (at f886636, beside four bursting
    neighbours, none@32 read 28.0 ±45% and then 11.3 ±14%, both busy: the two disagreeing, a third reading
    was taken, 13.8 s of the run's 84, busy again at 14.1)."""
    records = list(records)
    busy = taken_busy(records)
    out: set[int] = set()
    for config in {r.config for r in records if r.config is not None}:
        rs = readings(records, config)
        steady = [r.throughput for r in rs if r.throughput is not None and not is_shaky(r)]
        for r in rs:
            speed = r.throughput
            if r.kind is TrialKind.VERIFICATION or speed is None:
                continue
            shaken = is_shaky(r) and bool(steady) and speed.mid < min(i.low for i in steady)
            others = [o.throughput for o in rs if o is not r and o.throughput is not None]
            busier = r.number in busy and any(
                speed.mid < other.mid and disagree([speed, other]) for other in others
            )
            if shaken or busier:
                out.add(r.number)
    return out


def busy_anchor(
    records: list[TrialRecord],
    reference: str | None,
    largest: int,
    left_out: frozenset[Configuration] = frozenset(),
) -> Configuration | None:
    """A configuration the throughput line is anchored on (the reference plan, up to its largest batch size
    measured, ``largest``; not one the line leaves out, ``left_out``: ThroughputModel.slowed) that only a
    busy machine read: each of its readings, fewer than MAX_READINGS, was taken busy (:func:`taken_busy`);
    the smallest batch size first. What the line extrapolates to (a larger
    batch, another plan) is valued on such readings, and load only slows: a small batch read slow makes
    the step's fixed part look long and every larger batch look better, a largest batch read slow leaves
    a plan past it room to climb. Beside four bursting neighbours, examples/gpt.py read none@1 at 13.7
    ±21% and none@4 at 18.3 ±14%, a third and a quarter of their quiet speed, and none@32 at its own: the
    line through them valued every recompute plan at a batch past none's frontier above none@32, and the
    search measured four of them at batch 48 (10-23 s each there) before its verification. A plan's
    reading there, taken busy, bounds nothing (ThroughputModel.busy_plans) and the next plan is measured in
    its turn, while one more reading of a small batch costs a few seconds. At a3e620a (which read only
    shaky readings again, and only below the largest batch) two runs measured two and five plans at batch
    48, each read busy: one with none@4 read once at 27.0 ±10% (busy, steady: 94 quiet), 153 s; one with
    none@32 read once at 21.6 ±34% (107 quiet), 108 s; quiet runs take 14-16 s.

    Up to MAX_READINGS, though a second reading came back busy too: the line then rests on the faster
    reading of each (:func:`outrun`), and a third reading is a gamble against the plans past the line's
    largest batch (14-27 s each there, a small batch's reading 8-23 s). This rule is asked only
    where a configuration valued on the line is worth a trial: at 2fa44b2, which read such an anchor
    again once, none@4 read 21.0 and 15.6 (both busy) beside none@32's quiet 85.1, and the line through
    them sent the search to three plans at batch 48 (67 s of a 156 s run); beside four bursting
    neighbours 4 of 17 re-readings of none@1 and none@4 came back quiet (their steps at 2% pressure)."""
    busy = taken_busy(records)
    found = []
    for config in {r.config for r in records if r.config is not None}:
        anchor = config.plan == reference and config.batch_size <= largest and config not in left_out
        if not anchor or in_flight(records, config):
            continue
        rs = readings(records, config)
        if 0 < len(rs) < MAX_READINGS and all(r.number in busy for r in rs):
            found.append(config)
    return min(found, default=None)


def _edge(speeds: Mapping[Configuration, Interval], config: Configuration, sign: int) -> float:
    """``config``'s speed at its interval's edge up (``sign`` +1) or down (-1), at least ±ORDER_FLOOR."""
    speed = speeds[config]
    return speed.mid * (1 + sign * max(speed.noise, ORDER_FLOOR))


def _longer_step(speeds: Mapping[Configuration, Interval], slow: Configuration, other: Configuration) -> bool:
    """Whether ``slow``, a smaller batch of ``other``'s plan, read a longer step than ``other`` beyond both
    readings' noise: steps compared as batch / speed, cross-multiplied (a reading so noisy that its interval
    reaches 0 samples/s, a step of any length, contradicts nothing)."""
    return slow.batch_size * _edge(speeds, other, -1) > other.batch_size * _edge(speeds, slow, +1)


def _falls(speeds: Mapping[Configuration, Interval], slow: Configuration, small: Configuration) -> bool:
    """Whether ``slow`` read fewer samples/s than ``small``, a smaller batch of its plan, beyond both
    readings' noise (each at least ±ORDER_FLOOR)."""
    return _edge(speeds, slow, +1) < _edge(speeds, small, -1)


def slowed(
    speeds: Mapping[Configuration, Interval],
    fitting: Iterable[Configuration],
    busy: Iterable[Configuration] = (),
) -> frozenset[Configuration]:
    """The configurations whose readings a busy machine must have slowed and that can never be the answer:
    a longer step than a larger batch of the same plan that fits (:func:`_longer_step`). That larger batch
    is faster whatever the load did, so such a reading is measured again for nothing; it is left out of the
    throughput model instead (load only slows: its step time would pull the fitted line). Issue 42: beside
    four bursting neighbours, none@1 read 1.3 samples/s against none@4's 45.1, was measured twice more in
    processes of its own (a warm process on the CPU takes no smaller batch) at 10.3 and 26.5, and that spread
    became the between-trial noise that let Block:1@48 and Block:0.75@48 look able to win: four trials of
    the run's nine, and none@32 answered.

    So is one read only on a busy machine (``busy``) that read fewer samples/s than a smaller batch of its
    plan (beyond both readings' noise), where a larger batch of its plan fits: samples/s does not fall with
    the batch where memory is not the limit (throughput_model.dominates), and load only slows. Issue 42:
    beside four bursting neighbours, examples/gpt.py's none@4 read 18.2 (its one reading, busy) where
    none@1 read 40.0 quiet and none@32 94.7; the line through the three had a fixed step four times the
    quiet one's, valued the plans at batch 48 above none@32, and three of them were measured (13-22 s
    each) before the verification."""
    fits, busy = set(fitting), set(busy)

    def is_slowed(slow: Configuration) -> bool:
        larger = [o for o in fits if o.plan == slow.plan and o.batch_size > slow.batch_size]
        if any(_longer_step(speeds, slow, other) for other in larger if other in speeds):
            return True
        smaller = [o for o in speeds if o.plan == slow.plan and o.batch_size < slow.batch_size]
        return bool(larger) and slow in busy and any(_falls(speeds, slow, small) for small in smaller)

    return frozenset(slow for slow in speeds if is_slowed(slow))


def unanswerable(records: list[TrialRecord], limit: int) -> frozenset[Configuration]:
    """The configurations over ``limit`` by the majority of their peaks (records.peak_verdict) whose speed
    readings disagree: left out of the throughput model, like :func:`slowed`, and not measured again. Such a
    configuration is never the answer; a reading of it only bends the line the others are valued on, and
    a run spent settling it is one not spent on a configuration that fits. Issue 42's bench, beside four
    bursting neighbours: examples/mlp.py's none@512 read 1023 samples/s warm and 272 in a process of its
    own, both over the 634.2 MiB limit; a third reading (551, ±50%) took the run's last search trial, and
    the run answered none@128 at 0.65 of none@384's quiet speed, which it never measured."""
    return frozenset(
        config
        for config in {r.config for r in records if r.config is not None}
        if peak_verdict(records, config, limit) is False and disagree(_intervals(readings(records, config)))
    )


def out_of_order(
    records: list[TrialRecord], speeds: Mapping[Configuration, Interval]
) -> Configuration | None:
    """A configuration read once whose reading a busy machine must have slowed (see the module docstring),
    the smallest batch size first (the cheapest trial); None when every reading keeps the order. ``speeds``:
    each configuration's readings pooled (ThroughputModel.pooled). Each side
    is taken at its interval's edge toward the other (at least ±ORDER_FLOOR), so only a contradiction
    beyond what two quiet trials usually differ by counts.

    Issue 31's CI run read none@1 15% slow (a 0.05 s step beside a core another test was using): its step
    as long as at 24 leaves the fitted line no per-sample time, which values every large batch as if free."""

    suspects = set()
    for slow, other in itertools.permutations(speeds, 2):
        (batch, plan), (other_batch, other_plan) = slow, other
        if plan == other_plan and batch < other_batch:  # a longer step at the smaller batch
            wrong = _longer_step(speeds, slow, other)
        elif batch == other_batch and plan == "none" and other_plan != "none":  # none slower than a recompute
            wrong = plan_recomputes_at_least(other_plan, "none") and _edge(speeds, other, -1) > _edge(
                speeds, slow, +1
            )
        else:
            continue
        if wrong and len(readings(records, slow)) == 1 and not in_flight(records, slow):
            suspects.add(slow)
    return min(suspects, default=None)


def unsettled(records: list[TrialRecord], deciders: Sequence[Configuration]) -> Configuration | None:
    """The decider to measure again before the search may stop (None: they are settled): one read only on
    a busy machine (:func:`taken_busy`, or where the kernel gives no CPU pressure), or whose readings
    disagree; the one read least often first, so that two deciders are measured interleaved."""
    busy, out = taken_busy(records), outrun(records)
    needing = []
    for order, config in enumerate(dict.fromkeys(deciders)):
        rs = readings(records, config)
        if not rs or in_flight(records, config):
            continue
        unsure = any(r.number in busy or (r.load is not None and r.load.reading_pressure is None) for r in rs)
        kept = _intervals([r for r in rs if r.number not in out])  # those load slowed below another left out
        if (len(rs) < 2 and unsure) or (len(rs) < MAX_READINGS and disagree(kept)):
            needing.append((len(rs), order, config))
    return min(needing)[2] if needing else None


def next_attempt(records: Iterable[TrialRecord], config: Configuration) -> int:
    """The lease attempt of the next re-measurement of ``config``, from its trials (the search raises it
    past any lease of that configuration already stored)."""
    done = sum(1 for r in records if (r.batch_size, r.plan) == config and r.kind is TrialKind.MEASURED)
    return REMEASURE_ATTEMPT + max(done - 1, 0)


def certainty(records: list[TrialRecord], config: Configuration) -> str | None:
    """One line on how noisy the tuning was, or None for a quiet one: how far readings of one configuration
    disagreed, how many trials a busy machine disturbed, and how often the answer was measured."""
    spread = 1.0
    for key in {r.config for r in records if r.config is not None}:
        mids = [i.mid for i in _intervals(readings(records, key))]
        if len(mids) > 1 and min(mids) > 0:
            spread = max(spread, max(mids) / min(mids))
    busy = disturbed(records)
    pressures = [p for r in records if r.number in busy and (p := pressure(r)) is not None]
    parts = []
    if spread > 1 + 2 * BETWEEN_FLOOR:
        parts.append(f"readings of one configuration varied {spread:.1f}x between trials")
    if pressures:
        parts.append(
            f"{len(pressures)} of {sum(1 for r in records if r.load is not None)} trials ran while the "
            f"machine was busy (CPU pressure up to {100 * max(pressures):.0f}%)"
        )
    if not parts:
        return None
    n = len(readings(records, config))
    return f"{'; '.join(parts)}: the answer was measured {n} time{'s' if n != 1 else ''}"
