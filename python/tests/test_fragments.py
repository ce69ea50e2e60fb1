"""Layout fragments (ABI 1.1, docs/abi.md §8): weights prepared with the primitives, the record
assembled from the fragments they report, a CPU launch on it against float64, and a hand edit
of the record refused at launch naming the field."""

import copy

import ml_dtypes
import numpy as np
import pytest

import moeplug

E, H, INTER, HP, IP = 4, 96, 48, 128, 64


def layer(rng):
    w13 = (rng.standard_normal((E, 2 * INTER, H)) * 0.1).astype(ml_dtypes.bfloat16)
    w2 = (rng.standard_normal((E, H, INTER)) * 0.1).astype(ml_dtypes.bfloat16)
    return w13, w2


def reference(x, w13, w2, ids, wts):
    """float64 SILU MoE over the unpadded checkpoint (SEPARATED rows)."""
    x, w13, w2 = (np.asarray(a, np.float64) for a in (x, w13, w2))
    out = np.zeros((x.shape[0], H))
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = ids[t, s]
            h = w13[e] @ x[t]
            g, u = h[:INTER], h[INTER:]
            out[t] += wts[t, s] * (w2[e] @ (g / (1 + np.exp(-g)) * u))
    return out


def by_primitives(w13, w2):
    """pad + shuffle each weight, collecting the fragments; the assembled record."""
    frags = []
    w13p = moeplug.pad_weights(w13, rows=2 * IP, cols=HP, gate_up=True, fragments=frags)
    w13s = moeplug.shuffle_weight(w13p, fragments=frags)
    w2p = moeplug.pad_weights(w2, rows=HP, cols=IP, fragments=frags)
    w2s = moeplug.shuffle_weight(w2p, fragments=frags)
    return frags, moeplug.Prepared(layout=moeplug.layout_from_fragments(frags), w13=w13s, w2=w2s)


def test_each_primitive_reports_its_fragment():
    w13, w2 = layer(np.random.default_rng(1))
    frags, _ = by_primitives(w13, w2)
    assert len(frags) == 4
    pad13, shuf13, pad2, _ = frags
    got = [(f.weight_format, f.gate_mode, f.weight_layout, f.num_experts, f.hidden_size, f.intermediate_size, f.hidden_padded, f.intermediate_padded, f.has_bias) for f in frags]
    bf16, sep, aiter = moeplug.WEIGHT_FORMATS["bf16"], moeplug.GATE_MODES["separated"], moeplug.WEIGHT_LAYOUTS["aiter_16x16"]
    assert got == [
        (bf16, sep, 0, E, H, INTER, HP, IP, 0),
        (bf16, 0, aiter, 0, 0, 0, 0, 0, 0),
        (bf16, 0, 0, E, H, INTER, HP, IP, 0),
        (bf16, 0, aiter, 0, 0, 0, 0, 0, 0),
    ]
    # quantize_mx reports the MX format and the scale layout.
    frags = []
    moeplug.quantize_mx(np.ones((4, 64), np.float32), fmt="mxfp8", shuffle_scale=True, fragments=frags)
    assert (frags[0].weight_format, frags[0].scale_layout) == (moeplug.WEIGHT_FORMATS["mxfp8"], moeplug.SCALE_LAYOUTS["aiter_e8m0"])


def test_an_assembled_record_matches_prepare_moe_and_launches():
    rng = np.random.default_rng(2)
    w13, w2 = layer(rng)
    _, p = by_primitives(w13, w2)
    want = moeplug.prepare_moe(w13, w2, weight_format="bf16", hidden_align=HP, intermediate_align=IP)
    assert np.array_equal(np.asarray(p.w13).view(np.uint16), np.asarray(want.w13).view(np.uint16))
    assert np.array_equal(np.asarray(p.w2).view(np.uint16), np.asarray(want.w2).view(np.uint16))
    fields = [n for n, _ in type(p.layout)._fields_ if n != "prep_fingerprint"]
    assert [getattr(p.layout, n) for n in fields] == [getattr(want.layout, n) for n in fields]
    assert p.layout.prep_fingerprint != 0
    x = (rng.standard_normal((6, H))).astype(ml_dtypes.bfloat16)
    ids = np.stack([rng.choice(E, size=2, replace=False) for _ in range(6)]).astype(np.int32)
    wts = (rng.random((6, 2)) + 0.1).astype(np.float32)
    out = moeplug.fused_moe(x, p, wts, ids)
    ref = reference(x, w13, w2, ids, wts)
    err = np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref)
    assert err < 1e-2, err
    assert np.array_equal(np.asarray(out).view(np.uint16), np.asarray(moeplug.fused_moe(x, want, wts, ids)).view(np.uint16))


def test_a_hand_edit_of_an_assembled_record_is_refused_naming_the_field():
    rng = np.random.default_rng(3)
    w13, w2 = layer(rng)
    _, p = by_primitives(w13, w2)
    x = rng.standard_normal((2, H)).astype(ml_dtypes.bfloat16)
    ids, wts = np.array([[0, 1], [2, 3]], np.int32), np.full((2, 2), 0.5, np.float32)
    wrong = copy.copy(p)
    wrong.layout = type(p.layout).from_buffer_copy(p.layout)
    wrong.layout.weight_layout = moeplug.WEIGHT_LAYOUTS["plain"]
    out = np.full((2, H), 7, ml_dtypes.bfloat16)
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.fused_moe(x, wrong, wts, ids, out=out)
    assert info.value.name == "MOEPLUG_LAYOUT_MISMATCH"
    assert info.value.message == (
        "moeplug_fused_moe: layout.weight_layout: the record says plain, but preparation produced aiter_16x16 (layout.prep_fingerprint)"
    )
    assert (np.asarray(out, np.float32) == 7).all()


def test_declared_fragments_and_refusals():
    w13, w2 = layer(np.random.default_rng(4))
    frags, _ = by_primitives(w13, w2)
    declared = moeplug.declare_fragment(has_bias=True, act_dtype="bf16")
    layout = moeplug.layout_from_fragments(frags + [declared])
    assert (layout.flags, layout.act_dtype) == (1, moeplug.ACT_DTYPES["bf16"])
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.layout_from_fragments(frags + [moeplug.declare_fragment(hidden_padded=2 * HP)])
    assert info.value.name == "MOEPLUG_INVALID_ARGUMENT"
    assert info.value.message == (
        "moeplug_layout_from_fragments: fragments[4].hidden_padded: 256, but fragments[0] established 128 (the calls prepared different layouts)"
    )
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.layout_from_fragments(frags[:1])
    assert info.value.message.startswith("moeplug_layout_from_fragments: fragments: none establishes weight_layout, which a record needs")
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.layout_from_fragments([])
    assert info.value.message == "moeplug_layout_from_fragments: num_fragments: expected 1 to 256, got 0"
    with pytest.raises(TypeError, match=r"fragments\[0\]: expected a LayoutFragment"):
        moeplug.layout_from_fragments([object()])
