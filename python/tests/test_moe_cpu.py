"""fused_moe through the Python package on the CPU backend: AITER's golden references,
the launch check's statuses, and the options an engine uses."""

import copy

import ml_dtypes
import numpy as np
import pytest
from golden import cases, tensor

import moeplug

CASES = cases()
GOLDEN_MOE = {
    # case: (weight format, activation, act_dtype, router weight on input)
    "moe_ref_a16w16_silu": ("bf16", "silu", "default", False),
    "moe_ref_a16w16_gelu_doweight_stage1": ("bf16", "gelu", "default", True),
    "moe_ref_a16w4_swiglu_bias": ("mxfp4", "swiglu_oai", "bf16", False),
    "moe_ref_a4w4_silu": ("mxfp4", "silu", "mxfp4", False),
    "moe_ref_a8w4_swiglu_bias": ("mxfp4", "swiglu_oai", "mxfp8", False),
}


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def prepared_golden(name):
    case = CASES[name]
    fmt = GOLDEN_MOE[name][0]
    if fmt == "bf16":
        return moeplug.prepare_moe(tensor(case, "w1"), tensor(case, "w2"), weight_format="bf16")
    w1, w2 = tensor(case, "w1_fp4"), tensor(case, "w2_fp4")
    e = w1.shape[0]
    bias = {}
    if any(t["name"] == "bias1" for t in case["tensors"]):
        bias = {"w13_bias": tensor(case, "bias1"), "w2_bias": tensor(case, "bias2")}
    return moeplug.prepare_moe(
        w1,
        w2,
        weight_format="mxfp4",
        w13_scale=tensor(case, "w1_scale_e8m0").reshape(e, w1.shape[1], -1),
        w2_scale=tensor(case, "w2_scale_e8m0").reshape(e, w2.shape[1], -1),
        **bias,
    )


@pytest.mark.parametrize("name", sorted(GOLDEN_MOE))
def test_golden_moe_references(name):
    case = CASES[name]
    fmt, act, act_dtype, rwoi = GOLDEN_MOE[name]
    p = prepared_golden(name)
    if fmt == "mxfp4":  # default alignment pads I = 128 to 256: the pad must be skipped
        assert p.layout.intermediate_padded == 256 and p.layout.intermediate_size == 128
    hidden = tensor(case, "hidden")
    out = np.full(hidden.shape, np.nan, dtype=ml_dtypes.bfloat16)
    moeplug.fused_moe(
        hidden,
        p,
        tensor(case, "topk_weights"),
        tensor(case, "topk_ids"),
        activation=act,
        act_dtype=act_dtype,
        router_weight_on_input=rwoi,
        out=out,
    )
    err = rel_l2(out, tensor(case, "stage2"))
    assert err <= 1e-2, f"{name}: relative L2 {err:.3e}"


def random_layer(rng, e=8, h=128, i=64):
    w13 = (rng.standard_normal((e, 2 * i, h)) * 0.1).astype(ml_dtypes.bfloat16)
    w2 = (rng.standard_normal((e, h, i)) * 0.1).astype(ml_dtypes.bfloat16)
    return w13, w2


def routing(rng, m, e, k):
    ids = np.stack([rng.choice(e, size=k, replace=False) for _ in range(m)]).astype(np.int32)
    w = rng.random((m, k)).astype(np.float32) + 0.1
    return ids, (w / w.sum(1, keepdims=True)).astype(np.float32)


def reference(x, w13, w2, ids, wts, limit=None):
    """float64 SILU MoE over the unprepared checkpoint (SEPARATED rows)."""
    x, w13, w2 = (np.asarray(a, np.float64) for a in (x, w13, w2))
    i = w2.shape[2]
    out = np.zeros((x.shape[0], w2.shape[1]))
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = ids[t, s]
            h = w13[e] @ x[t]
            g, u = h[:i], h[i:]
            a = g / (1 + np.exp(-g)) * u
            a = np.asarray(a.astype(ml_dtypes.bfloat16), np.float64)  # stage-1 output is bf16
            out[t] += wts[t, s] * (w2[e] @ a)
    return out


def test_bf16_layer_against_float64():
    rng = np.random.default_rng(7)
    w13, w2 = random_layer(rng)
    p = moeplug.prepare_moe(w13, w2, weight_format="bf16")
    x = rng.standard_normal((9, 128)).astype(ml_dtypes.bfloat16)
    ids, wts = routing(rng, 9, 8, 3)
    out = moeplug.fused_moe(x, p, wts, ids)
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (9, 128)
    assert rel_l2(out, reference(x, w13, w2, ids, wts)) <= 1e-2


def test_num_local_tokens_zeroes_the_tail_and_masked_experts_drop_out():
    rng = np.random.default_rng(8)
    w13, w2 = random_layer(rng)
    p = moeplug.prepare_moe(w13, w2, weight_format="bf16")
    x = rng.standard_normal((6, 128)).astype(ml_dtypes.bfloat16)
    ids, wts = routing(rng, 6, 8, 2)
    out = moeplug.fused_moe(x, p, wts, ids, num_local_tokens=np.array([4], np.int32))
    assert not np.any(np.asarray(out[4:], np.float64))
    assert rel_l2(out[:4], reference(x[:4], w13, w2, ids[:4], wts[:4])) <= 1e-2

    # Expert parallelism: 8 local experts among 12 global ids plus the sentinel slot.
    mask = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 0], np.int32)
    global_of_local = np.nonzero(mask)[0]
    gids = global_of_local[ids].astype(np.int32)
    gids[0, 0] = 12  # the sentinel: contributes nothing
    gids[1, 1] = 4  # a masked-off expert: contributes nothing
    out = moeplug.fused_moe(x, p, wts, gids, expert_mask=mask)
    keep = np.ones_like(wts)
    keep[0, 0] = keep[1, 1] = 0
    assert rel_l2(out, reference(x, w13, w2, ids, wts * keep)) <= 1e-2


def test_layout_mismatch_is_reported_not_computed():
    rng = np.random.default_rng(9)
    w13, w2 = random_layer(rng)
    p = moeplug.prepare_moe(w13, w2, weight_format="bf16")
    x = rng.standard_normal((3, 128)).astype(ml_dtypes.bfloat16)
    ids, wts = routing(rng, 3, 8, 2)
    wrong = copy.copy(p)
    wrong.layout = type(p.layout).from_buffer_copy(p.layout)
    wrong.layout.hidden_padded = 256
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.fused_moe(x, wrong, wts, ids)
    assert info.value.name == "MOEPLUG_LAYOUT_MISMATCH"
    assert "w13: expected shape [8, 128, 256]" in info.value.message
    assert "got [8, 128, 128]" in info.value.message


def test_a_prepared_record_edited_by_hand_is_refused_naming_the_field():
    rng = np.random.default_rng(9)
    w13, w2 = random_layer(rng)
    p = moeplug.prepare_moe(w13, w2, weight_format="bf16")
    assert p.layout.prep_fingerprint != 0
    x = rng.standard_normal((3, 128)).astype(ml_dtypes.bfloat16)
    ids, wts = routing(rng, 3, 8, 2)
    wrong = copy.copy(p)
    wrong.layout = type(p.layout).from_buffer_copy(p.layout)
    wrong.layout.gate_mode = 2  # INTERLEAVE: the shapes cannot show it, the fingerprint does
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.fused_moe(x, wrong, wts, ids)
    assert info.value.name == "MOEPLUG_LAYOUT_MISMATCH"
    assert "layout.gate_mode: the record says interleave, but preparation produced separated" in info.value.message
    # Without a fingerprint (a record filled by hand) the same record runs as in 1.0.
    wrong.layout.prep_fingerprint = 0
    moeplug.fused_moe(x, wrong, wts, ids)


def test_check_fused_moe_says_why():
    rng = np.random.default_rng(10)
    w13, w2 = random_layer(rng)
    p = moeplug.prepare_moe(w13, w2, weight_format="bf16")
    moeplug.check_fused_moe(p, device="cpu", activation="gelu")
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.check_fused_moe(p, device="cpu", act_dtype="mxfp4")
    assert info.value.name == "MOEPLUG_UNSUPPORTED"
    assert "act_dtype mxfp4" in info.value.message and "bf16" in info.value.message
    with pytest.raises(ValueError):
        moeplug.check_fused_moe(p, activation="relu")
