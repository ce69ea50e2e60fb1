"""INT4_GROUP32 (AITER a16wi4, Kimi-K2) through the Python package on the CPU backend.

The independent reference is a NumPy re-implementation of AITER's own functions
(aiter/ops/shuffle.py and aiter/ops/quant.py @e4048607): per_1x32_i4_quant, shuffle_weight
(16, 16), pack_int8_to_packed_int4 and shuffle_scale_for_int4, composed as AITER's
op_tests/test_moe_2stage.py composes them for a16wi4, and a float64 MoE over the dequantized
weights."""

import ml_dtypes
import numpy as np
import pytest

import moeplug

BF16 = ml_dtypes.bfloat16


def per_1x32_i4_quant(w):
    """[..., N, K] float -> (int8 [..., N, K] in [-7, 7], bf16 [..., K/32, N])."""
    *b, n, k = w.shape
    g = w.reshape(*b, n, k // 32, 32)
    amax = np.maximum(np.abs(g).max(-1, keepdims=True), 1e-6)
    scale = (amax / 7.0).squeeze(-1)
    q = np.clip(np.round(g / scale[..., None]), -7, 7).astype(np.int8).reshape(*b, n, k)
    return q, np.swapaxes(scale, -1, -2).astype(BF16)


def shuffle_weight(x):
    """AITER shuffle_weight(x, (16, 16)) on a 1-byte dtype [E, N, K]."""
    e, n, k = x.shape
    return x.reshape(e, n // 16, 16, k // 32, 2, 16).transpose(0, 1, 3, 4, 2, 5).reshape(e, n, k)


def pack_int8_to_packed_int4(x):
    u = (x.reshape(-1).astype(np.int16) & 0xF).astype(np.uint8).reshape(-1, 8)
    out = u[:, :4] | (u[:, 4:] << 4)
    return out.reshape(-1).view(np.int8)


def shuffle_scale_for_int4(s):
    e, g, n = s.shape
    return s.reshape(e, g // 2, 2, n).transpose(0, 1, 3, 2).copy()


def aiter_a16wi4(q, s):
    """What op_tests/test_moe_2stage.py hands AITER's kernels for int8-held q and scales s."""
    e, n, k = q.shape
    w = pack_int8_to_packed_int4(shuffle_weight(q)).reshape(e, n, k // 2)
    return w, shuffle_scale_for_int4(s)


def layer(rng, e=4, h=128, i=64):
    w13 = rng.standard_normal((e, 2 * i, h)) * 0.1
    w2 = rng.standard_normal((e, h, i)) * 0.1
    return per_1x32_i4_quant(w13), per_1x32_i4_quant(w2)


def rows_major(s):
    """AITER's [E, K/32, N] scales as moeplug's checkpoint layout [E, N, K/32]."""
    return np.ascontiguousarray(np.swapaxes(s, -1, -2))


@pytest.mark.parametrize("packed", [False, True])
def test_prepare_moe_is_aiters_a16wi4_layout(packed):
    rng = np.random.default_rng(3)
    (q13, s13), (q2, s2) = layer(rng)
    if packed:  # the unshuffled pack: AITER's nibble order, row-major bytes
        e, n, k = q13.shape
        w13 = pack_int8_to_packed_int4(q13).view(np.uint8).reshape(e, n, k // 2)
        e, n, k = q2.shape
        w2 = pack_int8_to_packed_int4(q2).view(np.uint8).reshape(e, n, k // 2)
    else:
        w13, w2 = q13, q2
    p = moeplug.prepare_moe(w13, w2, weight_format="int4_group32",
                            w13_scale=rows_major(s13), w2_scale=rows_major(s2))
    assert p.layout.weight_format == moeplug.WEIGHT_FORMATS["int4_group32"]
    assert p.layout.scale_layout == moeplug.SCALE_LAYOUTS["aiter_int4"]
    assert (p.layout.hidden_padded, p.layout.intermediate_padded) == (128, 64)  # no padding
    want13, want_s13 = aiter_a16wi4(q13, s13)
    want2, want_s2 = aiter_a16wi4(q2, s2)
    assert np.asarray(p.w13).view(np.uint8).tobytes() == want13.view(np.uint8).tobytes()
    assert np.asarray(p.w2).view(np.uint8).tobytes() == want2.view(np.uint8).tobytes()
    assert np.asarray(p.w13_scale).tobytes() == want_s13.tobytes()
    assert np.asarray(p.w2_scale).tobytes() == want_s2.tobytes()


def reference(x, q13, s13, q2, s2, ids, wts):
    """float64 a16wi4 MoE (AITER's torch_moe_stage1/2 for i4x2): silu(g) * u, the stage-1
    output rounded to bf16."""
    def deq(q, s):
        return q.astype(np.float64) * np.repeat(np.swapaxes(s.astype(np.float64), -1, -2), 32, -1)

    w13, w2 = deq(q13, s13), deq(q2, s2)
    i = w2.shape[2]
    xf = np.asarray(x, np.float64)
    out = np.zeros((x.shape[0], w2.shape[1]))
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = ids[t, s]
            h = w13[e] @ xf[t]
            g, u = h[:i], h[i:]
            a = np.asarray((g / (1 + np.exp(-g)) * u).astype(BF16), np.float64)
            out[t] += wts[t, s] * (w2[e] @ a)
    return out


def test_fused_moe_against_float64():
    rng = np.random.default_rng(4)
    (q13, s13), (q2, s2) = layer(rng)
    p = moeplug.prepare_moe(q13, q2, weight_format="int4_group32",
                            w13_scale=rows_major(s13), w2_scale=rows_major(s2))
    x = rng.standard_normal((9, 128)).astype(BF16)
    ids = np.stack([rng.permutation(4)[:2] for _ in range(9)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (9, 2)).astype(np.float32)
    out = moeplug.fused_moe(x, p, wts, ids)
    want = reference(x, q13, s13, q2, s2, ids, wts)
    err = np.linalg.norm(np.asarray(out, np.float64) - want) / np.linalg.norm(want)
    assert err <= 1e-2


def test_bad_int4_checkpoints():
    rng = np.random.default_rng(5)
    (q13, s13), (q2, s2) = layer(rng, e=1)
    q2 = q2.copy()
    q2.reshape(-1)[3] = 12
    with pytest.raises(moeplug.MoeplugError) as bad:
        moeplug.prepare_moe(q13, q2, weight_format="int4_group32",
                            w13_scale=rows_major(s13), w2_scale=rows_major(s2))
    assert bad.value.name == "MOEPLUG_INVALID_ARGUMENT"
    assert bad.value.message == (
        "moeplug_prepare_moe: w2: int8-held int4 values must lie in [-8, 7], got 12 at flat index 3")
    with pytest.raises(moeplug.MoeplugError) as bad:
        moeplug.prepare_moe(q13, q2, weight_format="int4_group32",
                            w13_scale=rows_major(s13).astype(np.float32), w2_scale=rows_major(s2))
    assert bad.value.name == "MOEPLUG_INVALID_ARGUMENT"
    assert bad.value.message == (
        "moeplug_prepare_moe_sizes: w13_scale: expected dtype bfloat16, got float32")
