"""Operator kinds: the aten ops a recompute policy and the probe talk about, grouped as a user thinks of them.

Views (``view``, ``transpose``, ...) allocate nothing and are kind ``view``; ops not listed are ``other``.
"""

from __future__ import annotations

from typing import Any

_KINDS = {
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "_addmm_activation"),
    "conv": (
        "convolution",
        "_convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "cudnn_convolution",
        "mkldnn_convolution",
        "miopen_convolution",
        "_slow_conv2d_forward",
        "slow_conv3d_forward",
        "convolution_overrideable",
    ),
    "attention": (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "scaled_dot_product_attention",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ),
    "softmax": ("_softmax", "softmax", "_log_softmax", "log_softmax"),
    "dropout": ("native_dropout", "bernoulli", "bernoulli_", "dropout"),
    "activation": (
        "gelu",
        "relu",
        "silu",
        "tanh",
        "sigmoid",
        "leaky_relu",
        "elu",
        "hardtanh",
        "mish",
        "threshold",
        "hardswish",
        "hardsigmoid",
        "softplus",
        "glu",
    ),
    "norm": (
        "native_layer_norm",
        "native_group_norm",
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
        "rms_norm",
        "_fused_rms_norm",
        "layer_norm",
    ),
    "elementwise": (
        "add",
        "add_",
        "sub",
        "mul",
        "mul_",
        "div",
        "div_",
        "masked_fill",
        "masked_fill_",
        "where",
        "exp",
        "neg",
        "pow",
        "rsqrt",
        "sqrt",
        "clamp",
        "abs",
        "sin",
        "cos",
        "square",
        "reciprocal",
        "log",
        "maximum",
        "minimum",
        "addcmul",
        "lerp",
        "_to_copy",
        "clone",
    ),
    "factory": (
        "empty",
        "empty_like",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "arange",
        "empty_strided",
        "new_empty",
        "new_zeros",
        "new_ones",
        "new_full",
    ),
    "view": (
        "view",
        "_unsafe_view",
        "reshape",
        "transpose",
        "t",
        "expand",
        "permute",
        "unsqueeze",
        "squeeze",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "alias",
        "as_strided",
        "detach",
        "unflatten",
        "flatten",
        "narrow",
        "contiguous",
    ),
}
_BY_NAME = {name: kind for kind, names in _KINDS.items() for name in names}


def op_name(op: Any) -> str:
    return str(op._schema.name.split("::", 1)[-1]) if hasattr(op, "_schema") else str(op)


def op_kind(op: Any) -> str:
    """The kind of an aten OpOverload (``torch.ops.aten.gelu.default`` -> ``activation``)."""
    return _BY_NAME.get(op_name(op), "other")


def may_save(op: Any) -> bool:
    """Whether selective checkpointing may cache this op's output: never an in-place op, an allocation
    (dropout fills an ``empty_like`` in place) or a view — torch refuses a cached tensor that is mutated."""
    name = op_name(op)
    return not name.endswith("_") and _BY_NAME.get(name) not in ("factory", "view")


def draws_random(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether this call of ``op`` draws from a random generator: an op torch tags ``nondeterministic_seeded``
    (dropout, bernoulli, randn...), except an attention kernel called with ``dropout_p`` 0.

    Selective recompute must never cache such an op: the recompute starts from the forward's generator state
    and replays the region's random ops in order, so one whose output was cached draws nothing, and every
    random op after it draws other numbers than the forward did. On an H100, ``GPT2Block:1/save=attention``
    cached SDPA's fused dropout and the block's later dropouts drew other masks: gradients off by 0.36
    (issue 31). On the CPU, dropout is ``bernoulli_`` in place (never cached), so only an out-of-place random
    op shows it there."""
    tags = getattr(op, "tags", ())
    import torch  # only ever called inside a checkpointed region: torch is loaded

    if torch.Tag.nondeterministic_seeded not in tags:
        return False
    schema = getattr(op, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    if "dropout_p" in names:
        index = names.index("dropout_p")
        p = kwargs.get("dropout_p", args[index] if index < len(args) else 0.0)
        return bool(p)
    return True
