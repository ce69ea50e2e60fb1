"""The self-test before first use on a CUDA GPU (issue 13): the first open of cuda:0 in a
process runs one small fused_moe per kernel family the device may select against the CPU
backend, and one device prep against the host bytes; it passes here, is timed (`moeplug info`),
and a family broken on purpose by the test-only switch MOEPLUG_SELFTEST_BREAK is refused with
its reason while the other families run. Each case is a fresh process: the self-test runs once
per process and device and reads its switches then."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import _abi  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BREAK = "MOEPLUG_SELFTEST_BREAK"
# On an H200 at least these are tested (a new family adds its own entry).
TESTED = ["fp32", "tile32", "stream", "prep"]


def cli():
    for p in [Path(_abi.library_path()).parent / "moeplug", ROOT / "target/release/moeplug"]:
        if p.exists():
            return p
    raise AssertionError("the moeplug CLI is not built (cargo build --release)")


def env(**kw):
    e = {k: v for k, v in os.environ.items()
         if k not in (BREAK, "MOEPLUG_SELFTEST", "MOEPLUG_GPU_FAMILY")}
    e.update(kw)
    return e


def info(**kw):
    """(seconds, summary) of cuda:0's self-test as `moeplug info` prints it."""
    r = subprocess.run([str(cli()), "info"], env=env(**kw), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"cuda:0 self-test before first use: ([0-9.]+) s; (.*)", r.stdout)
    assert m, r.stdout
    return float(m.group(1)), m.group(2).strip()


def verdicts(summary):
    """{"fp32": "ok", "stream": "refused (...)", ...} of a summary."""
    out = {}
    for part in summary.split("; "):
        name, verdict = part.split(" ", 1)
        out[name] = verdict
    return out


def assert_all_ok(summary):
    v = verdicts(summary)
    assert set(TESTED) <= set(v), summary
    assert all(x == "ok" for x in v.values()), summary


def test_selftest_runs_at_first_open_passes_and_is_timed(tmp_path):
    cache = str(tmp_path / "kernels")
    cold, summary = info(MOEPLUG_CACHE_DIR=cache)
    assert_all_ok(summary)
    warm, summary = info(MOEPLUG_CACHE_DIR=cache)
    assert_all_ok(summary)
    # For bench/NOTES.md: the cold figure includes compiling every tested configuration.
    print(f"self-test before first use on cuda:0: cold cache {cold:.3f} s, warm {warm:.3f} s")
    # The time is reported, not bounded here: speed is the benchmarks' business, and under
    # compute-sanitizer (bench/sanitize.sh) the same self-test takes many seconds.
    assert cold > 0.0 and warm > 0.0, (cold, warm)


def test_skipping_is_reported():
    seconds, summary = info(MOEPLUG_SELFTEST="0")
    assert summary == "skipped (MOEPLUG_SELFTEST=0): no family proven"
    assert seconds == 0.0


def test_a_broken_family_is_refused_with_its_reason_while_the_others_run():
    _, summary = info(**{BREAK: "stream"})
    m = re.search(
        r"; stream refused \(rel L2 (\S+) vs the CPU backend > 1e-2\) "
        r"\[MOEPLUG_SELFTEST_BREAK=stream: a test switch corrupted that result\]$", summary)
    assert m, summary
    others = verdicts(summary[:m.start()])
    assert set(TESTED) - {"stream"} <= set(others), summary
    assert all(x == "ok" for x in others.values()), summary
    # The corruption negates the output: rel L2 2 up to the device-vs-CPU difference.
    assert abs(float(m.group(1)) - 2.0) < 0.01, summary


LAUNCH = """
import sys
import torch
sys.path.insert(0, {here!r})
from test_fused_moe import run_moe, assert_close
out, ref, st = run_moe("bf16", E=8, k=2, H=1024, I=512, M=4, seed=5)
assert_close(out, ref, st=st)
torch.save(out.cpu(), sys.argv[1])
"""


def launch_output(path, **kw):
    """A small-M bf16 launch (the stream family's regime) in a fresh process, checked against
    the CPU backend and float64 there; its output bits."""
    r = subprocess.run([sys.executable, "-c", LAUNCH.format(here=str(HERE)), str(path)],
                       env=env(**kw), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return torch.load(path)


def test_a_refused_family_is_never_selected(tmp_path):
    stream = launch_output(tmp_path / "stream.pt", MOEPLUG_GPU_FAMILY="stream")
    tile32 = launch_output(tmp_path / "tile32.pt", MOEPLUG_GPU_FAMILY="tile32")
    # The families sum in different orders: their bits tell which one ran.
    assert not torch.equal(stream, tile32), "pick a shape where stream and tile32 differ"
    # Asked for stream, with stream refused by the self-test: tile32 (its fallback) runs.
    refused = launch_output(tmp_path / "refused.pt", MOEPLUG_GPU_FAMILY="stream",
                            **{BREAK: "stream"})
    assert torch.equal(refused, tile32)


CAPS = """
import sys
sys.path.insert(0, {here!r})
import _abi
print(_abi.get_caps(2, 0).features)
"""


def test_a_refused_device_prep_drops_the_feature():
    _, summary = info(**{BREAK: "prep"})
    m = re.search(
        r"; prep refused \((\d+) of (\d+) bytes differ from the host prep\) "
        r"\[MOEPLUG_SELFTEST_BREAK=prep: a test switch corrupted that result\]$", summary)
    assert m and m.group(1) == "1", summary
    others = verdicts(summary[:m.start()])
    assert set(TESTED) - {"prep"} <= set(others), summary
    assert all(x == "ok" for x in others.values()), summary
    features = []
    for kw in [{}, {BREAK: "prep"}]:
        r = subprocess.run([sys.executable, "-c", CAPS.format(here=str(HERE))],
                           env=env(**kw), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        features.append(int(r.stdout.split()[-1]))
    device_prep = 1 << 5
    assert features[0] & device_prep
    assert features[1] == features[0] & ~device_prep
