"""A fixed global batch: the micro-batches that divide it, each accumulated ``global / micro`` times per
optimizer step by each of the trial's ranks (DeepSpeed's train_batch = micro x accumulation x world size).
"""

from __future__ import annotations

from autotune.core.errors import InputError

MAX_GLOBAL_BATCH = 2**20  # its divisors are enumerated


def check_batch_size(value: object, what: str = "a batch size") -> int:
    """``value`` if it is a whole number >= 1 (a bool is not one).

    Every batch size that reaches a trial's command line or environment passes here, wherever it came from:
    a template passes ``{batch_size}`` on as text, through a shell if the template names one, so a batch
    read from a database row that was edited to ``1; touch x`` would otherwise run as a command.

    Raises:
        InputError: it is not.
    """
    if type(value) is not int or value < 1:
        raise InputError(f"{what} must be a whole number >= 1, got {value!r}")
    return value


def check_trial_sizes(batch_size: object, grad_accum: object | None) -> None:
    """Raises InputError unless a trial's batch size, and its accumulation if it has one, are whole numbers
    >= 1 (check_batch_size)."""
    check_batch_size(batch_size, "a trial's batch size")
    if grad_accum is not None:
        check_batch_size(grad_accum, "a trial's gradient accumulation")


def check_global_batch(global_batch: int) -> int:
    """Raises InputError unless 1 <= ``global_batch`` <= MAX_GLOBAL_BATCH."""
    if not 1 <= global_batch <= MAX_GLOBAL_BATCH:
        raise InputError(f"--global-batch must be between 1 and {MAX_GLOBAL_BATCH}, got {global_batch}")
    return global_batch


def micro_batches(global_batch: int) -> tuple[int, ...]:
    """Every micro-batch size that divides ``global_batch``, ascending."""
    check_global_batch(global_batch)
    return tuple(b for b in range(1, global_batch + 1) if global_batch % b == 0)


def per_rank(global_batch: int, world_size: int) -> int:
    """Each rank's share of ``global_batch`` (DeepSpeed's train_batch = micro x accumulation x world).

    Raises:
        InputError: the ranks cannot share it evenly.
    """
    if global_batch % world_size:
        raise InputError(
            f"--global-batch {global_batch} cannot be shared by the trial's {world_size} ranks: give a multiple "
            f"of {world_size}"
        )
    return global_batch // world_size


def grad_accum_for(global_batch: int, batch_size: int, world_size: int = 1) -> int:
    """The accumulation of ``batch_size`` in ``global_batch`` trained by ``world_size`` ranks.

    Raises:
        InputError: the ranks' share is not whole, or ``batch_size`` does not divide it.
    """
    global_batch = per_rank(global_batch, world_size)
    if global_batch % batch_size:
        raise InputError(
            f"batch size {batch_size} does not divide --global-batch {global_batch}: its micro-batches "
            f"are {', '.join(map(str, micro_batches(global_batch)))}"
        )
    return global_batch // batch_size
