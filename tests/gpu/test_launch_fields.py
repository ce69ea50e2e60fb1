"""The ABI 1.1 launch options (issue 11) on a CUDA GPU: GELU_TANH against the float64 reference
and the CPU backend, static per-tensor activation scales, pre-quantized hidden_states (the
same output bytes as the launch that quantizes the same input itself, on the GPU as on the
CPU), the activation NONE and a separate stage-2 act dtype on every family that runs them,
against the float64 reference and the CPU backend, and what `check_fused_moe` says of them."""

import pytest

torch = pytest.importorskip("torch")

import _abi  # noqa: E402
from test_fused_moe import TOL_CPU, TOL_QUANT, assert_close, run_moe  # noqa: E402
from moe_ref import make_matrix, rel_l2  # noqa: E402

FP8_MAX = 448.0


def launch(st, dev, **change):
    """The launch of `st` with tensors replaced by `change`, on `dev` ("cuda" or "cpu"), into a
    NaN-poisoned output; returns the output."""
    t = dict(st["tensors"], **change)
    if dev == "cpu":
        t = {n: (None if v is None else v.cpu()) for n, v in t.items() if n != "workspace"}
    out = torch.full(t["output"].shape, float("nan"), dtype=t["output"].dtype, device=dev)
    t["output"] = out
    kw = dict(st["kw"], stream=None) if dev == "cpu" else st["kw"]
    if dev == "cuda":
        need = _abi.workspace_size(_abi.make_args(st["layout"], t, **kw))
        t["workspace"] = torch.full((need,), 0xFF, dtype=torch.uint8, device=dev)
    _abi.fused_moe(_abi.make_args(st["layout"], t, **kw))
    if dev == "cuda":
        torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "output has unwritten (NaN) elements"
    return out


@pytest.mark.parametrize("fmt,act_dtype", [("bf16", "bf16"), ("fp8_per_channel", "fp8_per_token"),
                                           ("fp8_block128", "fp8_block128"), ("mxfp4", "bf16"),
                                           ("mxfp4", "mxfp4"), ("mxfp8", "mxfp8")])
@pytest.mark.parametrize("M", [1, 33])
def test_gelu_tanh(fmt, act_dtype, M):
    out, ref, st = run_moe(fmt, act="gelu_tanh", act_dtype=act_dtype, M=M, bias=True, seed=M)
    assert_close(out, ref, st=st)
    out, ref, st = run_moe(fmt, act="gelu_tanh", act_dtype=act_dtype, M=M, limit=1.5, seed=M + 1,
                           gate="interleave")
    assert_close(out, ref, st=st)


@pytest.mark.parametrize("fmt", ["fp8_per_tensor", "fp8_per_channel"])
@pytest.mark.parametrize("M", [4, 64])
def test_static_act_scales(fmt, M):
    out, ref, st = run_moe(fmt, act_dtype="fp8_per_tensor", M=M, seed=3)
    x = st["tensors"]["hidden_states"]
    H = ref.shape[1]
    dynamic1 = (x[:, :H].float().abs().max() / FP8_MAX).reshape(1)
    # The dynamic stage-1 scale given as a static one: the same bytes as the dynamic launch.
    same = launch(st, "cuda", stage1_act_scale=dynamic1.clone())
    assert torch.equal(same, out)
    # Other static scales: as the CPU backend with the same scales, and they are used.
    scales = dict(stage1_act_scale=dynamic1 * 1.7,
                  stage2_act_scale=torch.tensor([0.05], device="cuda").reshape(()))
    gpu = launch(st, "cuda", **scales)
    cpu = launch(st, "cpu", **scales)
    assert rel_l2(gpu.cpu(), cpu) <= TOL_CPU
    assert not torch.equal(gpu, out)
    # A static scale needs FP8_PER_TENSOR for its stage.
    out2, ref2, st2 = run_moe(fmt, act_dtype="fp8_per_token", M=M, seed=4)
    with pytest.raises(_abi.MoeplugError) as e:
        launch(st2, "cuda", stage1_act_scale=dynamic1)
    assert e.value.name == "INVALID_ARGUMENT"
    assert "stage1_act_scale: a static scale needs the stage-1 act dtype fp8_per_tensor" in str(e.value)


def fp8_codes(x, group):
    """moeplug's fp8 activation quantizer (docs/layouts.md §3.5) in torch: scale = amax / 448
    per row or per `group` columns (1 for an all-zero group), code = fp8(x / scale)."""
    M, C = x.shape
    g = C if group is None else group
    xf = x.cpu().float().reshape(M, C // g, g)  # IEEE f32 on the host, as the CPU backend
    s = xf.abs().amax(2, keepdim=True) / FP8_MAX
    s = torch.where(s == 0, torch.ones_like(s), s)
    codes = (xf / s).to(torch.float8_e4m3fn).reshape(M, C)
    return codes, s.reshape(M, C // g)


def mx_codes(x, fmt):
    import moeplug
    q, s = moeplug.quantize_mx(x.cpu(), fmt=fmt)  # round mode UP, plain scales
    return q, s


@pytest.mark.parametrize("fmt,act_dtype", [("fp8_per_channel", "fp8_per_token"),
                                           ("fp8_per_tensor", "fp8_per_token"),
                                           ("fp8_block128", "fp8_block128"),
                                           ("mxfp4", "mxfp4"), ("mxfp4", "mxfp8"),
                                           ("mxfp8", "mxfp8")])
@pytest.mark.parametrize("M", [1, 7, 200])
def test_prequantized_inputs_give_the_self_quantized_bytes(fmt, act_dtype, M):
    H = 256
    out, ref, st = run_moe(fmt, act_dtype=act_dtype, M=M, H=H, I=128, seed=5)
    x = st["tensors"]["hidden_states"]
    if act_dtype.startswith("fp8"):
        codes, scales = fp8_codes(x, 128 if act_dtype == "fp8_block128" else None)
    else:
        codes, scales = mx_codes(x, act_dtype)
    change = dict(hidden_states=codes.cuda().contiguous(), hidden_scale=scales.cuda().contiguous())
    # The codes are moeplug's: on the CPU backend the pre-quantized launch gives the bytes of
    # the self-quantized one ...
    cpu_own = launch(st, "cpu")
    cpu_pre = launch(st, "cpu", **change)
    assert torch.equal(cpu_pre, cpu_own), "the torch quantizer differs from moeplug's"
    # ... and so it must on the GPU.
    pre = launch(st, "cuda", **change)
    assert torch.equal(pre, out)
    assert_close(pre, ref, st=st)
    # uint8 codes stand for the fp8 / packed fp4 ones.
    pre_u8 = launch(st, "cuda", hidden_states=change["hidden_states"].view(torch.uint8),
                    hidden_scale=change["hidden_scale"])
    assert torch.equal(pre_u8, out)


def test_prequantized_bad_scale_is_refused_as_on_the_cpu():
    out, ref, st = run_moe("fp8_per_channel", act_dtype="fp8_per_token", M=5, H=256, I=128)
    codes, scales = fp8_codes(st["tensors"]["hidden_states"], None)
    bad = dict(hidden_states=codes.cuda(), hidden_scale=torch.ones(5, 2, device="cuda"))
    answers = []
    for dev in ["cuda", "cpu"]:
        with pytest.raises(_abi.MoeplugError) as e:
            launch(st, dev, **bad)
        # "STATUS: <call>: message": the CUDA path is refused by its workspace-size call first
        status, _call, message = str(e.value).split(": ", 2)
        answers.append((e.value.status, status, message))
    assert answers[0] == answers[1]
    assert answers[0][0] == 1 and answers[0][2].startswith("hidden_scale: expected shape [5] or [5, 1]")


def make_up_only(fmt, wlayout, slayout, E, H, I, Hp, Ip, bias, seed):
    """A non-gated layer (activation NONE): w13 holds the Ip up rows only, with their scales and
    biases; the logical up / down matrices for the float64 reference."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    w13, s13, d13 = make_matrix(fmt, wlayout, slayout, E, Ip, Hp, "cuda", g)
    w2, s2, d2 = make_matrix(fmt, wlayout, slayout, E, Hp, Ip, "cuda", g)
    m = dict(w13=w13, w13_scale=s13, w2=w2, w2_scale=s2, up=d13[:, :I, :H], down=d2[:, :H, :I])
    if bias:
        b13 = torch.randn(E, Ip, device="cuda", generator=g) * 0.1
        b2 = torch.randn(E, Hp, device="cuda", generator=g) * 0.1
        m.update(w13_bias=b13, w2_bias=b2, b_up=b13[:, :I], b_down=b2[:, :H])
    return m


def default_slayout(fmt, wlayout):
    if fmt.startswith("mx"):
        return "aiter_e8m0" if wlayout == "aiter_16x16" else "plain"
    if fmt == "int4_group32":
        return "aiter_int4" if wlayout == "aiter_16x16" else "plain"
    return "none"


# Activation NONE (ABI 1.1) on the families that run it, chosen by the heuristics for these
# shapes on an H200 (E = 8, top-2; docs in heuristics::options_unsupported): the AITER layout
# with M = 1 runs on stream where stream covers the format (bf16, fp8 with fp8 activations,
# MXFP4 with bf16), M = 200 and the plain layout on tile32 (wgmma is passed over), int4 on fp32.
# A second pass with MOEPLUG_GPU_FAMILY=fp32 runs the whole file on the fp32 family.
NONE_CASES = [("bf16", "bf16"), ("fp16", "fp16"), ("fp8_per_channel", "fp8_per_token"),
              ("fp8_per_tensor", "fp8_per_tensor"), ("fp8_block128", "fp8_block128"),
              ("fp8_per_channel", "bf16"), ("mxfp4", "bf16"), ("mxfp4", "mxfp4"),
              ("mxfp8", "mxfp8"), ("int4_group32", "bf16"),
              ("int4_per_channel", "fp8_per_token")]


@pytest.mark.parametrize("fmt,act_dtype", NONE_CASES)
@pytest.mark.parametrize("wlayout", ["aiter_16x16", "plain"])
@pytest.mark.parametrize("M", [1, 200])
def test_activation_none(fmt, act_dtype, wlayout, M):
    pad = M == 200  # padded sizes and every option on the larger launch
    H, I = 256, 128
    Hp, Ip = (384, 192) if pad else (H, I)
    in_dtype = torch.float16 if act_dtype == "fp16" else torch.bfloat16
    slayout = default_slayout(fmt, wlayout)
    m = make_up_only(fmt, wlayout, slayout, 8, H, I, Hp, Ip, pad, seed=M + 11)
    out, ref, st = run_moe(fmt, wlayout=wlayout, slayout=slayout, act="none",
                           act_dtype=act_dtype, M=M, H=H, I=I, Hp=Hp, Ip=Ip, bias=pad, rwoi=pad,
                           in_dtype=in_dtype, seed=M + 12, m=m)
    assert_close(out, ref, st=st)
    assert torch.equal(launch(st, "cuda"), out)  # DETERMINISTIC: the same bytes again


# A stage-2 act dtype other than the stage-1 one: every kind of pairing a format allows
# (quantized -> quantized, 16-bit -> quantized, quantized -> 16-bit, bf16 -> fp16). With the
# AITER layout and M = 1 the fp8 -> fp8 pairs run on stream, the others on tile32 (stream
# covers neither stage of them), int4 on fp32.
STAGE2_CASES = [("fp8_per_channel", "fp8_per_token", "fp8_per_tensor"),
                ("fp8_per_tensor", "fp8_per_tensor", "fp8_per_token"),
                ("fp8_per_channel", "bf16", "fp8_per_token"),
                ("fp8_per_tensor", "fp8_per_token", "bf16"),
                ("fp8_block128", "bf16", "fp8_block128"),
                ("fp8_block128", "fp8_block128", "fp16"),
                ("mxfp4", "mxfp4", "mxfp8"), ("mxfp4", "bf16", "mxfp8"),
                ("mxfp4", "mxfp8", "bf16"), ("mxfp4", "bf16", "mxfp4"),
                ("mxfp8", "bf16", "mxfp8"), ("mxfp8", "mxfp8", "fp16"),
                ("bf16", "bf16", "fp16"), ("fp16", "fp16", "bf16"),
                ("int4_group32", "bf16", "fp16"),
                ("int4_per_channel", "fp8_per_token", "bf16")]


def worst_act(a1, a2):
    """The act dtype whose tolerances bound a launch quantizing with both."""
    return max([a1, a2], key=lambda a: TOL_QUANT.get(a, 0.0))


@pytest.mark.parametrize("fmt,act1,act2", STAGE2_CASES)
@pytest.mark.parametrize("M", [1, 200])
def test_stage2_act_dtype(fmt, act1, act2, M):
    in_dtype = torch.float16 if act1 == "fp16" else torch.bfloat16
    out_dtype = torch.float16 if M == 200 else None  # the intermediate's cast meets fp16 too
    out, ref, st = run_moe(fmt, act_dtype=act1, stage2_act_dtype=act2, M=M, H=320, I=160,
                           Hp=384, Ip=192, bias=M == 200, gate=["separated", "interleave"][M % 2],
                           in_dtype=in_dtype, out_dtype=out_dtype, seed=M + 21)
    st["act"] = worst_act(act1, act2)
    assert_close(out, ref, st=st)
    assert torch.equal(launch(st, "cuda"), out)  # DETERMINISTIC: the same bytes again
    # It is used: the launch with one act dtype gives other bytes. Not for a bf16 output into
    # fp16 stage-2 activations: the intermediate is rounded to the output dtype first (as on
    # the CPU), and fp16 holds those bf16 values exactly, so both launches compute the same.
    out_bf16 = (out_dtype or in_dtype) == torch.bfloat16
    if not (out_bf16 and act2 == "fp16"):
        one = dict(st, kw=dict(st["kw"], stage2_act_dtype="default"))
        assert not torch.equal(launch(one, "cuda"), out)


@pytest.mark.parametrize("fmt", ["fp8_per_channel", "fp8_per_tensor"])
def test_stage2_static_scale_with_its_own_act_dtype(fmt):
    # fp8 per token into stage 1, fp8 per tensor with a static scale into stage 2.
    out, ref, st = run_moe(fmt, act_dtype="fp8_per_token", stage2_act_dtype="fp8_per_tensor",
                           M=9, H=256, I=128, seed=31)
    st["act"] = "fp8_per_tensor"
    assert_close(out, ref, st=st)
    scale = dict(stage2_act_scale=torch.tensor([0.05], device="cuda"))
    gpu = launch(st, "cuda", **scale)
    cpu = launch(st, "cpu", **scale)
    assert rel_l2(gpu.cpu(), cpu) <= TOL_CPU
    assert not torch.equal(gpu, out)


def test_none_with_a_stage2_act_dtype():
    m = make_up_only("mxfp4", "aiter_16x16", "aiter_e8m0", 8, 256, 128, 256, 128, True, seed=41)
    out, ref, st = run_moe("mxfp4", slayout="aiter_e8m0", act="none", act_dtype="mxfp4",
                           stage2_act_dtype="mxfp8", M=33, H=256, I=128, bias=True, m=m, seed=42)
    st["act"] = "mxfp4"
    assert_close(out, ref, st=st)


def test_check_claims_none_and_stage2_act_dtype_on_cuda():
    layout = _abi.make_layout("mxfp4", "separated", "aiter_16x16", "aiter_e8m0", 8, 256, 128,
                              256, 128, False)
    lib = _abi.lib()
    for kw in [dict(activation="none"), dict(act_dtype="mxfp4", stage2_act_dtype="mxfp8"),
               dict(act_dtype="bf16", stage2_act_dtype="mxfp4"),
               dict(activation="none", act_dtype="mxfp8", stage2_act_dtype="bf16")]:
        args = _abi.make_args(layout, {}, **kw)
        assert _abi.check_fused_moe(args) == 0, (kw, lib.moeplug_last_error())
        assert _abi.check_fused_moe(args, device_type=1) == 0
    # What no backend takes, with the CPU backend's status and message.
    for kw, status, message in [
        (dict(activation="none", limit=7.0), 1,
         b"moeplug_check_fused_moe: limit: activation none takes no limit, got 7"),
        (dict(act_dtype="bf16", stage2_act_dtype="fp8_per_token"), 2,
         b"moeplug_check_fused_moe: stage2_act_dtype fp8_per_token is not defined for "
         b"weight_format mxfp4 (allowed: bf16, fp16, mxfp4, mxfp8)")]:
        args = _abi.make_args(layout, {}, **kw)
        answers = []
        for dev in [2, 1]:
            answers.append((_abi.check_fused_moe(args, device_type=dev), lib.moeplug_last_error()))
        assert answers[0] == answers[1] == (status, message), answers
    interleaved = _abi.make_layout("mxfp4", "interleave", "aiter_16x16", "aiter_e8m0", 8, 256,
                                   128, 256, 128, False)
    args = _abi.make_args(interleaved, {}, activation="none")
    assert _abi.check_fused_moe(args) == 1
    assert lib.moeplug_last_error().startswith(
        b"moeplug_check_fused_moe: activation none: w13 holds only the up projection, so "
        b"layout.gate_mode must be separated, got interleave")
