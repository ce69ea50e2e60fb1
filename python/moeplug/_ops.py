"""The prep and fused_moe calls (docs/abi.md §7–§10), one to one with the C functions.

Every prep primitive takes `fragments=`: a list to which a successful call appends the
layout fragment it established (ABI 1.1, docs/abi.md §8), for `layout_from_fragments`."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

from . import _abi
from ._tensor import DLPackArray, as_array, c_int, describe, is_torch, ptr


def _lib():
    from . import _library

    return _library()


def _check(status):
    from . import _check as check

    check(status)


def _enum(table, value, what):
    from . import _enum as enum

    return enum(table, value, what)


def _empty_like(ref, shape, dtype=None):
    """An uninitialized array/tensor on the same library and device as `ref`."""
    shape = tuple(int(s) for s in shape)
    if isinstance(ref, DLPackArray):
        if not ref.is_host:  # moeplug cannot allocate another library's device memory
            raise TypeError(f"an output for a DLPack array on device {ref.device} must be passed (out=...)")
        if dtype is None and ref.dtype is None:
            raise TypeError("an output of this DLPack dtype must be passed (out=...)")
        return np.empty(shape, dtype=dtype if dtype is not None else ref.dtype)
    if is_torch(ref):
        import torch

        return torch.empty(shape, dtype=dtype if dtype is not None else ref.dtype, device=ref.device)
    return np.empty(shape, dtype=dtype if dtype is not None else ref.dtype)


def _stream_of(x, stream):
    """The caller's stream: explicit, else torch's current stream for CUDA tensors, else NULL."""
    if stream is not None:
        return stream if isinstance(stream, int) else getattr(stream, "cuda_stream", stream)
    if is_torch(x) and x.device.type == "cuda":
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    return None


def _ceil_to(n, m):
    return (n + m - 1) // m * m


def _dims(x, call, name, ndim, spelled):
    """ValueError naming the call and argument unless `x` has `ndim` dimensions (a tuple:
    any of them); before the shape is indexed, so the caller never sees an IndexError."""
    nd = len(getattr(x, "shape", ()))
    if nd not in (ndim if isinstance(ndim, tuple) else (ndim,)):
        raise ValueError(f"{call}: {name}: expected {spelled}, got shape {tuple(getattr(x, 'shape', ()))}")


def _stored(x):
    """The array as it will be passed (fp4 values packed to bytes)."""
    d = describe(x)
    return d.obj


def _out_fragment(args, fragments):
    """Point `args.out_fragment` at a new fragment when the caller collects them (ABI 1.1)."""
    if fragments is None:
        return None
    from ._runtime import _need_1_1

    _need_1_1(_lib(), "moeplug_layout_from_fragments")  # a 1.0 library knows no out_fragment
    f = _abi.LayoutFragment()
    args.out_fragment = ctypes.pointer(f)
    return f


def _report(fragments, f):
    if f is not None:
        fragments.append(f)


def shuffle_weight(src, *, layout_n=16, layout_k=16, use_int4=False, is_guinterleave=False, gate_up=False, pad_k_to=0, out=None, stream=None, fragments=None):
    """AITER shuffle_weight (F1/F2). `src` [..., N, K] in storage elements (fp4: uint8 bytes)."""
    src = _stored(src)
    _dims(src, "shuffle_weight", "src", (2, 3, 4, 5, 6, 7, 8), "[..., N, K] (at least 2 dimensions)")
    k = src.shape[-1]
    if out is None:
        kp = _ceil_to(k, c_int(pad_k_to, "pad_k_to", 64)) if pad_k_to and pad_k_to > 0 else k
        out = _empty_like(src, tuple(src.shape[:-1]) + (kp,))
    s, d = describe(src, "src"), describe(out, "dst", writable=True)
    args = _abi.ShuffleWeightArgs(src=ptr(s), dst=ptr(d), layout_n=c_int(layout_n, "layout_n"), layout_k=c_int(layout_k, "layout_k"), use_int4=int(use_int4), is_guinterleave=int(is_guinterleave), gate_up=int(gate_up), pad_k_to=c_int(pad_k_to, "pad_k_to", 64))
    frag = _out_fragment(args, fragments)
    _check(_lib().moeplug_shuffle_weight(ctypes.byref(args), _stream_of(src, stream)))
    _report(fragments, frag)
    return out


def shuffle_scale(src, *, num_experts=0, is_guinterleave=False, gate_up=False, out=None, stream=None, fragments=None):
    """AITER shuffle_scale / e8m0_shuffle (F3/F4); fp32 scales are copied through."""
    src = as_array(src)
    _dims(src, "shuffle_scale", "src", 2, "[m, n] (2 dimensions)")
    if out is None:
        m, n = src.shape[-2], src.shape[-1]
        if str(src.dtype).endswith("float32"):
            shape = src.shape
        elif is_guinterleave:
            shape = (m, _ceil_to(n, 8))
        else:
            shape = (_ceil_to(m, 256), _ceil_to(n, 8))
        out = _empty_like(src, shape)
    s, d = describe(src, "src"), describe(out, "dst", writable=True)
    args = _abi.ShuffleScaleArgs(src=ptr(s), dst=ptr(d), num_experts=c_int(num_experts, "num_experts"), is_guinterleave=int(is_guinterleave), gate_up=int(gate_up))
    frag = _out_fragment(args, fragments)
    _check(_lib().moeplug_shuffle_scale(ctypes.byref(args), _stream_of(src, stream)))
    _report(fragments, frag)
    return out


def pad_weights(src, *, rows, cols=None, gate_up=False, fill=0, out=None, stream=None, fragments=None):
    """Zero padding [E, N, K] -> [E, rows, cols] (or [E, N] biases -> [E, rows])."""
    src = _stored(src)
    _dims(src, "pad_weights", "src", (2, 3), "[E, N, K] or [E, N] (3 or 2 dimensions)")
    if out is None:
        shape = (src.shape[0], rows) if src.ndim == 2 else (src.shape[0], rows, cols if cols is not None else src.shape[-1])
        out = _empty_like(src, shape)
    s, d = describe(src, "src"), describe(out, "dst", writable=True)
    args = _abi.PadWeightsArgs(src=ptr(s), dst=ptr(d), gate_up=int(gate_up), fill=float(fill))
    frag = _out_fragment(args, fragments)
    _check(_lib().moeplug_pad_weights(ctypes.byref(args), _stream_of(src, stream)))
    _report(fragments, frag)
    return out


def swizzle_scale(src, *, layout="cdna4", out=None, stream=None, fragments=None):
    """[E, N, K/32] e8m0 -> the CDNA4 MX scale layout, memory image [E, ⌈N/32⌉, ⌈K/32/8⌉·8·32]."""
    from . import SCALE_LAYOUTS

    src = as_array(src)
    _dims(src, "swizzle_scale", "src", 3, "[E, N, K/32] (3 dimensions)")
    if out is None:
        e, n, ks = src.shape
        out = _empty_like(src, (e, _ceil_to(n, 32) // 32, _ceil_to(ks, 8) * 32))
    s, d = describe(src, "src"), describe(out, "dst", writable=True)
    args = _abi.SwizzleScaleArgs(src=ptr(s), dst=ptr(d), layout=_enum(SCALE_LAYOUTS, layout, "layout"))
    frag = _out_fragment(args, fragments)
    _check(_lib().moeplug_swizzle_scale(ctypes.byref(args), _stream_of(src, stream)))
    _report(fragments, frag)
    return out


_MX_FORMATS = {"mxfp4": (6, None), "mxfp8": (7, "float8_e4m3fn"), "mxfp8_fnuz": (7, "float8_e4m3fnuz")}


def quantize_mx(x, *, fmt="mxfp4", round_mode="up", shuffle_scale=False, stream=None, fragments=None):
    """bf16/fp32 [..., K] -> (q, scale): MXFP4 packed uint8 [..., K/2] or MXFP8 fp8 [..., K];
    e8m0 scales [rows, K/32] (AITER e8m0_shuffle layout when shuffle_scale)."""
    from . import ROUND_MODES

    x = as_array(x)
    if fmt not in _MX_FORMATS:
        raise ValueError(f"fmt: expected one of {', '.join(_MX_FORMATS)}, got {fmt!r}")
    code, fp8 = _MX_FORMATS[fmt]
    _dims(x, "quantize_mx", "x", (1, 2, 3, 4, 5, 6, 7, 8), "[..., K] (at least 1 dimension)")
    k = x.shape[-1]
    rows = int(np.prod(x.shape[:-1])) if x.ndim > 1 else 1
    if is_torch(x):
        import torch

        qdtype = torch.uint8 if fp8 is None else getattr(torch, fp8)
        sdtype = torch.uint8
    else:
        import ml_dtypes

        qdtype = np.uint8 if fp8 is None else getattr(ml_dtypes, fp8)
        sdtype = ml_dtypes.float8_e8m0fnu
    q = _empty_like(x, tuple(x.shape[:-1]) + ((k // 2) if fp8 is None else k,), qdtype)
    sshape = (_ceil_to(rows, 256), _ceil_to(max(k // 32, 1), 8)) if shuffle_scale else (rows, k // 32)
    scale = _empty_like(x, sshape, sdtype)
    s, dq, ds = describe(x, "src"), describe(q, "dst_q", writable=True), describe(scale, "dst_scale", writable=True)
    args = _abi.QuantizeMxArgs(src=ptr(s), dst_q=ptr(dq), dst_scale=ptr(ds), format=code, round_mode=_enum(ROUND_MODES, round_mode, "round_mode"), shuffle_scale=int(shuffle_scale))
    frag = _out_fragment(args, fragments)
    _check(_lib().moeplug_quantize_mx(ctypes.byref(args), _stream_of(x, stream)))
    _report(fragments, frag)
    return q, scale


def declare_fragment(*, weight_format=0, gate_mode=0, weight_layout=0, scale_layout=0, act_dtype=0, num_experts=0, hidden_size=0, intermediate_size=0, hidden_padded=0, intermediate_padded=0, has_bias=None):
    """A fragment the caller fills for what no primitive establishes (an fp8 weight format,
    biases, the activation dtype, sizes it did not pad); 0 / None = not established."""
    from . import SCALE_LAYOUTS

    def e(table, value, what):
        return 0 if value in (0, None) else _enum(table, value, what)

    return _abi.LayoutFragment(
        weight_format=e(_abi.WEIGHT_FORMATS, weight_format, "weight_format"),
        gate_mode=e(_abi.GATE_MODES, gate_mode, "gate_mode"),
        weight_layout=e(_abi.WEIGHT_LAYOUTS, weight_layout, "weight_layout"),
        scale_layout=e(SCALE_LAYOUTS, scale_layout, "scale_layout"),
        act_dtype=e(_abi.ACT_DTYPES, act_dtype, "act_dtype"),
        num_experts=c_int(num_experts, "num_experts", 64),
        hidden_size=c_int(hidden_size, "hidden_size", 64),
        intermediate_size=c_int(intermediate_size, "intermediate_size", 64),
        hidden_padded=c_int(hidden_padded, "hidden_padded", 64),
        intermediate_padded=c_int(intermediate_padded, "intermediate_padded", 64),
        has_bias=_abi.FRAGMENT_BIAS["unknown" if has_bias is None else "present" if has_bias else "absent"],
    )


def layout_from_fragments(fragments) -> _abi.Layout:
    """The layout record of weights prepared with the primitives, assembled from the fragments
    they reported (and any `declare_fragment`), sealed so that a launch refuses a hand edit
    (moeplug_layout_from_fragments, ABI 1.1)."""
    from ._runtime import _need_1_1

    fn = _need_1_1(_lib(), "moeplug_layout_from_fragments")
    parts = list(fragments)
    for i, f in enumerate(parts):
        if not isinstance(f, _abi.LayoutFragment):
            raise TypeError(f"layout_from_fragments: fragments[{i}]: expected a LayoutFragment, got {type(f).__name__}")
    array = (ctypes.POINTER(_abi.LayoutFragment) * max(len(parts), 1))(*[ctypes.pointer(f) for f in parts])
    layout = _abi.Layout()
    _check(fn(array, len(parts), ctypes.byref(layout)))
    return layout


@dataclass
class Prepared:
    """Kernel-ready weights and the layout record that describes them."""

    layout: _abi.Layout
    w13: object
    w2: object
    w13_scale: object = None
    w2_scale: object = None
    w13_bias: object = None
    w2_bias: object = None
    info: dict = field(default_factory=dict)


def _prepare_args(w13, w2, weight_format, w13_scale, w2_scale, w13_bias, w2_bias, gate_mode_in, device, config, keep):
    from . import ACT_DTYPES, GATE_MODES, WEIGHT_FORMATS, parse_device

    dev_type, dev_id = parse_device(device if device is not None else (w13.device if is_torch(w13) else "cpu"))
    if config.get("target") not in (None, 0, "moeplug") and device is None:
        dev_type, dev_id = 0, 0  # an AITER target names its kernels (and their device) itself
    ins = {"w13": w13, "w13_scale": w13_scale, "w13_bias": w13_bias, "w2": w2, "w2_scale": w2_scale, "w2_bias": w2_bias}
    described = {k: describe(v, k) for k, v in ins.items()}
    keep.extend(described.values())
    unknown = set(config) - {"act_dtype", "hidden_align", "intermediate_align", "target"}
    if unknown:
        raise TypeError(f"prepare_moe: unknown keyword(s) {', '.join(sorted(unknown))}")
    args = _abi.PrepareMoeArgs(
        weight_format=_enum(WEIGHT_FORMATS, weight_format, "weight_format"),
        gate_mode_in=_enum(GATE_MODES, gate_mode_in, "gate_mode_in"),
        device_type=c_int(dev_type, "device_type"),
        device_id=c_int(dev_id, "device_id"),
        act_dtype=_enum(ACT_DTYPES, config.get("act_dtype"), "act_dtype"),
        hidden_align=c_int(config.get("hidden_align", 0), "hidden_align"),
        intermediate_align=c_int(config.get("intermediate_align", 0), "intermediate_align"),
        target=_enum(_abi.PREP_TARGETS, config.get("target"), "target"),
    )
    for k, d in described.items():
        setattr(args, k, ptr(d))
    return args, described


def _int4_words_dtype(weight_format, name, src):
    """int8-held int4_per_channel weights come back as uint32 words (int32 for torch, whose
    uint32 has few kernels); None: like the input."""
    from . import WEIGHT_FORMATS

    fmt = WEIGHT_FORMATS.get(weight_format, weight_format)
    if fmt != WEIGHT_FORMATS["int4_per_channel"] or name not in ("w13", "w2"):
        return None
    if is_torch(src):
        import torch

        return torch.int32 if src.dtype == torch.int8 else None
    return np.dtype(np.uint32) if np.dtype(getattr(src, "dtype", None)) == np.int8 else None


def prepare_moe(w13, w2, *, weight_format, w13_scale=None, w2_scale=None, w13_bias=None, w2_bias=None, gate_mode_in="separated", device=None, stream=None, **config):
    """Pad, re-order, shuffle and swizzle checkpoint weights for a target; returns Prepared."""
    keep = []
    args, described = _prepare_args(w13, w2, weight_format, w13_scale, w2_scale, w13_bias, w2_bias, gate_mode_in, device, config, keep)
    sizes = _abi.PrepareMoeSizes()
    _check(_lib().moeplug_prepare_moe_sizes(ctypes.byref(args), ctypes.byref(sizes)))
    outs = {}
    for name in _abi.PREPARED_OUTPUTS:
        ndim = getattr(sizes, name + "_ndim")
        src = described[name]
        if ndim == 0 or src is None:
            outs[name] = None
            continue
        shape = tuple(getattr(sizes, name + "_shape")[:ndim])
        outs[name] = _empty_like(src.obj, shape, _int4_words_dtype(weight_format, name, src.obj))
        d = describe(outs[name], "out_" + name, writable=True)
        keep.append(d)
        setattr(args, "out_" + name, ptr(d))
    layout = _abi.Layout()
    args.out_layout = ctypes.pointer(layout)
    _check(_lib().moeplug_prepare_moe(ctypes.byref(args), _stream_of(w13, stream)))
    return Prepared(layout=layout, **outs)


def _fused_args(hidden_states, prepared, topk_weights, topk_ids, activation, alpha, limit, act_dtype, router_weight_on_input, expert_mask, num_local_tokens, out, hidden_scale, keep, stage2_act_dtype="default", stage1_act_scale=None, stage2_act_scale=None):
    from . import ACT_DTYPES, ACTIVATIONS

    tensors = {
        "hidden_states": hidden_states,
        "hidden_scale": hidden_scale,
        "stage1_act_scale": stage1_act_scale,
        "stage2_act_scale": stage2_act_scale,
        "w13": prepared.w13,
        "w13_scale": prepared.w13_scale,
        "w13_bias": prepared.w13_bias,
        "w2": prepared.w2,
        "w2_scale": prepared.w2_scale,
        "w2_bias": prepared.w2_bias,
        "topk_weights": topk_weights,
        "topk_ids": topk_ids,
        "expert_mask": expert_mask,
        "num_local_tokens": num_local_tokens,
        "output": out,
    }
    args = _abi.FusedMoeArgs(
        layout=ctypes.pointer(prepared.layout),
        activation=_enum(ACTIVATIONS, activation, "activation"),
        alpha=float(alpha),
        limit=float(limit),
        act_dtype=_enum(ACT_DTYPES, act_dtype, "act_dtype"),
        flags=_abi.MOE_FLAGS["router_weight_on_input"] if router_weight_on_input else 0,
        stage2_act_dtype=_enum(ACT_DTYPES, stage2_act_dtype, "stage2_act_dtype"),
    )
    for k, v in tensors.items():
        d = describe(v, k, writable=(k == "output"))
        keep.append(d)
        setattr(args, k, ptr(d))
    return args


def fused_moe(hidden_states, prepared, topk_weights, topk_ids, *, activation="silu", alpha=0.0, limit=0.0, act_dtype="default", router_weight_on_input=False, expert_mask=None, num_local_tokens=None, hidden_scale=None, out=None, workspace=None, stream=None, stage2_act_dtype="default", stage1_act_scale=None, stage2_act_scale=None):
    """out[t] = Σ_s w[t,s] · act(x_t W13[e]ᵀ + b13) W2[e]ᵀ + b2 (docs/abi.md §9); returns `out`.
    `stage2_act_dtype` ("default": the stage-1 act dtype) and the static per-tensor fp8 scales
    `stage1_act_scale` / `stage2_act_scale` (one f32 each) are the 1.1 fields of §9."""
    hidden_states = as_array(hidden_states)
    if not isinstance(prepared, Prepared):
        raise TypeError(f"fused_moe: prepared: expected the Prepared that prepare_moe returned, got {type(prepared).__name__}")
    if hidden_states is None:
        raise TypeError("fused_moe: hidden_states: must not be None")
    if out is None:
        out = _empty_like(hidden_states, hidden_states.shape)
    keep = []
    args = _fused_args(hidden_states, prepared, as_array(topk_weights), as_array(topk_ids), activation, alpha, limit, act_dtype, router_weight_on_input, as_array(expert_mask), as_array(num_local_tokens), out, as_array(hidden_scale), keep,
                       stage2_act_dtype, as_array(stage1_act_scale), as_array(stage2_act_scale))
    args.stream = _stream_of(hidden_states, stream)
    if workspace is None:
        need = _workspace_bytes(args, as_launch=True)
        if need:
            workspace = _empty_like(hidden_states, (need,), _byte_dtype(hidden_states))
    if workspace is not None:
        d = describe(workspace, "workspace", writable=True)
        keep.append(d)
        args.workspace = ptr(d)
    _check(_lib().moeplug_fused_moe(ctypes.byref(args)))
    return out


def _workspace_bytes(args, as_launch=False) -> int:
    need = ctypes.c_size_t(0)
    status = _lib().moeplug_fused_moe_workspace_size(ctypes.byref(args), ctypes.byref(need))
    if status != 0 and as_launch:
        # fused_moe queried on the caller's behalf; the launch checks what the query checks,
        # so let the launch report it: the error names the call the caller made.
        _check(_lib().moeplug_fused_moe(ctypes.byref(args)))
    _check(status)
    return need.value


def fused_moe_workspace_size(hidden_states, prepared, topk_weights, topk_ids, *, activation="silu", alpha=0.0, limit=0.0, act_dtype="default", router_weight_on_input=False, expert_mask=None, num_local_tokens=None, hidden_scale=None, out=None, stage2_act_dtype="default", stage1_act_scale=None, stage2_act_scale=None, **_ignored) -> int:
    """Bytes of `workspace` that `fused_moe` with the same arguments needs (0: none), so a
    caller can allocate it once, e.g. before capturing a CUDA graph. `workspace` and `stream`
    may be passed and are ignored, so the same keyword arguments serve both calls."""
    unknown = set(_ignored) - {"workspace", "stream"}
    if unknown:
        raise TypeError(f"fused_moe_workspace_size: unexpected keyword arguments {sorted(unknown)}")
    hidden_states = as_array(hidden_states)
    if out is None:  # checked like the launch's (shape, dtype, no aliasing), never written
        out = _empty_like(hidden_states, hidden_states.shape)
    keep = []
    args = _fused_args(hidden_states, prepared, as_array(topk_weights), as_array(topk_ids), activation, alpha, limit, act_dtype, router_weight_on_input, as_array(expert_mask), as_array(num_local_tokens), out, as_array(hidden_scale), keep,
                       stage2_act_dtype, as_array(stage1_act_scale), as_array(stage2_act_scale))
    return _workspace_bytes(args)


def _byte_dtype(ref):
    if is_torch(ref):
        import torch

        return torch.uint8
    return np.uint8


def check_fused_moe(prepared_or_layout, *, device="cpu", activation="silu", alpha=0.0, limit=0.0, act_dtype="default", router_weight_on_input=False, bias=None, expert_mask=False, num_local_tokens=False, stage2_act_dtype="default", static_act_scales=False):
    """Raise MoeplugError(UNSUPPORTED, reason) unless `device` can run this configuration
    (`static_act_scales`: launches pass stage1_act_scale and stage2_act_scale)."""
    from . import parse_device

    args, _keep = config_args(prepared_or_layout, activation, alpha, limit, act_dtype, router_weight_on_input, expert_mask, num_local_tokens, stage2_act_dtype, static_act_scales)
    dev_type, dev_id = parse_device(device)
    _check(_lib().moeplug_check_fused_moe(c_int(dev_type, "device_type"), c_int(dev_id, "device_id"), ctypes.byref(args)))


def config_args(prepared_or_layout, activation, alpha, limit, act_dtype, router_weight_on_input, expert_mask, num_local_tokens, stage2_act_dtype="default", static_act_scales=False):
    """A launch's configuration without tensors (and what it points to, to keep alive)."""
    from . import ACT_DTYPES, ACTIVATIONS

    layout = prepared_or_layout.layout if isinstance(prepared_or_layout, Prepared) else prepared_or_layout
    dummy = _abi.Tensor()  # only presence matters for the check
    args = _abi.FusedMoeArgs(
        layout=ctypes.pointer(layout),
        activation=_enum(ACTIVATIONS, activation, "activation"),
        alpha=float(alpha),
        limit=float(limit),
        act_dtype=_enum(ACT_DTYPES, act_dtype, "act_dtype"),
        flags=_abi.MOE_FLAGS["router_weight_on_input"] if router_weight_on_input else 0,
        stage2_act_dtype=_enum(ACT_DTYPES, stage2_act_dtype, "stage2_act_dtype"),
    )
    if static_act_scales:
        args.stage1_act_scale = ctypes.pointer(dummy)
        args.stage2_act_scale = ctypes.pointer(dummy)
    if expert_mask:
        args.expert_mask = ctypes.pointer(dummy)
    if num_local_tokens:
        args.num_local_tokens = ctypes.pointer(dummy)
    return args, (layout, dummy)
