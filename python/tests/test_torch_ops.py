"""moeplug.torch: the custom ops agree with the plain calls, pass torch.library.opcheck and
run under torch.compile (CPU here; tests/gpu/test_torch_ops_gpu.py adds CUDA and graphs).
Skipped where torch is not installed (CI: the torch wheel is too large for its budget)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("moeplug.torch needs torch >= 2.4", allow_module_level=True)

import moeplug  # noqa: E402
import moeplug.torch as mt  # noqa: E402

E, H, INTER, M, K = 4, 256, 256, 7, 2


@pytest.fixture(scope="module")
def layer():
    g = torch.Generator().manual_seed(5)
    w13 = (torch.randn(E, 2 * INTER, H, generator=g) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(E, H, INTER, generator=g) * 0.1).to(torch.bfloat16)
    p = moeplug.prepare_moe(w13, w2, weight_format="bf16")
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, E, (M, K), generator=g, dtype=torch.int32)
    wts = torch.full((M, K), 0.5)
    return p, x, wts, ids


@pytest.fixture(scope="module")
def quantized_layer():
    """The call shape of tests/gpu/test_torch_ops_gpu.py: MXFP4 with scales and biases passed
    as keywords, SWIGLU_OAI."""
    g = torch.Generator().manual_seed(11)
    w13 = (torch.randn(E, 2 * INTER, H, generator=g) * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(E, H, INTER, generator=g) * 0.05).to(torch.bfloat16)
    b13 = torch.randn(E, 2 * INTER, generator=g) * 0.1
    b2 = torch.randn(E, H, generator=g) * 0.1
    q13, s13 = moeplug.quantize_mx(w13.reshape(-1, H))
    q2, s2 = moeplug.quantize_mx(w2.reshape(-1, INTER))
    p = moeplug.prepare_moe(
        q13.reshape(E, 2 * INTER, H // 2), q2.reshape(E, H, INTER // 2), weight_format="mxfp4", gate_mode_in="interleave_rows",
        w13_scale=s13.reshape(E, 2 * INTER, -1), w2_scale=s2.reshape(E, H, -1), w13_bias=b13, w2_bias=b2,
    )
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)]).to(torch.int32)
    wts = torch.softmax(torch.randn(M, K, generator=g), dim=1)
    return p, x, wts, ids


def _prepared_kwargs(p):
    return dict(w13_scale=p.w13_scale, w2_scale=p.w2_scale, w13_bias=p.w13_bias, w2_bias=p.w2_bias)


def test_mutated_arguments_are_positional_without_default():
    # The dispatcher drops trailing positional arguments equal to their default, and torch
    # >= 2.6 bumps a mutated argument's version by position (args[idx]): a mutated argument
    # with a default, or keyword-only, is missing there when left out (IndexError).
    for op in (torch.ops.moeplug.fused_moe.default, torch.ops.moeplug.shuffle_weight.default):
        for arg in op._schema.arguments:
            if arg.alias_info is not None and arg.alias_info.is_write:
                assert not arg.kwarg_only and not arg.has_default_value(), f"{op}: {arg.name}"
    names = [a.name for a in torch.ops.moeplug.fused_moe.default._schema.arguments]
    assert names.index("workspace") == 6


def test_quantized_op_equals_the_plain_call(quantized_layer):
    p, x, wts, ids = quantized_layer
    kw = dict(activation="swiglu_oai")
    want = moeplug.fused_moe(x, p, wts, ids, **kw)
    assert torch.equal(mt.fused_moe_prepared(x, p, wts, ids, **kw), want)
    need = moeplug.fused_moe_workspace_size(x, p, wts, ids, **kw)
    ws = torch.empty(need, dtype=torch.uint8)
    assert torch.equal(mt.fused_moe_prepared(x, p, wts, ids, ws, **kw), want)
    values = mt.layout_values(p)
    for workspace in (None, ws):
        args = (x, p.w13, p.w2, wts, ids, values, workspace)
        torch.library.opcheck(torch.ops.moeplug.fused_moe.default, args, dict(_prepared_kwargs(p), **kw))
        assert torch.equal(torch.ops.moeplug.fused_moe(*args, **_prepared_kwargs(p), **kw), want)


def test_layout_values_round_trip(layer):
    p = layer[0]
    values = mt.layout_values(p)
    assert len(values) == len(mt.LAYOUT_FIELDS) and "hidden_padded" in mt.LAYOUT_FIELDS
    back = mt.layout_from_values(values)
    assert bytes(back) == bytes(p.layout)
    with pytest.raises(ValueError, match="layout: expected"):
        mt.layout_from_values(values[:-1])


def test_op_matches_the_plain_call(layer):
    p, x, wts, ids = layer
    want = moeplug.fused_moe(x, p, wts, ids, activation="silu")
    got = mt.fused_moe_prepared(x, p, wts, ids, activation="silu")
    assert torch.equal(got, want)
    src = torch.arange(E * 32 * 64, dtype=torch.int32).to(torch.uint8).reshape(E, 32, 64)
    for pad in (0, 128):
        got = torch.ops.moeplug.shuffle_weight(src, pad_k_to=pad)
        want = moeplug.shuffle_weight(src.numpy(), pad_k_to=pad)
        assert np.array_equal(got.numpy(), want)


def test_opcheck(layer):
    p, x, wts, ids = layer
    for workspace in (None, torch.empty(1 << 16, dtype=torch.uint8)):
        args = (x, p.w13, p.w2, wts, ids, mt.layout_values(p), workspace)
        torch.library.opcheck(torch.ops.moeplug.fused_moe.default, args, {"activation": "silu"})
    src = torch.arange(E * 32 * 64, dtype=torch.int32).to(torch.uint8).reshape(E, 32, 64)
    torch.library.opcheck(torch.ops.moeplug.shuffle_weight.default, (src,), {"pad_k_to": 128})


def test_runs_under_torch_compile(layer):
    p, x, wts, ids = layer
    values = mt.layout_values(p)

    def layer_fn(x):
        y = torch.ops.moeplug.fused_moe(x * 1, p.w13, p.w2, wts, ids, values, None, activation="silu")
        return y.float().sum(-1)

    eager = layer_fn(x)
    compiled = torch.compile(layer_fn, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), eager)


def test_quantized_runs_under_torch_compile(quantized_layer):
    p, x, wts, ids = quantized_layer
    values = mt.layout_values(p)
    ws = torch.empty(moeplug.fused_moe_workspace_size(x, p, wts, ids, activation="swiglu_oai"), dtype=torch.uint8)

    def step(x):
        return torch.ops.moeplug.fused_moe(x, p.w13, p.w2, wts, ids, values, ws, activation="swiglu_oai", **_prepared_kwargs(p))

    eager = step(x)
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), eager)
