"""What the model's inputs show: each forward's batch dimension, and for (B, T) token inputs the tokens
and the sequence length. The trial counts samples from them (autotune.runtime.trial), so a script that
ignores the batch size is caught at its first step instead of being measured at a size it never trained at.

The batch dimension is read from the first tensor the forward receives: the first positional argument
that is a tensor, else the first tensor keyword argument (Hugging Face models take ``input_ids=...``),
looking one level into a dict, list or tuple (``model(batch)`` with a dict of tensors). It is the leading
dimension, unless that differs from the batch asked while another dimension equals it: a sequence-first
layout (``nn.LSTM``, ``nn.Transformer`` without ``batch_first``). A script whose batch was fixed at the same
value as a sequence length it also uses is the one case this cannot tell apart.

torch is passed in, never imported here: the hooks call this once the script has imported it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Inputs:
    """What one forward's inputs showed."""

    batch: int
    tokens: int | None = None  # batch x length, for a (B, T) tensor of token ids
    length: int | None = None  # T


@dataclass
class Seen:
    """What the forwards of one optimizer step showed, summed."""

    forwards: int = 0  # forwards whose inputs showed a batch dimension
    samples: int = 0
    tokens: int = 0
    batch: int | None = None  # the largest batch dimension
    longest: int | None = None  # the largest length, for token inputs

    def add(self, inputs: Inputs) -> None:
        self.forwards += 1
        self.samples += inputs.batch
        self.tokens += inputs.tokens or 0
        self.batch = max(self.batch or 0, inputs.batch)
        if inputs.length is not None:
            self.longest = max(self.longest or 0, inputs.length)


def read_inputs(torch: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], asked: int) -> Inputs | None:
    """What the forward's inputs show (None: no tensor with a dimension among them)."""
    tensor = _first_tensor(torch, (*args, *kwargs.values()))
    if tensor is None or tensor.dim() == 0:
        return None
    shape = tuple(int(d) for d in tensor.shape)
    batch_dim = 0
    if shape[0] != asked and asked in shape[1:]:
        batch_dim = shape.index(asked)
    batch = shape[batch_dim]
    if len(shape) == 2 and not (
        tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool
    ):
        length = shape[1 - batch_dim]
        return Inputs(batch, batch * length, length)
    return Inputs(batch)


def _first_tensor(torch: Any, values: tuple[Any, ...], depth: int = 0) -> Any:
    for value in values:
        if torch.is_tensor(value):
            return value
        if depth == 0 and isinstance(value, Mapping):
            found = _first_tensor(torch, tuple(value.values()), 1)
        elif depth == 0 and isinstance(value, list | tuple):
            found = _first_tensor(torch, tuple(value), 1)
        else:
            continue
        if found is not None:
            return found
    return None


def batch_ignored_message(seen: int, asked: int) -> str:
    """The one line a trial whose model saw another batch size fails with."""
    return (
        f"the script trained on batches of {seen} when the trial asked for {asked}: pass {{batch_size}} to "
        "its batch-size option or read autotune.batch_size() (where a sample is not a row of the model's "
        "first input, count steps with autotune.step(samples))"
    )


def varied_lengths(lengths: tuple[int, int]) -> str:
    """What a trial (or an answer) whose sequence lengths varied says: its peak is that of the longest drawn."""
    return (
        f"sequence lengths varied from {lengths[0]} to {lengths[1]} between steps: the peak is that of "
        f"length {lengths[1]} at most; the job's longest input may need more (pad to it where "
        "autotune.worst_case() is true, and tune with AUTOTUNE_WORST_CASE=1)"
    )
