"""Device tensors in every prep call (issue 5): the output of a call on CUDA tensors must be
byte-identical to the same library's output for the same inputs on the CPU. Outputs are
poisoned (0xAB) before each device call so that unwritten bytes show. Skipped cleanly without
torch, a GPU or the library (conftest.py)."""

import ctypes
import random
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
np = pytest.importorskip("numpy")
moeplug = pytest.importorskip("moeplug")
from moeplug import _abi as mabi  # noqa: E402
from moeplug._tensor import describe, ptr  # noqa: E402

DEV = "cuda"
POISON = 0xAB


def lib():
    return moeplug._library()


def rbytes(shape, gen, dtype=torch.uint8, device="cpu"):
    """Random bytes, never 0 (so a zero that should be data cannot pass for padding)."""
    n = 1
    for s in shape:
        n *= s
    size = torch.empty((), dtype=dtype).element_size()
    b = torch.randint(1, 256, (n * size,), generator=gen, dtype=torch.uint8)
    return b.view(dtype).reshape(shape).to(device)


def poisoned(shape, dtype):
    t = torch.empty(shape, dtype=dtype, device=DEV)
    t.view(torch.uint8).fill_(POISON)
    return t


def as_bytes(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.uint8)


def assert_same(dev, host, what):
    torch.cuda.synchronize()
    d, h = as_bytes(dev).flatten(), as_bytes(host).flatten()
    assert d.shape == h.shape, f"{what}: {d.shape} vs {h.shape}"
    bad = (d != h).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.numel()} of {d.numel()} bytes differ, first at {bad[0].item()}: "
        f"device {d[bad[0]].item():#x}, host {h[bad[0]].item():#x}")


def stream_of(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


# ----------------------------------------------------------------------------------------
# shuffle_weight


def shuffle_cases():
    rng = random.Random(5)
    cases = []
    for dtype in [torch.bfloat16, torch.float16, torch.uint8, torch.float8_e4m3fn, torch.int8]:
        es = torch.empty((), dtype=dtype).element_size()
        for _ in range(6):
            gui = rng.random() < 0.35
            if gui:
                ln, lk = rng.choice([4, 8, 16, 32]), rng.choice([8, 16, 32])
                gate_up = rng.random() < 0.5
                n = 2 * ln * rng.randint(1, 4)
                k = (64 // ln) * lk * rng.randint(1, 3)
                p = dict(layout_n=ln, layout_k=lk, is_guinterleave=True, gate_up=gate_up)
                shape = (rng.randint(1, 3), n, k)
            else:
                use_int4 = es == 1 and dtype == torch.int8 and rng.random() < 0.5
                ln = rng.choice([16, 32])
                pad = 0 if use_int4 else rng.choice([0, 0, 96, 256])
                k = 32 * rng.randint(1, 6) + (32 if pad else 0)
                kp = -(-k // pad) * pad if pad else k
                if kp % 32:
                    continue
                p = dict(layout_n=ln, layout_k=16, use_int4=use_int4, pad_k_to=pad)
                lead = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 2)))
                shape = lead + (ln * rng.randint(1, 4), k)
            cases.append((dtype, shape, p))
    return cases


@pytest.mark.parametrize("dtype,shape,params", shuffle_cases())
def test_shuffle_weight(dtype, shape, params):
    gen = torch.Generator().manual_seed(hash((str(dtype), shape)) & 0xFFFF)
    src = rbytes(shape, gen, dtype)
    host = moeplug.shuffle_weight(src, **params)
    dst = poisoned(tuple(host.shape), dtype)
    moeplug.shuffle_weight(src.to(DEV), out=dst, **params)
    assert_same(dst, host, f"shuffle_weight {shape} {params}")


# ----------------------------------------------------------------------------------------
# shuffle_scale, swizzle_scale


@pytest.mark.parametrize("seed", range(8))
def test_shuffle_scale(seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    m, n = rng.randint(1, 700), rng.randint(1, 40)
    dtype = rng.choice([torch.uint8, torch.float8_e8m0fnu])
    src = rbytes((m, n), gen, dtype)
    host = moeplug.shuffle_scale(src)
    dst = poisoned(tuple(host.shape), dtype)
    moeplug.shuffle_scale(src.to(DEV), out=dst)
    assert_same(dst, host, f"F3 {m}x{n}")

    ne, per = rng.randint(1, 4), 32 * rng.randint(1, 3)
    gate_up = bool(seed % 2)
    src = rbytes((ne * per, n), gen, dtype)
    host = moeplug.shuffle_scale(src, num_experts=ne, is_guinterleave=True, gate_up=gate_up)
    dst = poisoned(tuple(host.shape), dtype)
    moeplug.shuffle_scale(src.to(DEV), num_experts=ne, is_guinterleave=True, gate_up=gate_up, out=dst)
    assert_same(dst, host, f"F4 {ne}x{per}x{n} gate_up={gate_up}")

    src = torch.randn((m, n), generator=gen)
    dst = poisoned((m, n), torch.float32)
    moeplug.shuffle_scale(src.to(DEV), out=dst)
    assert_same(dst, src, "fp32 copy-through")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("layout", ["cdna4_swizzle", "aiter_e8m0"])
def test_swizzle_scale(seed, layout):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    e, n, ks = rng.randint(1, 3), rng.randint(1, 100), rng.randint(1, 24)
    src = rbytes((e, n, ks), gen)
    if layout == "aiter_e8m0":
        shape = (-(-e * n // 256) * 256, -(-ks // 8) * 8)
        host = torch.empty(shape, dtype=torch.uint8)
        moeplug.swizzle_scale(src, layout=layout, out=host)
    else:
        host = moeplug.swizzle_scale(src, layout=layout)
    dst = poisoned(tuple(host.shape), torch.uint8)
    moeplug.swizzle_scale(src.to(DEV), layout=layout, out=dst)
    assert_same(dst, host, f"swizzle {layout} {e}x{n}x{ks}")


# ----------------------------------------------------------------------------------------
# pad_weights


PAD_FILLS = {torch.bfloat16: [0, 1.5, -2.0], torch.float16: [0, 3.0], torch.float32: [0, -0.25],
             torch.uint8: [0, 7], torch.float8_e4m3fn: [0, 1.0], torch.int32: [0, -5]}


@pytest.mark.parametrize("dtype", list(PAD_FILLS))
@pytest.mark.parametrize("seed", range(3))
def test_pad_weights(dtype, seed):
    rng = random.Random(seed * 31 + hash(str(dtype)) % 97)
    gen = torch.Generator().manual_seed(seed)
    for fill in PAD_FILLS[dtype]:
        gate_up = rng.random() < 0.5
        e, n, k = rng.randint(1, 3), 2 * rng.randint(1, 20), rng.randint(1, 40)
        n2, k2 = n + 2 * rng.randint(0, 6), k + rng.randint(0, 9)
        two_d = dtype == torch.float32 and rng.random() < 0.5
        shape = (e, n) if two_d else (e, n, k)
        src = rbytes(shape, gen, dtype) if dtype != torch.float32 else torch.randn(shape, generator=gen)
        host = moeplug.pad_weights(src, rows=n2, cols=k2, gate_up=gate_up, fill=fill)
        dst = poisoned(tuple(host.shape), dtype)
        moeplug.pad_weights(src.to(DEV), rows=n2, cols=k2, gate_up=gate_up, fill=fill, out=dst)
        assert_same(dst, host, f"pad {shape} -> {tuple(host.shape)} gate_up={gate_up} fill={fill}")


# ----------------------------------------------------------------------------------------
# quantize_mx


FORMATS = {"mxfp4": (6, torch.uint8, 2), "mxfp8": (7, torch.float8_e4m3fn, 1),
           "mxfp8_fnuz": (7, torch.float8_e4m3fnuz, 1)}


def quant_input(rows, k, dtype, gen):
    """Golden-like values: gaussian times per-block magnitudes over a wide range, plus the
    special values the encoders treat specially (NaN of both signs, infinities, -0.0,
    subnormals, exact ties) sprinkled in."""
    x = torch.randn((rows, k), generator=gen, dtype=torch.float32)
    mag = torch.exp2(torch.randint(-30, 30, (rows, k // 32, 1), generator=gen).float())
    x = (x.view(rows, k // 32, 32) * mag).view(rows, k)
    flat = x.view(-1)
    n = flat.numel()
    idx = torch.randint(0, n, (max(n // 50, 8),), generator=gen)
    specials = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0, 0.0,
                             1e-40, -3e-39, 0.25, 0.75, 5.0, 448.0, 480.0, 1.0625, 65504.0,
                             1e38, -1e38, 3.4e38], dtype=torch.float32)
    flat[idx] = specials[torch.randint(0, len(specials), idx.shape, generator=gen)]
    # One block all zeros, one all equal: still "never all zeros" overall.
    if rows * k >= 64:
        flat[:32] = 0.0
        flat[32:64] = 1.5
    return x.to(dtype)


def quantize_raw(x, q, s, fmt, mode, shuffled):
    code = FORMATS[fmt][0]
    dx, dq, ds = describe(x, "src"), describe(q, "dst_q", writable=True), describe(s, "dst_scale", writable=True)
    args = mabi.QuantizeMxArgs(src=ptr(dx), dst_q=ptr(dq), dst_scale=ptr(ds), format=code,
                               round_mode=mode, shuffle_scale=int(shuffled))
    st = lib().moeplug_quantize_mx(ctypes.byref(args), stream_of(x))
    return st, (lib().moeplug_last_error().decode() if st else "")


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", [1, 2, 3, 4])
def test_quantize_mx(fmt, src_dtype, mode):
    gen = torch.Generator().manual_seed(mode * 7 + len(fmt))
    _, qdtype, per = FORMATS[fmt]
    for rows, k, shuffled in [(37, 96, False), (300, 64, True), (5, 32, True), (1024, 256, False)]:
        x = quant_input(rows, k, src_dtype, gen)
        qshape, sshape = (rows, k // per), (rows, k // 32)
        if shuffled:
            sshape = (-(-rows // 256) * 256, -(-(k // 32) // 8) * 8)
        qh, sh = torch.empty(qshape, dtype=qdtype), torch.empty(sshape, dtype=torch.uint8)
        st, msg = quantize_raw(x, qh, sh, fmt, mode, shuffled)
        assert st == 0, msg
        qd, sd = poisoned(qshape, qdtype), poisoned(sshape, torch.uint8)
        st, msg = quantize_raw(x.to(DEV), qd, sd, fmt, mode, shuffled)
        assert st == 0, msg
        what = f"{fmt} {src_dtype} mode {mode} [{rows}, {k}] shuffled={shuffled}"
        assert_same(sd, sh, what + " scales")
        assert_same(qd, qh, what + " values")


# ----------------------------------------------------------------------------------------
# prepare_moe


WFMT = {"bf16": (1, torch.bfloat16), "fp16": (2, torch.float16), "fp8_per_tensor": (3, torch.float8_e4m3fn),
        "fp8_per_channel": (4, torch.float8_e4m3fn), "fp8_block128": (5, torch.float8_e4m3fn),
        "mxfp4": (6, torch.uint8), "mxfp8": (7, torch.float8_e4m3fn),
        # packed uint8 int4 (AITER's pack order): Tile steps, run on the device too
        "int4_group32": (8, torch.uint8),
        # int4 per channel as AITER's uint32 words (int32 in torch): Tile steps as well
        "int4_per_channel": (9, torch.int32)}


def checkpoint(fmt, e, h, i, bias, gen):
    _, wd = WFMT[fmt]
    vpe = {"mxfp4": 2, "int4_group32": 2, "int4_per_channel": 8}.get(fmt, 1)
    t = dict(w13=rbytes((e, 2 * i, h // vpe), gen, wd), w2=rbytes((e, h, i // vpe), gen, wd))
    if fmt in ("mxfp4", "mxfp8"):
        t["w13_scale"] = rbytes((e, 2 * i, h // 32), gen)
        t["w2_scale"] = rbytes((e * h, i // 32), gen)
    elif fmt == "int4_group32":  # bf16 group scales, row-major [E, N, K/32]
        t["w13_scale"] = rbytes((e, 2 * i, h // 32), gen, torch.bfloat16)
        t["w2_scale"] = rbytes((e * h, i // 32), gen, torch.bfloat16)
    elif fmt == "fp8_per_tensor":
        t["w13_scale"], t["w2_scale"] = torch.rand((e,), generator=gen) + 0.5, torch.rand((e, 1), generator=gen) + 0.5
    elif fmt in ("fp8_per_channel", "int4_per_channel"):
        t["w13_scale"], t["w2_scale"] = torch.rand((e, 2 * i), generator=gen) + 0.5, torch.rand((e, h, 1), generator=gen) + 0.5
    elif fmt == "fp8_block128":
        t["w13_scale"] = torch.rand((e, 2 * i // 128, -(-h // 128)), generator=gen) + 0.5
        t["w2_scale"] = torch.rand((e, -(-h // 128), i // 128), generator=gen) + 0.5
    if bias:
        t["w13_bias"], t["w2_bias"] = torch.randn((e, 2 * i), generator=gen), torch.randn((e, h), generator=gen)
    return t


def prepare_raw(fmt, gate_mode, tensors, device, target, align=(0, 0)):
    """moeplug_prepare_moe with caller outputs (poisoned on the device); `device` None keeps
    the inputs where they are (outputs on the CPU). Returns (status, message, outputs, layout)."""
    keep = []
    args = mabi.PrepareMoeArgs(weight_format=WFMT[fmt][0], gate_mode_in=gate_mode, device_type=target,
                               device_id=0, hidden_align=align[0], intermediate_align=align[1])
    for k, v in tensors.items():
        d = describe(v.to(device) if v is not None and device else v, k)
        keep.append(d)
        setattr(args, k, ptr(d))
    sizes = mabi.PrepareMoeSizes()
    st = lib().moeplug_prepare_moe_sizes(ctypes.byref(args), ctypes.byref(sizes))
    assert st == 0, lib().moeplug_last_error().decode()
    outs = {}
    for name in mabi.PREPARED_OUTPUTS:
        ndim = getattr(sizes, name + "_ndim")
        if ndim == 0:
            continue
        shape = tuple(getattr(sizes, name + "_shape")[:ndim])
        dtype = tensors[name].dtype
        if fmt == "int4_per_channel" and name in ("w13", "w2") and dtype == torch.int8:
            dtype = WFMT[fmt][1]  # int8-held values in, uint32 words (int32 in torch) out
        outs[name] = poisoned(shape, dtype) if device == DEV else torch.empty(shape, dtype=dtype)
        d = describe(outs[name], "out_" + name, writable=True)
        keep.append(d)
        setattr(args, "out_" + name, ptr(d))
    layout = mabi.Layout()
    args.out_layout = ctypes.pointer(layout)
    stream = torch.cuda.current_stream().cuda_stream if device == DEV else None
    st = lib().moeplug_prepare_moe(ctypes.byref(args), stream)
    return st, (lib().moeplug_last_error().decode() if st else ""), outs, layout


def prepare_cases():
    rng = random.Random(9)
    cases = []
    for fmt in WFMT:
        for gm in [1, 2, 3]:
            if fmt == "fp8_block128" and gm != 1:
                continue
            unit = 128 if fmt == "fp8_block128" else 32
            e, h, i = rng.randint(1, 3), unit * rng.randint(1, 4), unit * rng.randint(1, 3)
            align = rng.choice([(0, 0), (64, 96), (256, 256)])
            cases.append((fmt, gm, e, h, i, rng.random() < 0.5, align))
    return cases


@pytest.mark.parametrize("fmt,gate_mode,e,h,i,bias,align", prepare_cases())
def test_prepare_moe(fmt, gate_mode, e, h, i, bias, align):
    gen = torch.Generator().manual_seed(e * 1000 + h + i)
    t = checkpoint(fmt, e, h, i, bias, gen)
    st, msg, host, lh = prepare_raw(fmt, gate_mode, t, "cpu", 1, align)
    assert st == 0, msg
    st, msg, dev, ld = prepare_raw(fmt, gate_mode, t, DEV, 2, align)
    assert st == 0, msg
    assert bytes(lh) == bytes(ld)
    assert set(host) == set(dev)
    for name in host:
        assert_same(dev[name], host[name], f"prepare {fmt} gate_mode {gate_mode} {name}")


# ----------------------------------------------------------------------------------------
# Streams, graphs, errors, caps


def test_caps_report_device_prep():
    assert "device_prep" in moeplug.get_caps("cuda:0").features


def test_side_stream_and_graph_capture():
    gen = torch.Generator().manual_seed(3)
    src = rbytes((4, 64, 256), gen, torch.bfloat16)
    host = moeplug.shuffle_weight(src)
    d_src = src.to(DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    dst = poisoned(tuple(host.shape), torch.bfloat16)
    with torch.cuda.stream(s):
        moeplug.shuffle_weight(d_src, out=dst)
    s.synchronize()
    assert_same(dst, host, "side stream")

    x = quant_input(64, 128, torch.bfloat16, gen).to(DEV)
    qh, sh = moeplug.quantize_mx(x.cpu(), fmt="mxfp4", shuffle_scale=True)
    out = poisoned(tuple(host.shape), torch.bfloat16)
    q, sc = poisoned(tuple(qh.shape), torch.uint8), poisoned(tuple(sh.shape), torch.uint8)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        moeplug.shuffle_weight(d_src, out=out)
        st, msg = quantize_raw(x, q, sc, "mxfp4", 2, True)
        assert st == 0, msg
    for t in (out, q, sc):
        t.view(torch.uint8).fill_(POISON)
    g.replay()
    torch.cuda.synchronize()
    assert_same(out, host, "graph replay: shuffle_weight")
    assert_same(q, qh, "graph replay: quantize_mx values")
    assert_same(sc, sh, "graph replay: quantize_mx scales")


def test_mixed_devices_are_invalid_argument():
    gen = torch.Generator().manual_seed(4)
    src = rbytes((32, 64), gen)
    with pytest.raises(moeplug.MoeplugError) as e:
        moeplug.shuffle_weight(src.to(DEV), out=torch.empty((32, 64), dtype=torch.uint8))
    assert e.value.status == 1 and "dst" in str(e.value) and "cuda:0" in str(e.value)
    with pytest.raises(moeplug.MoeplugError) as e:
        moeplug.shuffle_weight(src, out=torch.empty((32, 64), dtype=torch.uint8, device=DEV))
    assert e.value.status == 1 and "dst" in str(e.value)
    x = torch.randn((4, 64))
    q, s = torch.empty((4, 32), dtype=torch.uint8, device=DEV), torch.empty((4, 2), dtype=torch.uint8)
    st, msg = quantize_raw(x.to(DEV), q, s, "mxfp4", 2, False)
    assert st == 1 and "dst_scale: expected device cuda:0" in msg, msg
    t = checkpoint("bf16", 1, 64, 64, True, gen)
    t["w2_bias"] = t["w2_bias"].to(DEV)
    st, msg, _, _ = prepare_raw("bf16", 1, t, None, 1)
    assert st == 1 and "w2_bias" in msg, msg


def test_validation_errors_match_the_host():
    """The same bad arguments give the same status and message on host and device."""
    gen = torch.Generator().manual_seed(6)
    src = rbytes((2, 48, 64), gen, torch.bfloat16)
    msgs = []
    for dev in ["cpu", DEV]:
        out = torch.empty((2, 48, 64), dtype=torch.bfloat16, device=dev)
        with pytest.raises(moeplug.MoeplugError) as e:
            moeplug.shuffle_weight(src.to(dev), layout_n=32, out=out)
        msgs.append((e.value.status, str(e.value)))
        with pytest.raises(moeplug.MoeplugError) as e:
            moeplug.pad_weights(src.to(dev), rows=40, cols=64, out=torch.empty((2, 40, 64), dtype=torch.bfloat16, device=dev))
        msgs.append((e.value.status, str(e.value)))
    assert msgs[:2] == msgs[2:], msgs


def test_int8_held_int4_is_packed_on_the_host_only():
    gen = torch.Generator().manual_seed(3)
    e, h, i = 1, 64, 64
    t = dict(w13=torch.randint(-8, 8, (e, 2 * i, h), generator=gen, dtype=torch.int8),
             w2=torch.randint(-8, 8, (e, h, i), generator=gen, dtype=torch.int8),
             w13_scale=rbytes((e, 2 * i, h // 32), gen, torch.bfloat16),
             w2_scale=rbytes((e, h, i // 32), gen, torch.bfloat16))
    st, msg, _, _ = prepare_raw("int4_group32", 1, t, DEV, 2)
    assert mabi.STATUS_NAMES[st] == "MOEPLUG_UNSUPPORTED"
    assert msg == ("moeplug_prepare_moe: w13: int8-held int4 weights are packed on the host only; "
                   "pass host tensors, or packed uint8 weights (AITER's pack_int8_to_packed_int4 "
                   "order) on the device, got cuda tensors")
    t["w13_scale"] = torch.rand((e, 2 * i, 1), generator=gen)
    t["w2_scale"] = torch.rand((e, h, 1), generator=gen)
    st, msg, _, _ = prepare_raw("int4_per_channel", 1, t, DEV, 2)
    assert mabi.STATUS_NAMES[st] == "MOEPLUG_UNSUPPORTED"
    assert msg == ("moeplug_prepare_moe: w13: int8-held int4 weights are packed on the host only; "
                   "pass host tensors, or packed uint32 words (AITER's a8w4 int4 order) on the "
                   "device, got cuda tensors")
