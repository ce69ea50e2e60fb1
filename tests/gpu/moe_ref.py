"""Random MoE weights in every storage format moeplug reads, and a float64 torch reference of
the fused MoE math (docs/abi.md §2 and §9, docs/layouts.md §7), written independently of the library.

Weights are generated in their *physical* form (gate mode row order, padding filled with
random values that the kernels must skip), dequantized to float32 (exact for every format:
the kernels dequantize the same way) and mapped back to the logical gate/up/down matrices."""

import math

import torch

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def logical_row_of_physical(gate_mode, Ip):
    """For each physical w13 row, its row in the separated order [gate 0..Ip, up 0..Ip]."""
    p = torch.arange(2 * Ip)
    if gate_mode == "separated":
        return p
    if gate_mode == "interleave":  # 16-row blocks g, u, g, u
        pair, within = p // 32, p % 32
        return (within // 16) * Ip + pair * 16 + within % 16
    if gate_mode == "interleave_rows":  # g0, u0, g1, u1
        return (p % 2) * Ip + p // 2
    raise ValueError(gate_mode)


def f1_shuffle(x, elem_size):
    """LAYOUTS F1 (16,16) on storage elements of `elem_size` bytes: [E, N, K] -> same shape."""
    E, N, K = x.shape
    P = 16 // elem_size
    return x.view(E, N // 16, 16, K // P, P).permute(0, 1, 3, 2, 4).contiguous().view(E, N, K)


def f3_shuffle(s):
    """LAYOUTS F3 on e8m0 bytes [m, n] -> [ceil(m/256)*256, ceil(n/8)*8], padding 0."""
    m, n = s.shape
    SM, SN = -(-m // 256) * 256, -(-n // 8) * 8
    pad = torch.zeros(SM, SN, dtype=torch.uint8, device=s.device)
    pad[:m, :n] = s
    return pad.view(SM // 32, 2, 16, SN // 8, 2, 4).permute(0, 3, 5, 2, 4, 1).contiguous().view(SM, SN)


def cdna4_swizzle(s, E, N):
    """LAYOUTS F5 (triton_kernels CDNA4 MX scale layout): per expert, F3 with the rows padded
    to a multiple of 32 (not 256) and zero padding: [E*N, k] -> [E, ceil(N/32), ceil(k/8)*8*32]."""
    k = s.shape[1]
    N32, SN = -(-N // 32) * 32, -(-k // 8) * 8
    pad = torch.zeros(E, N32, SN, dtype=torch.uint8, device=s.device)
    pad[:, :N, :k] = s.view(E, N, k)
    f3 = pad.view(E, N32 // 32, 2, 16, SN // 8, 2, 4).permute(0, 1, 4, 6, 3, 5, 2)
    return f3.contiguous().view(E, N32 // 32, SN * 32)


def pack_int8_to_packed_int4(v):
    """AITER's pack (aiter/ops/shuffle.py): runs of 8 int4 codes v0..v7 -> 4 bytes
    (v[j+4] << 4) | v[j], j = 0..3. `v` uint8 nibbles [..., K] -> uint8 [..., K/2]."""
    r = v.reshape(-1, 8)
    return (r[:, :4] | (r[:, 4:] << 4)).reshape(*v.shape[:-1], v.shape[-1] // 2)


def shuffle_scale_for_int4(s):
    """AITER's shuffle_scale_for_int4 of [E, G, N] bf16 -> [E, G/2, N, 2]."""
    E, G, N = s.shape
    return s.view(E, G // 2, 2, N).permute(0, 1, 3, 2).contiguous()


def pack_int8_to_a8w4_words(v):
    """AITER's a8w4 int4 words (aiter/int4_utils.py: convert_int8_to_uint32_int4 then
    rearrange_4bit_elements): runs of 8 int4 codes v0..v7 -> one little-endian uint32 with
    value j in nibble [0, 4, 1, 5, 2, 6, 3, 7][j], held as int32 [..., K/8]."""
    r = (v.to(torch.int64) & 15).reshape(-1, 8)
    nib = [0, 4, 1, 5, 2, 6, 3, 7]
    w = sum(r[:, j] << (4 * nib[j]) for j in range(8))
    w = torch.where(w >= 2**31, w - 2**32, w)  # the uint32 bit pattern as int32
    return w.to(torch.int32).reshape(*v.shape[:-1], v.shape[-1] // 8)


def _fp8(shape, device, g):
    return (torch.randn(shape, device=device, generator=g) * 8).to(torch.float8_e4m3fn)


def make_matrix(fmt, wlayout, slayout, E, N, K, device, g):
    """One physical weight matrix [E, N, K] (K logical, N physical rows): storage tensor,
    scale tensor, and the float32 dequantized physical values."""
    std = 1.0 / math.sqrt(K)
    scale = None
    if fmt in ("bf16", "fp16"):
        dt = torch.bfloat16 if fmt == "bf16" else torch.float16
        w = (torch.randn(E, N, K, device=device, generator=g) * std).to(dt)
        deq = w.float()
        store = w.view(torch.int16)
        esize = 2
    elif fmt.startswith("fp8"):
        w = _fp8((E, N, K), device, g)
        base = std / 8
        if fmt == "fp8_per_tensor":
            scale = base * (0.5 + torch.rand(E, device=device, generator=g))
            full = scale.view(E, 1, 1)
        elif fmt == "fp8_per_channel":
            scale = base * (0.5 + torch.rand(E, N, device=device, generator=g))
            full = scale.view(E, N, 1)
        else:
            nb, kb = -(-N // 128), -(-K // 128)
            scale = base * (0.5 + torch.rand(E, nb, kb, device=device, generator=g))
            full = scale.repeat_interleave(128, 1)[:, :N].repeat_interleave(128, 2)[:, :, :K]
        deq = w.float() * full
        store = w.view(torch.uint8)
        esize = 1
    elif fmt in ("mxfp4", "mxfp8"):
        if fmt == "mxfp4":
            store = torch.randint(0, 256, (E, N, K // 2), device=device, generator=g,
                                  dtype=torch.uint8)
            table = torch.tensor(E2M1, device=device)
            codes = torch.stack([store & 15, store >> 4], dim=-1).view(E, N, K).long()
            vals = table[codes]
            b0 = 127 - round(math.log2(3.0 / std))
        else:
            w = _fp8((E, N, K), device, g)
            store = w.view(torch.uint8)
            vals = w.float()
            b0 = 127 - round(math.log2(8.0 / std))
        sbytes = torch.randint(b0 - 1, b0 + 2, (E * N, K // 32), device=device, generator=g,
                               dtype=torch.int32).to(torch.uint8)
        sval = torch.pow(2.0, sbytes.float() - 127).view(E, N, K // 32).repeat_interleave(32, -1)
        deq = vals * sval
        if slayout == "aiter_e8m0":
            scale = f3_shuffle(sbytes)
        elif slayout == "cdna4_swizzle":
            scale = cdna4_swizzle(sbytes, E, N)
        else:
            scale = sbytes
        esize = 1
    elif fmt == "int4_group32":
        # Signed nibbles -8..7 (all 16 codes) times a bf16 scale per 1x32 group along K.
        codes = torch.randint(0, 16, (E, N, K), device=device, generator=g, dtype=torch.uint8)
        vals = ((codes ^ 8).float() - 8)
        sval = (std / 4 * (0.5 + torch.rand(E, N, K // 32, device=device, generator=g)))
        sval = sval.to(torch.bfloat16)
        deq = vals * sval.float().repeat_interleave(32, -1)
        # AITER a16wi4: F1 (16, 16) of the int8-held values, then the pack.
        held = f1_shuffle(codes, 1) if wlayout == "aiter_16x16" else codes
        store = pack_int8_to_packed_int4(held)
        if slayout == "aiter_int4":
            scale = shuffle_scale_for_int4(sval.transpose(1, 2).contiguous())
        else:
            scale = sval
        esize = 1
    elif fmt == "int4_per_channel":
        # Signed nibbles -8..7 (all 16 codes) times an fp32 scale per row (Quark int4-fp8).
        codes = torch.randint(0, 16, (E, N, K), device=device, generator=g, dtype=torch.uint8)
        vals = ((codes ^ 8).float() - 8)
        scale = std / 4 * (0.5 + torch.rand(E, N, 1, device=device, generator=g))
        deq = vals * scale
        # AITER a8w4: F1 (16, 16, use_int4) of the int8-held values (32-value packs), then the
        # uint32 words; as bytes that is F1 over the words' bytes (16-byte packs).
        held = codes
        if wlayout == "aiter_16x16":
            held = codes.view(E, N // 16, 16, K // 32, 32).permute(0, 1, 3, 2, 4).contiguous()
            held = held.view(E, N, K)
        store = pack_int8_to_a8w4_words(held)
        esize = 4
    else:
        raise ValueError(fmt)
    if wlayout == "aiter_16x16" and not fmt.startswith("int4"):
        store = f1_shuffle(store.contiguous(), esize)
    if fmt == "bf16":
        store = store.view(torch.bfloat16)
    elif fmt == "fp16":
        store = store.view(torch.float16)
    elif fmt.startswith("fp8") or fmt == "mxfp8":
        store = store.view(torch.float8_e4m3fn)
    return store.contiguous(), (None if scale is None else scale.contiguous()), deq


def make_moe(fmt, wlayout, slayout, gate_mode, E, H, I, Hp, Ip, bias, device, seed):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    w13, s13, d13 = make_matrix(fmt, wlayout, slayout, E, 2 * Ip, Hp, device, g)
    w2, s2, d2 = make_matrix(fmt, wlayout, slayout, E, Hp, Ip, device, g)
    rows = logical_row_of_physical(gate_mode, Ip).to(device)
    logical13 = torch.empty_like(d13)
    logical13[:, rows] = d13  # physical row p holds logical row rows[p]
    m = dict(w13=w13, w13_scale=s13, w2=w2, w2_scale=s2,
             gate=logical13[:, :I, :H], up=logical13[:, Ip:Ip + I, :H], down=d2[:, :H, :I])
    if bias:
        b13 = torch.randn(E, 2 * Ip, device=device, generator=g) * 0.1
        b2 = torch.randn(E, Hp, device=device, generator=g) * 0.1
        lb = torch.empty_like(b13)
        lb[:, rows] = b13
        m.update(w13_bias=b13, w2_bias=b2, b_gate=lb[:, :I], b_up=lb[:, Ip:Ip + I],
                 b_down=b2[:, :H])
    return m


def activation(g, u, act, alpha, limit):
    if act == "none":  # not gated (ABI 1.1): the up output itself, no limit
        return u
    if act == "swiglu_oai":
        L = 7.0 if limit == 0 else limit
        a = 1.702 if alpha == 0 else alpha
        g = g.clamp(max=L)
        u = u.clamp(-L, L)
        return g * torch.sigmoid(a * g) * (u + 1)
    if limit:
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
    if act == "silu":
        return torch.nn.functional.silu(g) * u
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(g, approximate="tanh") * u
    return torch.nn.functional.gelu(g) * u  # exact erf GELU


def reference(x, topk_w, topk_ids, m, *, act="silu", alpha=0.0, limit=0.0, rwoi=False,
              expert_mask=None, n_local=None, act_dtype=torch.bfloat16, act2_dtype=None):
    """float64 fused MoE; the stage-1 output is rounded to the activation dtype (`act2_dtype`
    if given) before stage 2 (as the CPU reference and AITER's torch reference do). A layer
    without "gate" (activation "none") has only the up projection."""
    M, k = topk_ids.shape
    E, I, H = m["up"].shape
    n_local = M if n_local is None else max(0, min(int(n_local), M))
    ids = topk_ids.long()
    if expert_mask is not None:
        local_of = torch.cumsum(expert_mask.long(), 0) - 1
        local_of[expert_mask == 0] = -1
        ok = (ids >= 0) & (ids < expert_mask.numel())
        lid = torch.where(ok, local_of[ids.clamp(0, expert_mask.numel() - 1)], -1)
    else:
        lid = torch.where((ids >= 0) & (ids < E), ids, -1)
    lid[lid >= E] = -1
    lid[n_local:] = -1
    xr = x[:, :H].to(act_dtype).double()
    out = torch.zeros(M, H, dtype=torch.float64, device=x.device)
    for e in torch.unique(lid[lid >= 0]).tolist():
        t, s = (lid == e).nonzero(as_tuple=True)
        w = topk_w[t, s].double().unsqueeze(1)
        hu = xr[t] @ m["up"][e].double().T
        hg = xr[t] @ m["gate"][e].double().T if "gate" in m else torch.zeros_like(hu)
        if rwoi:
            hg, hu = hg * w, hu * w
        if "b_gate" in m:
            hg = hg + m["b_gate"][e].double()
        if "b_up" in m:
            hu = hu + m["b_up"][e].double()
        a = activation(hg, hu, act, alpha, limit).to(act2_dtype or act_dtype).double()
        y = a @ m["down"][e].double().T
        if "b_down" in m:
            y = y + m["b_down"][e].double()
        if not rwoi:
            y = y * w
        out.index_add_(0, t, y)
    return out


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
