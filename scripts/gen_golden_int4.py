#!/usr/bin/env python3
"""Golden vectors for INT4_PER_CHANNEL (AITER's a8w4 "int4" path, Quark int4-fp8), made by
running AITER's own functions on the CPU.

    python scripts/gen_golden_int4.py --aiter PATH [--out tests/golden]

PATH is an AITER checkout, or a bare git directory of one (its HEAD is read with
`git show`). Only `aiter/int4_utils.py` and `aiter/ops/shuffle.py` are loaded, under stub
`aiter` / `aiter.dtypes` / `aiter.jit.utils.chip_info` modules (they need nothing else on the
paths used here); none of AITER's code is part of this repository. Needs torch and numpy.

Writes `aiter_int4_per_channel.json` (the manifest format of tests/golden/aiter_int4.json)
and one .bin per tensor (raw little-endian, C order).
"""

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types

import torch

FILES = ["aiter/int4_utils.py", "aiter/ops/shuffle.py"]


def aiter_sources(path):
    """(commit, {file: source}) of the AITER tree at `path`."""
    git = ["git", "-C", path]
    commit = subprocess.run(
        git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    out = {}
    for f in FILES:
        plain = os.path.join(path, f)
        if os.path.exists(plain):
            with open(plain) as fh:
                out[f] = fh.read()
        else:  # a bare git directory
            out[f] = subprocess.run(
                git + ["show", f"HEAD:{f}"], check=True, capture_output=True, text=True
            ).stdout
    return commit, out


def load_aiter(sources):
    """Import AITER's two files under minimal stub packages."""
    aiter = types.ModuleType("aiter")
    aiter.__path__ = []
    dtypes = types.ModuleType("aiter.dtypes")
    dtypes.i8, dtypes.i32, dtypes.fp32 = torch.int8, torch.int32, torch.float32
    aiter.dtypes = dtypes
    chip = types.ModuleType("aiter.jit.utils.chip_info")
    chip.get_gfx = lambda: "gfx942"
    ops = types.ModuleType("aiter.ops")
    ops.__path__ = []
    for name, mod in [
        ("aiter", aiter),
        ("aiter.dtypes", dtypes),
        ("aiter.jit", types.ModuleType("aiter.jit")),
        ("aiter.jit.utils", types.ModuleType("aiter.jit.utils")),
        ("aiter.jit.utils.chip_info", chip),
        ("aiter.ops", ops),
    ]:
        sys.modules[name] = mod
    loaded = {}
    tmp = tempfile.mkdtemp()
    for f, src in sources.items():
        name = f[:-3].replace("/", ".")
        file = os.path.join(tmp, os.path.basename(f))
        with open(file, "w") as fh:
            fh.write(src)
        spec = importlib.util.spec_from_file_location(name, file)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        loaded[f] = mod
    return loaded["aiter/int4_utils.py"], loaded["aiter/ops/shuffle.py"]


def tensor_entry(out_dir, case, role, name, t):
    t = t.contiguous()
    raw = t.view(torch.uint8).numpy().tobytes() if t.element_size() == 1 else None
    if raw is None:
        # uint32 has no numpy view in torch 2.5: int32 holds the same bytes.
        src = t.view(torch.int32) if t.dtype == torch.uint32 else t
        raw = src.numpy().tobytes()
    file = f"{case}.{role}.{name}.bin"
    with open(os.path.join(out_dir, file), "wb") as fh:
        fh.write(raw)
    return {
        "role": role,
        "name": name,
        "file": file,
        "shape": list(t.shape),
        "dtype": str(t.dtype).replace("torch.", ""),
        "element_size": t.element_size(),
        "nbytes": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiter", required=True, help="AITER checkout or bare git dir")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "../tests/golden")
    )
    args = ap.parse_args()
    commit, sources = aiter_sources(args.aiter)
    int4_utils, shuffle = load_aiter(sources)
    up = lambda f: f"{f}@{commit}"

    g = torch.Generator().manual_seed(11)
    cases = []

    def case(name, function, upstream, call_args, inputs, output, notes=""):
        tensors = [tensor_entry(args.out, name, "input", n, t) for n, t in inputs]
        tensors.append(tensor_entry(args.out, name, "output", "out", output))
        cases.append(
            {
                "name": name,
                "function": function,
                "upstream": up(upstream),
                "args": call_args,
                "tensors": tensors,
                "notes": notes,
            }
        )

    # Every nibble value at every position of a u32: 16 runs of 8 int8 values.
    runs = torch.arange(16 * 8, dtype=torch.int64).reshape(1, 16, 8)
    vals = ((runs * 5 + runs // 8) % 16 - 8).to(torch.int8)
    x = vals.reshape(1, 16, 8)
    u = int4_utils.convert_int8_to_uint32_int4(x)
    case(
        "convert_int8_to_uint32_int4",
        "aiter.int4_utils.convert_int8_to_uint32_int4",
        "aiter/int4_utils.py",
        {},
        [("x", x)],
        u,
        "8 int8 values along the last dim -> one uint32, value j in nibble j (low 4 bits kept)",
    )
    case(
        "rearrange_4bit_elements",
        "aiter.int4_utils.rearrange_4bit_elements",
        "aiter/int4_utils.py",
        {},
        [("x", u)],
        int4_utils.rearrange_4bit_elements(u),
        "nibble permutation inside each uint32",
    )

    # The whole a8w4 int4 weight preparation of op_tests/test_moe_2stage.py for one w13
    # [E, 2I, H] and one w2 [E, H, I] (E 2, H 96, I 32: no padding for prepare_moe), int8
    # values in [-8, 7] (AITER's quantizer writes [-7, 7]); "words" is the same without the
    # shuffle (moeplug's plain storage, and its packed checkpoint input).
    for part, shape in [("w13", (2, 64, 96)), ("w2", (2, 96, 32))]:
        w = torch.randint(-8, 8, shape, generator=g, dtype=torch.int8)
        words = int4_utils.rearrange_4bit_elements(
            int4_utils.convert_int8_to_uint32_int4(w)
        )
        case(
            f"a8w4_int4_words_{part}",
            "aiter.int4_utils.rearrange_4bit_elements(aiter.int4_utils.convert_int8_to_uint32_int4(x))",
            "aiter/int4_utils.py",
            {},
            [("x", w)],
            words,
            "the uint32 packing alone (no shuffle)",
        )
        out = int4_utils.rearrange_4bit_elements(
            int4_utils.convert_int8_to_uint32_int4(
                shuffle.shuffle_weight(w, (16, 16), use_int4=True)
            )
        )
        case(
            f"a8w4_int4_weight_{part}",
            "aiter.int4_utils.rearrange_4bit_elements(aiter.int4_utils.convert_int8_to_uint32_int4("
            "aiter.ops.shuffle.shuffle_weight(x, (16, 16), use_int4=True)))",
            "aiter/ops/shuffle.py",
            {"layout": [16, 16], "use_int4": True},
            [("x", w)],
            out,
            "op_tests/test_moe_2stage.py a8w4 (WQDType torch.int4) weight preparation",
        )

    # The scales: test_moe_2stage.py passes pertoken_quant's fp32 [E, N, 1] through
    # e8m0_shuffle = shuffle_scale, which returns fp32 unchanged.
    for part, rows in [("w13", 64), ("w2", 96)]:
        s = torch.rand((2, rows, 1), generator=g, dtype=torch.float32) / 7
        case(
            f"shuffle_scale_fp32_{part}",
            "aiter.ops.shuffle.shuffle_scale",
            "aiter/ops/shuffle.py",
            {},
            [("scale", s)],
            shuffle.shuffle_scale(s),
            "fp32 per-row scales [E, N, 1] come back unchanged",
        )

    manifest = {
        "generator": "scripts/gen_golden_int4.py",
        "aiter_commit": commit,
        "format": "raw little-endian, C-order contiguous; dtype names are torch dtype names",
        "cases": cases,
    }
    with open(os.path.join(args.out, "aiter_int4_per_channel.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
