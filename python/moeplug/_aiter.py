"""What an engine asks once at start-up (ABI 1.1): the configuration a launch resolves to
(`resolve_config`) and the AITER `fused_moe` keywords of a prepared record (`aiter_args`)."""

from __future__ import annotations

import ctypes

from . import _abi
from ._ops import Prepared, _check, _enum, config_args
from ._runtime import _need_1_1
from ._tensor import c_int

_ACT_NAMES = {v: k for k, v in _abi.ACT_DTYPES.items()}
_ACTIVATION_NAMES = {v: k for k, v in _abi.ACTIVATIONS.items()}


def _names(table):
    return {v: k for k, v in table.items() if k not in _abi.ALIASES}


def aiter_args(prepared_or_layout, *, activation="silu") -> dict:
    """AITER `fused_moe` keyword values for a prepared record, as plain strings and ints:
    `gate_mode`, `hidden_pad`, `intermediate_pad`, `quant_type`, `quant_type_a`,
    `quant_dtype_a`, `quant_dtype_a2`, `activation`, `is_shuffled`, `scale_swizzled`
    (docs/aiter.md). Enum values are AITER's member names (`QuantType.per_1x32` →
    "per_1x32", `aiter.dtypes.fp4x2` → "fp4x2", `ActivationType.Swiglu` → "Swiglu")."""
    from . import _library

    lib = _library()
    _need_1_1(lib, "moeplug_aiter_args")
    layout = prepared_or_layout.layout if isinstance(prepared_or_layout, Prepared) else prepared_or_layout
    out = _abi.AiterArgsOut()
    _check(lib.moeplug_aiter_args(ctypes.byref(layout), _enum(_abi.ACTIVATIONS, activation, "activation"), ctypes.byref(out)))
    text = ("gate_mode", "quant_type", "quant_type_a", "quant_dtype_a", "quant_dtype_a2", "activation")
    d = {k: getattr(out, k).decode() for k in text}
    d.update(hidden_pad=out.hidden_pad, intermediate_pad=out.intermediate_pad)
    d.update(is_shuffled=bool(out.is_shuffled), scale_swizzled=bool(out.scale_swizzled))
    return d


def resolve_config(prepared_or_layout, *, device="cpu", activation="silu", alpha=0.0, limit=0.0, act_dtype="default", router_weight_on_input=False, expert_mask=False, num_local_tokens=False, stage2_act_dtype="default", static_act_scales=False) -> dict:
    """What every launch of this configuration on `device` uses, for any M: the backend, the
    stage-1/stage-2 activation dtypes, the activation with its resolved alpha and limit (0.0 =
    no clamp) and the record's layouts; raises MoeplugError as `check_fused_moe` does. A CUDA
    device is answered without a GPU from the CUDA backend's rules."""
    from . import BACKENDS, _library, parse_device

    lib = _library()
    _need_1_1(lib, "moeplug_resolve_config")
    args, _keep = config_args(prepared_or_layout, activation, alpha, limit, act_dtype, router_weight_on_input, expert_mask, num_local_tokens, stage2_act_dtype, static_act_scales)
    dev_type, dev_id = parse_device(device)
    out = _abi.ResolvedConfig()
    _check(lib.moeplug_resolve_config(c_int(dev_type, "device_type"), c_int(dev_id, "device_id"), ctypes.byref(args), ctypes.byref(out)))
    return {
        "backend": BACKENDS.get(out.backend, "unknown"),
        "act_dtype": _ACT_NAMES[out.act_dtype],
        "act_dtype_stage2": _ACT_NAMES[out.act_dtype_stage2],
        "activation": _ACTIVATION_NAMES[out.activation],
        "alpha": out.alpha,
        "limit": out.limit,
        "weight_format": _names(_abi.WEIGHT_FORMATS)[out.weight_format],
        "gate_mode": _names(_abi.GATE_MODES)[out.gate_mode],
        "weight_layout": _names(_abi.WEIGHT_LAYOUTS)[out.weight_layout],
        "scale_layout": _names(_abi.SCALE_LAYOUTS).get(out.scale_layout),
    }
