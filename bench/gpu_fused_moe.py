"""Time moeplug fused_moe on the GPU for the real model shapes: CUDA events, warm-up, median
of many runs, rotating weight sets so they do not sit in L2. Prints a table and writes JSON.

Floor = max(bytes that must move / 4.3 TB/s, FLOPs / 790 TFLOP/s) (DEVICE.md's measured
ceilings). Bytes = weights of the experts actually hit + activations in and out."""

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
import _abi  # noqa: E402
from moe_ref import make_moe  # noqa: E402

BW, PEAK = 4.3e12, 790e12
# Activation dtype of every run: "default" = each format's DEFAULT (docs/abi.md §2: FP8_PER_TOKEN,
# FP8_BLOCK128, MXFP8 quantize; MXFP4 and 16-bit formats run bf16).
ACT = os.environ.get("BENCH_ACT", "default")
MODELS = {  # E trimmed for memory; H, I, k real
    "gpt-oss-120b": dict(E=32, k=4, H=2880, I=2880, Hp=3072, Ip=3072, act="swiglu_oai", bias=True),
    "deepseek-v3": dict(E=64, k=8, H=7168, I=2048, Hp=7168, Ip=2048, act="silu", bias=False),
    "qwen3-30b-a3b": dict(E=128, k=8, H=2048, I=768, Hp=2048, Ip=768, act="silu", bias=False),
}
RUNS = [("gpt-oss-120b", "mxfp4"), ("gpt-oss-120b", "bf16"),
        ("deepseek-v3", "fp8_block128"), ("deepseek-v3", "mxfp8"), ("deepseek-v3", "bf16"),
        ("qwen3-30b-a3b", "bf16"), ("qwen3-30b-a3b", "fp8_per_channel"),
        ("qwen3-30b-a3b", "fp8_per_tensor"), ("qwen3-30b-a3b", "fp16")]
BYTES_PER_W = {"bf16": 2, "fp16": 2, "mxfp4": 0.5 + 1 / 32, "mxfp8": 1 + 1 / 32,
               "fp8_per_tensor": 1, "fp8_per_channel": 1, "fp8_block128": 1}


def bench(model, fmt, M, sets, iters):
    c = MODELS[model]
    E, k, H, I = c["E"], c["k"], c["H"], c["I"]
    g = torch.Generator(device="cuda")
    g.manual_seed(M)
    x = torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, device="cuda", generator=g)[:k] for _ in range(M)]).int()
    w = torch.rand(M, k, device="cuda", generator=g)
    out = torch.empty(M, H, device="cuda", dtype=torch.bfloat16)
    slay = "aiter_e8m0" if fmt.startswith("mx") else "none"
    lay = _abi.make_layout(fmt, "separated", "aiter_16x16", slay, E, H, I, c["Hp"], c["Ip"], c["bias"])
    argsets = []
    for m in sets:
        t = dict(hidden_states=x, w13=m["w13"], w13_scale=m["w13_scale"], w2=m["w2"],
                 w2_scale=m["w2_scale"], w13_bias=m.get("w13_bias"), w2_bias=m.get("w2_bias"),
                 topk_weights=w, topk_ids=ids, output=out)
        kw = dict(activation=c["act"], act_dtype=ACT,
                  stream=torch.cuda.current_stream().cuda_stream)
        a = _abi.make_args(lay, t, **kw)
        t["workspace"] = torch.empty(_abi.workspace_size(a), dtype=torch.uint8, device="cuda")
        argsets.append(_abi.make_args(lay, t, **kw))
    for a in argsets:  # warm-up (compile, caches)
        _abi.fused_moe(a)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        _abi.fused_moe(argsets[i % len(argsets)])
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    hit = torch.unique(ids).numel()
    wbytes = hit * (2 * I * H + H * I) * BYTES_PER_W[fmt]
    flops = 2 * M * k * (2 * I * H + I * H)
    floor = max((wbytes + M * H * 4) / BW, flops / PEAK)
    t = statistics.median(times)
    return dict(model=model, fmt=fmt, act_dtype=ACT, M=M, median_s=t, floor_s=floor, ratio=t / floor,
                experts_hit=hit, tflops=flops / t / 1e12, gbps=(wbytes + M * H * 4) / t / 1e9)


def main():
    ms = [int(v) for v in os.environ.get("BENCH_M", "1,64,4096").split(",")]
    # BENCH_RUNS="model:format,..." picks some of the runs (all by default).
    picked = os.environ.get("BENCH_RUNS")
    runs = [tuple(r.split(":")) for r in picked.split(",")] if picked else RUNS
    rows = []
    # BENCH_E="model=E,..." overrides the trimmed expert counts (e.g. the real ones for ncu).
    for spec in filter(None, os.environ.get("BENCH_E", "").split(",")):
        name, e = spec.split("=")
        MODELS[name]["E"] = int(e)
    for model, fmt in runs:
        c = MODELS[model]
        nsets = int(os.environ.get("BENCH_SETS", 3))
        sets = [make_moe(fmt, "aiter_16x16", "aiter_e8m0" if fmt.startswith("mx") else "none",
                         "separated", c["E"], c["H"], c["I"], c["Hp"], c["Ip"], c["bias"], "cuda", s)
                for s in range(nsets)]
        for m in sets:  # the reference-side copies are not needed here
            for key in ["gate", "up", "down"]:
                m.pop(key)
        torch.cuda.empty_cache()
        for M in ms:
            iters = int(os.environ.get("BENCH_ITERS", 20 if M < 1000 else 5))
            r = bench(model, fmt, M, sets, iters)
            rows.append(r)
            print(f"{model:14s} {fmt:16s} M={M:5d} {r['median_s']*1e3:9.3f} ms  floor "
                  f"{r['floor_s']*1e3:8.3f} ms  x{r['ratio']:7.1f}  {r['tflops']:6.1f} TFLOP/s "
                  f"{r['gbps']:7.0f} GB/s", flush=True)
        del sets
        torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        Path(out, "bench_gpu.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
