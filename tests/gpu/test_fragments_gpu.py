"""Layout fragments (ABI 1.1, docs/abi.md §8) on CUDA: the primitives on torch CUDA tensors
report the same fragments and bytes as on the host, the record assembled from them launches on
CUDA matching the CPU backend, and a hand edit of it is LAYOUT_MISMATCH naming the field with
the output untouched."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
import moeplug  # noqa: E402

# H and I not aligned, so both pads do something.
E, H, INTER, HP, IP, M, K = 8, 448, 200, 512, 256, 29, 2


def host(t):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def as_bytes(x):
    return np.ascontiguousarray(host(x) if torch.is_tensor(x) else x).view(np.uint8).reshape(-1)


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.fixture(scope="module")
def layer():
    g = torch.Generator().manual_seed(11)
    w13 = (torch.randn(E, 2 * INTER, H, generator=g) * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(E, H, INTER, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)]).to(torch.int32)
    wts = torch.softmax(torch.randn(M, K, generator=g), dim=1)
    return w13, w2, x, ids, wts


def by_primitives(w13, w2):
    frags = []
    w13p = moeplug.pad_weights(w13, rows=2 * IP, cols=HP, gate_up=True, fragments=frags)
    w13s = moeplug.shuffle_weight(w13p, fragments=frags)
    w2p = moeplug.pad_weights(w2, rows=HP, cols=IP, fragments=frags)
    w2s = moeplug.shuffle_weight(w2p, fragments=frags)
    return frags, moeplug.Prepared(layout=moeplug.layout_from_fragments(frags), w13=w13s, w2=w2s)


def test_device_primitives_report_the_host_fragments_and_bytes(layer):
    w13, w2, *_ = layer
    dev_frags, dev = by_primitives(w13.cuda(), w2.cuda())
    host_frags, hst = by_primitives(host(w13), host(w2))
    torch.cuda.synchronize()
    assert [bytes(f) for f in dev_frags] == [bytes(f) for f in host_frags]
    assert bytes(dev.layout) == bytes(hst.layout)
    assert dev.layout.prep_fingerprint != 0
    assert np.array_equal(as_bytes(dev.w13), as_bytes(hst.w13))
    assert np.array_equal(as_bytes(dev.w2), as_bytes(hst.w2))


def test_fused_moe_on_an_assembled_record_matches_the_cpu_backend(layer):
    w13, w2, x, ids, wts = layer
    _, dev = by_primitives(w13.cuda(), w2.cuda())
    _, hst = by_primitives(host(w13), host(w2))
    out = torch.full((M, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    moeplug.fused_moe(x.cuda(), dev, wts.cuda(), ids.cuda(), out=out)
    want = moeplug.fused_moe(host(x), hst, host(wts), host(ids))
    torch.cuda.synchronize()
    assert rel_l2(host(out), want) <= 1e-2


def test_an_edited_assembled_record_is_refused_on_cuda(layer):
    w13, w2, x, ids, wts = layer
    _, dev = by_primitives(w13.cuda(), w2.cuda())
    dev.layout = type(dev.layout).from_buffer_copy(dev.layout)
    dev.layout.gate_mode = moeplug.GATE_MODES["interleave"]
    out = torch.full((M, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(moeplug.MoeplugError) as info:
        moeplug.fused_moe(x.cuda(), dev, wts.cuda(), ids.cuda(), out=out)
    assert info.value.name == "MOEPLUG_LAYOUT_MISMATCH"
    assert info.value.message == (
        "moeplug_fused_moe: layout.gate_mode: the record says interleave, but preparation produced separated (layout.prep_fingerprint)"
    )
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all()
