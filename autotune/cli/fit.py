"""Fitting output to the terminal's width: plan names shortened the same way everywhere (with a legend), and
text clipped to one line with an ellipsis rather than wrapped or dropped.

A plan is shortened in steps, each only when the last was not enough: operator kinds to their short names
(``attention`` -> ``attn``), then class names to their capitals (``LlamaDecoderLayer`` -> ``LDL``). Every
shortening is remembered, so the same plan reads the same in a run's lines and in its table, and the legend
says what each short name stands for.
"""

from __future__ import annotations

import re

OPS = {
    "attention": "attn",
    "matmul": "mm",
    "activation": "act",
    "dropout": "drop",
    "elementwise": "elem",
    "recompute=": "rc=",
}
_CLASS = re.compile(r"(?<![\w=+])([A-Z][A-Za-z0-9_]*)(?=:|$|\|)")


class PlanNames:
    """Plan names at most ``width`` characters, and the legend of what was shortened."""

    def __init__(self, width: int = 24) -> None:
        self.width = width
        self.ops: dict[str, str] = {}
        self.classes: dict[str, str] = {}

    def __call__(self, plan: str | None) -> str:
        plan = plan or ""
        if len(plan) <= self.width:
            return plan
        short = plan
        for long, abbrev in OPS.items():
            if long in short:
                short = short.replace(long, abbrev)
                self.ops[abbrev] = long.rstrip("=")
        if len(short) <= self.width:
            return short
        short = _CLASS.sub(self._class, short)
        return clip(short, self.width)

    def _class(self, match: re.Match[str]) -> str:
        name = match.group(1)
        initials = "".join(c for c in name if c.isupper() or c.isdigit()) or name[:3]
        taken = {v: k for k, v in self.classes.items()}
        abbrev, n = initials, 2
        while taken.get(abbrev, name) != name:  # two classes, one set of capitals: number the second
            abbrev, n = f"{initials}{n}", n + 1
        self.classes[name] = abbrev
        return abbrev

    def legend(self) -> str | None:
        """``plans shortened: LDL = LlamaDecoderLayer, attn = attention``; None when nothing was."""
        pairs = [f"{v} = {k}" for k, v in self.classes.items()] + [f"{k} = {v}" for k, v in self.ops.items()]
        return f"plans shortened: {', '.join(pairs)}" if pairs else None


def clip(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters, an ellipsis marking the cut."""
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def plan_width(width: int) -> int:
    """How wide a plan name may be in a table or trial line of a terminal ``width`` columns wide."""
    return 16 if width < 90 else 24 if width < 130 else 40
