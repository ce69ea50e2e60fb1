"""AITER targets through the Python package (ABI 1.1): the MXFP8 pairing against a NumPy
re-implementation of AITER's shuffles (written from aiter/ops/shuffle.py @e4048607: the same
view/permute steps, not from moeplug's index maps), the AITER `fused_moe` keywords of a
record, and the configuration resolver."""

import ml_dtypes
import numpy as np
import pytest

import moeplug

# --- aiter/ops/shuffle.py, re-done in NumPy ------------------------------------------------


def aiter_shuffle_weight_gui(x, gate_up, nlane=16, kpack=16):
    """`shuffle_weight(x, layout=(nlane, kpack), is_guinterleave=True, gate_up=gate_up)` on a
    byte array `[E, N, K]`: view [E, (2,) N0, NLane, K0, KLane, KPack], permute so that N0
    is outermost, then (gate/up), K0, KLane, NLane, KPack."""
    e, n, k = x.shape
    if gate_up:
        n //= 2
    klane = 64 // nlane
    n0, k0 = n // nlane, k // (klane * kpack)
    if gate_up:
        y = x.reshape(e, 2, n0, nlane, k0, klane, kpack).transpose(0, 2, 1, 4, 5, 3, 6)
    else:
        y = x.reshape(e, n0, nlane, k0, klane, kpack).transpose(0, 1, 3, 4, 2, 5)
    return np.ascontiguousarray(y).reshape(x.shape)


def aiter_shuffle_scale_gui(s, experts, gate_up):
    """`shuffle_scale(s, experts, is_guinterleave=True, gate_up)` on `[E·N, k]` bytes: k
    padded to 8 with 0x7F, view [E, (NPack, N1 | N1, NPack), NLane, K1, KPack, KLane],
    permute to [E, N1, K1, KLane, NLane, KPack, NPack]."""
    rows, k = s.shape
    if k % 8:
        padded = np.full((rows, (k + 7) // 8 * 8), 0x7F, np.uint8)
        padded[:, :k] = s
        s, k = padded, padded.shape[1]
    n = rows // experts
    k1, n1 = k // 2 // 4, n // 16 // 2
    if gate_up:
        y = s.reshape(experts, 2, n1, 16, k1, 2, 4).transpose(0, 2, 4, 6, 3, 5, 1)
    else:
        y = s.reshape(experts, n1, 2, 16, k1, 2, 4).transpose(0, 1, 4, 6, 3, 5, 2)
    return np.ascontiguousarray(y).reshape(s.shape)


def aiter_e8m0_shuffle(s):
    """`shuffle_scale(s)` / `e8m0_shuffle(s)`: pad to [⌈m/256⌉·256, ⌈n/8⌉·8] (undefined
    upstream; moeplug's 0x00 here), view [sm/32, 2, 16, sn/8, 2, 4], permute (0,3,5,2,4,1)."""
    m, n = s.shape
    sm, sn = (m + 255) // 256 * 256, (n + 7) // 8 * 8
    padded = np.zeros((sm, sn), np.uint8)
    padded[:m, :n] = s
    y = padded.reshape(sm // 32, 2, 16, sn // 8, 2, 4).transpose(0, 3, 5, 2, 4, 1)
    return np.ascontiguousarray(y).reshape(sm, sn)


# --- the MXFP8 pairing (no upstream golden vector) -------------------------------------------


def fp8(rng, shape):
    return rng.integers(0, 256, shape, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)


def e8m0(rng, shape):
    return rng.integers(100, 140, shape, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)


def zero_pad(x, shape):
    """`x` in the leading corner of zeros of `shape` (the padding a caller allocates)."""
    out = np.zeros(shape, x.dtype)
    out[tuple(slice(0, d) for d in x.shape)] = x
    return out


def pad_halves(x, e, inter, inter_pad, cols):
    """Gate/up rows `[E, 2·inter, k]` with each half zero-padded to `inter_pad` rows."""
    h = x.reshape(e, 2, inter, -1)
    return zero_pad(h, (e, 2, inter_pad, cols)).reshape(e, 2 * inter_pad, cols)


@pytest.mark.parametrize("E,H,inter", [(2, 256, 128), (3, 128, 64), (1, 512, 96)])
def test_mxfp8_target_matches_aiter_shuffles(E, H, inter):
    I = inter  # noqa: E741 (the issue's name for the intermediate size)
    rng = np.random.default_rng(E * 1000 + H + I)
    w13, w2 = fp8(rng, (E, 2 * I, H)), fp8(rng, (E, H, I))
    s13, s2 = e8m0(rng, (E * 2 * I, H // 32)), e8m0(rng, (E * H, I // 32))
    # Sizes rise to multiples of 64 values (shuffle_weight_a16w4's 64-byte K): I = 96 -> 128.
    p = moeplug.prepare_moe(w13, w2, weight_format="mxfp8", w13_scale=s13, w2_scale=s2, target="aiter_mxfp8", hidden_align=64, intermediate_align=32)
    Ip = (I + 63) // 64 * 64
    assert (p.layout.hidden_padded, p.layout.intermediate_padded) == (H, Ip)
    b = lambda a: np.asarray(a).view(np.uint8)  # noqa: E731
    # The caller's zero-padded checkpoint, then op_tests/test_moe_2stage.py's mxfp8 recipe:
    # w1 and its scale gate_up, w2 without, w2's scale e8m0_shuffle.
    w13p = pad_halves(b(w13), E, I, Ip, H)
    s13p = pad_halves(b(s13), E, I, Ip, H // 32).reshape(E * 2 * Ip, H // 32)
    w2p = zero_pad(b(w2), (E, H, Ip))
    s2p = zero_pad(b(s2).reshape(E, H, I // 32), (E, H, Ip // 32)).reshape(E * H, Ip // 32)
    np.testing.assert_array_equal(b(p.w13), aiter_shuffle_weight_gui(w13p, True))
    np.testing.assert_array_equal(b(p.w13_scale), aiter_shuffle_scale_gui(s13p, E, True))
    np.testing.assert_array_equal(b(p.w2), aiter_shuffle_weight_gui(w2p, False))
    np.testing.assert_array_equal(b(p.w2_scale), aiter_e8m0_shuffle(s2p))
    assert (p.layout.gate_mode, p.layout.act_dtype) == (moeplug.GATE_MODES["interleave"], moeplug.ACT_DTYPES["mxfp8"])
    assert p.layout.flags & moeplug._abi.LAYOUT_FLAGS["aiter_target"]


def test_numpy_reimplementation_reproduces_the_golden_interleave_pack():
    """The NumPy functions above are AITER's: they give the golden INTERLEAVE pack."""
    from golden import cases, tensor

    c = cases()["moe_weight_packs_mxfp4"]
    w1 = np.asarray(tensor(c, "w1_fp4")).view(np.uint8)
    s1 = np.asarray(tensor(c, "w1_scale_e8m0")).view(np.uint8)
    s2 = np.asarray(tensor(c, "w2_scale_e8m0")).view(np.uint8)
    out = lambda n: np.asarray(tensor(c, n)).view(np.uint8)  # noqa: E731
    np.testing.assert_array_equal(aiter_shuffle_weight_gui(w1.reshape(4, 256, 128), True).reshape(out("INTERLEAVE_w1").shape), out("INTERLEAVE_w1"))
    np.testing.assert_array_equal(aiter_shuffle_scale_gui(s1, 4, True), out("INTERLEAVE_w1_scale"))
    np.testing.assert_array_equal(aiter_shuffle_scale_gui(s2, 4, False), out("A16W4_w2_scale"))


# --- moeplug.aiter_args: the four engine cases of issue 11 ------------------------------------


def mxfp4_ck(rng, E, H, inter, mode="separated"):
    I = inter  # noqa: E741
    w13 = rng.integers(0, 256, (E, 2 * I, H // 2), dtype=np.uint8)
    w2 = rng.integers(0, 256, (E, H, I // 2), dtype=np.uint8)
    s13, s2 = e8m0(rng, (E, 2 * I, H // 32)), e8m0(rng, (E, H, I // 32))
    b13, b2 = rng.standard_normal((E, 2 * I), np.float32), rng.standard_normal((E, H), np.float32)
    return dict(w13=w13, w2=w2, w13_scale=s13, w2_scale=s2, w13_bias=b13, w2_bias=b2, gate_mode_in=mode)


def test_aiter_args_gpt_oss_w4a16_interleave():
    # gpt-oss: H = 2880, I = 2880 (row-interleaved checkpoint), padded to 256 by the default.
    rng = np.random.default_rng(1)
    ck = mxfp4_ck(rng, 1, 2880, 2880, mode="interleave_rows")
    p = moeplug.prepare_moe(ck.pop("w13"), ck.pop("w2"), weight_format="mxfp4", target="aiter_a16w4_interleave", **ck)
    assert moeplug.aiter_args(p, activation="swiglu_oai") == {
        "gate_mode": "interleave",
        "hidden_pad": 3072 - 2880,
        "intermediate_pad": 3072 - 2880,
        "quant_type": "per_1x32",
        "quant_type_a": "No",
        "quant_dtype_a": "bf16",
        "quant_dtype_a2": "bf16",
        "activation": "Swiglu",
        "is_shuffled": True,
        "scale_swizzled": False,
    }


def test_aiter_args_dsv4_fp4_carries_the_intermediate_pad():
    # DSV4-style FP4 experts with I not a multiple of 256: I = 1408 -> 1536 per half, not
    # doubled and not rounded to a kernel tile (AITER does that itself).
    rng = np.random.default_rng(2)
    ck = mxfp4_ck(rng, 2, 512, 1408)
    p = moeplug.prepare_moe(ck.pop("w13"), ck.pop("w2"), weight_format="mxfp4", target="aiter_a8w4", intermediate_align=256, **ck)
    d = moeplug.aiter_args(p, activation="silu")
    assert (d["hidden_pad"], d["intermediate_pad"]) == (0, 1536 - 1408)
    assert (d["gate_mode"], d["quant_dtype_a"], d["quant_type_a"], d["activation"]) == ("interleave", "fp8", "per_1x32", "Silu")


def test_aiter_args_cdna4_swizzled_scales():
    rng = np.random.default_rng(3)
    ck = mxfp4_ck(rng, 2, 256, 256, mode="interleave_rows")
    p = moeplug.prepare_moe(ck.pop("w13"), ck.pop("w2"), weight_format="mxfp4", target="aiter_triton_a16w4", **ck)
    d = moeplug.aiter_args(p, activation="swiglu_oai")
    assert (d["scale_swizzled"], d["is_shuffled"], d["gate_mode"], d["quant_dtype_a"]) == (True, False, "", "bf16")


def test_aiter_args_dsv41_a4w4():
    rng = np.random.default_rng(4)
    ck = mxfp4_ck(rng, 2, 512, 256, mode="separated")
    del ck["w13_bias"], ck["w2_bias"]
    p = moeplug.prepare_moe(ck.pop("w13"), ck.pop("w2"), weight_format="mxfp4", target="aiter_a4w4", **ck)
    d = moeplug.aiter_args(p, activation="silu")
    assert (d["gate_mode"], d["quant_type"], d["quant_type_a"], d["quant_dtype_a"], d["quant_dtype_a2"]) == ("separated", "per_1x32", "per_1x32", "fp4x2", "fp4x2")
    assert (d["hidden_pad"], d["intermediate_pad"], d["is_shuffled"]) == (0, 0, True)


def test_aiter_args_of_a_record_with_a_forged_fingerprint_is_refused():
    rng = np.random.default_rng(5)
    ck = mxfp4_ck(rng, 1, 256, 256)
    p = moeplug.prepare_moe(ck.pop("w13"), ck.pop("w2"), weight_format="mxfp4", target="aiter_a8w4", **ck)
    p.layout.gate_mode = moeplug.GATE_MODES["separated"]
    with pytest.raises(moeplug.MoeplugError) as e:
        moeplug.aiter_args(p)
    assert e.value.name == "MOEPLUG_LAYOUT_MISMATCH"
    assert e.value.message.startswith("moeplug_aiter_args: layout.gate_mode: ")


# --- moeplug.resolve_config ------------------------------------------------------------------


def bf16_prepared(act_dtype="default"):
    rng = np.random.default_rng(6)
    w13 = rng.standard_normal((2, 64, 32), np.float32).astype(ml_dtypes.bfloat16)
    w2 = rng.standard_normal((2, 32, 32), np.float32).astype(ml_dtypes.bfloat16)
    return moeplug.prepare_moe(w13, w2, weight_format="bf16", act_dtype=act_dtype)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_resolve_config_answers_without_m(device):
    p = bf16_prepared()
    r = moeplug.resolve_config(p, device=device, activation="swiglu_oai")
    assert r == {
        "backend": device,
        "act_dtype": "bf16",
        "act_dtype_stage2": "bf16",
        "activation": "swiglu_oai",
        "alpha": pytest.approx(1.702),
        "limit": 7.0,
        "weight_format": "bf16",
        "gate_mode": "separated",
        "weight_layout": "aiter_16x16",
        "scale_layout": None,
    }
    assert moeplug.resolve_config(p, device=device)["limit"] == 0.0  # silu: no clamp


def test_resolve_config_refuses_what_the_launch_check_refuses():
    p = bf16_prepared(act_dtype="bf16")
    for device in ["cpu", "cuda"]:
        with pytest.raises(moeplug.MoeplugError) as e:
            moeplug.resolve_config(p, device=device, act_dtype="fp16")
        assert e.value.name == "MOEPLUG_LAYOUT_MISMATCH"
        with pytest.raises(moeplug.MoeplugError) as e2:
            moeplug.check_fused_moe(p, device="cpu", act_dtype="fp16")
        # The same check: the same message after each export's name.
        assert e.value.message.split(": ", 1)[1] == e2.value.message.split(": ", 1)[1]
