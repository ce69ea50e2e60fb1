"""The Python package end to end on the GPU with torch tensors: quantize, prepare and launch on
CUDA (torch's current stream), byte-identical prep and matching fused_moe against the same
calls on NumPy arrays (the CPU backend), and a CUDA-graph capture of the launch."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
import moeplug  # noqa: E402

E, H, I, M, K = 8, 512, 256, 37, 4


def host(t):
    """A torch tensor as the NumPy array the CPU path takes (bf16 via ml_dtypes)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def as_bytes(x):
    return np.ascontiguousarray(host(x) if torch.is_tensor(x) else x).view(np.uint8).reshape(-1)


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture(scope="module")
def layer():
    g = torch.Generator().manual_seed(3)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) * 0.05).to(torch.bfloat16)
    b13 = torch.randn(E, 2 * I, generator=g) * 0.1
    b2 = torch.randn(E, H, generator=g) * 0.1
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)]).to(torch.int32)
    wts = torch.softmax(torch.randn(M, K, generator=g), dim=1)
    return w13, w2, b13, b2, x, ids, wts


def prepare(w13, w2, b13, b2):
    q13, s13 = moeplug.quantize_mx(w13.reshape(-1, H))
    q2, s2 = moeplug.quantize_mx(w2.reshape(-1, I))
    prepared = moeplug.prepare_moe(
        q13.reshape(E, 2 * I, H // 2),
        q2.reshape(E, H, I // 2),
        weight_format="mxfp4",
        gate_mode_in="interleave_rows",
        w13_scale=s13.reshape(E, 2 * I, -1),
        w2_scale=s2.reshape(E, H, -1),
        w13_bias=b13,
        w2_bias=b2,
    )
    return (q13, s13, q2, s2), prepared


def test_quantize_and_prepare_on_cuda_match_the_host_bytes(layer):
    w13, w2, b13, b2, *_ = layer
    dev_q, dev = prepare(w13.cuda(), w2.cuda(), b13.cuda(), b2.cuda())
    host_q, hst = prepare(host(w13), host(w2), host(b13), host(b2))
    torch.cuda.synchronize()
    for d, h in zip(dev_q, host_q):
        assert np.array_equal(as_bytes(d), as_bytes(h))
    for name in ("w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias"):
        assert np.array_equal(as_bytes(getattr(dev, name)), as_bytes(getattr(hst, name))), name
    assert bytes(dev.layout) == bytes(hst.layout)


def test_fused_moe_on_cuda_matches_the_cpu_backend(layer):
    w13, w2, b13, b2, x, ids, wts = layer
    _, dev = prepare(w13.cuda(), w2.cuda(), b13.cuda(), b2.cuda())
    _, hst = prepare(host(w13), host(w2), host(b13), host(b2))
    out = torch.full((M, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    moeplug.fused_moe(x.cuda(), dev, wts.cuda(), ids.cuda(), activation="swiglu_oai", out=out)
    want = moeplug.fused_moe(host(x), hst, host(wts), host(ids), activation="swiglu_oai")
    torch.cuda.synchronize()
    assert rel_l2(host(out), want) <= 1e-2


def test_fused_moe_is_captured_in_a_cuda_graph(layer):
    w13, w2, b13, b2, x, ids, wts = layer
    _, dev = prepare(w13.cuda(), w2.cuda(), b13.cuda(), b2.cuda())
    xs, idx, w = x.cuda(), ids.cuda(), wts.cuda()
    out = torch.empty((M, H), dtype=torch.bfloat16, device="cuda")
    eager = moeplug.fused_moe(xs, dev, w, idx, activation="swiglu_oai").clone()
    need = moeplug.fused_moe_workspace_size(xs, dev, w, idx, activation="swiglu_oai", out=out)
    assert need > 0  # the GPU launch routes and stages through the caller's workspace
    with pytest.raises(moeplug.MoeplugError) as small:
        moeplug.fused_moe(xs, dev, w, idx, activation="swiglu_oai", workspace=torch.empty(need - 1, dtype=torch.uint8, device="cuda"))
    assert small.value.name == "MOEPLUG_BUFFER_TOO_SMALL"
    ws = torch.empty(need, dtype=torch.uint8, device="cuda")  # exactly what was asked for
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            moeplug.fused_moe(xs, dev, w, idx, activation="swiglu_oai", out=out, workspace=ws)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    xs.copy_(torch.randn_like(xs, dtype=torch.float32).to(torch.bfloat16))
    graph.replay()
    fresh = moeplug.fused_moe(xs, dev, w, idx, activation="swiglu_oai")
    torch.cuda.synchronize()
    assert torch.equal(out, fresh)


def test_cuda_caps_report_the_packed_limits_and_a_launch_past_them_is_refused(layer):
    """The GPU kernels route with AITER's packed `(slot << 24) | token`: caps say so, and k = 129
    on a real device is UNSUPPORTED naming the limit, the output untouched (issue 14)."""
    caps = moeplug.get_caps("cuda:0")
    assert (caps.max_tokens, caps.max_topk) == (2**24 - 1, 128)
    w13, w2, b13, b2, x, _, _ = layer
    _, dev = prepare(w13.cuda(), w2.cuda(), b13.cuda(), b2.cuda())
    g = torch.Generator(device="cuda").manual_seed(5)
    ids = torch.randint(0, E, (M, 129), device="cuda", generator=g, dtype=torch.int32)
    wts = torch.rand(M, 129, device="cuda", generator=g)
    out = torch.full((M, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(moeplug.MoeplugError) as e:
        moeplug.fused_moe(x.cuda(), dev, wts, ids, activation="swiglu_oai", out=out)
    assert e.value.name == "MOEPLUG_UNSUPPORTED"
    assert "at most 16777215 tokens and 128 slots per token" in e.value.message, e.value.message
    torch.cuda.synchronize()
    assert out.isnan().all()
