"""ctypes mirror of include/moeplug.h (ABI 1.0) and the library loader."""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int32, c_int64, c_uint8
from ctypes import c_uint16, c_uint32, c_uint64, c_size_t, c_void_p
from pathlib import Path

ABI_MAJOR = 1


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

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
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
    ]


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
    ]


class ShuffleScaleArgs(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("src", TensorP),
        ("dst", TensorP),
        ("num_experts", c_int32),
        ("is_guinterleave", c_int32),
        ("gate_up", c_int32),
    ]


class PadWeightsArgs(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("src", TensorP),
        ("dst", TensorP),
        ("gate_up", c_int32),
        ("fill", c_double),
    ]


class SwizzleScaleArgs(_Sized):
    _fields_ = [("struct_size", c_uint32), ("src", TensorP), ("dst", TensorP), ("layout", c_int32)]


class QuantizeMxArgs(_Sized):
    _fields_ = [
        ("struct_size", c_uint32),
        ("src", TensorP),
        ("dst_q", TensorP),
        ("dst_scale", TensorP),
        ("format", c_int32),
        ("round_mode", c_int32),
        ("shuffle_scale", c_int32),
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
    ]


PREPARED_OUTPUTS = ("w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias")


class PrepareMoeSizes(_Sized):
    _fields_ = [("struct_size", c_uint32)]
    for _name in PREPARED_OUTPUTS:
        _fields_ += [(_name + "_ndim", c_int32), (_name + "_shape", c_int64 * 4)]
    _fields_ += [(_name + "_bytes", c_uint64) for _name in PREPARED_OUTPUTS]
    _fields_ += [("layout", Layout)]


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
    lib.path = str(path)
    return lib
