"""Issue 14: Python values out of range for their C field are refused before ctypes truncates
them (2**32 + 1 would run as 1, 1.9 as 1)."""

import ml_dtypes
import numpy as np
import pytest

import moeplug
from moeplug import _abi
from moeplug._ops import Prepared


def _prepared():
    bf16 = ml_dtypes.bfloat16
    return Prepared(layout=_abi.Layout(), w13=np.zeros((1, 2, 1), bf16), w2=np.zeros((1, 1, 1), bf16))


def _launch(**kw):
    bf16 = ml_dtypes.bfloat16
    x = np.zeros((1, 1), bf16)
    w = np.ones((1, 1), np.float32)
    ids = np.zeros((1, 1), np.int32)
    return moeplug.fused_moe(x, _prepared(), w, ids, **kw)


def test_an_activation_past_int32_is_a_value_error():
    with pytest.raises(ValueError, match=r"^activation: 4294967297 is outside the int32 range"):
        _launch(activation=2**32 + 1)


def test_a_float_activation_is_a_type_error():
    with pytest.raises(TypeError, match=r"^activation: expected an integer, got 1.9$"):
        _launch(activation=1.9)


def test_a_layout_n_past_int32_is_a_value_error():
    src = np.zeros((16, 32), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=r"^layout_n: 4294967312 is outside the int32 range"):
        moeplug.shuffle_weight(src, layout_n=2**32 + 16)


def test_a_device_id_past_int32_is_a_value_error():
    with pytest.raises(ValueError, match=r"^device id: 1099511627776 is outside the int32 range"):
        moeplug.get_caps((1, 2**40))
    with pytest.raises(ValueError, match=r"^device id: 1099511627776 is outside the int32 range"):
        moeplug.get_caps(f"cuda:{2**40}")


def test_in_range_integers_still_pass():
    # numpy integers are integers; the CPU answers for device id 0.
    assert moeplug.get_caps((np.int32(1), np.int64(0))).backend == "cpu"
