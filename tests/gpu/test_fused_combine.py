"""The top-k combine fused into stage 2 (issue 8; kernels/moe_common.cuh "fused top-k combine")
against the moe_reduce launch it replaces: the same bits for every format at M in {1, 7, 64,
300}, with expert_mask / num_local_tokens (tokens without a routed slot, duplicate experts in
a token's slots) and padded output columns, on every family that fuses it and on the
heuristics' own pick; the fused output is also checked against the CPU backend and float64,
is the same run after run and after CUDA graph replays, and the launch has no moe_reduce
kernel. MOEPLUG_FUSED_COMBINE and MOEPLUG_GPU_FAMILY are read once per process, so each
setting runs in a fresh process (the `child` below), for the formats named by FORMATS_VAR."""

import os

import pytest

torch = pytest.importorskip("torch")

import _abi  # noqa: E402
from test_fused_moe import assert_close, assert_replays_give, capture_graph, run_child, run_moe  # noqa: E402

# Three formats per test (and child process); one under compute-sanitizer (bench/sanitize.sh),
# which must finish each test within one GPU call: racecheck ran past 560 s on six groups of
# three (session 14).
FORMATS = ["bf16", "fp16", "fp8_per_tensor", "fp8_per_channel", "fp8_block128", "mxfp4",
           "mxfp8", "int4_group32", "int4_per_channel"]
PER_TEST = 1 if os.environ.get("MOEPLUG_UNDER_SANITIZER") == "1" else 3
FORMAT_GROUPS = [FORMATS[i:i + PER_TEST] for i in range(0, len(FORMATS), PER_TEST)]
MS = [1, 7, 64, 300]
OPTIONS = ["plain", "ep", "padded"]
# None: the heuristics' pick (at M = 300 often wgmma, which keeps moe_reduce either way).
FAMILIES = [None, "stream", "tile32", "fp32"]
PROFILED = ("bf16", 7, "ep")
FORMATS_VAR = "MOEPLUG_TEST_COMBINE_FORMATS"  # the child's formats, comma-separated


def case_kwargs(fmt, M, option):
    """run_moe arguments of one case (H = 320: a partial last column block in every family)."""
    kw = dict(E=8, k=3, H=320, I=160, M=M, seed=11 + M)
    if fmt == "fp16":
        kw["in_dtype"] = torch.float16
    if fmt == "int4_group32":  # AITER's int4 scales pair 32-groups: K % 64 (the padded sizes)
        kw["slayout"] = "aiter_int4" if option == "padded" else "plain"
    if option == "ep":
        # 8 local of 13 global experts; ids off-rank, out of range and repeated within a token
        # leave some tokens without a routed slot; num_local_tokens cuts the last rows (all of
        # them at M = 1).
        mask = torch.zeros(13, dtype=torch.int32, device="cuda")
        mask[torch.tensor([0, 2, 3, 5, 8, 9, 10, 12])] = 1
        g = torch.Generator(device="cuda")
        g.manual_seed(M)
        kw["mask"] = mask
        kw["ids"] = torch.randint(-1, 14, (M, 3), device="cuda", generator=g, dtype=torch.int32)
        kw["n_local"] = M - 3 if M > 3 else 0
    elif option == "padded":
        kw.update(Hp=384, Ip=192, out_cols=384, bias=True, act="swiglu_oai", gate="interleave")
    return kw


def checked_outputs(formats, ms, check=True):
    """Each (format, M, option) case's output, keyed "format-M-option" (the children of the
    tests that compare one setting's bits with another's); with `check`, also checked against
    the CPU backend and float64 and repeated for the same bits."""
    outs = {}
    for fmt in formats:
        for M in ms:
            for option in OPTIONS:
                kw = case_kwargs(fmt, M, option)
                out, ref, st = run_moe(fmt, **kw)
                if check:
                    assert_close(out, ref, kw.get("n_local"), st)
                    again, _, _ = run_moe(fmt, m=st["m"], **kw)
                    assert torch.equal(again, out), f"{fmt} M={M} {option}: not repeatable"
                outs[f"{fmt}-{M}-{option}"] = out.cpu()
    return outs


def launch_kernels(st):
    """The names of the moe_* kernels one launch of `st` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _abi.fused_moe(st["args"])
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if e.key.startswith("moe_")})


def child(path):
    """One process: every case of its formats under this process's MOEPLUG_FUSED_COMBINE /
    MOEPLUG_GPU_FAMILY; outputs (and, with bf16, the kernel names of one launch) saved to
    `path`."""
    fused = os.environ.get("MOEPLUG_FUSED_COMBINE") == "1"
    formats = os.environ[FORMATS_VAR].split(",")
    outs = checked_outputs(formats, MS, check=fused)
    fmt, M, option = PROFILED
    if fmt not in formats:
        torch.save(dict(outs=outs, kernels=None), path)
        return
    out, _, st = run_moe(fmt, **case_kwargs(fmt, M, option))
    kernels = launch_kernels(st)
    # Graph replays: the route kernel zeroes the arrival counters in every replay.
    assert_replays_give(capture_graph(st), st, out)
    torch.save(dict(outs=outs, kernels=kernels), path)


def run_fused_child(path, fused, family, formats):
    return run_child("test_fused_combine", path,
                     {"MOEPLUG_FUSED_COMBINE": "1" if fused else "0", "MOEPLUG_GPU_FAMILY": family,
                      FORMATS_VAR: ",".join(formats)})


@pytest.mark.parametrize("formats", FORMAT_GROUPS, ids="+".join)
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f or "heuristics")
def test_fused_combine_gives_moe_reduce_bits(tmp_path, family, formats):
    fused = run_fused_child(tmp_path / "fused.pt", True, family, formats)
    unfused = run_fused_child(tmp_path / "unfused.pt", False, family, formats)
    assert len(fused["outs"]) == len(formats) * len(MS) * len(OPTIONS)
    assert fused["outs"].keys() == unfused["outs"].keys()
    differ = [k for k in fused["outs"] if not torch.equal(fused["outs"][k], unfused["outs"][k])]
    assert not differ, f"fused combine bits differ from moe_reduce: {differ}"
    if PROFILED[0] not in formats:
        return  # the launch count is checked with bf16's formats
    if os.environ.get("MOEPLUG_UNDER_SANITIZER") == "1":
        pytest.skip("bits compared; the launch count is not: torch.profiler sees no kernels "
                    "under compute-sanitizer (bench/sanitize.sh)")
    # The launch count: no moe_reduce once fused (bf16 at M = 7 runs on the stream family when
    # the heuristics pick).
    assert "moe_stage2" in fused["kernels"] and "moe_stage2" in unfused["kernels"]
    assert "moe_reduce" in unfused["kernels"], unfused["kernels"]
    assert "moe_reduce" not in fused["kernels"], fused["kernels"]
