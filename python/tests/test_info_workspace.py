"""`python -m moeplug info` and `fused_moe_workspace_size` (pre-allocation before a launch)."""

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import moeplug

PYTHON_DIR = Path(__file__).resolve().parents[1]
E, H, INTER, M, K = 4, 256, 256, 5, 2


def _info(*args):
    return subprocess.run(
        [sys.executable, "-m", "moeplug", "info", *args],
        capture_output=True, text=True, cwd=PYTHON_DIR,
    )


def test_info_json_reports_the_loaded_library_and_every_device():
    out = _info("--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["version"] == moeplug.version()
    assert r["abi_version"] == "1.1"
    assert r["library"] == moeplug.library_path()
    assert set(r["devices"]) == {"cpu", "cuda:0", "rocm:0"}
    cpu = r["devices"]["cpu"]
    assert cpu["available"] is True and cpu["backend"] == "cpu"
    assert cpu["weight_formats"] == sorted(moeplug.get_caps("cpu").weight_formats)
    for gpu in ("cuda:0", "rocm:0"):
        d = r["devices"][gpu]
        if not d["available"]:
            assert d["status"] == "MOEPLUG_BACKEND_UNAVAILABLE" and d["message"]


def test_info_text_and_bad_arguments():
    out = _info()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"moeplug  {moeplug.version()}\nABI      1.1\n")
    assert "\ncpu\n  backend          cpu\n" in out.stdout
    bad = _info("--all")
    assert bad.returncode == 2
    assert "unrecognized arguments: --all" in bad.stderr


@pytest.fixture(scope="module")
def layer():
    rng = np.random.default_rng(7)
    bf16 = ml_dtypes.bfloat16
    w13 = (rng.standard_normal((E, 2 * INTER, H)) * 0.1).astype(bf16)
    w2 = (rng.standard_normal((E, H, INTER)) * 0.1).astype(bf16)
    p = moeplug.prepare_moe(w13, w2, weight_format="bf16")
    x = rng.standard_normal((M, H)).astype(bf16)
    ids = np.array([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2]], np.int32)
    wts = np.full((M, K), 0.5, np.float32)
    return p, x, wts, ids


def test_workspace_size_on_the_cpu_is_zero_and_the_launch_takes_it(layer):
    p, x, wts, ids = layer
    kwargs = dict(activation="silu", act_dtype="bf16")
    need = moeplug.fused_moe_workspace_size(x, p, wts, ids, **kwargs)
    assert isinstance(need, int) and need == 0  # the CPU backend takes scratch from its heap
    ws = np.zeros(need, np.uint8)
    out = moeplug.fused_moe(x, p, wts, ids, workspace=ws, **kwargs)
    np.testing.assert_array_equal(out.view(np.uint16), moeplug.fused_moe(x, p, wts, ids, **kwargs).view(np.uint16))
    # The launch's own keywords are accepted (and ignored) so one dict serves both calls.
    assert moeplug.fused_moe_workspace_size(x, p, wts, ids, workspace=ws, stream=None, **kwargs) == 0


def test_workspace_size_checks_arguments_like_the_launch(layer):
    p, x, wts, ids = layer
    with pytest.raises(moeplug.MoeplugError) as e:
        moeplug.fused_moe_workspace_size(x, p, wts, ids[:, :1])
    assert e.value.name == "MOEPLUG_INVALID_ARGUMENT"
    assert e.value.message == "moeplug_fused_moe_workspace_size: topk_weights: expected shape [5, 1], got [5, 2]"
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['bogus'\]"):
        moeplug.fused_moe_workspace_size(x, p, wts, ids, bogus=1)
