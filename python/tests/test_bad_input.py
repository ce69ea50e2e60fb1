"""Issue 14: Python values out of range for their C field are refused before ctypes truncates
them (2**32 + 1 would run as 1, 1.9 as 1), and errors name the call and argument the caller
used (not an IndexError, not the workspace query fused_moe makes on the caller's behalf)."""

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


def test_prep_calls_with_too_few_dimensions_name_the_call_and_argument():
    scalar = np.zeros((), np.uint8)
    cases = [
        (lambda: moeplug.shuffle_weight(np.zeros((4,), ml_dtypes.bfloat16)), r"^shuffle_weight: src: expected \[\.\.\., N, K\]"),
        (lambda: moeplug.shuffle_scale(scalar), r"^shuffle_scale: src: expected \[m, n\]"),
        (lambda: moeplug.pad_weights(scalar, rows=4), r"^pad_weights: src: expected \[E, N, K\] or \[E, N\]"),
        (lambda: moeplug.swizzle_scale(np.zeros((2, 3), np.uint8)), r"^swizzle_scale: src: expected \[E, N, K/32\].*got shape \(2, 3\)"),
        (lambda: moeplug.quantize_mx(np.zeros((), np.float32)), r"^quantize_mx: x: expected \[\.\.\., K\]"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_fused_moe_without_prepared_weights_is_a_type_error():
    x = np.zeros((1, 1), ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match=r"^fused_moe: prepared: expected the Prepared that prepare_moe returned, got NoneType$"):
        moeplug.fused_moe(x, None, np.ones((1, 1), np.float32), np.zeros((1, 1), np.int32))


def test_fused_moe_argument_errors_name_fused_moe():
    # topk_ids as float32: refused by the launch check, reported as the launch's error.
    bf16 = ml_dtypes.bfloat16
    layout = _abi.Layout(struct_size=ctypes.sizeof(_abi.Layout), weight_format=1, gate_mode=1, weight_layout=1, num_experts=1, hidden_size=1, intermediate_size=1, hidden_padded=1, intermediate_padded=1)
    p = Prepared(layout=layout, w13=np.zeros((1, 2, 1), bf16), w2=np.zeros((1, 1, 1), bf16))
    x = np.zeros((1, 1), bf16)
    with pytest.raises(moeplug.MoeplugError) as e:
        moeplug.fused_moe(x, p, np.ones((1, 1), np.float32), np.zeros((1, 1), np.float32))
    assert e.value.name == "MOEPLUG_INVALID_ARGUMENT"
    assert e.value.message.startswith("moeplug_fused_moe: topk_ids: expected dtype int32"), e.value.message


def test_caps_report_the_launch_limits():
    caps = moeplug.get_caps("cpu")
    assert (caps.max_tokens, caps.max_topk) == (2**64 - 1, 2**64 - 1)


# The child of the test below: inputs and output are allocated first (the limit is on the whole
# process, and Python with numpy already maps ~400 MB), then RLIMIT_AS = 1 GiB, then a launch:
# the CPU backend's scratch is bounded. Two workers on every machine: with 128, glibc itself
# aborted a started worker whose thread-local data (dynamic TLS of a dlopen'ed library) it
# could not allocate under the limit (tests/bad_input.rs covers refused workers, linked).
_LIMITED_LAUNCH = textwrap.dedent("""
    import resource
    import ml_dtypes
    import numpy as np
    import moeplug

    bf16 = ml_dtypes.bfloat16
    M, K, H, I, E = 2**18, 8, 128, 256, 8
    rng = np.random.default_rng(14)
    x = rng.standard_normal((M, H), np.float32).astype(bf16)
    w13 = (rng.standard_normal((E, 2 * I, H), np.float32) * 0.1).astype(bf16)
    w2 = (rng.standard_normal((E, H, I), np.float32) * 0.1).astype(bf16)
    ids = np.argsort(rng.random((M, E), np.float32), axis=1)[:, :K].astype(np.int32)
    wts = rng.random((M, K), np.float32)
    p = moeplug.prepare_moe(w13, w2, weight_format="bf16")
    out = np.zeros((M, H), bf16)
    rows = np.array([0, 1, 77777, M // 2 + 3, M - 1])
    small = np.zeros((len(rows), H), bf16)
    moeplug.set_num_threads(2)
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    moeplug.fused_moe(x, p, wts, ids, out=out)
    # The same tokens in a launch of their own give the same bytes.
    moeplug.fused_moe(x[rows], p, wts[rows], ids[rows], out=small)
    assert np.isfinite(small.astype(np.float32)).all() and small.astype(np.float32).any()
    np.testing.assert_array_equal(out[rows].view(np.uint16), small.view(np.uint16))
    print("child done")
""")


def test_a_2_pow_18_token_launch_runs_under_a_1_gib_address_space_limit():
    python_dir = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(python_dir), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", _LIMITED_LAUNCH], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"child exited {r.returncode} (negative: a signal)\n{r.stdout}\n{r.stderr}"
    assert "child done" in r.stdout, r.stdout + r.stderr
