"""Reading the golden vectors (tests/golden)."""

import json
from pathlib import Path

import ml_dtypes
import numpy as np

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "golden"

DTYPES = {
    "float4_e2m1fn_x2": np.uint8,
    "uint8": np.uint8,
    "int8": np.int8,
    "int32": np.int32,
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}


def cases():
    return {c["name"]: c for c in json.loads((GOLDEN / "manifest.json").read_text())["cases"]}


def tensor(case, name, role=None):
    for t in case["tensors"]:
        if t["name"] == name and (role is None or t["role"] == role):
            data = np.fromfile(GOLDEN / t["file"], dtype=DTYPES[t["dtype"]])
            return data.reshape(t["shape"])
    raise KeyError(f"{case['name']}: no tensor {name}")


def has(case, name):
    return any(t["name"] == name for t in case["tensors"])


def assert_bytes_equal(got, want, mask=None, what=""):
    g = np.ascontiguousarray(got).view(np.uint8).reshape(-1)
    w = np.ascontiguousarray(want).view(np.uint8).reshape(-1)
    assert g.shape == w.shape, f"{what}: {g.shape} bytes vs {w.shape}"
    if mask is not None:
        m = np.ascontiguousarray(mask).view(np.uint8).reshape(-1).astype(bool)
        g, w = g[m], w[m]
    bad = np.nonzero(g != w)[0]
    assert bad.size == 0, f"{what}: {bad.size} bytes differ, first at {bad[:8]}"
