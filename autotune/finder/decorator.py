"""``autotune.find_batch_size``: Accelerate's ``find_executable_batch_size`` shape, measured.

    @autotune.find_batch_size(budget="12GB")      # or bare: the device's memory
    def train(batch_size):
        model, optimizer, loader = build(batch_size)   # built inside, as for Accelerate's finder
        for batch in loader:
            ...

    train()    # searches here, then trains at the answer; train.answer is the TuneResult

The first call searches batch size x recompute plan in this process (autotune.finder.inprocess: each
configuration is a short run of the function that autotune ends after its measured steps), then calls the
function once more at the answer's batch size with its plan applied to the model at its first forward, and
returns what that call returns. A later call in the same process trains at the same answer; a later run of
the script answers from the database with zero trials. In a trial of ``autotune run`` or ``autotune
measure`` (the script run by the CLI), the function runs once at the trial's batch size: no search inside a
search.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, overload

from autotune.finder.search import FinderOptions, answer_environment, search_in_process

R = TypeVar("R")


class Tuned:
    """A training function with its finder: calling it searches once, then trains at the answer."""

    def __init__(self, function: Callable[..., Any], options: FinderOptions) -> None:
        self.function = function
        self.options = options
        self.answer: Any = None  # the TuneResult, once the first call has it
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from autotune.runtime.trial import current

        running = current()
        if running is not None:  # a trial of `autotune run` or `measure` runs the script: its batch size
            return self.function(running.request.batch_size, *args, **kwargs)
        if self.answer is None:

            def train(batch: int) -> Any:
                return self.function(batch, *args, **kwargs)

            self.answer = search_in_process(train, self.function, self.options)
        from autotune.runtime.hooks import apply_at_first_forward

        answer_environment(self.answer)
        remove = apply_at_first_forward()
        try:
            return self.function(self.answer.best.batch_size, *args, **kwargs)
        finally:
            remove()


@overload
def find_batch_size(function: Callable[..., R], **options: Any) -> Tuned: ...
@overload
def find_batch_size(function: None = None, **options: Any) -> Callable[[Callable[..., Any]], Tuned]: ...
def find_batch_size(
    function: Callable[..., Any] | None = None, **options: Any
) -> Tuned | Callable[[Callable[..., Any]], Tuned]:
    """Decorate a training function whose first argument is the batch size (see the module docstring);
    ``options`` are autotune.finder.search.FinderOptions' (``budget``: None, the device's memory).

    Raises:
        InputError: an unknown or bad option, at decoration (nothing has run).
    """
    if function is not None and not callable(function):
        from autotune.core.errors import InputError

        raise InputError(f"find_batch_size takes its options by name (budget=...), got {function!r}")
    chosen = FinderOptions.of("find_batch_size", options)
    if function is not None:
        return Tuned(function, chosen)
    return lambda f: Tuned(f, chosen)
