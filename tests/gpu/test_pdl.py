"""Programmatic dependent launch (the stream and wgmma families' default on sm_90: every kernel
of a launch may start while the previous one finishes and waits on it with griddepcontrol; by
default a stage that follows no route kernel starts its weight reads before it waits;
MOEPLUG_PDL=wait waits first, =0 launches plainly): the same bits in every mode for formats that
run every kernel of the module (route, amax, quant, both stages, reduce or the fused combine),
with the expert mask and padded columns, run after run and in CUDA graph replays. MOEPLUG_PDL is
read once per process, so each setting runs in a fresh process (`child`)."""

import pytest

torch = pytest.importorskip("torch")

from test_fused_combine import case_kwargs, checked_outputs  # noqa: E402
from test_fused_moe import assert_replays_give, capture_graph, run_child, run_moe  # noqa: E402

# bf16: route + stages; fp8 per tensor: the amax kernels; fp8 block-128: the 1x128 quant;
# mxfp4: the MXFP4 decode.
FORMATS = ["bf16", "fp8_per_tensor", "fp8_block128", "mxfp4"]
MS = [1, 7, 64]


def child(path):
    outs = checked_outputs(FORMATS, MS)
    # Graph replays of one launch: the dependencies captured as programmatic edges.
    for fmt in ("bf16", "fp8_block128"):
        out, _, st = run_moe(fmt, **case_kwargs(fmt, 7, "ep"))
        assert_replays_give(capture_graph(st), st, out, f"{fmt}: ")
    torch.save(outs, path)


def run_pdl_child(path, family, pdl):
    return run_child("test_pdl", path, {"MOEPLUG_PDL": pdl, "MOEPLUG_GPU_FAMILY": family})


@pytest.mark.parametrize("family", ["stream", "wgmma"])
def test_pdl_gives_the_plain_launch_bits(tmp_path, family):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90 (the launches stay plain below)")
    plain = run_pdl_child(tmp_path / "plain.pt", family, "0")
    for mode in ("wait", "early"):
        pdl = run_pdl_child(tmp_path / f"{mode}.pt", family, mode)
        assert pdl.keys() == plain.keys()
        differ = [k for k in pdl if not torch.equal(pdl[k], plain[k])]
        assert not differ, f"{family}, MOEPLUG_PDL={mode}: bits differ from the plain launches: {differ}"
