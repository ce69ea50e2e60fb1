"""The prep calls through the Python package reproduce AITER's golden vectors byte for byte."""

import ml_dtypes
import numpy as np
import pytest
from golden import assert_bytes_equal, cases, has, tensor

import moeplug

CASES = cases()


def named(prefix):
    return sorted(n for n in CASES if n.startswith(prefix))


@pytest.mark.parametrize("name", named("sw_") + named("swgu_") + named("a16w4_wrapper_"))
def test_shuffle_weight(name):
    if name.startswith("sw_NK"):
        pytest.skip("shuffle_weight_NK is not part of the moeplug API")
    case = CASES[name]
    a = case["args"]
    layout = a.get("layout", [a.get("NLane", 16), 16])
    guinterleave = a.get("is_guinterleave", name.startswith("a16w4_wrapper_"))
    out = moeplug.shuffle_weight(
        tensor(case, "x"),
        layout_n=layout[0],
        layout_k=layout[1],
        use_int4=a.get("use_int4", False),
        is_guinterleave=guinterleave,
        gate_up=a.get("gate_up", False),
        pad_k_to=a.get("pad_k_to", 0),
    )
    assert_bytes_equal(out, tensor(case, "out"), what=name)


@pytest.mark.parametrize("name", named("ss_") + named("ssgu_"))
def test_shuffle_scale(name):
    if name.startswith("ss_n32k4"):
        pytest.skip("gfx1250 n32k4 layout is not part of the moeplug API")
    case = CASES[name]
    a = case["args"]
    gui = a.get("is_guinterleave", name.startswith("ss_a16w4_wrapper"))
    out = moeplug.shuffle_scale(
        tensor(case, "scale"),
        num_experts=a.get("experts_cnt") or 0,
        is_guinterleave=gui,
        gate_up=a.get("gate_up", False),
    )
    mask = tensor(case, "defined_mask") if has(case, "defined_mask") else None
    assert_bytes_equal(out, tensor(case, "out"), mask, what=name)


@pytest.mark.parametrize("name", named("cdna4_swz_"))
def test_swizzle_scale(name):
    case = CASES[name]
    out = moeplug.swizzle_scale(tensor(case, "scale_checkpoint_ENK"))
    assert_bytes_equal(out, tensor(case, "swizzled_memory_image"), what=name)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_quantize_mxfp4_modes(mode):
    case = CASES[f"per_1x32_f4_quant_mode{mode}"]
    q, s = moeplug.quantize_mx(tensor(case, "x"), fmt="mxfp4", round_mode=mode + 1)
    assert_bytes_equal(q, tensor(case, "q"), what="q")
    assert_bytes_equal(s, tensor(case, "scale"), what="scale")


def test_quantize_mxfp4_shuffled_scales():
    case = CASES["per_1x32_f4_quant_shuffled"]
    q, s = moeplug.quantize_mx(tensor(case, "x"), fmt="mxfp4", shuffle_scale=True)
    assert_bytes_equal(q, tensor(case, "q"), what="q")
    assert_bytes_equal(s, tensor(case, "scale_shuffled"), tensor(case, "scale_defined_mask"), what="scale")


def test_quantize_mxfp8():
    case = CASES["per_1x32_f8_quant_e8m0"]
    q, s = moeplug.quantize_mx(tensor(case, "x"), fmt="mxfp8")
    assert q.dtype == ml_dtypes.float8_e4m3fn
    assert_bytes_equal(q, tensor(case, "q"), what="q")
    assert_bytes_equal(s, tensor(case, "scale"), what="scale")


def test_prepare_moe_reproduces_the_separated_mxfp4_pack():
    case = CASES["moe_weight_packs_mxfp4"]
    w1, w2 = tensor(case, "w1_fp4"), tensor(case, "w2_fp4")
    e = w1.shape[0]
    s1 = tensor(case, "w1_scale_e8m0").reshape(e, w1.shape[1], -1)
    s2 = tensor(case, "w2_scale_e8m0").reshape(e, w2.shape[1], -1)
    p = moeplug.prepare_moe(w1, w2, weight_format="mxfp4", w13_scale=s1, w2_scale=s2, intermediate_align=128)
    assert p.layout.hidden_padded == p.layout.hidden_size == 256
    assert p.layout.intermediate_padded == p.layout.intermediate_size == 128
    assert p.layout.weight_layout == moeplug.WEIGHT_LAYOUTS["aiter_16x16"]
    assert p.layout.scale_layout == moeplug.SCALE_LAYOUTS["aiter_e8m0"]
    assert_bytes_equal(p.w13, tensor(case, "SEPARATED_w1"), what="w13")
    assert_bytes_equal(p.w2, tensor(case, "SEPARATED_w2"), what="w2")
    assert_bytes_equal(p.w13_scale, tensor(case, "SEPARATED_w1_scale"), what="w13_scale")
    assert_bytes_equal(p.w2_scale, tensor(case, "SEPARATED_w2_scale"), tensor(case, "SEPARATED_w2_scale_defined_mask"), what="w2_scale")


def test_shuffle_weight_rejects_bad_k_with_a_message():
    x = np.random.default_rng(1).integers(0, 255, size=(2, 32, 40), dtype=np.uint8)
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.shuffle_weight(x)
    assert info.value.name == "MOEPLUG_INVALID_ARGUMENT"
    assert "src" in info.value.message
