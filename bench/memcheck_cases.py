"""Diagnostic (issue 14): test_fused_combine's cases one by one, each printed before its launch,
so a compute-sanitizer report names the case that faulted. Env as the test's child
(MOEPLUG_FUSED_COMBINE, MOEPLUG_GPU_FAMILY, MOEPLUG_WGMMA_*).
  compute-sanitizer --tool memcheck python3 bench/memcheck_cases.py [FMT...]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "gpu"))
import torch  # noqa: E402
from test_fused_combine import FORMATS, MS, OPTIONS, case_kwargs  # noqa: E402
from test_fused_moe import run_moe  # noqa: E402

for fmt in sys.argv[1:] or FORMATS:
    for M in MS:
        for option in OPTIONS:
            print(f"case {fmt} M={M} {option}", flush=True)
            run_moe(fmt, **case_kwargs(fmt, M, option))
            torch.cuda.synchronize()
print("all cases done", flush=True)
