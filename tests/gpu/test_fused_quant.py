"""The activation quantizations folded into neighbouring kernels, both defaults (`0` turns
each off) read once per process (each setting runs in a fresh process, `child`):
MOEPLUG_ROUTE_QUANT1 (the route kernel's extra blocks quantize stage 1's input; stream and
wgmma) and MOEPLUG_FUSED_QUANT2 (the wgmma stage-1 epilogue writes stage 2's fp8 1x128
input; each stream stage-2 block quantizes its tile's rows, fp8 per token or 1x128). Each
gives the same output bits as moe_quant1 / moe_quant2, one launch fewer each, with the expert
mask, padded columns and a partial last 128-column group (I = 160), run after run and in CUDA
graph replays. The wgmma warpgroups do not split K here (MOEPLUG_WGMMA_KSPLIT=0, the
default): split, they add K in another order."""

import os

import pytest

torch = pytest.importorskip("torch")

from test_fused_combine import case_kwargs, checked_outputs, launch_kernels  # noqa: E402
from test_fused_moe import assert_replays_give, capture_graph, run_child, run_moe  # noqa: E402

# fp8 1x128 (every fold) and fp8 per token (on wgmma the route's fold only).
FORMATS = ["fp8_block128", "fp8_per_channel"]
MS = [1, 7, 64, 300]
PROFILED = ("fp8_block128", 7, "ep")


def child(path):
    outs = checked_outputs(FORMATS, MS)
    fmt, M, option = PROFILED
    out, _, st = run_moe(fmt, **case_kwargs(fmt, M, option))
    kernels = launch_kernels(st)
    assert_replays_give(capture_graph(st), st, out)
    torch.save(dict(outs=outs, kernels=kernels), path)


def run_quant_child(path, family, folded):
    on = "1" if folded else "0"
    return run_child("test_fused_quant", path,
                     {"MOEPLUG_ROUTE_QUANT1": on, "MOEPLUG_FUSED_QUANT2": on,
                      "MOEPLUG_GPU_FAMILY": family, "MOEPLUG_WGMMA_KSPLIT": "0"})


@pytest.mark.parametrize("family", ["stream", "wgmma"])
def test_folded_quantization_gives_the_quant_kernels_bits(tmp_path, family):
    if family == "wgmma" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma family runs on sm_90 only")
    folded = run_quant_child(tmp_path / "folded.pt", family, True)
    plain = run_quant_child(tmp_path / "plain.pt", family, False)
    assert folded["outs"].keys() == plain["outs"].keys()
    differ = [k for k in folded["outs"] if not torch.equal(folded["outs"][k], plain["outs"][k])]
    assert not differ, f"{family}: folded quantization bits differ from the quant kernels': {differ}"
    if os.environ.get("MOEPLUG_UNDER_SANITIZER") == "1":
        pytest.skip("bits compared; the launch count is not: torch.profiler sees no kernels "
                    "under compute-sanitizer (bench/sanitize.sh)")
    assert {"moe_route", "moe_quant1", "moe_quant2"} <= set(plain["kernels"]), plain["kernels"]
    assert "moe_route" in folded["kernels"], folded["kernels"]
    assert not {"moe_quant1", "moe_quant2"} & set(folded["kernels"]), folded["kernels"]
