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
    args = (x, p.w13, p.w2, wts, ids, mt.layout_values(p))
    torch.library.opcheck(torch.ops.moeplug.fused_moe.default, args, {"activation": "silu"})
    src = torch.arange(E * 32 * 64, dtype=torch.int32).to(torch.uint8).reshape(E, 32, 64)
    torch.library.opcheck(torch.ops.moeplug.shuffle_weight.default, (src,), {"pad_k_to": 128})


def test_runs_under_torch_compile(layer):
    p, x, wts, ids = layer
    values = mt.layout_values(p)

    def layer_fn(x):
        y = torch.ops.moeplug.fused_moe(x * 1, p.w13, p.w2, wts, ids, values, activation="silu")
        return y.float().sum(-1)

    eager = layer_fn(x)
    compiled = torch.compile(layer_fn, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), eager)
