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
