"""The 1.1 launch options through the Python package (CPU backend): a stage-2 act dtype and
static per-tensor fp8 act scales reach the C fields, change the result the way the launch
rules say, and bad values name the argument."""

import ml_dtypes
import numpy as np
import pytest

import moeplug

E, H, INTER, M, K = 4, 64, 32, 7, 2


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def fp8_layer(seed=3):
    rng = np.random.default_rng(seed)
    w13 = (rng.standard_normal((E, 2 * INTER, H)) * 0.5).astype(ml_dtypes.float8_e4m3fn)
    w2 = (rng.standard_normal((E, H, INTER)) * 0.5).astype(ml_dtypes.float8_e4m3fn)
    scale = np.full(E, 0.05, np.float32)
    p = moeplug.prepare_moe(w13, w2, weight_format="fp8_per_tensor", w13_scale=scale, w2_scale=scale)
    x = rng.standard_normal((M, H)).astype(ml_dtypes.bfloat16)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(M)]).astype(np.int32)
    w = rng.random((M, K), np.float32)
    return p, x, w, ids


def run(p, x, w, ids, **kw):
    out = np.full(x.shape, np.nan, ml_dtypes.bfloat16)
    moeplug.fused_moe(x, p, w, ids, out=out, **kw)
    assert not np.isnan(out.astype(np.float32)).any()
    return out


def test_stage2_act_dtype_is_used_and_defaults_to_stage_1():
    p, x, w, ids = fp8_layer()
    fp8 = run(p, x, w, ids, act_dtype="fp8_per_token")
    assert np.array_equal(run(p, x, w, ids, act_dtype="fp8_per_token", stage2_act_dtype="fp8_per_token"), fp8)
    mixed = run(p, x, w, ids, act_dtype="fp8_per_token", stage2_act_dtype="fp8_per_tensor")
    assert not np.array_equal(mixed, fp8)
    assert rel_l2(mixed, fp8) < 0.1  # two fp8 quantizations of the same intermediate
    r = moeplug.resolve_config(p, act_dtype="fp8_per_token", stage2_act_dtype="fp8_per_tensor")
    assert (r["act_dtype"], r["act_dtype_stage2"]) == ("fp8_per_token", "fp8_per_tensor")
    moeplug.check_fused_moe(p, act_dtype="fp8_per_token", stage2_act_dtype="fp8_per_tensor")


def test_static_act_scales_replace_the_amax():
    p, x, w, ids = fp8_layer()
    dynamic = run(p, x, w, ids, act_dtype="fp8_per_tensor")
    one, huge = np.ones(1, np.float32), np.array([1e30], np.float32)
    # A scale no value reaches quantizes every code of that stage's input to zero: no bias,
    # so the output is zero. The amax would have given the dynamic result.
    for s1, s2 in [(huge, one), (one, huge)]:
        out = run(p, x, w, ids, act_dtype="fp8_per_tensor", stage1_act_scale=s1, stage2_act_scale=s2)
        assert not np.any(out.astype(np.float32)), (s1, s2)
    # The stage-1 amax scale as a static one: the same stage-1 codes, close to the dynamic run.
    s1 = np.array([np.abs(x.astype(np.float32)).max() / 448.0], np.float32)
    out = run(p, x, w, ids, act_dtype="fp8_per_tensor", stage1_act_scale=s1, stage2_act_scale=np.array([1e-3], np.float32))
    assert rel_l2(out, dynamic) < 0.1
    moeplug.check_fused_moe(p, act_dtype="fp8_per_tensor", static_act_scales=True)


def test_bad_launch_options_name_the_argument():
    p, x, w, ids = fp8_layer()
    with pytest.raises(moeplug.MoeplugError) as e:
        run(p, x, w, ids, act_dtype="fp8_per_token", stage2_act_dtype="mxfp4")
    assert "stage2_act_dtype" in e.value.message
    with pytest.raises((TypeError, ValueError)) as e2:
        run(p, x, w, ids, stage2_act_dtype="fp9")
    assert "stage2_act_dtype" in str(e2.value)
    with pytest.raises(moeplug.MoeplugError) as e3:  # static scales are fp8 per-tensor only
        moeplug.check_fused_moe(p, act_dtype="fp8_per_token", static_act_scales=True)
    assert "stage1_act_scale" in e3.value.message
    with pytest.raises(moeplug.MoeplugError) as e4:  # one f32, not two
        run(p, x, w, ids, act_dtype="fp8_per_tensor", stage1_act_scale=np.ones(2, np.float32), stage2_act_scale=np.ones(1, np.float32))
    assert "stage1_act_scale" in e4.value.message
