"""A CUDA __dlpack__ producer that is not torch (what CuPy/JAX arrays look like) is read
through its capsule: prep on it equals the torch call byte for byte; outputs must be given."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

torch = pytest.importorskip("torch")
import moeplug  # noqa: E402


class Foreign:
    """Hides a torch tensor behind the DLPack protocol only."""

    def __init__(self, t):
        self.t = t
        self.streams = []

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return self.t.__dlpack__(stream=stream)


def test_cuda_dlpack_producer_through_the_capsule():
    src = torch.randint(0, 256, (4, 32, 64), dtype=torch.uint8, device="cuda")
    want = moeplug.shuffle_weight(src)
    out = torch.empty_like(src)
    f = Foreign(src)
    moeplug.shuffle_weight(f, out=Foreign(out))
    torch.cuda.synchronize()
    assert f.streams == [1]
    assert torch.equal(out, want)
    with pytest.raises(TypeError, match=r"must be passed \(out=\.\.\.\)"):
        moeplug.shuffle_weight(Foreign(src))
