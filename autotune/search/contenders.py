"""Who a verification compares, and who wins: decisions read from the trial records alone.

autotune.search.verify runs the verification (leases, trial runs, what it tells the user); the rules it runs
by are here, as functions of the records, so a test can replay a run's readings without running a trial.

- Who is compared: the leader and its :func:`rivals` (their readings overlap it, or the throughput model
  says they could); after a verification disproves the leader, its :func:`challengers` (by the model, not
  the next raw reading); where a busy machine took the readings, the fitting configurations that dominate
  the leader by the model's structure (:func:`dominating`), measured in its place (:func:`in_place`).
- What a reading settles: whether a round :func:`decided`; whether a verified leader's reading fell below
  another's interval (:func:`disproved`: its challengers are measured), or, its own readings disagreeing,
  it is answered alone (:func:`settled_alone`).
- Who wins: :func:`choose` (the fastest by all its readings; a tie goes to the smaller peak; a busy
  machine's readings never crown a configuration another dominates); where the run can pay for no more
  runs, :func:`unverified` and :func:`standing`.
"""

from __future__ import annotations

import statistics

from autotune.core.stats import Interval
from autotune.search import noise
from autotune.search.propose import Configuration, speed_of
from autotune.search.records import TIE, TrialKind, TrialRecord, peak_verdict
from autotune.search.throughput_model import ThroughputModel, dominates, outranks

MAX_CONTENDERS = 3  # the leader and at most two rivals are measured again


def rivals(
    leader: Configuration,
    ranked: list[tuple[Configuration, Interval]],
    records: list[TrialRecord],
    forward_shares: dict[str, float],
    transfer: dict[str, float] | None = None,
) -> list[Configuration]:
    """The configurations that could be as fast as the leader (at most MAX_CONTENDERS - 1, the likeliest
    first; ``ranked``: the fitting configurations with their readings, fastest first): their readings'
    interval overlaps the leader's, or the throughput model fitted to every *other* configuration's
    readings predicts them within it (a slow reading of a configuration the rest of the
    landscape says is fast is the machine's noise, not the configuration's speed) and the model's own
    structure does not rank them below the leader (:func:`dominates`: the leader's plan at a smaller batch
    is never faster than the leader, whatever a fit extrapolated below the batches it was fitted on says).
    A configuration the leader dominates whose readings put it below the leader too is no rival, however
    its interval overlaps: readings and structure agree; one that reads as fast as the leader or faster is,
    where they disagree, and so is a smaller batch of the leader's plan within TIE of it, which
    :func:`choose` takes from a tie for its smaller peak.

    Measured (#32): a loop whose throughput is flat from batch 4 to 24 had batch 1 (20.3 samples/s) re-measured
    twice against the 32.7 leader, none@24, on a fit of batches 4-24 that put batch 1 at the leader's speed.
    Measured (#41): bench/time_to_answer.py's GPT-2 on the CPU spent 65 of its 188 s verifying
    GPT2Block:0.25@7 (3.68 samples/s, its interval overlapping) beside the leader none@7 (3.80), which
    recomputes nothing at the same batch and was answered."""
    own = dict(ranked).get(leader)
    if own is None:
        return []
    likely: dict[Configuration, float] = {}
    for config, reading in ranked:
        others = speed_of([r for r in records if (r.batch_size, r.plan) != config], forward_shares, transfer)
        # Only what the others measured predicts a configuration: its plan's overhead or the curve itself.
        known = config.plan == others.reference or config.plan in others.overhead
        predicted = (others.predict(*config) or 0.0) if known else 0.0
        below = dominates(leader, config)  # by the model's structure
        plausible = predicted >= own.low and not below
        # and by its readings, unless it ties and choose() would take it for its smaller peak
        tied = not outranks(leader, config) and reading.mid >= own.mid * (1 - TIE)
        agreed = below and reading.mid < own.mid and not tied
        if config != leader and not agreed and (reading.overlaps(own) or plausible):
            likely[config] = max(reading.mid, predicted)
    return sorted(likely, key=lambda c: -likely[c])[: MAX_CONTENDERS - 1]


def challengers(
    leader: Configuration,
    ranked: list[tuple[Configuration, Interval]],
    records: list[TrialRecord],
    forward_shares: dict[str, float] | None = None,
) -> list[Configuration]:
    """The rivals of a leader its verification disproved (at most MAX_CONTENDERS - 1; ``ranked``: the
    fitting configurations with their readings): those that could be faster than it verified, by the
    throughput model fitted to every reading no verification overruled (autotune.search.noise.overruled),
    a configuration as fast as its own readings or the model say, whichever is more; first those that no
    other fitting configuration dominates by the model's structure (:func:`dominates`: the same plan at a
    larger batch, ``none`` at the same batch), the likeliest first. Not the next by its raw reading: on a
    busy machine that is another reading taken in a quiet gap.

    Where a busy machine took a reading of the leader, none it dominates is a rival: :func:`choose` drops
    it from a busy round, and a quiet one reads it no faster than the leader (which fits).

    Measured (issue 42): the demo's none@4, read at 103 in a quiet gap, verified at 10; its rival by raw
    reading was none@1 (40.6, another gap), and none@32, read twice at 23, was never compared: none@4 was
    answered at half of none@32's speed. And beside four bursting neighbours, examples/gpt.py's none@32,
    read 9.3, 23.7 and 90.6, was measured in a second round beside none@4 and none@1 (10-15 s each)."""
    verified = speeds(records).get(leader)
    floor = verified.low if verified is not None else 0.0
    model = speed_of(records, forward_shares)
    fitting = [c for c, _ in ranked]
    likely: dict[Configuration, float] = {}
    busy = loaded(records, [leader])
    for config, reading in ranked:
        estimate = max(reading.mid, model.predict(*config) or 0.0)
        if busy and dominates(leader, config):
            continue
        if config != leader and max(reading.high, estimate) >= floor:
            likely[config] = estimate
    undominated = {c for c in likely if not any(dominates(o, c) for o in fitting if o != c)}
    order = sorted(likely, key=lambda c: (c not in undominated, -likely[c], c))
    return order[: MAX_CONTENDERS - 1]


def dominating(
    leader: Configuration, fitting: list[Configuration], records: list[TrialRecord]
) -> list[Configuration]:
    """Where a busy machine took the readings of the leader or of a fitting configuration that dominates it
    by the throughput model's structure (:func:`autotune.search.throughput_model.dominates`: its plan at a
    larger batch, a plan recomputing less at its batch): those configurations, the ones no other of them
    dominates; they are verified beside it. Issue 42: beside four bursting neighbours on 2 cores, a larger
    batch read slower even side by side (every answer of examples/mlp.py at 700 MB was a smaller batch of
    ``none`` than the quiet optimum, none@384, at 0.53-0.86 of its quiet speed); and the demo beside two
    such neighbours read none@1 at 41 in a quiet moment and none@2 and none@4 at 2-24 in busy ones, and
    answered none@1 at half of none@32's speed."""
    above = [c for c in fitting if dominates(c, leader)]
    if not loaded(records, [leader, *above]):
        return []
    return without_dominated(above)[: MAX_CONTENDERS - 1]


def in_place(
    leader: Configuration, stronger: list[Configuration], rivals_: list[Configuration]
) -> list[Configuration]:
    """The contenders a verification measures (at most MAX_CONTENDERS): the leader and its rivals; where fitting
    configurations dominate it and a busy machine took the readings (``stronger``: :func:`dominating`),
    those in its place, with the rivals none of them dominates. :func:`choose` takes no configuration
    another contender dominates once a busy machine took any of their readings, so the leader, and a rival
    one of them dominates, could only be answered if none of them fits: the leader is then verified after
    them (autotune.search.verify). Measured (#42): beside four bursting neighbours on 2 cores, examples/gpt.py's
    verifications measured a dominated leader beside none@32 in most runs, 7-20 s each, for a reading that
    could not change the answer."""
    if not stronger:
        return list(dict.fromkeys([leader, *rivals_]))[:MAX_CONTENDERS]
    free = [c for c in rivals_ if c != leader and not any(dominates(s, c) for s in stronger)]
    return list(dict.fromkeys([*stronger, *free]))[:MAX_CONTENDERS]


def decided(
    records: list[TrialRecord], contenders: list[Configuration], latest: set[int], in_place_: bool = False
) -> str | None:
    """Why another round of side-by-side readings would not change the answer, None while it could: no
    reading of the last round (``latest``: their numbers) was taken while the machine was busy
    (autotune.search.noise.disturbed), and one contender is left (a leader measured again because its own
    readings disagreed: the median of three) or each contender either ties with the fastest by all its
    readings (within TIE: :func:`choose` then decides on peaks and the model's structure, which a reading
    more does not move) or lies below it beyond both intervals. The second round is for a load that comes
    and goes; on a quiet machine the first decides (issue 41: verification took 35 of a quiet demo's 56 s,
    two rounds of three contenders).

    A disturbed round decides where one contender dominates every other by the throughput model's
    structure (:func:`dominates`): under load :func:`choose` drops the dominated and the readings order
    nothing else, so a round more buys nothing (issue 42's heavy demo measured none@32 five times for
    --trials 10, with none@24 and Block:0.25@32 beside it); so does a round of one contender measured in the
    place of a leader it dominates (``in_place_``: :func:`in_place`), which is the answer where it fits
    whatever it reads; and so does a round of a lone leader measured again because its own readings
    disagreed (what it dominates left out of the round: autotune.search.verify): a busy reading more moves
    the speed reported, and the certainty line already says the machine was busy, not the answer.

    An undisturbed round also settles a contender that reads below the fastest, their intervals
    overlapping, where the fastest dominates it (its plan at a larger batch, a plan recomputing less):
    readings and structure agree, and a round more could at most make the two a tie, which :func:`choose`
    gives to the smaller peak, trading speed the readings say is there for headroom the verification has
    already read. Measured (#41): bench/gpt2_train.py on a quiet CPU at 2312 MiB verified none@4 (2.76
    samples/s in the search) beside none@7 (2.67): 2.38 against 2.83 side by side, then a second round of
    two fresh processes (3.30 against 3.31: 34 s of a 136 s run) made them a tie and answered none@4."""
    if noise.disturbed(records) & latest:
        top = without_dominated(contenders)
        if len(contenders) > 1 and len(top) == 1:
            return (
                f"the machine was busy, and {top[0].label} dominates every other contender by the "
                "throughput model's structure (readings taken busy order nothing else)"
            )
        if in_place_ and len(contenders) == 1:
            return (
                f"the machine was busy, and {contenders[0].label} dominates the leader by the throughput "
                "model's structure (readings taken busy order nothing else)"
            )
        if len(contenders) == 1:
            return (
                "the machine was busy, and one contender is left: a reading more would move the speed "
                "reported, not the answer"
            )
        return None
    if len(contenders) < 2:  # its own readings disagreed: a third, undisturbed, makes their median
        return "its reading was not disturbed, and one contender is left"
    readings = speeds(records)
    fastest = max(contenders, key=lambda c: readings[c].mid)
    bar = readings[fastest].mid * (1 - min(readings[fastest].noise, TIE))
    if any(
        bar > readings[c].mid and readings[c].high >= readings[fastest].low and not dominates(fastest, c)
        for c in contenders
    ):
        return None
    return (
        f"none of its readings was disturbed, and each contender ties with {fastest.label}, lies below it "
        "beyond both intervals, or lies below it and is dominated by it (the throughput model's structure)"
    )


def settled_alone(
    leader: Configuration,
    overtaken: Configuration | None,
    rivals_: list[Configuration],
    records: list[TrialRecord],
) -> bool:
    """Whether a verified leader whose own readings disagree is answered without another: nothing overtook
    it, it has no rival (:func:`challengers`: where a busy machine took its readings, none it dominates is
    one), and a busy machine took them. Another reading would make the median of three, which moves the
    speed reported (the certainty line says the machine was busy), not the answer. Issue 42: beside four
    bursting neighbours, examples/gpt.py's none@32, read 76.2 in its search and 24.8 verified, was
    verified again alone (24.1, 19 s of a 96 s run)."""
    return overtaken is None and not rivals_ and loaded(records, [leader])


def disproved(
    leader: Configuration, verified: Interval | None, ranked: list[tuple[Configuration, Interval]]
) -> Configuration | None:
    """The best other configuration (``ranked``: the fitting ones with their readings, fastest first) whose
    interval lies above the leader's ``verified`` reading, if any; not one the leader dominates by the
    throughput model's structure (:func:`dominates`): that one reading faster says the leader's reading was
    slowed, which :func:`noise.disagreeing` asks about. Issue 42: beside four bursting neighbours,
    examples/gpt.py's none@32 verified at 14.0 (94.7 in its search) was "below Block:0.25@32's interval"
    (73.5), a plan recomputing a quarter of the blocks at the same batch."""
    for config, speed in ranked:
        if config == leader or dominates(leader, config):
            continue
        if verified is not None and verified.high < speed.low:
            return config
    return None


def choose(records: list[TrialRecord], contenders: list[Configuration], memory_noise: float) -> Configuration:
    """The fastest contender by all its readings; among those within its noise (at most TIE of its speed):
    first, those that no tied contender recomputing less at the same batch outranks (:func:`outranks`:
    where readings cannot tell two plans apart, the recompute's cost can); of those, the ones whose peak
    (the median of its readings) is within the memory noise of the smallest; of those, the fastest. A
    larger batch of a tied contender's own plan does not outrank it: a tie is a curve that has flattened,
    and the smaller peak keeps the headroom (issue 43: the T5 script's batch 64 beat 48 at +2% and, verified
    at 1.85 GiB, reached 1958 MiB within 60 steps, past its 1945.6 MiB limit; the ViT's 128 beat 96 at +0.7%
    for ~300 MiB more). Unless the curve has not flattened between them (:func:`climbs`: the throughput
    model, fitted to every reading, puts the larger batch faster beyond TIE): then the tie is the readings'
    noise, and the larger batch outranks the smaller as a plan recomputing less does at one batch. Measured
    (#42): examples/gpt.py at 1 GiB on a quiet machine read none@32 at 99.4 samples/s in the search and
    86.3 and 87.9 in fresh processes of 8 steps (their steps still quickening: 0.37 s falling to 0.34),
    none@4 at 86.9 and 89.7; the tie answered none@4, at 0.82 of none@32's speed by 15-step readings
    (90.5 against 109.0); the model put none@32 7.8% above none@4.

    Measured on a busy machine (issue 25's bench): the smaller peak within the speed noise once chose a
    recompute plan 5% slower than ``none`` at the same batch size (a few MiB smaller by RSS: noise too);
    readings spread ±15% made batch 4 (105 samples/s by its median) a tie with batch 32 (114), and batch
    4's smaller peak won, at 0.77 of the optimum; and every reading of a run taken under load put batch 4,
    batch 32 and MLP:1@32 within 0.4% of each other.

    Where a busy machine took the contenders' readings, none that another contender dominates is chosen,
    whatever the readings say: under contention a larger batch, or ``none`` beside a plan that recomputes,
    reads slower than it runs on the machine the answer is for (torch's threads wait on one another when a
    core is taken from them), and readings taken side by side do not undo that. Nor where they were not
    read side by side (:func:`side_by_side`: a run that could pay for no round): a leader's longer run in a
    process of its own beside a rival's one search reading is no comparison, and nothing but the model's
    structure orders them (issue 41: bench/time_to_answer.py's GPT-2 verified none@7 at 2.69 samples/s
    against 3.01 in the search, the time limit left no round, and none@4's one reading, 2.85, tied the
    two's median: none@4 was answered, 0.89x the peer's speed where none@7 ran 1.04x).

    Where both hold (a busy machine took readings not taken side by side), the readings order nothing:
    the first of ``contenders`` that no other dominates is chosen, the leader (callers give it first: the
    configuration the search found, whose verification read its peak), or what dominates it. Issue 42:
    beside four bursting neighbours, examples/gpt.py's run spent its --trials on plans at batch 48 and
    verified none@32 at 29.4 against its search's 93.6; with no run left for a round, the one busy reading
    of CausalSelfAttention:1@48 (67.9) beat none@32's median and was answered, at 0.72 of none@32's quiet
    speed (Block:0.5@48 in another run, 0.71)."""
    apart = not side_by_side(records, contenders)
    if apart or loaded(records, contenders):
        contenders = without_dominated(contenders)
        if apart and loaded(records, contenders):
            return contenders[0]
    model = speed_of(records)
    readings = model.pooled
    peaks = {
        c: statistics.median(
            [r.peak_bytes or 0 for r in records if (r.batch_size, r.plan) == c and r.measured]
        )
        for c in contenders
    }
    fastest = max(contenders, key=lambda c: readings[c].mid)
    bar = readings[fastest].mid * (1 - min(readings[fastest].noise, TIE))
    close = [c for c in contenders if readings[c].mid >= bar]
    undominated = [c for c in close if not any(outranks(o, c) or climbs(model, o, c) for o in close)] or close
    smallest = min(peaks[c] for c in undominated)
    lean = [c for c in undominated if peaks[c] <= smallest + memory_noise]
    return max(lean, key=lambda c: (readings[c].mid, -peaks[c]))


def climbs(model: ThroughputModel, larger: Configuration, smaller: Configuration) -> bool:
    """Whether ``larger`` is ``smaller``'s plan at a larger batch that ``model`` predicts faster beyond TIE:
    the curve between them still climbs, and readings that tie them are noise (:func:`choose`). Where the
    curve has flattened (issue 43's T5 at batches 48 and 64, +2%) it predicts them within TIE."""
    (batch, plan), (other_batch, other_plan) = larger, smaller
    if plan != other_plan or batch <= other_batch:
        return False
    high, low = model.predict(*larger), model.predict(*smaller)
    return high is not None and low is not None and high > low * (1 + TIE)


def unverified(
    leader: Configuration, stronger: list[Configuration], records: list[TrialRecord], memory_noise: float
) -> Configuration:
    """The answer of a run that can pay for no verification: the leader, or, where a busy machine took the
    readings of fitting configurations that dominate it (``stronger``: :func:`dominating`), the one
    :func:`choose` takes from them all, which is never one another dominates: what a verification would
    have answered had its side-by-side readings been as busy. Measured (#42): beside four bursting
    neighbours, examples/gpt.py's run reached its time limit with none@1 (one quiet reading, 37.1)
    leading none@32 (27.3 by the median of three readings, 78.2 the quiet one) and answered none@1,
    unverified, at 0.4 of none@32's speed."""
    return choose(records, [leader, *stronger], memory_noise) if stronger else leader


def standing(
    asked: list[Configuration],
    measured: list[Configuration],
    records: list[TrialRecord],
    limit: int,
    memory_noise: float,
) -> Configuration | None:
    """The answer where a verification that could pay for fewer runs than its contenders (``asked``, the
    leader first) measured only some of them (``measured``), and none of those fitted: the one :func:`choose`
    takes from the others that fit by their readings (records.peak_verdict), unverified; None where none
    does. They were not shown not to fit: failing the leader with what its stand-in read drops a
    configuration that fits. Measured (#42): examples/mlp.py at 700 MB, quiet, --trials 10, one run left:
    none@256 led (777 samples/s), none@384 (732, dominating it, the two not read side by side) was read
    alone in its place at 635.95 MiB against a 634.19 MiB limit, and none@256's verification failed with
    "0 of its 1 peaks over the limit"; none@384's split peaks failed the next, and none@64 was answered,
    unverified, at 0.77 of none@256's reading."""
    left = [c for c in dict.fromkeys(asked) if c not in measured and peak_verdict(records, c, limit) is True]
    return choose(records, left, memory_noise) if left else None


def speeds(records: list[TrialRecord]) -> dict[Configuration, Interval]:
    """Every configuration's throughput over all its readings (search, warm start and verifications)."""
    return speed_of(records).pooled


def side_by_side(records: list[TrialRecord], contenders: list[Configuration]) -> bool:
    """Whether every one of several contenders was measured again by the verification (interleaved: a
    round), so that readings, not only the model's structure, may order them."""
    verified = {r.config for r in records if r.kind is TrialKind.VERIFICATION and r.throughput is not None}
    return len(contenders) < 2 or all(c in verified for c in contenders)


def loaded(records: list[TrialRecord], configs: list[Configuration]) -> bool:
    """Whether a busy machine took any reading of ``configs`` (autotune.search.noise.disturbed)."""
    return not noise.read_busy(records).isdisjoint(configs)


def without_dominated(configs: list[Configuration]) -> list[Configuration]:
    """``configs`` less those another of them dominates by the throughput model's structure, in order."""
    return [c for c in configs if not any(dominates(o, c) for o in configs)]
