"""A fixed global batch: the micro-batches that divide it, each accumulated ``global / micro`` times per
optimizer step (DeepSpeed's train_batch = micro x accumulation; the world size joins once trials span ranks).
"""

from __future__ import annotations

from autotune.core.errors import InputError

MAX_GLOBAL_BATCH = 2**20  # its divisors are enumerated


def check_global_batch(global_batch: int) -> int:
    """Raises InputError unless 1 <= ``global_batch`` <= MAX_GLOBAL_BATCH."""
    if not 1 <= global_batch <= MAX_GLOBAL_BATCH:
        raise InputError(f"--global-batch must be between 1 and {MAX_GLOBAL_BATCH}, got {global_batch}")
    return global_batch


def micro_batches(global_batch: int) -> tuple[int, ...]:
    """Every micro-batch size that divides ``global_batch``, ascending."""
    check_global_batch(global_batch)
    return tuple(b for b in range(1, global_batch + 1) if global_batch % b == 0)


def grad_accum_for(global_batch: int, batch_size: int) -> int:
    """The accumulation of ``batch_size`` in ``global_batch``.

    Raises:
        InputError: ``batch_size`` does not divide ``global_batch``.
    """
    if global_batch % batch_size:
        raise InputError(
            f"batch size {batch_size} does not divide --global-batch {global_batch}: its micro-batches "
            f"are {', '.join(map(str, micro_batches(global_batch)))}"
        )
    return global_batch // batch_size
