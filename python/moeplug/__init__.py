"""moeplug: MoE weight preparation and fused MoE through libmoeplug's C ABI (docs/abi.md §10).

Every function raises :class:`MoeplugError` (with ``.status``, ``.name`` and the library's
message) when the library refuses a call.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from . import _abi
from ._tensor import DEVICE_CPU, DEVICE_CUDA, DEVICE_ROCM, c_int, describe, ptr  # noqa: F401 (re-exported)

__all__ = [
    "MoeplugError",
    "Caps",
    "abi_version",
    "version",
    "get_caps",
    "library_path",
    "WEIGHT_FORMATS",
    "ACT_DTYPES",
    "GATE_MODES",
    "ACTIVATIONS",
    "WEIGHT_LAYOUTS",
    "SCALE_LAYOUTS",
    "FEATURES",
]

# The ABI's vocabulary lives once, in the ctypes mirror (checked against the header).
from ._abi import (  # noqa: E402
    ACT_DTYPES,
    ACTIVATIONS,
    BACKENDS,
    FEATURES,
    GATE_MODES,
    ROUND_MODES,  # noqa: F401 (read by _ops)
    SCALE_LAYOUTS,
    STATUS_NAMES,  # noqa: F401 (public table)
    WEIGHT_FORMATS,
    WEIGHT_LAYOUTS,
)


class MoeplugError(RuntimeError):
    """A call the library refused: ``status`` (int), ``name`` ("MOEPLUG_..."), ``message``."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.status = status
        self.name = name
        self.message = message


_lib = None


def _library():
    global _lib
    if _lib is None:
        lib = _abi.load()
        from ._runtime import install_log_bridge

        install_log_bridge(lib)
        _lib = lib
    return _lib


def library_path() -> str:
    """The path of the loaded libmoeplug."""
    return _library().path


def _check(status: int) -> None:
    if status != 0:
        lib = _library()
        raise MoeplugError(status, lib.moeplug_status_name(status).decode(), lib.moeplug_last_error().decode())


def _enum(table: dict, value, what: str) -> int:
    """Enum from its lower-case name or int (0/None = default)."""
    if value is None:
        return 0
    if isinstance(value, str):
        try:
            return table[value.lower()]
        except KeyError:
            raise ValueError(f"{what}: unknown name {value!r} (valid: {', '.join(table)})") from None
    return c_int(value, what)


def abi_version() -> tuple[int, int]:
    """(major, minor) of the library's ABI."""
    v = _library().moeplug_abi_version()
    return v >> 16, v & 0xFFFF


def version() -> str:
    return _library().moeplug_version().decode()


@dataclass(frozen=True)
class Caps:
    """What a device can run: sets of enum names (see the module's tables)."""

    backend: str
    arch: str
    runtime_version: str
    device: str
    weight_formats: frozenset
    act_dtypes: frozenset
    gate_modes: frozenset
    activations: frozenset
    weight_layouts: frozenset
    scale_layouts: frozenset
    features: frozenset
    # The largest M and k one launch may have (2**64 - 1: only memory bounds it).
    max_tokens: int
    max_topk: int


def _names(table: dict, mask: int, bits: bool = True) -> frozenset:
    """The header names (not the aliases) of the values set in `mask`."""
    return frozenset(n for n, v in table.items() if mask & ((1 << v) if bits else v) and n not in _abi.ALIASES)


def parse_device(device) -> tuple[int, int]:
    """"cpu", "cuda:0", "rocm:1", a torch.device, or (device_type, device_id)."""
    if device is None:
        return DEVICE_CPU, 0
    if isinstance(device, tuple):
        return c_int(device[0], "device type"), c_int(device[1], "device id")
    text = str(device)
    kind, _, index = text.partition(":")
    types = {"cpu": DEVICE_CPU, "cuda": DEVICE_CUDA, "rocm": DEVICE_ROCM, "hip": DEVICE_ROCM}
    if kind not in types:
        raise ValueError(f"device: expected 'cpu', 'cuda:N' or 'rocm:N', got {text!r}")
    return types[kind], c_int(int(index or 0), "device id")


def get_caps(device="cpu") -> Caps:
    """Capabilities of a device; raises MoeplugError(BACKEND_UNAVAILABLE) if its runtime is missing."""
    dtype, did = parse_device(device)
    caps = _abi.Caps()
    _check(_library().moeplug_get_caps(dtype, did, ctypes.byref(caps)))
    return Caps(
        backend=BACKENDS.get(caps.backend, "unknown"),
        arch=caps.arch.decode(),
        runtime_version=caps.runtime_version.decode(),
        device=str(device),
        weight_formats=_names(WEIGHT_FORMATS, caps.weight_formats),
        act_dtypes=_names(ACT_DTYPES, caps.act_dtypes),
        gate_modes=_names(GATE_MODES, caps.gate_modes),
        activations=_names(ACTIVATIONS, caps.activations),
        weight_layouts=_names(WEIGHT_LAYOUTS, caps.weight_layouts),
        scale_layouts=_names(SCALE_LAYOUTS, caps.scale_layouts),
        features=_names(FEATURES, caps.features, bits=False),
        max_tokens=caps.max_tokens,
        max_topk=caps.max_topk,
    )


from ._abi import LayoutFragment  # noqa: E402
from ._aiter import aiter_args, resolve_config  # noqa: E402  (ABI 1.1)
from ._ops import (  # noqa: E402  (the ops need the tables above)
    Prepared,
    check_fused_moe,
    declare_fragment,
    fused_moe,
    fused_moe_workspace_size,
    layout_from_fragments,
    pad_weights,
    prepare_moe,
    quantize_mx,
    shuffle_scale,
    shuffle_weight,
    swizzle_scale,
)
from ._runtime import num_threads, set_num_threads, set_progress_callback  # noqa: E402

__all__ += [
    "aiter_args",
    "resolve_config",
    "num_threads",
    "set_num_threads",
    "set_progress_callback",
    "Prepared",
    "LayoutFragment",
    "check_fused_moe",
    "declare_fragment",
    "layout_from_fragments",
    "fused_moe",
    "fused_moe_workspace_size",
    "pad_weights",
    "prepare_moe",
    "quantize_mx",
    "shuffle_scale",
    "shuffle_weight",
    "swizzle_scale",
]
