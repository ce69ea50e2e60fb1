import ctypes

import ml_dtypes
import numpy as np
import pytest

import moeplug
from moeplug import _abi
from moeplug._tensor import describe


def test_loads_the_built_library_and_reports_abi_1_1():
    assert moeplug.abi_version() == (1, 1)
    assert moeplug.version().startswith("0.1.0")
    assert moeplug.library_path().endswith(".so")


def test_struct_sizes_match_the_header():
    # DLTensor is 48 bytes; the args structs have no padding surprises across ctypes and C.
    assert ctypes.sizeof(_abi.Tensor) == 48
    assert _abi.Tensor.byte_offset.offset == 40
    assert _abi.Tensor.dtype.offset == 20


def test_cpu_caps():
    caps = moeplug.get_caps("cpu")
    assert caps.backend == "cpu"
    assert caps.arch


# (caps field, package table): the CPU backend runs every value of each table.
CAPS_TABLES = [
    ("weight_formats", moeplug.WEIGHT_FORMATS),
    ("act_dtypes", moeplug.ACT_DTYPES),
    ("gate_modes", moeplug.GATE_MODES),
    ("activations", moeplug.ACTIVATIONS),
    ("weight_layouts", moeplug.WEIGHT_LAYOUTS),
    ("scale_layouts", moeplug.SCALE_LAYOUTS),
]


@pytest.mark.parametrize("field,table", CAPS_TABLES, ids=[f for f, _ in CAPS_TABLES])
def test_cpu_caps_masks_count_each_value_once(field, table):
    raw = _abi.Caps()
    moeplug._check(moeplug._library().moeplug_get_caps(1, 0, ctypes.byref(raw)))
    # SCALE_LAYOUTS maps "cdna4" and "cdna4_swizzle" to 3: each value counts once.
    assert getattr(raw, field) == _abi.bit_mask(table)
    names = getattr(moeplug.get_caps("cpu"), field)
    assert names == {n for n, v in table.items() if v and n not in _abi.ALIASES}
    assert _abi.bit_mask({n: table[n] for n in names}) == getattr(raw, field)


def test_bit_mask_counts_an_alias_once():
    assert _abi.bit_mask(moeplug.SCALE_LAYOUTS) == 0b11110  # plain .. aiter_int4 (1..4)
    for alias, name in _abi.ALIASES.items():
        holders = [t for _, t in CAPS_TABLES if alias in t]
        assert holders and all(t[alias] == t[name] for t in holders), alias


def test_cuda_caps_or_a_clear_error():
    try:
        caps = moeplug.get_caps("cuda:0")
    except moeplug.MoeplugError as e:
        assert e.name == "MOEPLUG_BACKEND_UNAVAILABLE"
        assert e.status == 4
        assert "CUDA" in e.message
    else:
        assert caps.backend == "cuda"


def test_error_carries_status_name_and_message():
    lib = moeplug._library()
    bad = _abi.Caps()
    bad.struct_size = 4
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug._check(lib.moeplug_get_caps(1, 0, ctypes.byref(bad)))
    err = info.value
    assert err.status == 1
    assert err.name == "MOEPLUG_INVALID_ARGUMENT"
    assert "out.struct_size" in err.message
    assert "expected at least" in err.message
    assert str(err).startswith("MOEPLUG_INVALID_ARGUMENT: moeplug_get_caps:")


def test_unknown_device_is_invalid_argument():
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.get_caps((77, 0))
    assert info.value.name == "MOEPLUG_INVALID_ARGUMENT"
    assert "device_type" in info.value.message
    with pytest.raises(ValueError):
        moeplug.get_caps("tpu:0")


@pytest.mark.parametrize(
    "dtype,code",
    [
        (np.float32, (2, 32)),
        (np.int32, (0, 32)),
        (np.uint8, (1, 8)),
        (ml_dtypes.bfloat16, (4, 16)),
        (ml_dtypes.float8_e4m3fn, (10, 8)),
        (ml_dtypes.float8_e4m3fnuz, (11, 8)),
        (ml_dtypes.float8_e8m0fnu, (14, 8)),
    ],
)
def test_numpy_arrays_become_dltensors(dtype, code):
    a = np.zeros((3, 5), dtype=dtype)
    d = describe(a)
    t = d.tensor
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (*code, 1)
    assert t.ndim == 2 and [t.shape[0], t.shape[1]] == [3, 5]
    assert t.data == a.ctypes.data
    assert t.device.device_type == 1


def test_fp4_values_are_packed_low_nibble_first():
    x = np.array([[0.5, -6.0, 1.0, 0.0]], dtype=ml_dtypes.float4_e2m1fn)
    d = describe(x)
    packed = d.obj
    assert packed.dtype == np.uint8 and packed.shape == (1, 2)
    assert list(packed[0]) == [0xF1, 0x02]
