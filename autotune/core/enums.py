"""The base of autotune's text enums: values that are stored and printed as their text."""

from __future__ import annotations

import enum


class TextEnum(str, enum.Enum):
    """A ``str`` enum whose ``str()`` and f-string form is its value (``Outcome.OOM`` prints ``oom``), as
    Python 3.11's StrEnum does; autotune supports 3.10."""

    def __str__(self) -> str:
        return str(self.value)
