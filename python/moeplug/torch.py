"""moeplug as PyTorch custom operators (``import moeplug.torch``), for engines that reach MoE
kernels through ``torch.ops`` and ``torch.compile``:

- ``torch.ops.moeplug.fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, layout, ...)``
- ``torch.ops.moeplug.shuffle_weight(src, layout_n, layout_k, ...)`` (a prep call run at load)

Each has a fake (meta) implementation, so torch.compile traces them without running the
library. The layout record crosses the op boundary as plain ints (:func:`layout_values`),
and the workspace is an argument (size it with :func:`moeplug.fused_moe_workspace_size`), so a
captured CUDA graph allocates nothing. Needs torch >= 2.4 (``torch.library.custom_op``).

The workspace is the op's one mutated argument, so it is positional (the 7th) and has no
default: the dispatcher leaves out trailing positional arguments that equal their default,
and torch >= 2.6 bumps the version of a mutated argument by its position, so a defaulted one
would be missing there (``IndexError: tuple index out of range``). Pass ``None`` to let the
call allocate it.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from . import _abi
from ._ops import Prepared
from ._ops import fused_moe as _fused_moe
from ._ops import shuffle_weight as _shuffle_weight

__all__ = ["LAYOUT_FIELDS", "layout_values", "layout_from_values", "fused_moe", "shuffle_weight", "fused_moe_prepared"]

#: The layout record's fields, in the order :func:`layout_values` lists them.
LAYOUT_FIELDS = tuple(name for name, _ in _abi.Layout._fields_ if name != "struct_size")


def layout_values(prepared_or_layout) -> List[int]:
    """The layout record (of a Prepared or an _abi.Layout) as ints, to pass to the ops."""
    layout = prepared_or_layout.layout if isinstance(prepared_or_layout, Prepared) else prepared_or_layout
    return [int(getattr(layout, f)) for f in LAYOUT_FIELDS]


def layout_from_values(values) -> _abi.Layout:
    values = list(values)
    if len(values) != len(LAYOUT_FIELDS):
        raise ValueError(f"layout: expected {len(LAYOUT_FIELDS)} values ({', '.join(LAYOUT_FIELDS)}), got {len(values)}")
    return _abi.Layout(**dict(zip(LAYOUT_FIELDS, (int(v) for v in values))))


@torch.library.custom_op("moeplug::fused_moe", mutates_args=("workspace",))
def fused_moe(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    layout: List[int],
    workspace: Optional[torch.Tensor],
    w13_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    activation: str = "silu",
    alpha: float = 0.0,
    limit: float = 0.0,
    act_dtype: str = "default",
    router_weight_on_input: bool = False,
    expert_mask: Optional[torch.Tensor] = None,
    num_local_tokens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """moeplug.fused_moe on prepared weights given as tensors plus their layout values."""
    prepared = Prepared(layout=layout_from_values(layout), w13=w13, w2=w2, w13_scale=w13_scale, w2_scale=w2_scale, w13_bias=w13_bias, w2_bias=w2_bias)
    return _fused_moe(
        hidden_states, prepared, topk_weights, topk_ids,
        activation=activation, alpha=alpha, limit=limit, act_dtype=act_dtype,
        router_weight_on_input=router_weight_on_input, expert_mask=expert_mask,
        num_local_tokens=num_local_tokens, workspace=workspace,
    )


@fused_moe.register_fake
def _fused_moe_fake(hidden_states, w13, w2, topk_weights, topk_ids, layout, workspace, w13_scale=None, w2_scale=None, w13_bias=None, w2_bias=None, activation="silu", alpha=0.0, limit=0.0, act_dtype="default", router_weight_on_input=False, expert_mask=None, num_local_tokens=None):
    return torch.empty_like(hidden_states)


@torch.library.custom_op("moeplug::shuffle_weight", mutates_args=())
def shuffle_weight(src: torch.Tensor, layout_n: int = 16, layout_k: int = 16, use_int4: bool = False, is_guinterleave: bool = False, gate_up: bool = False, pad_k_to: int = 0) -> torch.Tensor:
    """moeplug.shuffle_weight (AITER's shuffle_weight) as an op."""
    return _shuffle_weight(src, layout_n=layout_n, layout_k=layout_k, use_int4=use_int4, is_guinterleave=is_guinterleave, gate_up=gate_up, pad_k_to=pad_k_to)


@shuffle_weight.register_fake
def _shuffle_weight_fake(src, layout_n=16, layout_k=16, use_int4=False, is_guinterleave=False, gate_up=False, pad_k_to=0):
    k = src.shape[-1]
    kp = (k + pad_k_to - 1) // pad_k_to * pad_k_to if pad_k_to > 0 else k
    return src.new_empty(tuple(src.shape[:-1]) + (kp,))


def fused_moe_prepared(hidden_states, prepared: Prepared, topk_weights, topk_ids, workspace=None, **kwargs):
    """torch.ops.moeplug.fused_moe with the tensors and layout of a Prepared spelled out."""
    return torch.ops.moeplug.fused_moe(
        hidden_states, prepared.w13, prepared.w2, topk_weights, topk_ids, layout_values(prepared), workspace,
        w13_scale=prepared.w13_scale, w2_scale=prepared.w2_scale, w13_bias=prepared.w13_bias, w2_bias=prepared.w2_bias,
        **kwargs,
    )
