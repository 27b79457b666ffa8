"""How a search tells its caller what is happening, without printing: the CLI passes a Reporter that
draws progress; the library's default reports nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from autotune.search.records import TrialRecord


class Reporter(Protocol):
    def trial_started(self, number: int, batch_size: int, plan: str, why: str) -> None: ...

    def trial_progress(self, steps: int, elapsed: float) -> None: ...

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None: ...

    def skipped(self, record: TrialRecord) -> None: ...

    def note(self, text: str) -> None: ...

    def searching(self, counted: int, target: int, contenders: int | None) -> None:
        """Before a proposed trial: trials counted so far, the most the search will run, and how many
        configurations could still beat the best (None: not known yet)."""


class SilentReporter:
    def trial_started(self, number: int, batch_size: int, plan: str, why: str) -> None:
        pass

    def trial_progress(self, steps: int, elapsed: float) -> None:
        pass

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        pass

    def skipped(self, record: TrialRecord) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def searching(self, counted: int, target: int, contenders: int | None) -> None:
        pass
