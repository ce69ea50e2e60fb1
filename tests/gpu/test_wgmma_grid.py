"""The warp-specialised wgmma kernel runs from one block per SM walking the work items
(persistent) or from a block per item (heuristics::persistent_grid): MOEPLUG_WGMMA_PERSISTENT,
read once per process, forces either (each setting in a fresh process, `child`). Every item is
computed the same way wherever it runs, so the two grids give the same bits, checked against
the CPU backend, run after run and in CUDA graph replays. At M = 2000 (8 experts, ~12 tiles
each) a stage has ~190 work items: more than the GPU's SMs, so the persistent blocks take
several items each."""

import pytest

torch = pytest.importorskip("torch")

from test_fused_combine import case_kwargs, checked_outputs  # noqa: E402
from test_fused_moe import assert_replays_give, capture_graph, run_child, run_moe  # noqa: E402

# The formats the warp-specialised kernel takes (16-bit weights, fp8 with fp8 activations).
FORMATS = ["bf16", "fp8_block128"]
MS = [7, 2000]
REPLAYED = ("fp8_block128", 2000, "ep")


def child(path):
    outs = checked_outputs(FORMATS, MS)
    fmt, M, option = REPLAYED
    out, _, st = run_moe(fmt, **case_kwargs(fmt, M, option))
    assert_replays_give(capture_graph(st), st, out)
    torch.save(dict(outs=outs), path)


def test_a_block_per_work_item_gives_the_persistent_kernels_bits(tmp_path):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma family runs on sm_90 only")
    runs = {}
    for persistent in ["1", "0"]:
        runs[persistent] = run_child("test_wgmma_grid", tmp_path / f"p{persistent}.pt",
                                     {"MOEPLUG_WGMMA_PERSISTENT": persistent,
                                      "MOEPLUG_GPU_FAMILY": "wgmma"})
    a, b = runs["1"]["outs"], runs["0"]["outs"]
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"a block per work item gives other bits than the persistent kernel: {differ}"
