"""moeplug.torch on the GPU: torch.ops.moeplug.fused_moe on CUDA tensors (MXFP4, SWIGLU_OAI,
biases) equals the plain call, passes torch.library.opcheck, runs under torch.compile and is
captured in a CUDA graph with a workspace sized by fused_moe_workspace_size."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("moeplug.torch needs torch >= 2.4", allow_module_level=True)
import moeplug  # noqa: E402
import moeplug.torch as mt  # noqa: E402

E, H, I, M, K = 8, 512, 256, 37, 4
KW = dict(activation="swiglu_oai")


@pytest.fixture(scope="module")
def layer():
    g = torch.Generator().manual_seed(11)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.05).to(torch.bfloat16).cuda()
    w2 = (torch.randn(E, H, I, generator=g) * 0.05).to(torch.bfloat16).cuda()
    b13 = (torch.randn(E, 2 * I, generator=g) * 0.1).cuda()
    b2 = (torch.randn(E, H, generator=g) * 0.1).cuda()
    q13, s13 = moeplug.quantize_mx(w13.reshape(-1, H))
    q2, s2 = moeplug.quantize_mx(w2.reshape(-1, I))
    p = moeplug.prepare_moe(
        q13.reshape(E, 2 * I, H // 2), q2.reshape(E, H, I // 2), weight_format="mxfp4", gate_mode_in="interleave_rows",
        w13_scale=s13.reshape(E, 2 * I, -1), w2_scale=s2.reshape(E, H, -1), w13_bias=b13, w2_bias=b2,
    )
    x = torch.randn(M, H, generator=g).to(torch.bfloat16).cuda()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)]).to(torch.int32).cuda()
    wts = torch.softmax(torch.randn(M, K, generator=g), dim=1).cuda()
    return p, x, wts, ids


def _args(p, x, wts, ids, ws=None):
    return (x, p.w13, p.w2, wts, ids, mt.layout_values(p), ws)


def _kwargs(p, **extra):
    return dict(w13_scale=p.w13_scale, w2_scale=p.w2_scale, w13_bias=p.w13_bias, w2_bias=p.w2_bias, **KW, **extra)


def test_op_equals_the_plain_call(layer):
    p, x, wts, ids = layer
    want = moeplug.fused_moe(x, p, wts, ids, **KW)
    got = mt.fused_moe_prepared(x, p, wts, ids, **KW)
    need = moeplug.fused_moe_workspace_size(x, p, wts, ids, **KW)
    ws = torch.empty(need, dtype=torch.uint8, device="cuda")
    with_ws = mt.fused_moe_prepared(x, p, wts, ids, ws, **KW)
    torch.cuda.synchronize()
    assert torch.equal(got, want) and torch.equal(with_ws, want)


def test_opcheck_on_cuda(layer):
    p, x, wts, ids = layer
    need = moeplug.fused_moe_workspace_size(x, p, wts, ids, **KW)
    # Poisoned, not empty: opcheck clones every argument, and a clone of never-written bytes
    # is what compute-sanitizer initcheck reported here (session 14); the op must not depend
    # on what the workspace held.
    ws = torch.full((need,), 0xA5, dtype=torch.uint8, device="cuda")
    torch.library.opcheck(torch.ops.moeplug.fused_moe.default, _args(p, x, wts, ids, ws), _kwargs(p))
    torch.library.opcheck(torch.ops.moeplug.fused_moe.default, _args(p, x, wts, ids), _kwargs(p))


def test_torch_compile_and_cuda_graph(layer):
    p, x, wts, ids = layer
    need = moeplug.fused_moe_workspace_size(x, p, wts, ids, **KW)
    ws = torch.empty(need, dtype=torch.uint8, device="cuda")
    values = mt.layout_values(p)

    def step(x):
        return torch.ops.moeplug.fused_moe(x, p.w13, p.w2, wts, ids, values, ws, **_kwargs(p))

    eager = step(x).clone()
    compiled = torch.compile(step, fullgraph=True)
    assert torch.equal(compiled(x), eager)

    xs = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        step(xs)  # warm-up outside capture: kernels compiled and cached
        with torch.cuda.graph(graph, stream=stream):
            out = step(xs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    xs.copy_(torch.randn_like(xs, dtype=torch.float32).to(torch.bfloat16))
    graph.replay()
    fresh = step(xs)
    torch.cuda.synchronize()
    assert torch.equal(out, fresh)
