"""INT4_PER_CHANNEL (AITER a8w4 int4, Quark int4-fp8) through the Python package on the CPU.

The independent reference is a NumPy re-implementation of AITER's own functions
(aiter/ops/quant.py, aiter/ops/shuffle.py, aiter/int4_utils.py @e4048607): pertoken_quant
(int8, dtypeMax 7), shuffle_weight (16, 16, use_int4=True), convert_int8_to_uint32_int4 and
rearrange_4bit_elements, composed as op_tests/test_moe_2stage.py composes them for a8w4, and a
float64 MoE with fp8 per-token activations as AITER's torch reference quantizes them."""

import ml_dtypes
import numpy as np
import pytest

import moeplug

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn


def pertoken_quant_int4(w):
    """pertoken_quant(w, quant_dtype=int8, dtypeMax=7): per-row amax/7, `.to(int8)` truncates."""
    s = np.abs(w).max(-1, keepdims=True) / 7.0
    s[s == 0] = 1
    return np.trunc(w / s).astype(np.int8), s.astype(np.float32)


def shuffle_weight_int4(x):
    """shuffle_weight(x, (16, 16), use_int4=True) on int8 [E, N, K]: 32-value packs."""
    e, n, k = x.shape
    return x.reshape(e, n // 16, 16, k // 32, 1, 32).transpose(0, 1, 3, 4, 2, 5).reshape(e, n, k)


def convert_int8_to_uint32_int4(x):
    u = (x.astype(np.int32) & 0xF).astype(np.uint32).reshape(*x.shape[:-1], -1, 8)
    return sum(u[..., j] << (4 * j) for j in range(8)).astype(np.uint32)


def rearrange_4bit_elements(t):
    t = t.astype(np.uint32)
    return (
        (t & 0xF0000000)
        | ((t & 0x00F00000) << 4)
        | ((t & 0x0000F000) << 8)
        | ((t & 0x000000F0) << 12)
        | ((t & 0x0F000000) >> 12)
        | ((t & 0x000F0000) >> 8)
        | ((t & 0x00000F00) >> 4)
        | (t & 0x0000000F)
    ).astype(np.uint32)


def aiter_a8w4(q):
    """What op_tests/test_moe_2stage.py hands AITER's a8w4 int4 kernels for int8-held q."""
    return rearrange_4bit_elements(convert_int8_to_uint32_int4(shuffle_weight_int4(q)))


def layer(rng, e=4, h=128, i=64):
    w13 = rng.standard_normal((e, 2 * i, h)) * 0.1
    w2 = rng.standard_normal((e, h, i)) * 0.1
    return pertoken_quant_int4(w13), pertoken_quant_int4(w2)


@pytest.mark.parametrize("given", ["int8", "uint32", "int32"])
def test_prepare_moe_is_aiters_a8w4_layout(given):
    rng = np.random.default_rng(3)
    (q13, s13), (q2, s2) = layer(rng)
    if given == "int8":
        w13, w2 = q13, q2
    else:  # the unshuffled words: AITER's nibble order, row-major
        w13 = rearrange_4bit_elements(convert_int8_to_uint32_int4(q13)).view(given)
        w2 = rearrange_4bit_elements(convert_int8_to_uint32_int4(q2)).view(given)
    p = moeplug.prepare_moe(w13, w2, weight_format="int4_per_channel", w13_scale=s13, w2_scale=s2)
    assert p.layout.weight_format == moeplug.WEIGHT_FORMATS["int4_per_channel"]
    assert p.layout.weight_layout == moeplug.WEIGHT_LAYOUTS["aiter_16x16"]
    assert p.layout.scale_layout == 0
    assert (p.layout.hidden_padded, p.layout.intermediate_padded) == (128, 64)  # no padding
    assert np.asarray(p.w13).dtype == (np.uint32 if given == "int8" else np.dtype(given))
    assert np.asarray(p.w13).tobytes() == aiter_a8w4(q13).tobytes()
    assert np.asarray(p.w2).tobytes() == aiter_a8w4(q2).tobytes()
    # shuffle_scale returns fp32 scales unchanged.
    assert np.asarray(p.w13_scale).tobytes() == s13.tobytes()
    assert np.asarray(p.w2_scale).tobytes() == s2.tobytes()


def fp8_per_token(x):
    """Per-row fp8 e4m3fn quantize-dequantize (scale amax / 448 in f32)."""
    x = np.asarray(x, np.float32)
    s = (np.abs(x).max(-1, keepdims=True) / np.float32(448.0)).astype(np.float32)
    s[s == 0] = 1
    return (x / s).astype(FP8).astype(np.float64) * s


def reference(x, q13, s13, q2, s2, ids, wts):
    """float64 a8w4 MoE (AITER's torch_moe_stage1/2 for per_Token): fp8 per-token inputs of
    both stages, int4 times the row scale, silu(g) * u rounded to bf16."""
    w13 = q13.astype(np.float64) * s13
    w2 = q2.astype(np.float64) * s2
    i = w2.shape[2]
    xq = fp8_per_token(x)
    out = np.zeros((x.shape[0], w2.shape[1]))
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = ids[t, s]
            h = w13[e] @ xq[t]
            g, u = h[:i], h[i:]
            a = np.asarray((g / (1 + np.exp(-g)) * u).astype(BF16), np.float64)
            out[t] += wts[t, s] * (w2[e] @ fp8_per_token(a[None])[0])
    return out


def test_fused_moe_against_float64():
    rng = np.random.default_rng(4)
    (q13, s13), (q2, s2) = layer(rng)
    p = moeplug.prepare_moe(q13, q2, weight_format="int4_per_channel", w13_scale=s13, w2_scale=s2)
    x = rng.standard_normal((9, 128)).astype(BF16)
    ids = np.stack([rng.permutation(4)[:2] for _ in range(9)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (9, 2)).astype(np.float32)
    out = moeplug.fused_moe(x, p, wts, ids)  # default act dtype: fp8_per_token
    want = reference(x, q13, s13, q2, s2, ids, wts)
    err = np.linalg.norm(np.asarray(out, np.float64) - want) / np.linalg.norm(want)
    assert err <= 1e-2


def test_aiter_args_of_the_record():
    rng = np.random.default_rng(6)
    (q13, s13), (q2, s2) = layer(rng, e=1)
    p = moeplug.prepare_moe(q13, q2, weight_format="int4_per_channel", w13_scale=s13, w2_scale=s2)
    a = moeplug.aiter_args(p.layout, activation="gelu")
    assert (a["quant_type"], a["quant_dtype_a"], a["activation"], a["is_shuffled"]) == (
        "per_Token",
        "fp8",
        "Gelu",
        True,
    )


def test_bad_int4_checkpoints():
    rng = np.random.default_rng(5)
    (q13, s13), (q2, s2) = layer(rng, e=1)
    q2 = q2.copy()
    q2.reshape(-1)[3] = -9
    with pytest.raises(moeplug.MoeplugError) as bad:
        moeplug.prepare_moe(q13, q2, weight_format="int4_per_channel", w13_scale=s13, w2_scale=s2)
    assert bad.value.name == "MOEPLUG_INVALID_ARGUMENT"
    assert bad.value.message == (
        "moeplug_prepare_moe: w2: int8-held int4 values must lie in [-8, 7], got -9 at flat index 3"
    )
