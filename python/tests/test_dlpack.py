"""Any __dlpack__ producer is read through its capsule (__dlpack_device__, then
__dlpack__(stream=...)), not converted by NumPy: results equal the NumPy calls byte for byte,
strided or mismatched tensors are refused with a message, and device producers are asked for
the stream moeplug launches on."""

import ml_dtypes
import numpy as np
import pytest

import moeplug
from moeplug._tensor import DLPackArray, as_array


class Producer:
    """A minimal DLPack producer (what CuPy or JAX arrays look like to moeplug)."""

    def __init__(self, array, device=(1, 0)):
        self.array = array
        self.device = device
        self.streams = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return self.array.__dlpack__()


def test_host_producer_goes_through_the_capsule():
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    d = as_array(Producer(a))
    assert isinstance(d, DLPackArray)
    assert d.shape == (2, 3, 4) and d.dtype == np.int32 and d.device == (1, 0)
    assert d.tensor.data == a.ctypes.data  # borrowed, not copied


def test_prep_on_a_dlpack_producer_equals_the_numpy_call():
    src = np.random.default_rng(1).integers(0, 256, (4, 32, 64), dtype=np.uint8)
    p = Producer(src)
    got = moeplug.shuffle_weight(p, pad_k_to=128)
    assert p.streams == [None]  # host: no stream to synchronize with
    assert isinstance(got, np.ndarray) and got.shape == (4, 32, 128)
    assert np.array_equal(got, moeplug.shuffle_weight(src, pad_k_to=128))


def test_fused_moe_takes_dlpack_routing_tensors():
    rng = np.random.default_rng(2)
    E, H, INTER, M, K = 4, 256, 256, 5, 2
    bf16 = ml_dtypes.bfloat16
    w13 = (rng.standard_normal((E, 2 * INTER, H)) * 0.1).astype(bf16)
    w2 = (rng.standard_normal((E, H, INTER)) * 0.1).astype(bf16)
    p = moeplug.prepare_moe(w13, w2, weight_format="bf16")
    x = rng.standard_normal((M, H)).astype(bf16)
    ids = rng.integers(0, E, (M, K), dtype=np.int32)
    wts = rng.random((M, K), dtype=np.float32)
    want = moeplug.fused_moe(x, p, wts, ids)
    got = moeplug.fused_moe(x, p, Producer(wts), Producer(ids))
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_strided_producer_is_refused():
    a = np.arange(64 * 32, dtype=np.uint8).reshape(64, 32).T  # a transposed view: strides
    with pytest.raises(ValueError, match="is not C-contiguous"):
        moeplug.shuffle_weight(Producer(a))


def test_device_producer_is_asked_for_the_launch_stream():
    # Claims CUDA but hands over a host capsule: moeplug asks for stream 1 (the legacy default
    # stream its NULL stream is), then notices the capsule disagrees with the claim.
    p = Producer(np.zeros((16, 16), np.uint8), device=(2, 0))
    with pytest.raises(ValueError, match="disagree on the device"):
        moeplug.shuffle_weight(p)
    assert p.streams == [1]
