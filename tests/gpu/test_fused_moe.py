"""fused_moe on a CUDA GPU against the CPU backend of the same library (the same inputs copied
to host, through the same C ABI) and against a float64 torch reference of the same math
(moe_ref.py). Every masked capability of the CUDA backend is exercised here."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import _abi  # noqa: E402
from moe_ref import make_moe, reference, rel_l2  # noqa: E402

FORMATS = ["bf16", "fp16", "fp8_per_tensor", "fp8_per_channel", "fp8_block128", "mxfp4", "mxfp8",
           "int4_group32", "int4_per_channel"]
GATES = ["separated", "interleave", "interleave_rows"]
ACTS = ["silu", "gelu", "swiglu_oai"]
TOL = 1e-2
# vs CPU: 16-bit activations differ by f32 summation order only; quantized ones quantize
# identically (a rare one-code flip from the order of an f32 sum is within this).
TOL_CPU = 1e-2
# fp8 activations on the fp8 wgmma: its products are summed with ~14 bits per 128-column step
# (as in DeepGEMM), so a stage-1 output rounds differently often enough to move a per-token
# scale and with it a row of stage-2 codes; still well inside the quantization error itself.
TOL_CPU_FP8 = 2e-2
# vs the unquantized float64 reference: a sanity bound on the quantization error itself.
TOL_QUANT = dict(fp8_per_token=0.1, fp8_per_tensor=0.15, fp8_block128=0.1, mxfp8=0.1, mxfp4=0.4)


def resolved_act(fmt, act_dtype, in_dtype):
    if act_dtype != "default":
        return act_dtype
    d = _abi.DEFAULT_ACT[fmt]
    if d is None:
        return "fp16" if in_dtype == torch.float16 else "bf16"
    return d


def run_moe(fmt, *, wlayout="aiter_16x16", slayout=None, gate="separated", act="silu", E=8,
            k=2, H=192, I=128, Hp=None, Ip=None, M=7, bias=False, rwoi=False, mask=None,
            n_local=None, alpha=0.0, limit=0.0, in_dtype=torch.bfloat16, out_dtype=None,
            act_dtype="default", seed=0, out_cols=None, ids=None, m=None,
            stage2_act_dtype="default"):
    dev = "cuda"
    Hp, Ip = Hp or H, Ip or I
    if slayout is None:
        slayout = ("aiter_e8m0" if wlayout == "aiter_16x16" else "plain") if fmt.startswith("mx") else "none"
        if fmt == "int4_group32":
            slayout = "aiter_int4" if wlayout == "aiter_16x16" else "plain"
    if m is None:
        m = make_moe(fmt, wlayout, slayout, gate, E, H, I, Hp, Ip, bias, dev, seed)
    g = torch.Generator(device=dev)
    g.manual_seed(seed + 1)
    x = torch.randn(M, H, device=dev, generator=g).to(in_dtype)
    if Hp > H and M:  # padded hidden columns hold garbage the kernels must skip
        x = torch.cat([x, torch.randn(M, Hp - H, device=dev, generator=g).to(in_dtype) * 1e3], 1)
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
              router_weight_on_input=rwoi, stream=torch.cuda.current_stream().cuda_stream,
              stage2_act_dtype=stage2_act_dtype)
    args = _abi.make_args(layout, tensors, **kw)
    ws = torch.empty(_abi.workspace_size(args), dtype=torch.uint8, device=dev)
    ws.fill_(0xFF)  # stale workspace bytes (NaN-ish floats) must not leak into the result
    tensors["workspace"] = ws
    args = _abi.make_args(layout, tensors, **kw)
    _abi.fused_moe(args)
    torch.cuda.synchronize()
    adt_name = resolved_act(fmt, act_dtype, in_dtype)
    adt = torch.float16 if adt_name == "fp16" else torch.bfloat16
    # A 16-bit stage-2 act dtype of its own rounds the intermediate to it.
    adt2 = dict(bf16=torch.bfloat16, fp16=torch.float16).get(stage2_act_dtype)
    ref = reference(x, topk_w, ids, m, act=act, alpha=alpha, limit=limit, rwoi=rwoi,
                    expert_mask=mask, n_local=n_local, act_dtype=adt, act2_dtype=adt2)
    return out, ref, dict(m=m, args=args, tensors=tensors, layout=layout, kw=kw, act=adt_name,
                          fmt=fmt)


def capture_graph(st):
    """One fused_moe of run_moe's state `st`, captured in a CUDA graph on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        args = _abi.make_args(st["layout"], st["tensors"], **dict(st["kw"], stream=s.cuda_stream))
        with torch.cuda.graph(graph, stream=s):
            _abi.fused_moe(args)
    torch.cuda.synchronize()
    return graph


def assert_replays_give(graph, st, out, what=""):
    """Three replays of `graph` over a poisoned output, each giving `out`'s bits."""
    t = st["tensors"]
    for _ in range(3):
        t["output"].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(t["output"], out), f"{what}a graph replay changed the output"


def run_child(module, path, env):
    """`module`.child(path) in a fresh interpreter (the library reads its MOEPLUG_* settings
    once per process), with `env` over os.environ (None unsets); returns what it saved."""
    here = str(Path(__file__).resolve().parent)
    child_env = {k: v for k, v in os.environ.items() if k not in env}
    child_env.update({k: v for k, v in env.items() if v is not None})
    code = f"import sys; sys.path.insert(0, {here!r}); import {module} as t; t.child({str(path)!r})"
    r = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return torch.load(path)


_host_weights = {}


def cpu_output(st):
    """The same launch on the CPU backend: inputs copied to host, output poisoned."""
    t = st["tensors"]
    # Keyed by the layer object, which the cache holds: a bare id() of a freed layer can be
    # reused by the next one and would hand it the previous layer's host weights.
    cached = _host_weights.get("layer")
    if cached is None or cached[0] is not st["m"]:
        _host_weights["layer"] = (st["m"], {n: (None if t[n] is None else t[n].cpu())
                                            for n in ["w13", "w13_scale", "w2", "w2_scale",
                                                      "w13_bias", "w2_bias"]})
    host = dict(_host_weights["layer"][1])
    for n in ["hidden_states", "topk_weights", "topk_ids", "expert_mask", "num_local_tokens"]:
        host[n] = None if t[n] is None else t[n].cpu()
    host["output"] = torch.full(t["output"].shape, float("nan"), dtype=t["output"].dtype)
    _abi.fused_moe(_abi.make_args(st["layout"], host, **dict(st["kw"], stream=None)))
    return host["output"]


def assert_close(out, ref, n_local=None, st=None):
    """Every element written, rows >= num_local_tokens and padded columns zero; against the
    CPU backend (when `st` is given) and the float64 reference."""
    H = ref.shape[1]
    assert not torch.isnan(out).any(), "output has unwritten (NaN) elements"
    n = ref.shape[0] if n_local is None else max(0, min(n_local, ref.shape[0]))
    assert (out[n:] == 0).all(), "rows at or beyond num_local_tokens must be zero"
    assert (out[:, H:] == 0).all(), "padded output columns must be zero"
    errs = {}
    if n:  # the float64 reference first: when the CPU backend disagrees, this says who is off
        act = st["act"] if st is not None else "bf16"
        tol = TOL_QUANT.get(act, TOL)
        errs["f64"] = rel_l2(out[:n, :H], ref[:n])
        assert errs["f64"] <= tol, f"vs float64: rel L2 {errs['f64']:.3e} > {tol} ({act})"
    if st is not None:
        cpu = cpu_output(st)
        assert not torch.isnan(cpu).any()
        assert torch.equal(cpu[n:], torch.zeros_like(cpu[n:]))
        if n:
            errs["cpu"] = rel_l2(out[:n, :H].cpu(), cpu[:n, :H])
            tol_cpu = TOL_CPU_FP8 if act.startswith("fp8") else TOL_CPU
            assert errs["cpu"] <= tol_cpu, (
                f"vs CPU backend: rel L2 {errs['cpu']:.3e} > {tol_cpu} "
                f"(CPU vs float64: {rel_l2(cpu[:n, :H].double(), ref[:n].cpu().double()):.3e})")
    return errs


# Every format x every activation dtype defined for it; weight layout, scale layout, gate mode,
# activation and one option (bias, expert_mask, num_local_tokens, router weight on input)
# rotate so each meets several formats and activation dtypes.
OPTIONS = ["none", "bias", "expert_mask", "num_local_tokens", "rwoi", "all"]
CASES = []
for n, (fmt, adt) in enumerate((f, a) for f in FORMATS for a in _abi.ALLOWED_ACT[f]):
    CASES.append(dict(fmt=fmt, act_dtype=adt, wlayout=["aiter_16x16", "plain"][n % 2],
                      slayout=(["aiter_e8m0", "plain", "cdna4_swizzle"][n % 3]
                               if fmt.startswith("mx") else
                               # aiter_int4 pairs 32-groups: K % 64 (the padded sizes)
                               ("aiter_int4" if n % 4 in (1, 2) else "plain")
                               if fmt == "int4_group32" else "none"),
                      gate=GATES[n % 3], act=ACTS[(n // 3) % 3], option=OPTIONS[n % len(OPTIONS)],
                      pad=n % 4 in (1, 2)))


def run_case(c, M, seed):
    opt = c["option"]
    kw = {}
    E, k = 8, 3
    if opt in ("expert_mask", "all"):
        mask = torch.zeros(13, dtype=torch.int32, device="cuda")
        mask[torch.tensor([0, 2, 3, 5, 8, 9, 10, 12])] = 1  # 8 local of 12 global (+ fake slot)
        g = torch.Generator(device="cuda")
        g.manual_seed(seed + 7)
        kw["mask"] = mask
        kw["ids"] = torch.randint(-1, 14, (M, k), device="cuda", generator=g, dtype=torch.int32)
    if opt in ("num_local_tokens", "all"):
        kw["n_local"] = max(M - 3, 0) if M > 1 else 1
    if opt in ("rwoi", "all"):
        kw["rwoi"] = True
    bias = opt in ("bias", "all")
    H, I = 320, 160  # a short last 1x128 group on both stages
    pad = c["pad"]
    out, ref, st = run_moe(c["fmt"], wlayout=c["wlayout"], slayout=c["slayout"], gate=c["gate"],
                           act=c["act"], act_dtype=c["act_dtype"], bias=bias, M=M, k=k, E=E,
                           H=H, I=I, Hp=384 if pad else None, Ip=192 if pad else None,
                           seed=seed, **kw)
    return assert_close(out, ref, kw.get("n_local"), st)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['fmt']}-{c['act_dtype']}-{c['wlayout']}-"
                         f"{c['slayout']}-{c['gate']}-{c['act']}-{c['option']}{'-pad' if c['pad'] else ''}")
@pytest.mark.parametrize("M", [1, 7, 64])
def test_formats_x_act_dtypes(case, M):
    run_case(case, M, seed=M)


@pytest.mark.parametrize("act_dtype", ["fp8_per_token", "fp8_per_tensor", "fp8_block128",
                                       "mxfp4", "mxfp8"])
@pytest.mark.parametrize("option", OPTIONS[1:])
def test_quantized_acts_with_every_option(act_dtype, option):
    """Per-tensor amax must cover exactly the rows the GEMMs read (masked-off slots and rows
    past num_local_tokens excluded), whatever the option."""
    fmt = {"fp8_per_token": "fp8_per_channel", "fp8_per_tensor": "fp8_per_tensor",
           "fp8_block128": "fp8_block128", "mxfp4": "mxfp4", "mxfp8": "mxfp4"}[act_dtype]
    c = dict(fmt=fmt, act_dtype=act_dtype, wlayout="aiter_16x16",
             slayout="aiter_e8m0" if fmt.startswith("mx") else "none", gate="interleave",
             act="swiglu_oai", option=option, pad=True)
    run_case(c, 33, seed=100)


def test_fp8_fnuz_and_uint8_weights():
    """e4m3fnuz weights quantize fp8 activations to e4m3fnuz (max 240); uint8 fp8 weights are
    e4m3fn, as moe::check says."""
    for dt, act in [(torch.float8_e4m3fnuz, "fp8_per_token"), (torch.uint8, "fp8_per_tensor"),
                    (torch.float8_e4m3fnuz, "fp8_block128")]:
        fmt = "fp8_block128" if act == "fp8_block128" else "fp8_per_channel"
        m = make_moe(fmt, "aiter_16x16", "none", "separated", 8, 256, 128, 256, 128, False,
                     "cuda", 4)
        for key in ["w13", "w2"]:
            raw = m[key].view(torch.uint8)
            if dt == torch.float8_e4m3fnuz:
                # same values: fnuz code = fn code with exponent + 1 (bias 8 vs 7)
                v = m[key].float().to(torch.float8_e4m3fnuz)
                assert torch.equal(v.float(), m[key].float())
                m[key] = v
            else:
                m[key] = raw
        out, ref, st = run_moe(fmt, m=m, H=256, I=128, M=24, act_dtype=act, seed=4)
        assert_close(out, ref, st=st)


def test_default_act_dtypes_run():
    """DEFAULT resolves per weight format (docs/abi.md §2): the FP8 and MXFP8 defaults quantize."""
    for fmt in FORMATS:
        out, ref, st = run_moe(fmt, M=16, act_dtype="default", seed=2)
        assert_close(out, ref, st=st)


def test_mx_scale_layout_crossed():
    """Plain weights with AITER-shuffled scales and the reverse."""
    for fmt, wl, sl in [("mxfp4", "plain", "aiter_e8m0"), ("mxfp8", "aiter_16x16", "plain")]:
        out, ref, st = run_moe(fmt, wlayout=wl, slayout=sl, M=33)
        assert_close(out, ref, st=st)


@pytest.mark.parametrize("act", ACTS)
def test_activation_limit_and_alpha(act):
    out, ref, st = run_moe("bf16", act=act, limit=0.5, alpha=1.3 if act == "swiglu_oai" else 0.0,
                          M=40, bias=True)
    assert_close(out, ref, st=st)


def test_fp16_input_output_and_mixed_dtypes():
    out, ref, st = run_moe("fp16", in_dtype=torch.float16, M=20)
    assert_close(out, ref, st=st)
    out, ref, st = run_moe("mxfp4", in_dtype=torch.float16, out_dtype=torch.bfloat16,
                          act_dtype="fp16", M=20)
    assert_close(out, ref, st=st)


def test_router_weight_on_input():
    out, ref, st = run_moe("bf16", rwoi=True, k=1, M=50, bias=True)
    assert_close(out, ref, st=st)


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
        out, ref, st = run_moe("mxfp4", M=M, k=k, mask=mask, n_local=n_local, ids=ids,
                              bias=True, act="swiglu_oai")
        if n_local == 0:
            assert (out == 0).all()
        else:
            assert_close(out, ref, n_local, st)


def test_out_of_range_ids_without_mask():
    g = torch.Generator(device="cuda")
    g.manual_seed(9)
    ids = torch.randint(-3, 11, (30, 2), device="cuda", generator=g, dtype=torch.int32)
    out, ref, st = run_moe("bf16", M=30, ids=ids)
    assert_close(out, ref, st=st)


def test_many_tokens():
    """More tokens than a grid's y dimension allows (65535): tokens run along x."""
    out, ref, st = run_moe("bf16", M=70000, k=2, H=64, I=32)
    assert_close(out, ref, st=st)


# Prefill: 256 pairs per expert select the wgmma family on sm_90 where it covers the format
# (tile32 elsewhere); 16-bit and fp8 activations, both weight layouts and gate modes, bias.
LARGE = [("bf16", "bf16"), ("fp16", "fp16"), ("fp8_per_tensor", "fp8_per_tensor"),
         ("fp8_per_channel", "fp8_per_token"), ("fp8_block128", "fp8_block128"),
         ("mxfp4", "bf16"), ("mxfp8", "mxfp8")]


@pytest.mark.parametrize("fmt,act_dtype", LARGE)
@pytest.mark.parametrize("wlayout,gate", [("aiter_16x16", "separated"), ("plain", "interleave")])
def test_large_m(fmt, act_dtype, wlayout, gate):
    in_dtype = torch.float16 if act_dtype == "fp16" else torch.bfloat16
    out, ref, st = run_moe(fmt, wlayout=wlayout, gate=gate, act_dtype=act_dtype, M=1024, E=8,
                           k=2, H=256, I=256, Ip=320 if gate == "interleave" else None,
                           bias=True, act="swiglu_oai" if gate == "interleave" else "silu",
                           in_dtype=in_dtype, seed=21)
    assert_close(out, ref, st=st)


def test_padded_output_columns_are_zero():
    out, ref, st = run_moe("bf16", Hp=256, Ip=192, M=9, out_cols=256)
    assert_close(out, ref, st=st)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("M", [1, 64, 300, 1200])
def test_deterministic(fmt, M):
    # Same inputs, same bits, run after run (stream family at small M, tile32 at M=300, wgmma
    # at M=1200 where it covers the format: the split-K partial sums are added in a fixed
    # order, never by atomics; every wgmma output has one owner thread). Every format: the
    # CUDA caps may claim DETERMINISTIC only once this passes for all of them
    # (docs/determinism.md).
    a, _, st = run_moe(fmt, M=M, k=4, seed=3)
    for _ in range(3):
        b, _, _ = run_moe(fmt, M=M, k=4, seed=3, m=st["m"])
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
    # A hidden_scale with 16-bit activations is refused as on the CPU (pre-quantized inputs:
    # test_launch_fields.py).
    tensors = dict(st["tensors"])
    tensors["hidden_scale"] = torch.ones(16, 1, device="cuda")
    with pytest.raises(_abi.MoeplugError) as e:
        _abi.fused_moe(_abi.make_args(st["layout"], tensors, **st["kw"]))
    assert e.value.name == "INVALID_ARGUMENT" and "hidden_scale" in str(e.value)
    # Every activation dtype and scale layout passes the config check.
    layout = _abi.make_layout("mxfp4", "separated", "aiter_16x16", "cdna4_swizzle", 8, 192, 96,
                              192, 96, False)
    for adt in ["default", "mxfp4", "mxfp8"]:
        assert _abi.check_fused_moe(_abi.make_args(layout, {}, act_dtype=adt)) == 0
    # An act dtype not defined for the format is UNSUPPORTED with the allowed list.
    assert _abi.check_fused_moe(_abi.make_args(layout, {}, act_dtype="fp8_block128")) == 2
    assert b"allowed" in _abi.lib().moeplug_last_error()


def test_same_message_as_cpu_for_bad_launches():
    """One launch check: the CUDA backend answers a bad launch with the CPU's status and
    message (moe::check), uint8 fp8 weights included."""
    out, ref, st = run_moe("fp8_per_channel", M=5, act_dtype="fp8_per_token")
    t = st["tensors"]
    bad = [
        dict(w13=t["w13"][:, :-16].contiguous()),
        dict(w2_scale=None),
        dict(hidden_states=t["hidden_states"][:, :-8].contiguous()),
        dict(topk_ids=t["topk_ids"][:-1].contiguous()),
        dict(w13_bias=torch.zeros(8, 256, device="cuda")),
        dict(output=torch.zeros(5, 192, device="cuda")),
    ]
    for change in bad:
        gt = dict(t, **change)
        ht = {n: (None if v is None else v.cpu()) for n, v in gt.items() if n != "workspace"}
        answers = []
        for tensors, kw in [(gt, st["kw"]), (ht, dict(st["kw"], stream=None))]:
            with pytest.raises(_abi.MoeplugError) as e:
                _abi.fused_moe(_abi.make_args(st["layout"], tensors, **kw))
            answers.append((e.value.status, str(e.value)))
        assert answers[0] == answers[1], f"{list(change)}: {answers}"


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
    # bit_mask counts each value once: SCALE_LAYOUT holds the alias "cdna4" of "cdna4_swizzle".
    assert c.weight_formats == _abi.bit_mask(_abi.WEIGHT_FORMAT)
    assert c.act_dtypes == _abi.bit_mask(_abi.ACT_DTYPE)
    assert c.scale_layouts == _abi.bit_mask(_abi.SCALE_LAYOUT)
    assert c.gate_modes == _abi.bit_mask(_abi.GATE_MODE)
    # Every activation, NONE included (ABI 1.1, test_launch_fields.py).
    assert c.activations == _abi.bit_mask(_abi.ACTIVATION)
    assert c.weight_layouts == _abi.bit_mask(_abi.WEIGHT_LAYOUT)
    # BIAS, EXPERT_MASK, NUM_LOCAL_TOKENS, RWOI, GRAPH_CAPTURE, DEVICE_PREP, DETERMINISTIC,
    # PREQUANTIZED_INPUT, STATIC_ACT_SCALE, STAGE2_ACT_DTYPE
    assert c.features == 0b11_1111_1111
    cpu = _abi.get_caps(1, 0)
    for f in ["weight_formats", "act_dtypes", "gate_modes", "weight_layouts", "scale_layouts",
              "activations"]:
        assert getattr(c, f) == getattr(cpu, f), f
    # CPU: DETERMINISTIC and the launch options, no GPU bits
    assert c.features == cpu.features | (1 << 4) | (1 << 5)


@pytest.mark.parametrize("fmt,act_dtype", [("mxfp4", "bf16"), ("fp8_per_tensor", "fp8_per_tensor"),
                                           ("mxfp4", "mxfp4"), ("fp8_block128", "default")])
def test_cuda_graph_capture_and_replay(fmt, act_dtype):
    out, ref, st = run_moe(fmt, M=64, k=4, bias=True, act="swiglu_oai", act_dtype=act_dtype)
    assert_close(out, ref, st=st)
    t = st["tensors"]
    graph = capture_graph(st)
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
    assert_close(t["output"], ref2, st=st)


# Real model shapes (E trimmed to keep memory and time sane; H, I, k real), each with a 16-bit
# and a quantized activation dtype; the quantized runs are compared with the CPU backend too.
REAL = {
    "gpt-oss-120b": dict(fmt="mxfp4", E=16, k=4, H=2880, I=2880, Hp=3072, Ip=3072, bias=True,
                         act="swiglu_oai", gate="separated", acts=["bf16", "mxfp4"]),
    "deepseek-v3": dict(fmt="fp8_block128", E=32, k=8, H=7168, I=2048, act="silu",
                        gate="separated", acts=["bf16", "fp8_block128"]),
    "qwen3-30b-a3b": dict(fmt="fp8_per_channel", E=128, k=8, H=2048, I=768, act="silu",
                          gate="interleave", acts=["bf16", "fp8_per_token", "fp8_per_tensor"]),
}
_real_cache = {}


@pytest.mark.parametrize("M", [1, 7, 64, 300, 1024])
@pytest.mark.parametrize("model", list(REAL))
def test_real_shapes(model, M):
    c = dict(REAL[model])
    fmt = c.pop("fmt")
    acts = c.pop("acts")
    key = model
    if key not in _real_cache:
        _real_cache.clear()
        torch.cuda.empty_cache()
        _real_cache[key] = make_moe(fmt, "aiter_16x16",
                                    "aiter_e8m0" if fmt.startswith("mx") else "none",
                                    c["gate"], c["E"], c["H"], c["I"], c.get("Hp", c["H"]),
                                    c.get("Ip", c["I"]), c.get("bias", False), "cuda", 11)
    for adt in acts:
        out, ref, st = run_moe(fmt, M=M, m=_real_cache[key], seed=M, act_dtype=adt, **c)
        errs = assert_close(out, ref, st=st if adt != "bf16" or M <= 7 else None)
        print(f"{model} M={M} {adt}: {errs}")


# INT4_GROUP32 (AITER a16wi4) runs in the fp32 family: every weight layout x scale layout x gate
# mode, 16-bit activations of both kinds, against the float64 reference and the CPU backend.
@pytest.mark.parametrize("wlayout", ["aiter_16x16", "plain"])
@pytest.mark.parametrize("slayout", ["aiter_int4", "plain"])
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("M", [1, 7, 64, 300])
def test_int4_group32_layouts(wlayout, slayout, gate, M):
    out, ref, st = run_moe("int4_group32", wlayout=wlayout, slayout=slayout, gate=gate,
                           act=ACTS[M % 3], M=M, E=8, k=2, H=256, I=192, seed=M)
    assert_close(out, ref, st=st)


# INT4_PER_CHANNEL (AITER a8w4 int4, Quark int4-fp8) runs in the fp32 family: both weight
# layouts x every gate mode x every act dtype of the format (fp8 per-token is AITER's pairing).
@pytest.mark.parametrize("wlayout", ["aiter_16x16", "plain"])
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("act_dtype", _abi.ALLOWED_ACT["int4_per_channel"])
@pytest.mark.parametrize("M", [1, 7, 64, 300])
def test_int4_per_channel_layouts(wlayout, gate, act_dtype, M):
    out, ref, st = run_moe("int4_per_channel", wlayout=wlayout, gate=gate, act=ACTS[M % 3],
                           act_dtype=act_dtype, in_dtype=torch.float16 if act_dtype == "fp16"
                           else torch.bfloat16, M=M, E=8, k=2, H=256, I=192, seed=M)
    assert_close(out, ref, st=st)


def test_int4_per_channel_options_and_padding():
    mask = torch.zeros(13, dtype=torch.int32, device="cuda")
    mask[torch.tensor([0, 2, 3, 5, 8, 9, 10, 12])] = 1
    g = torch.Generator(device="cuda")
    g.manual_seed(12)
    ids = torch.randint(-1, 14, (9, 3), device="cuda", generator=g, dtype=torch.int32)
    out, ref, st = run_moe("int4_per_channel", act="gelu", E=8, k=3, M=9, H=320, I=160,
                           Hp=384, Ip=192, bias=True, rwoi=True, mask=mask, ids=ids, n_local=7,
                           act_dtype="fp8_per_token", stage2_act_dtype="fp8_per_tensor",
                           out_cols=384, seed=6)
    assert_close(out, ref, n_local=7, st=st)


def test_int4_group32_options_and_fp16():
    mask = torch.zeros(13, dtype=torch.int32, device="cuda")
    mask[torch.tensor([0, 2, 3, 5, 8, 9, 10, 12])] = 1
    g = torch.Generator(device="cuda")
    g.manual_seed(11)
    ids = torch.randint(-1, 14, (9, 3), device="cuda", generator=g, dtype=torch.int32)
    out, ref, st = run_moe("int4_group32", act="swiglu_oai", E=8, k=3, M=9, H=320, I=160,
                           Hp=384, Ip=192, bias=True, rwoi=True, mask=mask, ids=ids, n_local=7,
                           in_dtype=torch.float16, out_dtype=torch.float16, act_dtype="fp16",
                           out_cols=384, seed=5)
    assert_close(out, ref, n_local=7, st=st)
