"""Run the expert-parallel example: check it against a single-process run of the whole layer
and, on GPUs, time it.

    # CPU, gloo, 2 processes (what the test suite runs):
    python examples/ep/run.py --backend gloo --world 2
    # GPUs, NCCL, one process per GPU, check + timing table (README.md):
    python examples/ep/run.py --backend nccl --world 8 --bench --json bench/ep.json

Under torchrun (RANK / WORLD_SIZE set) it runs as the launched rank instead of spawning.

The check, on rank 0, for every layer, path and token count:
- exact: the EP output equals, bit for bit, the whole layer (all experts prepared in one
  process, no mask) run once per rank with the other ranks' experts replaced by the sentinel,
  the R partial outputs added by the same `combine_partials`: dispatch, local preparation,
  the mask and num_local_tokens change nothing.
- whole layer: against one fused_moe call over all experts and all tokens, relative L2
  <= 1e-2 (EP rounds each rank's partial sum to bf16 before the combine, the single call
  rounds once), and bit equality for the tokens whose experts all sit on one rank (their one
  partial is the whole sum, in the kernel's own slot order).
Bit equality needs a kernel whose per-token result does not depend on the batch around it:
the CPU backend's does (per-token activation quantization, fixed slot order), so on CPU it
is asserted; on CUDA it is reported, and asserted with --strict-bits.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1] / "python"))  # moeplug from the source tree

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import moeplug  # noqa: E402
from ep import Experts, ExpertParallelMoE, Timer, combine_partials, prepare_local, wire  # noqa: E402
from layers import CPU_LAYERS, GPU_LAYERS, batch, expert_weights  # noqa: E402

REL_L2_MAX = 1e-2


def rel_l2(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


def same_bits(a, b) -> torch.Tensor:
    """Per-row bit equality of two bf16 tensors."""
    return (a.view(torch.int16) == b.view(torch.int16)).all(1)


class Reference:
    """Rank 0's single-process runs of the whole layer (all experts prepared in one place)."""

    def __init__(self, layer, device, seed):
        full = expert_weights(layer, 0, layer.num_experts, device, seed)
        self.prepared = prepare_local(layer, full, device)
        del full
        self.layer = layer

    def run(self, x, w, ids):
        return moeplug.fused_moe(x, self.prepared, w, ids, activation=self.layer.activation)


def check(layer, path, opts, world, batches, ep_out_all, reference, device) -> tuple[bool, str]:
    """Compare every rank's EP output (gathered) with rank 0's single-process runs."""
    E = layer.num_experts
    x = torch.cat([b.x for b in batches])
    ids = torch.cat([b.topk_ids for b in batches])
    w = torch.cat([b.topk_weights for b in batches])
    whole = reference.run(x, w, ids)
    owner = Experts(E, world).owners(device)[ids.long()]
    partials = [reference.run(x, w, ids.masked_fill(owner != r, E)) for r in range(world)]
    exact = combine_partials(partials)

    real = torch.cat([torch.arange(len(b.x), device=device) < b.m for b in batches])
    one_rank = real & (owner == owner[:, :1]).all(1)
    exact_rows = same_bits(ep_out_all, exact)
    whole_rows = same_bits(ep_out_all, whole)
    err = rel_l2(ep_out_all[real], whole[real])
    sane = bool(torch.isfinite(whole.float()).all()) and float(whole[real].float().norm()) > 0
    bits_ok = bool(exact_rows.all()) and bool(whole_rows[one_rank].all())
    strict = opts.strict_bits or device.type == "cpu"
    ok = sane and err <= REL_L2_MAX and (bits_ok or not strict)
    msg = (
        f"{'PASS' if ok else 'FAIL'} {layer.name} {layer.weight_format} {path} R={world} "
        f"M/rank={len(batches[0].x)}: bit-equal to the per-rank partials of the whole layer "
        f"{int(exact_rows.sum())}/{len(exact_rows)} rows; vs one whole-layer call rel L2 "
        f"{err:.2e} (max {REL_L2_MAX:.0e}), bit-equal on single-rank tokens "
        f"{int(whole_rows[one_rank].sum())}/{int(one_rank.sum())}, on all real tokens "
        f"{int(whole_rows[real].sum())}/{int(real.sum())}"
        + ("" if strict else " (bits reported, not asserted: --strict-bits asserts them)")
        + ("" if sane else "; the reference is not finite or all zero")
    )
    return ok, msg


def gather_rows(y, world):
    """All ranks' [M, H] bf16 outputs, stacked in rank order (an all-gather of bytes)."""
    out = torch.empty(world * y.shape[0], y.shape[1], dtype=y.dtype, device=y.device)
    dist.all_gather(list(wire(out).view(world, y.shape[0], -1).unbind(0)), wire(y))
    return out


def bench(ep, b, opts, rank) -> dict:
    """Median seconds per section over opts.iters forward passes (after warm-up), ranks
    lined up by a barrier before each pass so a section measures itself, not the skew."""
    for _ in range(opts.warmup):
        ep.forward(b)
    ep.timer.seconds()
    samples = []
    for _ in range(opts.iters):
        dist.barrier()
        ep.forward(b)
        samples.append(ep.timer.seconds())
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    return dict(rank=rank, received=ep.received, **med)


def worker(rank, world, opts):
    cuda = opts.backend == "nccl"
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(1)  # R processes share the machine's cores with moeplug's pool
        device = torch.device("cpu")
    dist.init_process_group(opts.backend, rank=rank, world_size=world)
    layers = {"cpu": CPU_LAYERS, "gpu": GPU_LAYERS}[opts.layers or ("gpu" if cuda else "cpu")]
    if opts.only:
        layers = [l for l in layers if l.name in opts.only.split(",")]
    paths = ["a2a", "allgather"] if opts.path == "both" else [opts.path]
    tokens = [int(t) for t in opts.tokens.split(",")]
    failures, rows = 0, []
    for layer in layers:
        experts = Experts(layer.num_experts, world)
        # This rank prepares only its own experts, from only its slice of the checkpoint.
        prepared = prepare_local(layer, expert_weights(layer, *experts.range_of(rank), device, opts.seed), device)
        reference = Reference(layer, device, opts.seed) if rank == 0 and not opts.no_check else None
        for M in tokens:
            # Uneven batches (rank r has M - r real tokens) unless timing at exactly M.
            real = [M if opts.bench else max(1, M - r) for r in range(world)]
            mine = batch(layer, rank, world, M, real[rank], device, opts.seed, experts)
            for path in paths:
                timer = Timer(cuda)
                ep = ExpertParallelMoE(layer, prepared, rank, world, M, path, device, graph=cuda, timer=timer, fault=opts.fault)
                y = ep.forward(mine)
                if not opts.no_check:
                    y_all = gather_rows(y, world)
                    ok = torch.ones(1, dtype=torch.int32, device=device)
                    if rank == 0:
                        batches = [batch(layer, r, world, M, real[r], device, opts.seed, experts) for r in range(world)]
                        passed, msg = check(layer, path, opts, world, batches, y_all, reference, device)
                        print(msg, flush=True)
                        ok.fill_(int(passed))
                    dist.broadcast(ok, 0)
                    failures += int(ok.item() == 0)
                if opts.bench:
                    r = bench(ep, mine, opts, rank)
                    r.update(layer=layer.name, fmt=layer.weight_format, M=M, path=path)
                    got = [None] * world
                    dist.all_gather_object(got, r)
                    rows.extend(got)
                del ep
        del prepared, reference
    if rank == 0 and rows:
        print_table(rows, world, opts)
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        raise SystemExit(f"rank {rank}: {failures} EP check(s) failed")
    if rank == 0 and not opts.no_check:
        print(f"ep: every check matched (R={world}, backend {opts.backend})", flush=True)


def print_table(rows, world, opts):
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    us = lambda s: f"{s * 1e6:.0f}"  # noqa: E731
    lines = [
        f"EP over {world} ranks ({opts.backend}, {dev}, moeplug {moeplug.version()}); median of "
        f"{opts.iters}; dispatch = routing + count exchange + token all-to-all (or all-gather), "
        "combine = reverse all-to-all + fp32 sum",
        "",
        "| layer | format | M/rank | path | rank | rows in | fused_moe µs | dispatch µs | combine µs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['layer']} | {r['fmt']} | {r['M']} | {r['path']} | {r['rank']} | {r['received']} | "
            f"{us(r['fused_moe'])} | {us(r['dispatch'])} | {us(r['combine'])} |"
        )
    print("\n".join(lines), flush=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps(dict(world=world, device=dev, rows=rows), indent=1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--world", type=int, default=None, help="processes to spawn (default: 2 for gloo, every GPU for nccl)")
    p.add_argument("--layers", choices=["cpu", "gpu"], default=None, help="small CPU shapes or the real models (default by backend)")
    p.add_argument("--only", default="", help="comma-separated layer names")
    p.add_argument("--path", choices=["a2a", "allgather", "both"], default="both")
    p.add_argument("--tokens", default=None, help="tokens per rank, comma-separated (default 12 on CPU, 64,1024 on GPU)")
    p.add_argument("--bench", action="store_true", help="time each configuration (table on rank 0)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default="", help="also write the timing rows here")
    p.add_argument("--no-check", action="store_true", help="skip the single-process comparison")
    p.add_argument("--strict-bits", action="store_true", help="assert bit equality on CUDA too")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault", choices=["", "shifted-mask"], default="", help="break the EP layer on purpose (the test's negative control): the check must fail")
    opts = p.parse_args(argv)
    if opts.tokens is None:
        opts.tokens = "64,1024" if opts.backend == "nccl" else "12"
    return opts


def main(argv=None):
    opts = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), opts)
        return
    world = opts.world or (torch.cuda.device_count() if opts.backend == "nccl" else 2)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    if opts.backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only: no hostname lookup
    torch.multiprocessing.spawn(worker, args=(world, opts), nprocs=world)


if __name__ == "__main__":
    main()
