"""An expert-parallel MoE layer over torch.distributed with moeplug.

R ranks each hold a contiguous slice of the E global experts, prepared with
`moeplug.prepare_moe` from that slice of the checkpoint only. A forward pass:

1. dispatch: each token goes to the ranks that hold at least one of its experts, either
   - "a2a": `all_to_all_single` with uneven splits (the token counts are exchanged first);
     a slot whose expert lives on another rank is sent as the sentinel id E, or
   - "allgather": every rank gathers every rank's tokens (better for small M: one
     collective, no count exchange, equal splits);
2. compute: `moeplug.fused_moe` on the local experts with `expert_mask` [E + 1] (1 on this
   rank's experts, 0 elsewhere and on the sentinel slot E) and `num_local_tokens` (the real
   rows of the static receive buffer; the rest are stale and skipped), over buffers whose
   shape never changes, so on CUDA the call is captured once in a CUDA graph and replayed;
3. combine: the reverse all-to-all brings each rank's partial outputs (bf16) back to the
   token's owner, which adds them in rank order in fp32 and rounds once to bf16.

Collectives move 16-bit floats as bytes: they only transport (no reduction), so this is
exact, and it works on backends without a bf16 type (gloo in older torch releases).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

import moeplug


class Experts:
    """E global experts over R ranks: rank r holds [⌊r·E/R⌋, ⌊(r+1)·E/R⌋); id E is the
    sentinel (a slot that routes nowhere)."""

    def __init__(self, num_experts: int, world: int):
        if num_experts < world:
            raise ValueError(f"need at least one expert per rank: E = {num_experts}, R = {world}")
        self.num_experts, self.world = num_experts, world

    def range_of(self, rank: int) -> tuple[int, int]:
        return rank * self.num_experts // self.world, (rank + 1) * self.num_experts // self.world

    def owners(self, device) -> torch.Tensor:
        """int64 [E + 1]: the rank of each expert, -1 for the sentinel."""
        own = torch.full((self.num_experts + 1,), -1, dtype=torch.int64)
        for r in range(self.world):
            lo, hi = self.range_of(r)
            own[lo:hi] = r
        return own.to(device)

    def mask(self, rank: int, device) -> torch.Tensor:
        """moeplug's expert_mask for `rank`: int32 [E + 1], 1 on its experts; the trailing
        sentinel slot is 0, so ids equal to E contribute nothing."""
        m = torch.zeros(self.num_experts + 1, dtype=torch.int32)
        lo, hi = self.range_of(rank)
        m[lo:hi] = 1
        return m.to(device)


def wire(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (a view): what the collectives move."""
    return t.view(torch.uint8)


def combine_partials(parts) -> torch.Tensor:
    """Σ_r parts[r] in rank order, in fp32, rounded once to bf16. One definition for the EP
    layer and for the reference, so that both add in the same order."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc += p.float()
    return acc.to(torch.bfloat16)


class Timer:
    """Named sections of a forward pass: CUDA events on the current stream, else wall time."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks = []

    @contextmanager
    def __call__(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            start = time.perf_counter()
            yield
            end = time.perf_counter()
        self.marks.append((name, start, end))

    def seconds(self) -> dict:
        """Seconds per section name (summed) since the last call; then starts afresh."""
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for name, s, e in self.marks:
            dt = s.elapsed_time(e) * 1e-3 if self.cuda else e - s
            out[name] = out.get(name, 0.0) + dt
        self.marks = []
        return out


def prepare_local(layer, checkpoint: dict, device) -> moeplug.Prepared:
    """moeplug.prepare_moe on one rank's slice of the checkpoint (or on the whole layer)."""
    return moeplug.prepare_moe(
        checkpoint["w13"],
        checkpoint["w2"],
        weight_format=layer.weight_format,
        w13_scale=checkpoint.get("w13_scale"),
        w2_scale=checkpoint.get("w2_scale"),
        w13_bias=checkpoint.get("w13_bias"),
        w2_bias=checkpoint.get("w2_bias"),
        gate_mode_in=layer.gate_mode_in,
        device=str(device),
    )


class LocalMoE:
    """moeplug.fused_moe on this rank's experts over static buffers of `capacity` rows:
    `x`, `ids`, `weights` are filled by the dispatch, `n` (num_local_tokens, on the device)
    says how many rows are real, `out` receives the partial outputs (rows >= n are zero).
    On CUDA the call is captured once in a CUDA graph; `run` then only replays it."""

    def __init__(self, layer, prepared, expert_mask, capacity: int, device, graph: bool):
        self.layer, self.prepared, self.mask = layer, prepared, expert_mask
        E, k, H = layer.num_experts, layer.topk, layer.hidden
        self.x = torch.zeros(capacity, H, dtype=torch.bfloat16, device=device)
        self.ids = torch.full((capacity, k), E, dtype=torch.int32, device=device)
        self.weights = torch.zeros(capacity, k, dtype=torch.float32, device=device)
        self.n = torch.zeros(1, dtype=torch.int32, device=device)
        self.out = torch.empty(capacity, H, dtype=torch.bfloat16, device=device)
        # The start-up question an engine asks: can this device run exactly this?
        moeplug.check_fused_moe(
            prepared,
            device=str(device),
            activation=layer.activation,
            bias=layer.bias,
            expert_mask=True,
            num_local_tokens=True,
        )
        self.graph = None
        if graph:
            self._call()  # compiles and loads the kernels outside the capture
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            try:  # other threads (NCCL's watchdog) may keep querying events meanwhile
                capture = torch.cuda.graph(self.graph, capture_error_mode="thread_local")
            except TypeError:  # torch < 2.1
                capture = torch.cuda.graph(self.graph)
            with capture:
                self._call()

    def _call(self):
        moeplug.fused_moe(
            self.x,
            self.prepared,
            self.weights,
            self.ids,
            activation=self.layer.activation,
            expert_mask=self.mask,
            num_local_tokens=self.n,
            out=self.out,
        )

    def run(self, n: int):
        self.n.fill_(n)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._call()


class ExpertParallelMoE:
    """One rank's part of an EP MoE layer; `forward(batch)` returns the layer's output for
    this rank's tokens [M, H] bf16 (rows >= batch.m are zero)."""

    def __init__(self, layer, prepared, rank: int, world: int, tokens: int, path: str, device, graph: bool, timer: Timer, fault: str = ""):
        if path not in ("a2a", "allgather"):
            raise ValueError(f"path: expected 'a2a' or 'allgather', got {path!r}")
        self.layer, self.rank, self.world, self.tokens, self.path = layer, rank, world, tokens, path
        self.device, self.timer = device, timer
        self.experts = Experts(layer.num_experts, world)
        self.owner = self.experts.owners(device)
        self.prepared = prepared  # prepare_local on this rank's slice of the checkpoint
        lo, hi = self.experts.range_of(rank)
        if self.prepared.layout.num_experts != hi - lo:
            raise ValueError(f"checkpoint holds {self.prepared.layout.num_experts} experts, rank {rank} owns {hi - lo}")
        # Each rank sends at most `tokens` rows to each rank: R·M rows cover any routing.
        capacity = world * tokens
        # fault "shifted-mask" (the test's negative control): each rank's weights under the
        # next rank's mask, a global→local mix-up the library cannot see when counts agree.
        mask_rank = (rank + 1) % world if fault == "shifted-mask" else rank
        self.local = LocalMoE(layer, self.prepared, self.experts.mask(mask_rank, device), capacity, device, graph)
        self.meta = torch.empty(capacity, 2 * layer.topk, dtype=torch.int32, device=device)
        self.received = 0  # rows computed by the last forward

    def forward(self, b) -> torch.Tensor:
        return self._a2a(b) if self.path == "a2a" else self._allgather(b)

    def _unpack_meta(self, n: int):
        k = self.layer.topk
        self.local.ids[:n] = self.meta[:n, :k]
        self.local.weights[:n] = self.meta[:n, k:].view(torch.float32)

    def _a2a(self, b) -> torch.Tensor:
        R, E, H = self.world, self.layer.num_experts, self.layer.hidden
        t = self.timer
        with t("dispatch"):
            ids = b.topk_ids[: b.m].long()
            dest = self.owner[ids]  # [m, k]: the rank of each slot's expert
            hit = (dest.unsqueeze(0) == torch.arange(R, device=self.device).view(R, 1, 1)).any(2)
            send_dest, send_tok = hit.nonzero(as_tuple=True)  # (rank, token), by rank
            send_counts = torch.bincount(send_dest, minlength=R)
            other = dest[send_tok] != send_dest.unsqueeze(1)
            send_ids = ids[send_tok].masked_fill(other, E).to(torch.int32)
            send_w = b.topk_weights[: b.m][send_tok].masked_fill(other, 0.0)
            meta = torch.cat([send_ids, send_w.view(torch.int32)], 1)
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts)
            sc, rc = send_counts.tolist(), recv_counts.tolist()  # the splits live on the host
            n = sum(rc)
            dist.all_to_all_single(wire(self.local.x[:n]), wire(b.x[send_tok]), rc, sc)
            dist.all_to_all_single(self.meta[:n], meta, rc, sc)
            self._unpack_meta(n)
        with t("fused_moe"):
            self.local.run(n)
        with t("combine"):
            back = torch.empty(len(send_tok), H, dtype=torch.bfloat16, device=self.device)
            dist.all_to_all_single(wire(back), wire(self.local.out[:n]), sc, rc)
            parts = torch.zeros(R, self.tokens, H, dtype=torch.bfloat16, device=self.device)
            parts[send_dest, send_tok] = back
            y = combine_partials(parts)
        self.received = n
        return y

    def _allgather(self, b) -> torch.Tensor:
        R, M, H, k = self.world, self.tokens, self.layer.hidden, self.layer.topk
        t = self.timer
        with t("dispatch"):
            # Padding rows already carry the sentinel id; ids of other ranks' experts are
            # masked off by expert_mask.
            meta = torch.cat([b.topk_ids, b.topk_weights.view(torch.int32)], 1)
            dist.all_gather(list(wire(self.local.x).view(R, M, 2 * H).unbind(0)), wire(b.x))
            dist.all_gather(list(self.meta.view(R, M, 2 * k).unbind(0)), meta)
            self._unpack_meta(R * M)
        with t("fused_moe"):
            self.local.run(R * M)
        with t("combine"):
            back = torch.empty(R * M, H, dtype=torch.bfloat16, device=self.device)
            dist.all_to_all_single(wire(back), wire(self.local.out))
            y = combine_partials(back.view(R, M, H))
        self.received = R * M
        return y
