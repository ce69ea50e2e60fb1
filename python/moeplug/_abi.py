"""ctypes mirror of include/moeplug.h (ABI 1.1) and the library loader.

The one Python copy of the header: structs, enum values and flag bits. `C_STRUCTS` and
`C_ENUMS` name every header struct and enum; tests/abi.rs compares them with the header field
by field (offsets, sizes, values), so a header change without this file fails the tests."""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

ABI_MAJOR = 1

# Enum values by the lower-case names the package accepts (0 = "default" where the C enum has it).
WEIGHT_FORMATS = {"bf16": 1, "fp16": 2, "fp8_per_tensor": 3, "fp8_per_channel": 4, "fp8_block128": 5, "mxfp4": 6, "mxfp8": 7, "int4_group32": 8, "int4_per_channel": 9}  # int4_*: ABI 1.1
ACT_DTYPES = {"default": 0, "bf16": 1, "fp16": 2, "fp8_per_token": 3, "fp8_per_tensor": 4, "fp8_block128": 5, "mxfp4": 6, "mxfp8": 7}
GATE_MODES = {"separated": 1, "interleave": 2, "interleave_rows": 3}
ACTIVATIONS = {"silu": 1, "gelu": 2, "swiglu_oai": 3, "gelu_tanh": 4, "none": 5}  # 4, 5: ABI 1.1
WEIGHT_LAYOUTS = {"plain": 1, "aiter_16x16": 2}
# "cdna4" is an alias the package accepts; the header knows the value as CDNA4_SWIZZLE.
SCALE_LAYOUTS = {"plain": 1, "aiter_e8m0": 2, "cdna4_swizzle": 3, "cdna4": 3, "aiter_int4": 4}  # aiter_int4: ABI 1.1
# Names the package accepts beside the header's own, by the header name they stand for: a table
# holding one maps two names to one value, so count its values with `bit_mask`, and skip these
# names when a value is turned back into a name.
ALIASES = {"cdna4": "cdna4_swizzle"}
ROUND_MODES = {"down": 1, "up": 2, "even": 3, "ceil": 4}
# ABI 1.1: whose kernels prepare_moe lays out for (0 = moeplug's own; docs/aiter.md).
PREP_TARGETS = {
    "moeplug": 0,
    "aiter_a4w4": 1,
    "aiter_a8w4": 2,
    "aiter_mxfp8": 3,
    "aiter_a16w4_interleave": 4,
    "aiter_triton_a16w4": 5,
}
LOG_LEVELS = {"error": 1, "warn": 2, "info": 3, "debug": 4}  # ABI 1.1
BACKENDS = {1: "cpu", 2: "cuda", 3: "hip"}
DEVICE_TYPES = {"cpu": 1, "cuda": 2, "cuda_host": 3, "rocm": 10, "rocm_host": 11, "cuda_managed": 13}
DTYPE_CODES = {
    "int": 0,
    "uint": 1,
    "float": 2,
    "bfloat": 4,
    "float8_e4m3fn": 10,
    "float8_e4m3fnuz": 11,
    "float8_e8m0fnu": 14,
    "float4_e2m1fn": 17,
}
FEATURES = {
    "bias": 1 << 0,
    "expert_mask": 1 << 1,
    "num_local_tokens": 1 << 2,
    "router_weight_on_input": 1 << 3,
    "graph_capture": 1 << 4,
    "device_prep": 1 << 5,
    "deterministic": 1 << 6,  # ABI 1.1
    # ABI 1.1 launch options
    "prequantized_input": 1 << 7,
    "static_act_scale": 1 << 8,
    "stage2_act_dtype": 1 << 9,
}
LAYOUT_FLAGS = {"has_bias": 1 << 0, "aiter_target": 1 << 1}
FRAGMENT_BIAS = {"unknown": 0, "absent": 1, "present": 2}  # ABI 1.1
MOE_FLAGS = {"router_weight_on_input": 1 << 3}
STATUS_NAMES = [
    "MOEPLUG_OK",
    "MOEPLUG_INVALID_ARGUMENT",
    "MOEPLUG_UNSUPPORTED",
    "MOEPLUG_LAYOUT_MISMATCH",
    "MOEPLUG_BACKEND_UNAVAILABLE",
    "MOEPLUG_DEVICE_ERROR",
    "MOEPLUG_COMPILE_ERROR",
    "MOEPLUG_OUT_OF_MEMORY",
    "MOEPLUG_BUFFER_TOO_SMALL",
    "MOEPLUG_INTERNAL",
]


class Device(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class Tensor(Structure):
    """DLPack's DLTensor, byte for byte."""

    _fields_ = [
        ("data", c_void_p),
        ("device", Device),
        ("ndim", c_int32),
        ("dtype", DType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


TensorP = POINTER(Tensor)


class _Sized(Structure):
    """Argument structs: struct_size first, set automatically."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.struct_size = ctypes.sizeof(self)


class Layout(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("weight_format", c_int32),
        ("gate_mode", c_int32),
        ("weight_layout", c_int32),
        ("scale_layout", c_int32),
        ("num_experts", c_int32),
        ("hidden_size", c_int64),
        ("intermediate_size", c_int64),
        ("hidden_padded", c_int64),
        ("intermediate_padded", c_int64),
        ("flags", c_uint32),
        ("reserved0", c_uint32),
        ("act_dtype", c_int32),
        ("reserved1", c_uint32),
        ("prep_fingerprint", c_uint64),
    ]


class LayoutFragment(_Sized):
    """ABI 1.1: what one preparation call established (0 = nothing); docs/abi.md §8."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("weight_format", c_int32),
        ("gate_mode", c_int32),
        ("weight_layout", c_int32),
        ("scale_layout", c_int32),
        ("act_dtype", c_int32),
        ("num_experts", c_int64),
        ("hidden_size", c_int64),
        ("intermediate_size", c_int64),
        ("hidden_padded", c_int64),
        ("intermediate_padded", c_int64),
        ("has_bias", c_int32),
        ("reserved0", c_uint32),
    ]


# ABI 1.1: appended to every primitive's arguments; NULL = no fragment.
_OUT_FRAGMENT = ("out_fragment", POINTER(LayoutFragment))


class Caps(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("device_type", c_int32),
        ("device_id", c_int32),
        ("backend", c_int32),
        ("arch", c_char * 32),
        ("runtime_version", c_char * 32),
        ("weight_formats", c_uint32),
        ("act_dtypes", c_uint32),
        ("gate_modes", c_uint32),
        ("activations", c_uint32),
        ("weight_layouts", c_uint32),
        ("scale_layouts", c_uint32),
        ("features", c_uint32),
        # after the 1.0 fields: the largest M and k one launch may have (docs/abi.md §6)
        ("max_tokens", c_uint64),
        ("max_topk", c_uint64),
    ]


class ShuffleWeightArgs(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("src", TensorP),
        ("dst", TensorP),
        ("layout_n", c_int32),
        ("layout_k", c_int32),
        ("use_int4", c_int32),
        ("is_guinterleave", c_int32),
        ("gate_up", c_int32),
        ("pad_k_to", c_int64),
        _OUT_FRAGMENT,
    ]


class ShuffleScaleArgs(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("src", TensorP),
        ("dst", TensorP),
        ("num_experts", c_int32),
        ("is_guinterleave", c_int32),
        ("gate_up", c_int32),
        _OUT_FRAGMENT,
    ]


class PadWeightsArgs(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("src", TensorP),
        ("dst", TensorP),
        ("gate_up", c_int32),
        ("fill", c_double),
        _OUT_FRAGMENT,
    ]


class SwizzleScaleArgs(_Sized):
    _fields_ = [("struct_size", c_uint32), ("src", TensorP), ("dst", TensorP), ("layout", c_int32), _OUT_FRAGMENT]


class QuantizeMxArgs(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("src", TensorP),
        ("dst_q", TensorP),
        ("dst_scale", TensorP),
        ("format", c_int32),
        ("round_mode", c_int32),
        ("shuffle_scale", c_int32),
        _OUT_FRAGMENT,
    ]


class PrepareMoeArgs(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("weight_format", c_int32),
        ("gate_mode_in", c_int32),
        ("device_type", c_int32),
        ("device_id", c_int32),
        ("act_dtype", c_int32),
        ("hidden_align", c_int32),
        ("intermediate_align", c_int32),
        ("w13", TensorP),
        ("w13_scale", TensorP),
        ("w13_bias", TensorP),
        ("w2", TensorP),
        ("w2_scale", TensorP),
        ("w2_bias", TensorP),
        ("out_w13", TensorP),
        ("out_w13_scale", TensorP),
        ("out_w13_bias", TensorP),
        ("out_w2", TensorP),
        ("out_w2_scale", TensorP),
        ("out_w2_bias", TensorP),
        ("out_layout", POINTER(Layout)),
        ("target", c_int32),  # ABI 1.1
    ]


PREPARED_OUTPUTS = ("w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias")


class PrepareMoeSizes(_Sized):
    _fields_ = [("struct_size", c_uint32)]
    for _i, _name in enumerate(PREPARED_OUTPUTS):
        # reserved0..4: the header's explicit padding before each shape but the first.
        _reserved = [(f"reserved{_i - 1}", c_uint32)] if _i else []
        _fields_ += [(_name + "_ndim", c_int32), *_reserved, (_name + "_shape", c_int64 * 4)]
    _fields_ += [(_name + "_bytes", c_uint64) for _name in PREPARED_OUTPUTS]
    _fields_ += [("layout", Layout)]


class AiterArgsOut(_Sized):  # ABI 1.1
    _fields_ = [
        ("struct_size", c_uint32),
        ("is_shuffled", c_int32),
        ("scale_swizzled", c_int32),
        ("reserved0", c_uint32),
        ("hidden_pad", c_int64),
        ("intermediate_pad", c_int64),
    ] + [(name, c_char * 16) for name in ("gate_mode", "quant_type", "quant_type_a", "quant_dtype_a", "quant_dtype_a2", "activation")]


class ResolvedConfig(_Sized):  # ABI 1.1
    _fields_ = [
        ("struct_size", c_uint32),
        ("backend", c_int32),
        ("act_dtype", c_int32),
        ("act_dtype_stage2", c_int32),
        ("activation", c_int32),
        ("alpha", c_float),
        ("limit", c_float),
        ("reserved0", c_uint32),
        ("weight_format", c_int32),
        ("gate_mode", c_int32),
        ("weight_layout", c_int32),
        ("scale_layout", c_int32),
    ]


class FusedMoeArgs(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("layout", POINTER(Layout)),
        ("activation", c_int32),
        ("alpha", c_float),
        ("limit", c_float),
        ("act_dtype", c_int32),
        ("flags", c_uint32),
        ("hidden_states", TensorP),
        ("hidden_scale", TensorP),
        ("w13", TensorP),
        ("w13_scale", TensorP),
        ("w13_bias", TensorP),
        ("w2", TensorP),
        ("w2_scale", TensorP),
        ("w2_bias", TensorP),
        ("topk_weights", TensorP),
        ("topk_ids", TensorP),
        ("expert_mask", TensorP),
        ("num_local_tokens", TensorP),
        ("output", TensorP),
        ("workspace", TensorP),
        ("stream", c_void_p),
        # ABI 1.1
        ("stage1_act_scale", TensorP),
        ("stage2_act_scale", TensorP),
        ("stage2_act_dtype", c_int32),
        ("reserved0", c_uint32),
    ]


_STATUS = c_int32
_SIGNATURES = {
    "moeplug_abi_version": (c_uint32, []),
    "moeplug_version": (c_char_p, []),
    "moeplug_last_error": (c_char_p, []),
    "moeplug_status_name": (c_char_p, [c_int32]),
    "moeplug_get_caps": (_STATUS, [c_int32, c_int32, POINTER(Caps)]),
    "moeplug_check_fused_moe": (_STATUS, [c_int32, c_int32, POINTER(FusedMoeArgs)]),
    "moeplug_fused_moe_workspace_size": (_STATUS, [POINTER(FusedMoeArgs), POINTER(c_size_t)]),
    "moeplug_fused_moe": (_STATUS, [POINTER(FusedMoeArgs)]),
    "moeplug_shuffle_weight": (_STATUS, [POINTER(ShuffleWeightArgs), c_void_p]),
    "moeplug_shuffle_scale": (_STATUS, [POINTER(ShuffleScaleArgs), c_void_p]),
    "moeplug_pad_weights": (_STATUS, [POINTER(PadWeightsArgs), c_void_p]),
    "moeplug_swizzle_scale": (_STATUS, [POINTER(SwizzleScaleArgs), c_void_p]),
    "moeplug_quantize_mx": (_STATUS, [POINTER(QuantizeMxArgs), c_void_p]),
    "moeplug_prepare_moe_sizes": (_STATUS, [POINTER(PrepareMoeArgs), POINTER(PrepareMoeSizes)]),
    "moeplug_prepare_moe": (_STATUS, [POINTER(PrepareMoeArgs), c_void_p]),
}


# ABI 1.1 (symbol version MOEPLUG_1.1): host threads, log and progress callbacks.
LogCallback = ctypes.CFUNCTYPE(None, c_int32, c_char_p, c_void_p)
ProgressCallback = ctypes.CFUNCTYPE(None, c_char_p, c_uint64, c_uint64, c_void_p)
_SIGNATURES_1_1 = {
    "moeplug_set_num_threads": (_STATUS, [c_uint32]),
    "moeplug_num_threads": (c_uint32, []),
    "moeplug_set_log_callback": (_STATUS, [LogCallback, c_void_p]),
    "moeplug_set_progress_callback": (_STATUS, [ProgressCallback, c_void_p]),
    "moeplug_resolve_config": (_STATUS, [c_int32, c_int32, POINTER(FusedMoeArgs), POINTER(ResolvedConfig)]),
    "moeplug_aiter_args": (_STATUS, [POINTER(Layout), c_int32, POINTER(AiterArgsOut)]),
    "moeplug_layout_from_fragments": (_STATUS, [POINTER(POINTER(LayoutFragment)), c_size_t, POINTER(Layout)]),
}


def _candidates() -> list[Path]:
    env = os.environ.get("MOEPLUG_LIBRARY")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    repo = here.parent.parent
    return [
        here / "libmoeplug.so",
        here / "libmoeplug.so.1",
        repo / "target" / "release" / "libmoeplug.so",
        repo / "target" / "debug" / "libmoeplug.so",
    ]


def load() -> ctypes.CDLL:
    """Load libmoeplug: $MOEPLUG_LIBRARY, else next to the package, else the build tree."""
    tried = []
    for path in _candidates():
        if path.exists():
            lib = ctypes.CDLL(str(path))
            break
        tried.append(str(path))
    else:
        raise OSError(
            "libmoeplug.so not found (set MOEPLUG_LIBRARY or run `cargo build --release`); tried: "
            + ", ".join(tried)
        )
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    major = lib.moeplug_abi_version() >> 16
    if major != ABI_MAJOR:
        raise OSError(f"{path}: ABI major {major}, this package speaks {ABI_MAJOR}")
    # A 1.0 library lacks these: the Python calls that need them say so (moeplug._need_1_1).
    for name, (restype, argtypes) in _SIGNATURES_1_1.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes
    lib.path = str(path)
    return lib


def bit_mask(table: dict) -> int:
    """Bit `1 << v` for each distinct non-zero value of an enum table: a caps mask with every
    value of `table` set. Aliases share their value's bit (a sum over `.values()` would count it
    twice)."""
    return sum(1 << v for v in set(table.values()) if v)


def _constants(prefix: str, values: dict, *, default: bool = False) -> dict:
    out = {f"{prefix}DEFAULT": 0} if default else {}
    out.update({prefix + name.upper(): v for name, v in values.items() if name not in ALIASES})
    return out


# Every struct and enum of the header, by its C name (compared with the header by tests/abi.rs).
C_STRUCTS = {
    "moeplug_device": Device,
    "moeplug_dtype": DType,
    "moeplug_tensor": Tensor,
    "moeplug_caps": Caps,
    "moeplug_layout": Layout,
    "moeplug_layout_fragment": LayoutFragment,
    "moeplug_fused_moe_args": FusedMoeArgs,
    "moeplug_shuffle_weight_args": ShuffleWeightArgs,
    "moeplug_shuffle_scale_args": ShuffleScaleArgs,
    "moeplug_pad_weights_args": PadWeightsArgs,
    "moeplug_swizzle_scale_args": SwizzleScaleArgs,
    "moeplug_quantize_mx_args": QuantizeMxArgs,
    "moeplug_prepare_moe_args": PrepareMoeArgs,
    "moeplug_prepare_moe_sizes_out": PrepareMoeSizes,
    "moeplug_aiter_args_out": AiterArgsOut,
    "moeplug_resolved_config": ResolvedConfig,
}
C_ENUMS = {
    "moeplug_status": {name: i for i, name in enumerate(STATUS_NAMES)},
    "moeplug_device_type": _constants("MOEPLUG_DEVICE_TYPE_", DEVICE_TYPES),
    "moeplug_dtype_code": _constants("MOEPLUG_DTYPE_CODE_", DTYPE_CODES),
    "moeplug_weight_format": _constants("MOEPLUG_WEIGHT_FORMAT_", WEIGHT_FORMATS, default=True),
    "moeplug_act_dtype": _constants("MOEPLUG_ACT_DTYPE_", ACT_DTYPES),
    "moeplug_gate_mode": _constants("MOEPLUG_GATE_MODE_", GATE_MODES, default=True),
    "moeplug_activation": _constants("MOEPLUG_ACTIVATION_", ACTIVATIONS, default=True),
    "moeplug_weight_layout": _constants("MOEPLUG_WEIGHT_LAYOUT_", WEIGHT_LAYOUTS, default=True),
    "moeplug_scale_layout": _constants("MOEPLUG_SCALE_LAYOUT_", SCALE_LAYOUTS, default=True),
    "moeplug_backend": {"MOEPLUG_BACKEND_NONE": 0, **{f"MOEPLUG_BACKEND_{n.upper()}": v for v, n in BACKENDS.items()}},
    "moeplug_round_mode": _constants("MOEPLUG_ROUND_MODE_", ROUND_MODES, default=True),
    "moeplug_prep_target": _constants("MOEPLUG_PREP_TARGET_", PREP_TARGETS),
    "moeplug_log_level": _constants("MOEPLUG_LOG_LEVEL_", LOG_LEVELS),
    "moeplug_feature": _constants("MOEPLUG_FEATURE_", FEATURES),
    "moeplug_layout_flag": _constants("MOEPLUG_LAYOUT_FLAG_", LAYOUT_FLAGS),
    "moeplug_fragment_bias": _constants("MOEPLUG_FRAGMENT_BIAS_", FRAGMENT_BIAS),
    "moeplug_moe_flag": _constants("MOEPLUG_MOE_FLAG_", MOE_FLAGS),
}
# The frozen 1.0 size of every struct that starts with struct_size (the header's *_SIZE_V1_0).
SIZES_V1_0 = {
    "moeplug_caps": 112,
    "moeplug_layout": 64,
    "moeplug_fused_moe_args": 160,
    "moeplug_shuffle_weight_args": 56,
    "moeplug_shuffle_scale_args": 40,
    "moeplug_pad_weights_args": 40,
    "moeplug_swizzle_scale_args": 32,
    "moeplug_quantize_mx_args": 48,
    "moeplug_prepare_moe_args": 136,
    "moeplug_prepare_moe_sizes_out": 352,
}
# The 1.1 sizes (the header's *_SIZE_V1_1): a struct new in 1.1 at its first size, and the
# structs that grew in 1.1.
SIZES_V1_1 = {
    "moeplug_aiter_args_out": 128,
    "moeplug_resolved_config": 48,
    "moeplug_layout_fragment": 72,
    "moeplug_shuffle_weight_args": 64,
    "moeplug_shuffle_scale_args": 48,
    "moeplug_pad_weights_args": 48,
    "moeplug_swizzle_scale_args": 40,
    "moeplug_quantize_mx_args": 56,
}


def describe_mirror() -> list[str]:
    """The mirror in the probe's line format: struct sizes, field offsets and sizes, enum values."""
    lines = []
    for cname, cls in C_STRUCTS.items():
        lines.append(f"struct {cname} size {ctypes.sizeof(cls)}")
        for fname, _ in cls._fields_:
            f = getattr(cls, fname)
            lines.append(f"field {cname}.{fname} offset {f.offset} size {f.size}")
    for ename, values in C_ENUMS.items():
        for name, v in values.items():
            lines.append(f"enum {ename} {name} {v}")
    for version, sizes in (("v1_0", SIZES_V1_0), ("v1_1", SIZES_V1_1)):
        for cname, size in sizes.items():
            lines.append(f"{version} {cname} {size}")
    return lines
