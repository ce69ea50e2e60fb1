"""Device tensors the driver does not vouch for (issue 14): a tensor labelled CUDA whose
address is pageable or page-locked host memory, no allocation at all, a buffer freed through
the driver, an extent running past the end of its allocation, or another device's memory.
Each launch and device prep call must refuse with INVALID_ARGUMENT and the exact message of
src/backend/gpu/pointer.rs, leave the (poisoned) output bytes untouched, and leave the process
able to run the next good launch to the same bytes. Device and managed memory from the driver
itself must be accepted. Freed and exact-size buffers come from cuMemAlloc through ctypes: a
block torch frees stays mapped by its caching allocator, and its segments are rounded."""

import ctypes

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")  # the moeplug package, for the prep calls
moeplug = pytest.importorskip("moeplug")

import _abi  # noqa: E402
from test_fused_moe import run_moe  # noqa: E402

DEV = "cuda"
POISON = 0xAB
MIB = 1 << 20
QUERY = "cuPointerGetAttributes"


# ----------------------------------------------------------------------------------------
# The CUDA driver through ctypes, on torch's device 0 primary context


class Driver:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        u64, sz = ctypes.c_uint64, ctypes.c_size_t
        sig = {"cuMemAlloc_v2": [ctypes.POINTER(u64), sz], "cuMemFree_v2": [u64],
               "cuMemAllocManaged": [ctypes.POINTER(u64), sz, ctypes.c_uint],
               "cuMemsetD8_v2": [u64, ctypes.c_ubyte, sz],
               "cuMemcpyDtoH_v2": [ctypes.c_void_p, u64, sz],
               "cuMemcpyDtoD_v2": [u64, u64, sz],
               "cuDevicePrimaryCtxRetain": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int],
               "cuCtxSetCurrent": [ctypes.c_void_p]}
        for name, args in sig.items():
            getattr(self.lib, name).argtypes = args
            getattr(self.lib, name).restype = ctypes.c_int
        torch.cuda.init()
        ctx = ctypes.c_void_p()
        self.ok(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        self.ctx = ctx

    def ok(self, rc, what):
        assert rc == 0, f"{what} failed: CUresult {rc}"

    def current(self):
        self.ok(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def alloc(self, n, managed=False):
        self.current()
        p = ctypes.c_uint64()
        if managed:
            self.ok(self.lib.cuMemAllocManaged(ctypes.byref(p), n, 1), "cuMemAllocManaged")
        else:
            self.ok(self.lib.cuMemAlloc_v2(ctypes.byref(p), n), "cuMemAlloc")
        return p.value

    def free(self, p):
        self.current()
        self.ok(self.lib.cuMemFree_v2(p), "cuMemFree")

    def memset(self, p, byte, n):
        self.current()
        self.ok(self.lib.cuMemsetD8_v2(p, byte, n), "cuMemsetD8")

    def copy_from(self, p, t):
        """The bytes of device tensor `t` to address `p`."""
        self.current()
        torch.cuda.synchronize()
        self.ok(self.lib.cuMemcpyDtoD_v2(p, t.data_ptr(), t.numel() * t.element_size()), "cuMemcpyDtoD")

    def read(self, p, n):
        self.current()
        torch.cuda.synchronize()
        buf = (ctypes.c_ubyte * n)()
        self.ok(self.lib.cuMemcpyDtoH_v2(buf, p, n), "cuMemcpyDtoH")
        return bytes(buf)


@pytest.fixture(scope="module")
def drv():
    return Driver()


# ----------------------------------------------------------------------------------------
# fused_moe


@pytest.fixture(scope="module")
def layer():
    """A good bf16 launch and its output bytes (the CUDA backend is deterministic)."""
    out, _, st = run_moe("bf16", M=5, seed=11)
    return st, out.clone()


def nbytes(t):
    return t.numel() * t.element_size()


def args_with(st, name, data, device=(2, 0), out=None):
    """The launch of `st` into `out` (default: a fresh poisoned output) with the descriptor of
    `name` pointing at `data` on `device`; returns (args, out)."""
    t = dict(st["tensors"])
    if out is None:
        out = torch.empty_like(t["output"])
        out.view(torch.uint8).fill_(POISON)
    t["output"] = out
    args = _abi.make_args(st["layout"], t, **st["kw"])
    d = getattr(args, name).contents
    d.data = data
    d.device = _abi.Device(*device)
    return args, out


def refused(args):
    with pytest.raises(_abi.MoeplugError) as e:
        _abi.fused_moe(args)
    torch.cuda.synchronize()  # nothing was queued that could fault
    assert e.value.name == "INVALID_ARGUMENT", str(e.value)
    return str(e.value).removeprefix("INVALID_ARGUMENT: ")


def assert_poisoned(out):
    torch.cuda.synchronize()
    assert bool((out.view(torch.uint8) == POISON).all()), "a refused launch wrote its output"


def assert_still_runs(st, expected):
    """The process and the device survive: the next good launch gives the same bytes."""
    args, out = args_with(st, "w13", st["tensors"]["w13"].data_ptr())
    _abi.fused_moe(args)
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


def not_known(call, name, addr):
    return (f"{call}: {name}: address {addr:#x} is not in any CUDA allocation ({QUERY} knows none "
            "there: freed, never allocated, or pageable host memory), but the tensor is labelled cuda:0")


def assert_launch_refused(layer, name, addr, message):
    """fused_moe with tensor `name` at `addr`: refused with `message`, the output untouched,
    and the next good launch unharmed."""
    st, expected = layer
    args, out = args_with(st, name, addr)
    assert refused(args) == message
    assert_poisoned(out)
    assert_still_runs(st, expected)


def test_pageable_host_memory_labelled_cuda(layer):
    host = layer[0]["tensors"]["w13"].cpu()
    assert_launch_refused(layer, "w13", host.data_ptr(),
                          not_known("moeplug_fused_moe", "w13", host.data_ptr()))


def test_pinned_host_memory_labelled_cuda(layer):
    pinned = layer[0]["tensors"]["topk_ids"].cpu().pin_memory()
    assert_launch_refused(layer, "topk_ids", pinned.data_ptr(),
                          f"moeplug_fused_moe: topk_ids: address {pinned.data_ptr():#x} is "
                          f"page-locked host memory ({QUERY}), not device or managed memory of cuda:0")


@pytest.mark.parametrize("addr", [0x1000, 1 << 52], ids=["first_page", "2^52"])
def test_unmapped_address(layer, addr):
    assert_launch_refused(layer, "hidden_states", addr,
                          not_known("moeplug_fused_moe", "hidden_states", addr))


def test_freed_buffer(layer, drv):
    st, expected = layer
    w2 = st["tensors"]["w2"]
    p = drv.alloc(2 * MIB)
    drv.copy_from(p, w2)
    args, out = args_with(st, "w2", p)
    drv.free(p)  # last: no allocation may take the address back before the call
    assert refused(args) == not_known("moeplug_fused_moe", "w2", p)
    assert_poisoned(out)
    assert_still_runs(st, expected)


def test_input_extent_past_the_end_of_its_allocation(layer, drv):
    st, expected = layer
    w13 = st["tensors"]["w13"]
    n = nbytes(w13)
    size = -(-n // (2 * MIB)) * 2 * MIB
    base = drv.alloc(size)
    try:
        at = base + size - n + 256  # the descriptor's last 256 bytes are no memory of it
        args, out = args_with(st, "w13", at)
        assert refused(args) == (
            f"moeplug_fused_moe: w13: {n} bytes from {at:#x} run past the end of their "
            f"allocation ({size} bytes from {base:#x}, {QUERY}) by 256 bytes")
        assert_poisoned(out)
        # The same bytes inside the allocation are good weights.
        drv.copy_from(base, w13)
        args, out = args_with(st, "w13", base)
        _abi.fused_moe(args)
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    finally:
        drv.free(base)


def test_output_extent_past_the_end_of_its_allocation(layer, drv):
    """The output runs past its buffer: refused before a byte of the buffer is written."""
    st, expected = layer
    out_t = st["tensors"]["output"]
    n = nbytes(out_t)
    size = 2 * MIB
    base = drv.alloc(size)
    try:
        drv.memset(base, POISON, size)
        at = base + size - n + 64
        args, _ = args_with(st, "output", at)
        assert refused(args) == (
            f"moeplug_fused_moe: output: {n} bytes from {at:#x} run past the end of their "
            f"allocation ({size} bytes from {base:#x}, {QUERY}) by 64 bytes")
        assert drv.read(base, size) == bytes([POISON]) * size
    finally:
        drv.free(base)
    assert_still_runs(st, expected)


def test_managed_memory_is_accepted(layer, drv):
    st, expected = layer
    w13 = st["tensors"]["w13"]
    p = drv.alloc(nbytes(w13), managed=True)
    try:
        drv.copy_from(p, w13)
        args, out = args_with(st, "w13", p)
        _abi.fused_moe(args)
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    finally:
        drv.free(p)


def test_memory_of_another_device(layer):
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: no memory of another device to pass")
    other = layer[0]["tensors"]["w13"].to("cuda:1")
    assert_launch_refused(layer, "w13", other.data_ptr(),
                          f"moeplug_fused_moe: w13: address {other.data_ptr():#x} is device "
                          f"memory of cuda:1 ({QUERY}), but the call runs on cuda:0")


def test_refused_inside_a_graph_capture(layer):
    """The check runs while a stream captures: a bad tensor is refused on the host, nothing is
    captured, and the capture goes on to a graph that replays the good launch."""
    st, expected = layer
    host = st["tensors"]["w13"].cpu()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    kw = dict(st["kw"], stream=stream.cuda_stream)
    st_side = dict(st, kw=kw)
    bad, bad_out = args_with(st_side, "w13", host.data_ptr())
    good, out = args_with(st_side, "w13", st["tensors"]["w13"].data_ptr())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        with pytest.raises(_abi.MoeplugError) as e:
            _abi.fused_moe(bad)
        _abi.fused_moe(good)
    assert str(e.value) == "INVALID_ARGUMENT: " + not_known("moeplug_fused_moe", "w13", host.data_ptr())
    out.view(torch.uint8).fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    assert_poisoned(bad_out)


# ----------------------------------------------------------------------------------------
# Device prep: the same refusals, outputs untouched


def moeplug_lib():
    return moeplug._library()


def mirror():
    return moeplug._abi


class Raw:
    """A `moeplug_tensor` at any address (kept alive with its shape)."""

    def __init__(self, addr, shape, dtype=(1, 8), device=(2, 0)):
        m = mirror()
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.c = m.Tensor(addr, m.Device(*device), len(shape), m.DType(dtype[0], dtype[1], 1),
                          self.shape, None, 0)

    def ptr(self):
        return ctypes.pointer(self.c)


def shuffle_weight(src, dst):
    """moeplug_shuffle_weight of uint8 [E, N, K] (layout 16x16) on the current stream."""
    m = mirror()
    args = m.ShuffleWeightArgs(src=src.ptr(), dst=dst.ptr(), layout_n=16, layout_k=16)
    st = moeplug_lib().moeplug_shuffle_weight(ctypes.byref(args), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return st, moeplug_lib().moeplug_last_error().decode() if st else ""


SHAPE = (2, 64, 256)


def prep_tensors():
    gen = torch.Generator().manual_seed(21)
    src = torch.randint(0, 256, SHAPE, generator=gen, dtype=torch.uint8).to(DEV)
    dst = torch.empty(SHAPE, dtype=torch.uint8, device=DEV)
    dst.fill_(POISON)
    return src, dst


def test_prep_good_call_runs():
    src, dst = prep_tensors()
    st, msg = shuffle_weight(Raw(src.data_ptr(), SHAPE), Raw(dst.data_ptr(), SHAPE))
    assert st == 0, msg
    assert torch.equal(dst.cpu(), moeplug.shuffle_weight(src.cpu(), layout_n=16, layout_k=16))


def test_prep_host_source_labelled_cuda():
    src, dst = prep_tensors()
    host = src.cpu()
    st, msg = shuffle_weight(Raw(host.data_ptr(), SHAPE), Raw(dst.data_ptr(), SHAPE))
    assert mirror().STATUS_NAMES[st] == "MOEPLUG_INVALID_ARGUMENT"
    assert msg == not_known("moeplug_shuffle_weight", "src", host.data_ptr())
    assert bool((dst == POISON).all())


def test_prep_freed_destination(drv):
    src, _ = prep_tensors()
    p = drv.alloc(2 * MIB)
    drv.free(p)
    st, msg = shuffle_weight(Raw(src.data_ptr(), SHAPE), Raw(p, SHAPE))
    assert mirror().STATUS_NAMES[st] == "MOEPLUG_INVALID_ARGUMENT"
    assert msg == not_known("moeplug_shuffle_weight", "dst", p)


def test_prep_destination_past_the_end_of_its_allocation(drv):
    src, _ = prep_tensors()
    n = src.numel()
    size = 2 * MIB
    base = drv.alloc(size)
    try:
        drv.memset(base, POISON, size)
        at = base + size - n + 512
        st, msg = shuffle_weight(Raw(src.data_ptr(), SHAPE), Raw(at, SHAPE))
        assert mirror().STATUS_NAMES[st] == "MOEPLUG_INVALID_ARGUMENT"
        assert msg == (f"moeplug_shuffle_weight: dst: {n} bytes from {at:#x} run past the end of "
                       f"their allocation ({size} bytes from {base:#x}, {QUERY}) by 512 bytes")
        assert drv.read(base, size) == bytes([POISON]) * size
    finally:
        drv.free(base)
    test_prep_good_call_runs()


def test_prepare_moe_with_a_pinned_weight():
    """prepare_moe on device tensors: one pinned host weight refuses the whole call before any
    of its outputs is written."""
    m = mirror()
    e, h, i = 2, 64, 64
    gen = torch.Generator().manual_seed(5)
    w13 = torch.randn((e, 2 * i, h), generator=gen).to(torch.bfloat16)
    w2 = torch.randn((e, h, i), generator=gen).to(torch.bfloat16).pin_memory()
    d_w13 = w13.to(DEV)
    ins = dict(w13=Raw(d_w13.data_ptr(), w13.shape, (4, 16)), w2=Raw(w2.data_ptr(), w2.shape, (4, 16)))
    args = m.PrepareMoeArgs(weight_format=1, gate_mode_in=1, device_type=2, device_id=0)
    for k, v in ins.items():
        setattr(args, k, v.ptr())
    sizes = m.PrepareMoeSizes()
    st = moeplug_lib().moeplug_prepare_moe_sizes(ctypes.byref(args), ctypes.byref(sizes))
    assert st == 0, moeplug_lib().moeplug_last_error().decode()
    outs = {}
    for name in ("w13", "w2"):
        ndim = getattr(sizes, name + "_ndim")
        shape = tuple(getattr(sizes, name + "_shape")[:ndim])
        outs[name] = torch.empty(shape, dtype=torch.bfloat16, device=DEV)
        outs[name].view(torch.uint8).fill_(POISON)
        ins["out_" + name] = Raw(outs[name].data_ptr(), shape, (4, 16))
        setattr(args, "out_" + name, ins["out_" + name].ptr())
    layout = m.Layout()
    args.out_layout = ctypes.pointer(layout)
    st = moeplug_lib().moeplug_prepare_moe(ctypes.byref(args), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert m.STATUS_NAMES[st] == "MOEPLUG_INVALID_ARGUMENT"
    assert moeplug_lib().moeplug_last_error().decode() == (
        f"moeplug_prepare_moe: w2: address {w2.data_ptr():#x} is page-locked host memory ({QUERY}), "
        "not device or managed memory of cuda:0")
    for name, t in outs.items():
        assert bool((t.view(torch.uint8) == POISON).all()), f"out_{name} was written"
