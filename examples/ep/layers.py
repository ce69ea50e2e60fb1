"""The MoE layers the example runs and their deterministic checkpoints and batches.

Every rank regenerates the same checkpoint from the seed (expert by expert, so a rank builds
only the experts it holds) and its own batch; rank 0 regenerates every rank's batch for the
single-process reference, so no input ever travels for the check.

Weights are random quantized codes, made directly in the checkpoint's storage (packed e2m1
bytes with e8m0 scales, e4m3fn bytes with fp32 block scales): no float64 weights or
quantizer are needed, and the bytes are the same on every device and torch version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layer:
    name: str
    weight_format: str  # "mxfp4" | "fp8_block128"
    num_experts: int  # E (global)
    topk: int
    hidden: int  # H
    inter: int  # I
    activation: str
    gate_mode_in: str
    bias: bool


# Small shapes for the CPU (gloo) check: the real formats, gate modes and activations; H and
# I of the MXFP4 layer are not multiples of 256, so preparation pads them (the launch must
# skip the pad).
CPU_LAYERS = [
    Layer("gpt-oss-like", "mxfp4", 16, 4, 224, 160, "swiglu_oai", "interleave_rows", True),
    Layer("deepseek-like", "fp8_block128", 32, 8, 256, 128, "silu", "separated", False),
]
# The real shapes (all experts of the layer; H, I, k as in the checkpoints).
GPU_LAYERS = [
    Layer("gpt-oss-120b", "mxfp4", 128, 4, 2880, 2880, "swiglu_oai", "interleave_rows", True),
    Layer("deepseek-v3", "fp8_block128", 256, 8, 7168, 2048, "silu", "separated", False),
]


def _generator(device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _mx_weight(n, k, device, g):
    """Packed e2m1 codes [n, k/2] (every code is finite) and e8m0 scales [n, k/32] sized so
    that a dot product over k stays O(1)."""
    codes = torch.randint(0, 256, (n, k // 2), generator=g, device=device, dtype=torch.uint8)
    base = 127 - round(math.log2(math.sqrt(k)) + 1)
    scale = torch.randint(base - 1, base + 2, (n, k // 32), generator=g, device=device, dtype=torch.uint8)
    return codes, scale


def _fp8_weight(n, k, device, g):
    """e4m3fn bytes [n, k] with exponents 3..9 (|w| in [2^-4, 3.75], never NaN) and fp32
    128x128 block scales [⌈n/128⌉, ⌈k/128⌉] of about 1/√k."""
    sign = torch.randint(0, 2, (n, k), generator=g, device=device, dtype=torch.uint8) << 7
    exp = torch.randint(3, 10, (n, k), generator=g, device=device, dtype=torch.uint8) << 3
    mant = torch.randint(0, 8, (n, k), generator=g, device=device, dtype=torch.uint8)
    scale = torch.rand((-(-n // 128), -(-k // 128)), generator=g, device=device) + 0.5
    return sign | exp | mant, scale / math.sqrt(k)


def expert_weights(layer: Layer, lo: int, hi: int, device, seed: int) -> dict:
    """Checkpoint tensors of experts [lo, hi): w13 [E, 2I, ·] (gate/up rows as
    `layer.gate_mode_in`), w2 [E, H, ·], their scales and biases, ready for prepare_moe."""
    parts = []
    for e in range(lo, hi):
        g = _generator(device, seed * 100_003 + e)
        make = _mx_weight if layer.weight_format == "mxfp4" else _fp8_weight
        w13, s13 = make(2 * layer.inter, layer.hidden, device, g)
        w2, s2 = make(layer.hidden, layer.inter, device, g)
        p = dict(w13=w13, w13_scale=s13, w2=w2, w2_scale=s2)
        if layer.bias:
            p["w13_bias"] = torch.randn(2 * layer.inter, generator=g, device=device) * 0.1
            p["w2_bias"] = torch.randn(layer.hidden, generator=g, device=device) * 0.1
        parts.append(p)
    return {name: torch.stack([p[name] for p in parts]).contiguous() for name in parts[0]}


@dataclass
class Batch:
    """One rank's tokens: `x` [M, H] bf16, `topk_ids` [M, k] int32 global ids, `topk_weights`
    [M, k] fp32. Rows >= `m` are padding: x zero, every id the sentinel E."""

    x: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    m: int


def batch(layer: Layer, rank: int, world: int, capacity: int, m: int, device, seed: int, owners) -> Batch:
    """Rank `rank`'s batch of `m` real tokens in a buffer of `capacity` rows. Every third token
    picks all its experts on one rank (when a rank holds at least k experts), so the check
    sees tokens served by one rank as well as by several."""
    E, k, H = layer.num_experts, layer.topk, layer.hidden
    g = _generator(device, seed * 7919 + rank)
    x = torch.zeros(capacity, H, device=device, dtype=torch.bfloat16)
    x[:m] = torch.randn(m, H, generator=g, device=device).to(torch.bfloat16)
    scores = torch.rand(capacity, E, generator=g, device=device)
    for t in range(0, m, 3):
        lo, hi = owners.range_of((t // 3 + rank) % world)
        if hi - lo >= k:
            scores[t, :lo] -= 2.0
            scores[t, hi:] -= 2.0
    ids = scores.topk(k, dim=1).indices.to(torch.int32)
    ids[m:] = E  # the sentinel: padding rows route nowhere
    w = torch.rand(capacity, k, generator=g, device=device) + 0.1
    w = (w / w.sum(1, keepdim=True)).contiguous()
    return Batch(x.contiguous(), ids.contiguous(), w, m)
