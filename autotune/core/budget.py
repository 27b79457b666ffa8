"""Memory budgets: ``40GB``, ``40 GiB``, ``0.5TiB``, ``90%`` of the device, and byte formatting.

Grammar (ASCII only, one optional space between number and unit)::

    budget  := number [" "] unit | number "%"
    number  := digits ["." digits]
    unit    := B | KB | MB | GB | TB          (decimal: 1 GB = 10**9 bytes)
             | KiB | MiB | GiB | TiB          (binary:  1 GiB = 2**30 bytes)

Units are case-insensitive. A percentage is of the measured device's total memory (GPU memory on a GPU,
the machine's or container's memory limit on the CPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from autotune.core.errors import InputError
from autotune.core.protocol import Outcome

DEFAULT_HEADROOM = 0.05  # the margin a winner's verified peak keeps under the budget

UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

GRAMMAR = "a number and a unit, e.g. 40GB, 40 GiB, 0.5TiB, 40000MiB (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), or a percentage of the device such as 90%"

# re.ASCII: \d must not match full-width or Arabic-Indic digits, which float() would accept.
_BUDGET = re.compile(r"(?P<num>\d+(?:\.\d+)?)(?: ?(?P<unit>[a-z]+)|(?P<pct>%))", re.ASCII | re.IGNORECASE)


@dataclass(frozen=True)
class Budget:
    """A parsed budget: an absolute size in bytes, or a fraction of the device's total memory."""

    text: str
    absolute_bytes: int | None = None
    fraction: float | None = None

    def resolve(self, device_total_bytes: int | None) -> int:
        """The budget in bytes on a device with ``device_total_bytes`` of memory.

        Raises:
            InputError: the budget exceeds the device, or is a percentage and the total is unknown.
        """
        if self.fraction is not None:
            if device_total_bytes is None:
                raise InputError(
                    f"budget {self.text!r} is a percentage, but the device's total memory is unknown"
                )
            return int(device_total_bytes * self.fraction)
        assert self.absolute_bytes is not None  # built by parse_budget
        if device_total_bytes is not None and self.absolute_bytes > device_total_bytes:
            raise InputError(
                f"budget {self.text!r} ({format_bytes(self.absolute_bytes)}) is more than the device has "
                f"({format_bytes(device_total_bytes)})"
            )
        return self.absolute_bytes

    def limit(self, device_total_bytes: int | None, headroom: float = DEFAULT_HEADROOM) -> Limit:
        """This budget on a device with ``device_total_bytes``, less ``headroom``.

        Raises:
            InputError: as :meth:`resolve`, or a headroom outside [0, 1).
        """
        return Limit(self.resolve(device_total_bytes), headroom)


@dataclass(frozen=True)
class Limit:
    """A budget in bytes and the headroom its winner keeps: ``bytes`` is what a measured peak must stay
    under. The one place where a budget becomes a limit."""

    budget_bytes: int
    headroom: float = DEFAULT_HEADROOM

    def __post_init__(self) -> None:
        check_headroom(self.headroom)

    @property
    def bytes(self) -> int:
        return int(self.budget_bytes * (1 - self.headroom))


def peak_phase(
    warmup_peak_bytes: int | None, steady_peak_bytes: int | None, phase_peaks: dict[str, int] | None = None
) -> str | None:
    """Which phase of a trial set its peak: "warm-up" (start-up, compilation, autotuning), "steady" (its
    measured steps), or a phase of the job it ran after them ("eval", "save"); None when warm-up or the
    steps were not sampled."""
    if warmup_peak_bytes is None or steady_peak_bytes is None:
        return None
    peaks = {"steady": steady_peak_bytes, "warm-up": warmup_peak_bytes, **(phase_peaks or {})}
    return max(peaks, key=lambda name: peaks[name])  # a tie: the steps, then warm-up


def fits(outcome: Outcome | None, peak_bytes: int | None, limit_bytes: int) -> bool:
    """The one rule for fitting: the trial completed and its measured peak is within ``limit_bytes``. (An
    out-of-memory trial never fits; its peak is only a lower bound.)"""
    return outcome is Outcome.COMPLETE and peak_bytes is not None and peak_bytes <= limit_bytes


def with_rise(peak_bytes: int | None, rising_bytes: int | None) -> int | None:
    """The peak a run must hold room for: its measured peak, and as much again as it still rose over its
    last steps where its run ended before the peak settled (autotune.trials.settle.still_rising)."""
    return peak_bytes + rising_bytes if peak_bytes is not None and rising_bytes else peak_bytes


def check_headroom(headroom: float) -> float:
    """Raises InputError unless ``headroom`` is in [0, 1)."""
    if not 0 <= headroom < 1:
        raise InputError(f"headroom must be in [0, 1), got {headroom}")
    return headroom


def parse_headroom(text: str) -> float:
    """``'5%'`` or ``'0.05'`` -> 0.05.

    Raises:
        InputError: not a number, or outside [0, 1).
    """
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        raise InputError(
            f"invalid headroom {text!r}: expected a percentage such as 5% or a fraction such as 0.05"
        ) from None
    return check_headroom(value)


def parse_budget(text: str) -> Budget:
    """Parse a budget string (see the module docstring for the grammar).

    Raises:
        InputError: one line naming the bad value and the accepted grammar.
    """
    match = _BUDGET.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InputError(f"invalid budget {text!r}: expected {GRAMMAR}")
    number = Decimal(match["num"])
    if match["pct"]:
        if not 0 < number <= 100:
            raise InputError(f"invalid budget {text!r}: a percentage must be in (0, 100]")
        return Budget(text=text, fraction=float(number / 100))
    unit = match["unit"].lower()
    if unit not in UNITS:
        raise InputError(f"invalid budget {text!r}: unknown unit {match['unit']!r}; expected {GRAMMAR}")
    size = int(number * UNITS[unit])
    if size <= 0:
        raise InputError(f"invalid budget {text!r}: must be positive")
    return Budget(text=text, absolute_bytes=size)


def format_bytes(size: float) -> str:
    """``1536 * 2**20`` -> ``'1.50 GiB'``: binary units, as nvidia-smi and most profilers print them."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def signed_bytes(size: float) -> str:
    """``format_bytes`` with a minus for a negative size (a saving that costs memory)."""
    return ("-" if size < 0 else "") + format_bytes(abs(size))
