"""Describing NumPy arrays and torch tensors as moeplug_tensor (DLTensor) without copies."""

from __future__ import annotations

import ctypes
import operator

import numpy as np

from . import _abi

try:  # ml_dtypes gives NumPy the low-precision float types
    import ml_dtypes as _mld
except ImportError:  # pragma: no cover - exercised only without ml_dtypes
    _mld = None

DEVICE_CPU, DEVICE_CUDA, DEVICE_ROCM = (_abi.DEVICE_TYPES[d] for d in ("cpu", "cuda", "rocm"))

# DLPack (code, bits) of each NumPy dtype moeplug reads.
_NUMPY_CODES = {
    np.dtype(np.int8): (0, 8),
    np.dtype(np.int32): (0, 32),
    np.dtype(np.int64): (0, 64),
    np.dtype(np.uint8): (1, 8),
    np.dtype(np.uint32): (1, 32),  # int4_per_channel words (AITER's uint32), ABI 1.1
    np.dtype(np.float16): (2, 16),
    np.dtype(np.float32): (2, 32),
}
if _mld is not None:
    _NUMPY_CODES.update(
        {
            np.dtype(_mld.bfloat16): (4, 16),
            np.dtype(_mld.float8_e4m3fn): (10, 8),
            np.dtype(_mld.float8_e4m3fnuz): (11, 8),
            np.dtype(_mld.float8_e8m0fnu): (14, 8),
        }
    )

_TORCH_CODES = {
    "torch.int8": (0, 8),
    "torch.int32": (0, 32),
    "torch.int64": (0, 64),
    "torch.uint8": (1, 8),
    "torch.uint32": (1, 32),
    "torch.float16": (2, 16),
    "torch.float32": (2, 32),
    "torch.bfloat16": (4, 16),
    "torch.float8_e4m3fn": (10, 8),
    "torch.float8_e4m3fnuz": (11, 8),
    "torch.float8_e8m0fnu": (14, 8),
    "torch.float4_e2m1fn_x2": (1, 8),  # one byte, two values: passed as bytes
}


def c_int(value, name: str, bits: int = 32) -> int:
    """`value` for a C int32/int64 field, checked before ctypes sees it (ctypes would silently
    truncate 2**32 + 1 to 1 and 1.9 to 1): TypeError for a non-integer, ValueError out of range."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {value!r}") from None
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not lo <= v <= hi:
        raise ValueError(f"{name}: {v} is outside the int{bits} range [{lo}, {hi}]")
    return v


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def pack_fp4(x: np.ndarray) -> np.ndarray:
    """ml_dtypes float4_e2m1fn (one value per byte) -> packed uint8 [..., K/2], low nibble even."""
    codes = x.view(np.uint8) & 0x0F
    if codes.shape[-1] % 2:
        raise ValueError(f"packing fp4 needs an even last dimension, got shape {x.shape}")
    return np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4))


def as_array(x):
    """What describe() takes: NumPy arrays and torch tensors as they are, any other
    ``__dlpack__`` producer (CuPy, JAX, ...) as a :class:`DLPackArray` read through its
    capsule, anything else through ``np.asarray``."""
    if x is None or is_torch(x) or isinstance(x, (np.ndarray, DLPackArray)):
        return x
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return DLPackArray(x)
    return np.asarray(x)


_DLPACK_CUDA, _DLPACK_CUDA_MANAGED, _DLPACK_ROCM = 2, 13, 10
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class DLPackArray:
    """A ``__dlpack__`` producer's tensor, borrowed through its capsule (no NumPy, so device
    arrays work). The capsule is kept, unconsumed, for as long as this object lives, so the
    producer's deleter frees it afterwards. The producer is asked to make the data ready on
    the stream moeplug launches on when none is given: CUDA's legacy default stream
    (DLPack ``stream=1``), ROCm's default stream (``0``)."""

    def __init__(self, obj):
        self.obj = obj
        device_type, device_id = (int(v) for v in obj.__dlpack_device__())
        stream = {_DLPACK_CUDA: 1, _DLPACK_CUDA_MANAGED: 1, _DLPACK_ROCM: 0}.get(device_type)
        self.capsule = obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
        address = _capsule_pointer(self.capsule, b"dltensor")
        # DLManagedTensor starts with its DLTensor, which moeplug_tensor is byte for byte.
        src = _abi.Tensor.from_address(address)
        self.tensor = _abi.Tensor.from_buffer_copy(src)
        self.shape = tuple(src.shape[i] for i in range(src.ndim))
        if src.strides:
            want = 1
            for i in reversed(range(src.ndim)):
                if self.shape[i] != 1 and src.strides[i] != want:
                    raise ValueError(f"DLPack tensor with strides {[src.strides[j] for j in range(src.ndim)]} is not C-contiguous")
                want *= self.shape[i]
        if (self.tensor.device.device_type, self.tensor.device.device_id) != (device_type, device_id):
            raise ValueError("DLPack capsule and __dlpack_device__ disagree on the device")
        self.ndim = src.ndim
        self.device = (device_type, device_id)
        code = (src.dtype.code, src.dtype.bits)
        self.dtype = next((dt for dt, c in _NUMPY_CODES.items() if c == code), None)

    @property
    def is_host(self) -> bool:
        return self.device[0] == DEVICE_CPU


class Described:
    """A moeplug_tensor plus the Python objects that keep its memory alive."""

    def __init__(self, obj, tensor: _abi.Tensor, shape_buf):
        self.obj = obj
        self.tensor = tensor
        self._shape = shape_buf

    @property
    def ptr(self):
        return ctypes.pointer(self.tensor)


def describe(x, name: str = "tensor", writable: bool = False) -> Described | None:
    """moeplug_tensor for a NumPy array or torch tensor (None stays None)."""
    if x is None:
        return None
    x = as_array(x)
    if is_torch(x):
        return _describe_torch(x, name)
    if isinstance(x, DLPackArray):
        return _describe_dlpack(x, name, writable)
    if _mld is not None and x.dtype == np.dtype(_mld.float4_e2m1fn):
        if writable:
            raise TypeError(f"{name}: outputs of packed fp4 are uint8 [..., K/2]")
        x = pack_fp4(x)
    if not x.flags.c_contiguous:
        if writable:
            raise ValueError(f"{name}: output arrays must be C-contiguous")
        x = np.ascontiguousarray(x)
    if writable and not x.flags.writeable:
        raise ValueError(f"{name}: output array is read-only")
    code = _NUMPY_CODES.get(x.dtype)
    if code is None:
        raise TypeError(f"{name}: dtype {x.dtype} is not supported by moeplug")
    shape = (ctypes.c_int64 * max(x.ndim, 1))(*x.shape)
    t = _abi.Tensor(
        data=x.ctypes.data if x.size else None,
        device=_abi.Device(DEVICE_CPU, 0),
        ndim=x.ndim,
        dtype=_abi.DType(code[0], code[1], 1),
        shape=ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
        strides=None,
        byte_offset=0,
    )
    return Described(x, t, shape)


def _describe_torch(x, name: str) -> Described:
    if not x.is_contiguous():
        raise ValueError(f"{name}: torch tensors must be contiguous")
    code = _TORCH_CODES.get(str(x.dtype))
    if code is None:
        raise TypeError(f"{name}: dtype {x.dtype} is not supported by moeplug")
    if x.device.type == "cpu":
        dev = _abi.Device(DEVICE_CPU, 0)
    elif x.device.type == "cuda":
        import torch

        dev = _abi.Device(DEVICE_ROCM if torch.version.hip else DEVICE_CUDA, x.device.index or 0)
    else:
        raise ValueError(f"{name}: device {x.device} is not supported")
    shape = (ctypes.c_int64 * max(x.dim(), 1))(*x.shape)
    t = _abi.Tensor(
        data=x.data_ptr() or None,
        device=dev,
        ndim=x.dim(),
        dtype=_abi.DType(code[0], code[1], 1),
        shape=ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
        strides=None,
        byte_offset=0,
    )
    return Described(x, t, shape)


def _describe_dlpack(x: DLPackArray, name: str, writable: bool) -> Described:
    code = (x.tensor.dtype.code, x.tensor.dtype.bits)
    if code not in set(_NUMPY_CODES.values()) | set(_TORCH_CODES.values()) or x.tensor.dtype.lanes != 1:
        raise TypeError(f"{name}: DLPack dtype (code {code[0]}, bits {code[1]}, lanes {x.tensor.dtype.lanes}) is not supported by moeplug")
    t = _abi.Tensor.from_buffer_copy(x.tensor)
    t.strides = None  # checked C-contiguous; moeplug takes compact row-major tensors
    return Described(x, t, x.shape)


def ptr(d: Described | None):
    """Pointer for an args field (NULL for None)."""
    return d.ptr if d is not None else None
