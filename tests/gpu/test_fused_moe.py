"""fused_moe on a CUDA GPU against a float64 torch reference of the same math (moe_ref.py).
Every masked capability of the CUDA backend is exercised here."""

import itertools

import pytest

torch = pytest.importorskip("torch")

import _abi  # noqa: E402
from moe_ref import make_moe, reference, rel_l2  # noqa: E402

FORMATS = ["bf16", "fp16", "fp8_per_tensor", "fp8_per_channel", "fp8_block128", "mxfp4", "mxfp8"]
GATES = ["separated", "interleave", "interleave_rows"]
ACTS = ["silu", "gelu", "swiglu_oai"]
TOL = 1e-2


def run_moe(fmt, *, wlayout="aiter_16x16", slayout=None, gate="separated", act="silu", E=8,
            k=2, H=192, I=128, Hp=None, Ip=None, M=7, bias=False, rwoi=False, mask=None,
            n_local=None, alpha=0.0, limit=0.0, in_dtype=torch.bfloat16, out_dtype=None,
            act_dtype="default", seed=0, out_cols=None, ids=None, m=None):
    dev = "cuda"
    Hp, Ip = Hp or H, Ip or I
    if act_dtype == "default" and fmt not in ("bf16", "fp16", "mxfp4"):
        act_dtype = "bf16"  # quantized activations (the format's default) are not implemented
    if slayout is None:
        slayout = ("aiter_e8m0" if wlayout == "aiter_16x16" else "plain") if fmt.startswith("mx") else "none"
    if m is None:
        m = make_moe(fmt, wlayout, slayout, gate, E, H, I, Hp, Ip, bias, dev, seed)
    g = torch.Generator(device=dev)
    g.manual_seed(seed + 1)
    x = torch.randn(M, H, device=dev, generator=g).to(in_dtype)
    e_global = E if mask is None else mask.numel()
    if ids is None:
        ids = torch.stack([torch.randperm(e_global, device=dev, generator=g)[:k]
                           for _ in range(M)]).int() if M else torch.zeros(0, k, dtype=torch.int32, device=dev)
    topk_w = torch.rand(M, k, device=dev, generator=g) + 0.1
    out = torch.full((M, out_cols or H), float("nan"), device=dev, dtype=out_dtype or in_dtype)
    nl = None if n_local is None else torch.tensor([n_local], dtype=torch.int32, device=dev)
    layout = _abi.make_layout(fmt, gate, wlayout, slayout, E, H, I, Hp, Ip, bias)
    tensors = dict(hidden_states=x, w13=m["w13"], w13_scale=m["w13_scale"], w2=m["w2"],
                   w2_scale=m["w2_scale"], w13_bias=m.get("w13_bias"), w2_bias=m.get("w2_bias"),
                   topk_weights=topk_w, topk_ids=ids, expert_mask=mask, num_local_tokens=nl,
                   output=out)
    kw = dict(activation=act, alpha=alpha, limit=limit, act_dtype=act_dtype,
              router_weight_on_input=rwoi, stream=torch.cuda.current_stream().cuda_stream)
    args = _abi.make_args(layout, tensors, **kw)
    ws = torch.empty(_abi.workspace_size(args), dtype=torch.uint8, device=dev)
    tensors["workspace"] = ws
    args = _abi.make_args(layout, tensors, **kw)
    _abi.fused_moe(args)
    torch.cuda.synchronize()
    adt = torch.float16 if (act_dtype == "fp16" or (act_dtype == "default" and fmt in ("bf16", "fp16") and in_dtype == torch.float16)) else torch.bfloat16
    ref = reference(x, topk_w, ids, m, act=act, alpha=alpha, limit=limit, rwoi=rwoi,
                    expert_mask=mask, n_local=n_local, act_dtype=adt)
    return out, ref, dict(m=m, args=args, tensors=tensors, layout=layout, kw=kw)


def assert_close(out, ref, n_local=None):
    H = ref.shape[1]
    assert not torch.isnan(out).any(), "output has unwritten (NaN) elements"
    n = ref.shape[0] if n_local is None else n_local
    assert (out[n:] == 0).all(), "rows at or beyond num_local_tokens must be zero"
    assert (out[:, H:] == 0).all(), "padded output columns must be zero"
    err = rel_l2(out[:n, :H], ref[:n])
    assert err <= TOL, f"rel L2 {err:.3e} > {TOL}"
    return err


# Every format x weight layout; gate mode, activation, bias and padding rotate so each of
# them meets several formats.
CASES = []
for n, (fmt, wl) in enumerate(itertools.product(FORMATS, ["plain", "aiter_16x16"])):
    CASES.append(dict(fmt=fmt, wlayout=wl, gate=GATES[n % 3], act=ACTS[(n // 3 + n) % 3],
                      bias=n % 2 == 0, pad=n % 4 in (1, 2)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['fmt']}-{c['wlayout']}-{c['gate']}-{c['act']}"
                         f"{'-bias' if c['bias'] else ''}{'-pad' if c['pad'] else ''}")
@pytest.mark.parametrize("M", [1, 7, 64])
def test_formats_small(case, M):
    pad = case["pad"]
    out, ref, _ = run_moe(case["fmt"], wlayout=case["wlayout"], gate=case["gate"],
                          act=case["act"], bias=case["bias"], M=M, k=3,
                          Hp=256 if pad else None, Ip=192 if pad else None, seed=M)
    assert_close(out, ref)


def test_mx_scale_layout_crossed():
    """Plain weights with AITER-shuffled scales and the reverse."""
    for fmt, wl, sl in [("mxfp4", "plain", "aiter_e8m0"), ("mxfp8", "aiter_16x16", "plain")]:
        out, ref, _ = run_moe(fmt, wlayout=wl, slayout=sl, M=33)
        assert_close(out, ref)


@pytest.mark.parametrize("act", ACTS)
def test_activation_limit_and_alpha(act):
    out, ref, _ = run_moe("bf16", act=act, limit=0.5, alpha=1.3 if act == "swiglu_oai" else 0.0,
                          M=40, bias=True)
    assert_close(out, ref)


def test_fp16_input_output_and_mixed_dtypes():
    out, ref, _ = run_moe("fp16", in_dtype=torch.float16, M=20)
    assert_close(out, ref)
    out, ref, _ = run_moe("mxfp4", in_dtype=torch.float16, out_dtype=torch.bfloat16,
                          act_dtype="fp16", M=20)
    assert_close(out, ref)


def test_router_weight_on_input():
    out, ref, _ = run_moe("bf16", rwoi=True, k=1, M=50, bias=True)
    assert_close(out, ref)


def test_expert_mask_and_num_local_tokens():
    """EP: 8 local experts out of 20 global (+1 fake slot); ids off-rank or out of range
    contribute nothing; rows >= num_local_tokens are zero."""
    mask = torch.zeros(21, dtype=torch.int32, device="cuda")
    mask[torch.tensor([0, 3, 4, 7, 9, 12, 15, 19])] = 1
    M, k = 64, 4
    g = torch.Generator(device="cuda")
    g.manual_seed(5)
    ids = torch.randint(-2, 23, (M, k), device="cuda", generator=g, dtype=torch.int32)
    for n_local in [M, 37, 0]:
        out, ref, _ = run_moe("mxfp4", M=M, k=k, mask=mask, n_local=n_local, ids=ids,
                              bias=True, act="swiglu_oai")
        if n_local == 0:
            assert (out == 0).all()
        else:
            assert_close(out, ref, n_local)


def test_out_of_range_ids_without_mask():
    g = torch.Generator(device="cuda")
    g.manual_seed(9)
    ids = torch.randint(-3, 11, (30, 2), device="cuda", generator=g, dtype=torch.int32)
    out, ref, _ = run_moe("bf16", M=30, ids=ids)
    assert_close(out, ref)


def test_many_tokens():
    """More tokens than a grid's y dimension allows (65535): tokens run along x."""
    out, ref, _ = run_moe("bf16", M=70000, k=2, H=64, I=32)
    assert_close(out, ref)


def test_padded_output_columns_are_zero():
    out, ref, _ = run_moe("bf16", Hp=256, Ip=192, M=9, out_cols=256)
    assert_close(out, ref)


def test_deterministic():
    a, _, st = run_moe("mxfp4", M=64, k=4, seed=3)
    b, _, _ = run_moe("mxfp4", M=64, k=4, seed=3, m=st["m"])
    assert torch.equal(a, b)


def test_workspace_too_small_and_unsupported():
    out, ref, st = run_moe("bf16", M=16)
    tensors = dict(st["tensors"])
    need = _abi.workspace_size(st["args"])
    tensors["workspace"] = torch.empty(need - 1, dtype=torch.uint8, device="cuda")
    args = _abi.make_args(st["layout"], tensors, **st["kw"])
    with pytest.raises(_abi.MoeplugError) as e:
        _abi.fused_moe(args)
    assert e.value.name == "BUFFER_TOO_SMALL" and str(need) in str(e.value)
    # Quantized activations are not implemented: UNSUPPORTED through check and the launch.
    kw = dict(st["kw"], act_dtype="fp8_per_token")
    layout = _abi.make_layout("fp8_per_tensor", "separated", "aiter_16x16", "none", 8, 192, 96,
                              192, 96, False)
    args = _abi.make_args(layout, {}, **kw)
    assert _abi.check_fused_moe(args) == 2
    assert b"act_dtype" in _abi.lib().moeplug_last_error()
    # The cdna4 scale layout is not read by the CUDA kernels.
    layout = _abi.make_layout("mxfp4", "separated", "aiter_16x16", "cdna4_swizzle", 8, 192, 96,
                              192, 96, False)
    assert _abi.check_fused_moe(_abi.make_args(layout, {}, act_dtype="bf16")) == 2


def test_layout_mismatch_is_reported():
    out, ref, st = run_moe("bf16", M=4)
    bad = _abi.make_layout("bf16", "separated", "aiter_16x16", "none", 8, 192, 128, 192, 160, False)
    args = _abi.make_args(bad, st["tensors"], **st["kw"])
    with pytest.raises(_abi.MoeplugError) as e:
        _abi.fused_moe(args)
    assert e.value.name == "LAYOUT_MISMATCH" and "w13" in str(e.value)


def test_caps():
    c = _abi.get_caps(2, 0)
    assert c.backend == 2
    assert c.arch.decode().startswith("sm_")
    assert b"NVRTC" in c.runtime_version
    assert c.weight_formats == sum(1 << v for v in _abi.WEIGHT_FORMAT.values())
    assert c.act_dtypes == (1 << 1) | (1 << 2)
    assert c.features == 0b11111


def test_cuda_graph_capture_and_replay():
    out, ref, st = run_moe("mxfp4", M=64, k=4, bias=True, act="swiglu_oai")
    assert_close(out, ref)
    t = st["tensors"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        kw = dict(st["kw"], stream=s.cuda_stream)
        args = _abi.make_args(st["layout"], t, **kw)
        with torch.cuda.graph(graph, stream=s):
            _abi.fused_moe(args)
    torch.cuda.synchronize()
    # New inputs in place, poisoned output, replay: the graph must compute the new answer.
    g = torch.Generator(device="cuda")
    g.manual_seed(77)
    t["hidden_states"].copy_(torch.randn(t["hidden_states"].shape, device="cuda", generator=g))
    t["topk_weights"].copy_(torch.rand(t["topk_weights"].shape, device="cuda", generator=g))
    t["output"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref2 = reference(t["hidden_states"], t["topk_weights"], t["topk_ids"], st["m"],
                     act="swiglu_oai")
    assert_close(t["output"], ref2)


# Real model shapes (E trimmed to keep memory and time sane; H, I, k real).
REAL = {
    "gpt-oss-120b": dict(fmt="mxfp4", E=16, k=4, H=2880, I=2880, Hp=3072, Ip=3072, bias=True,
                         act="swiglu_oai", gate="separated"),
    "deepseek-v3": dict(fmt="fp8_block128", E=32, k=8, H=7168, I=2048, act="silu",
                        gate="separated"),
    "qwen3-30b-a3b": dict(fmt="bf16", E=128, k=8, H=2048, I=768, act="silu",
                          gate="interleave"),
}
_real_cache = {}


@pytest.mark.parametrize("M", [1, 7, 64, 300])
@pytest.mark.parametrize("model", list(REAL))
def test_real_shapes(model, M):
    c = dict(REAL[model])
    fmt = c.pop("fmt")
    key = model
    if key not in _real_cache:
        _real_cache.clear()
        torch.cuda.empty_cache()
        _real_cache[key] = make_moe(fmt, "aiter_16x16",
                                    "aiter_e8m0" if fmt.startswith("mx") else "none",
                                    c["gate"], c["E"], c["H"], c["I"], c.get("Hp", c["H"]),
                                    c.get("Ip", c["I"]), c.get("bias", False), "cuda", 11)
    out, ref, _ = run_moe(fmt, M=M, m=_real_cache[key], seed=M, **c)
    assert_close(out, ref)
