"""The warp-specialised wgmma kernel on 64-row tiles can split K between its two MMA
warpgroups (an opt-in, MOEPLUG_WGMMA_KSPLIT=1, read once per process: each setting runs in a
fresh process, `child`): both take the same weight rows, warpgroup 1 hands its sums to
warpgroup 0 through shared memory. Each setting is checked against the CPU backend,
repeated for the same bits and replayed in a CUDA graph; the two settings add K in another
order, so their bits may differ. fp8 block-128 runs without the fused stage-2 quantization
(which needs a block's 128 output columns, and so the whole weight rows of both
warpgroups)."""

import pytest

torch = pytest.importorskip("torch")

from test_fused_combine import case_kwargs, checked_outputs  # noqa: E402
from test_fused_moe import (  # noqa: E402
    assert_close, assert_replays_give, capture_graph, run_child, run_moe)

FORMATS = ["bf16", "fp16", "fp8_block128", "fp8_per_channel"]
MS = [1, 7, 300]
REPLAYED = ("bf16", 7, "ep")
# Long items on several per SM: 16 (bf16) K steps against the ring's 6 stages, ~190 items per
# stage, so each warpgroup's stages go round many times (a ring whose steps alternate between
# the warpgroups must still give each its stages' phases in order).
LONG = [("bf16", dict(E=8, k=3, H=1024, I=512, M=1000, seed=5)),
        ("fp8_block128", dict(E=8, k=3, H=1024, I=384, M=1000, seed=6))]


def child(path):
    outs = checked_outputs(FORMATS, MS)
    for fmt, kw in LONG:
        out, ref, st = run_moe(fmt, **kw)
        assert_close(out, ref, None, st)
        again, _, _ = run_moe(fmt, m=st["m"], **kw)
        assert torch.equal(again, out), f"{fmt} {kw}: not repeatable"
    fmt, M, option = REPLAYED
    out, _, st = run_moe(fmt, **case_kwargs(fmt, M, option))
    assert_replays_give(capture_graph(st), st, out)
    torch.save(dict(outs=outs), path)


@pytest.mark.parametrize("ksplit", ["1", "0"])
def test_warpgroups_splitting_k_match_the_cpu_backend(tmp_path, ksplit):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma family runs on sm_90 only")
    run = run_child("test_wgmma_ksplit", tmp_path / f"k{ksplit}.pt",
                    {"MOEPLUG_WGMMA_KSPLIT": ksplit, "MOEPLUG_WGMMA_BM": "64",
                     "MOEPLUG_FUSED_QUANT2": "0", "MOEPLUG_GPU_FAMILY": "wgmma"})
    assert len(run["outs"]) == len(FORMATS) * len(MS) * 3
