"""The ABI 1.1 launch options (issue 11) on a CUDA GPU: GELU_TANH against the float64 reference
and the CPU backend, static per-tensor activation scales, pre-quantized hidden_states (the
same output bytes as the launch that quantizes the same input itself, on the GPU as on the
CPU), and the options the CUDA backend refuses (NONE, a separate stage-2 act dtype)."""

import pytest

torch = pytest.importorskip("torch")

import _abi  # noqa: E402
from test_fused_moe import TOL_CPU, assert_close, run_moe  # noqa: E402
from moe_ref import rel_l2  # noqa: E402

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


def test_none_and_stage2_act_dtype_are_unsupported_on_cuda():
    layout = _abi.make_layout("mxfp4", "separated", "aiter_16x16", "aiter_e8m0", 8, 256, 128,
                              256, 128, False)
    args = _abi.make_args(layout, {}, activation="none")
    assert _abi.check_fused_moe(args) == 2
    assert b"activation none is not supported by the cuda backend" in _abi.lib().moeplug_last_error()
    assert _abi.check_fused_moe(args, device_type=1) == 0
    args = _abi.make_args(layout, {}, act_dtype="mxfp4", stage2_act_dtype="mxfp8")
    assert _abi.check_fused_moe(args) == 2
    assert b"stage2_act_dtype" in _abi.lib().moeplug_last_error()
    assert _abi.check_fused_moe(args, device_type=1) == 0
    # The same dtype spelled out is not a second dtype.
    args = _abi.make_args(layout, {}, act_dtype="mxfp4", stage2_act_dtype="mxfp4")
    assert _abi.check_fused_moe(args) == 0
