"""MXFP4 on the warp-specialised wgmma kernel (WG_MX4_WS, selected where one block per SM is
asked with the swap-AB kernel off: MOEPLUG_WGMMA_SWAP=0 MOEPLUG_WGMMA_BLOCKS=1, read once per
process, so each setting runs in a fresh process, `child`): the producer copies the packed codes and their scales, the consumers decode
them into bf16 weight tiles that both warpgroups multiply from; with MOEPLUG_WGMMA_DECODERS=2
two more warpgroups share the decode. Each setting is checked against the CPU backend and
float64, repeated for the same bits and replayed in a CUDA graph. Every kernel decodes the
same bf16 weights and adds each row's K in the same order, so the warp-specialised kernels'
bits, and those of the tile kernel with its packs by cp.async (MOEPLUG_WGMMA_PACK_COPIES=1),
must equal the two-blocks-per-SM tile kernel's (the default). The swap-AB kernel
(MOEPLUG_WGMMA_SWAP=1: the weights as the register operand, the tokens on the MMA's N) sums
the same products in the same K slices with the operands' roles exchanged, so the tensor
core's order within a slice may differ: on both tile heights (64 rows below 64 pairs per
expert by default, 128 from 64) it must match the tile kernel to fp32 rounding. Its tiles whose
second half is padding run half-width MMAs (n32 / n64): M = 1 and 7 have only such tiles, M =
300 and the long items almost only full ones (the emulator has both in one launch)."""

import pytest

torch = pytest.importorskip("torch")

from test_fused_combine import case_kwargs, checked_outputs  # noqa: E402
from test_fused_moe import (  # noqa: E402
    assert_close, assert_replays_give, capture_graph, run_child, run_moe)

MS = [1, 7, 300]
REPLAYED = ("mxfp4", 300, "padded")
# Long items, several per SM: 32 K steps (H = 2048) against the ring's 6 stages and the three
# decoded tiles, so the ring and the tiles go round many times within and across items.
LONG = dict(E=8, k=3, H=2048, I=512, M=1000, seed=7)


def child(path):
    outs = checked_outputs(["mxfp4"], MS)
    out, ref, st = run_moe("mxfp4", **LONG)
    assert_close(out, ref, None, st)
    again, _, _ = run_moe("mxfp4", m=st["m"], **LONG)
    assert torch.equal(again, out), "long items: not repeatable"
    outs["long"] = out.cpu()
    fmt, M, option = REPLAYED
    out, _, st = run_moe(fmt, **case_kwargs(fmt, M, option))
    assert_replays_give(capture_graph(st), st, out)
    torch.save(dict(outs=outs), path)


# The shared-memory kernels need the swap-AB kernel (the default) turned off.
SHARED = {"MOEPLUG_WGMMA_SWAP": "0", "MOEPLUG_WGMMA_BM": None}
SETTINGS = {
    "tile": {**SHARED, "MOEPLUG_WGMMA_BLOCKS": "2", "MOEPLUG_WGMMA_DECODERS": None,
             "MOEPLUG_WGMMA_PACK_COPIES": None},
    "pack_copies": {**SHARED, "MOEPLUG_WGMMA_BLOCKS": "2", "MOEPLUG_WGMMA_PACK_COPIES": "1"},
    "specialised": {**SHARED, "MOEPLUG_WGMMA_BLOCKS": "1", "MOEPLUG_WGMMA_DECODERS": None},
    "decoders": {**SHARED, "MOEPLUG_WGMMA_BLOCKS": "1", "MOEPLUG_WGMMA_DECODERS": "2"},
    "swap": {"MOEPLUG_WGMMA_SWAP": None, "MOEPLUG_WGMMA_BM": "64",
             "MOEPLUG_WGMMA_BLOCKS": None},
    "swap128": {"MOEPLUG_WGMMA_SWAP": None, "MOEPLUG_WGMMA_BM": "128",
                "MOEPLUG_WGMMA_BLOCKS": None},
    # its packs by bulk copies (the tests' weights are AITER 16x16)
    "swap_bulk": {"MOEPLUG_WGMMA_SWAP": None, "MOEPLUG_WGMMA_BM": "64",
                  "MOEPLUG_WGMMA_BLOCKS": None, "MOEPLUG_WGMMA_BULK_PACKS": "1"},
}
# Settings whose sums may differ from the tile kernel's in fp32 rounding (see above).
REORDERED = {"swap", "swap128", "swap_bulk"}


def test_warp_specialised_mxfp4_matches_the_cpu_backend_and_the_tile_kernel(tmp_path):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma family runs on sm_90 only")
    runs = {name: run_child("test_wgmma_mxfp4_ws", tmp_path / f"{name}.pt",
                            {**env, "MOEPLUG_GPU_FAMILY": "wgmma"})["outs"]
            for name, env in SETTINGS.items()}
    tile = runs.pop("tile")
    for name, outs in runs.items():
        assert len(outs) == len(MS) * 3 + 1
        for key, out in outs.items():
            if name in REORDERED:
                a, b = out.double(), tile[key].double()
                rel = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
                assert rel < 1e-3, f"{key}: the {name} and tile kernels differ (rel L2 {rel:.2e})"
            else:
                assert torch.equal(out, tile[key]), f"{key}: the {name} and tile kernels differ"
