"""The moeplug C ABI through ctypes, for the GPU tests: `moeplug_tensor` descriptors built from
torch tensors (any device) and thin call wrappers. The structs and enum values are the Python
package's ctypes mirror (python/moeplug/_abi.py, checked against the header), not a copy."""

import ctypes
import importlib.util
import os
from pathlib import Path

# The package's mirror needs only the standard library: load the file itself, so these tests
# do not depend on numpy or on how the package is installed.
_spec = importlib.util.spec_from_file_location(
    "moeplug_abi_mirror", Path(__file__).resolve().parents[2] / "python/moeplug/_abi.py")
_mirror = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mirror)

Device, DType, Tensor = _mirror.Device, _mirror.DType, _mirror.Tensor
Caps, Layout, FusedMoeArgs = _mirror.Caps, _mirror.Layout, _mirror.FusedMoeArgs

STATUS = [n.removeprefix("MOEPLUG_") for n in _mirror.STATUS_NAMES]
WEIGHT_FORMAT = _mirror.WEIGHT_FORMATS
ACT_DTYPE = _mirror.ACT_DTYPES
# moeplug_weight_format -> the activation dtypes defined for it (WeightFormat::allowed_act_dtypes)
ALLOWED_ACT = dict(bf16=["bf16", "fp16"], fp16=["bf16", "fp16"],
                   fp8_per_tensor=["bf16", "fp16", "fp8_per_token", "fp8_per_tensor"],
                   fp8_per_channel=["bf16", "fp16", "fp8_per_token", "fp8_per_tensor"],
                   fp8_block128=["bf16", "fp16", "fp8_block128"],
                   mxfp4=["bf16", "fp16", "mxfp4", "mxfp8"], mxfp8=["bf16", "fp16", "mxfp8"],
                   int4_group32=["bf16", "fp16"],
                   int4_per_channel=["bf16", "fp16", "fp8_per_token", "fp8_per_tensor"])
# docs/abi.md §2: the DEFAULT activation dtype of each weight format
DEFAULT_ACT = dict(bf16=None, fp16=None, fp8_per_tensor="fp8_per_token",
                   fp8_per_channel="fp8_per_token", fp8_block128="fp8_block128", mxfp4="bf16",
                   mxfp8="mxfp8", int4_group32="bf16", int4_per_channel="fp8_per_token")
GATE_MODE = _mirror.GATE_MODES
ACTIVATION = _mirror.ACTIVATIONS
WEIGHT_LAYOUT = _mirror.WEIGHT_LAYOUTS
SCALE_LAYOUT = dict(none=0, **_mirror.SCALE_LAYOUTS)
bit_mask = _mirror.bit_mask
FLAG_HAS_BIAS = _mirror.LAYOUT_FLAGS["has_bias"]
FLAG_ROUTER_WEIGHT_ON_INPUT = _mirror.MOE_FLAGS["router_weight_on_input"]


TP = ctypes.POINTER(Tensor)


def library_path():
    env = os.environ.get("MOEPLUG_LIBRARY")
    if env:
        return env
    root = Path(__file__).resolve().parents[2]
    for p in [root / "libmoeplug.so", root / "target/release/libmoeplug.so",
              root / "target/debug/libmoeplug.so"]:
        if p.exists():
            return str(p)
    return None


_lib = None


def lib():
    global _lib
    if _lib is None:
        path = library_path()
        if path is None:
            raise OSError("libmoeplug.so not found (set MOEPLUG_LIBRARY)")
        l = ctypes.CDLL(path)
        l.moeplug_last_error.restype = ctypes.c_char_p
        l.moeplug_get_caps.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(Caps)]
        l.moeplug_check_fused_moe.argtypes = [ctypes.c_int32, ctypes.c_int32,
                                              ctypes.POINTER(FusedMoeArgs)]
        l.moeplug_fused_moe_workspace_size.argtypes = [ctypes.POINTER(FusedMoeArgs),
                                                       ctypes.POINTER(ctypes.c_size_t)]
        l.moeplug_fused_moe.argtypes = [ctypes.POINTER(FusedMoeArgs)]
        for f in ["moeplug_get_caps", "moeplug_check_fused_moe",
                  "moeplug_fused_moe_workspace_size", "moeplug_fused_moe"]:
            getattr(l, f).restype = ctypes.c_int32
        _lib = l
    return _lib


class MoeplugError(RuntimeError):
    def __init__(self, status, message):
        self.status = status
        self.name = STATUS[status] if 0 <= status < len(STATUS) else "UNKNOWN"
        super().__init__(f"{self.name}: {message}")


def check(status):
    if status != 0:
        raise MoeplugError(status, lib().moeplug_last_error().decode())


def get_caps(device_type=2, device_id=0):
    c = Caps(struct_size=ctypes.sizeof(Caps))
    check(lib().moeplug_get_caps(device_type, device_id, ctypes.byref(c)))
    return c


def _dtype_of(t):
    import torch
    table = {torch.bfloat16: (4, 16), torch.float16: (2, 16), torch.float32: (2, 32),
             torch.int32: (0, 32), torch.uint8: (1, 8), torch.float8_e4m3fn: (10, 8),
             torch.float8_e4m3fnuz: (11, 8)}
    return table[t.dtype]


class Desc:
    """A `moeplug_tensor` for a torch tensor (kept alive with its shape array)."""

    def __init__(self, t):
        assert t.is_contiguous()
        self.t = t
        self.shape = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
        code, bits = _dtype_of(t)
        dev = Device(2, t.device.index or 0) if t.is_cuda else Device(1, 0)
        self.c = Tensor(t.data_ptr(), dev, t.dim(), DType(code, bits, 1), self.shape, None, 0)

    def ptr(self):
        return ctypes.pointer(self.c)


def make_args(layout, tensors, *, activation="silu", alpha=0.0, limit=0.0, act_dtype="default",
              router_weight_on_input=False, stream=None, stage2_act_dtype="default"):
    """Build `moeplug_fused_moe_args`; `tensors` maps field names to torch tensors."""
    keep = [layout]
    a = FusedMoeArgs(struct_size=ctypes.sizeof(FusedMoeArgs))
    a.layout = ctypes.pointer(layout)
    a.activation = ACTIVATION[activation]
    a.alpha = alpha
    a.limit = limit
    a.act_dtype = ACT_DTYPE[act_dtype]
    a.stage2_act_dtype = ACT_DTYPE[stage2_act_dtype]  # ABI 1.1; "default" = act_dtype
    a.flags = FLAG_ROUTER_WEIGHT_ON_INPUT if router_weight_on_input else 0
    for name, t in tensors.items():
        if t is None:
            continue
        d = Desc(t)
        keep.append(d)
        setattr(a, name, d.ptr())
    a.stream = stream
    a._keep = keep
    return a


def make_layout(weight_format, gate_mode, weight_layout, scale_layout, E, H, I, Hp, Ip, bias):
    return Layout(ctypes.sizeof(Layout), WEIGHT_FORMAT[weight_format], GATE_MODE[gate_mode],
                  WEIGHT_LAYOUT[weight_layout], SCALE_LAYOUT[scale_layout], E, H, I, Hp, Ip,
                  FLAG_HAS_BIAS if bias else 0)


def workspace_size(args):
    n = ctypes.c_size_t(0)
    check(lib().moeplug_fused_moe_workspace_size(ctypes.byref(args), ctypes.byref(n)))
    return n.value


def fused_moe(args):
    check(lib().moeplug_fused_moe(ctypes.byref(args)))


def check_fused_moe(args, device_type=2, device_id=0):
    return lib().moeplug_check_fused_moe(device_type, device_id, ctypes.byref(args))
