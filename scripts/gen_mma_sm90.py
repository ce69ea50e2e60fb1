"""Writes kernels/mma_sm90.cuh: the wgmma wrappers, whose asm operand lists (one "+f" per
accumulator register) are too long to keep by hand. Run: python3 scripts/gen_mma_sm90.py"""
import pathlib

HEAD = '''// Warpgroup MMA primitives of CUDA sm_90a (wgmma.mma_async), fp32 accumulation, both
// operands in shared memory through matrix descriptors, K-major, 128-byte swizzle. Generated
// by scripts/gen_mma_sm90.py (the operand lists are long): edit the generator, not this file.
//
// Accumulator fragment of m64nN (PTX ISA "Matrix Fragments for wgmma .m64nNk16"): warp w of
// the warpgroup holds rows 16 w .. 16 w + 15; lane = 4 gid + tig; d[4 j + c] is row
// 16 w + gid + 8 (c >> 1), column 8 j + 2 tig + (c & 1).
#pragma once
#include "moeplug_port.h"

// Descriptor of a K-major tile whose rows are 128 bytes, 8-row groups 1024 bytes apart,
// 128-byte swizzle (16-byte chunk c of row r stored at chunk c ^ (r & 7)); `addr` is the
// shared-memory address of the row-0 chunk to start from (the tile base 1024-aligned, plus
// 32 bytes per K step of one instruction).
__device__ __forceinline__ u64 wgmma_desc(u32 addr) {
  return (u64)((addr & 0x3FFFFu) >> 4) | (u64)1 << 16 | (u64)(1024 >> 4) << 32 | (u64)1 << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
'''

FUNC = '''
// D[64 x {n}] (+)= A[64 x {k}] * B[{n} x {k}]^T, {ty} operands; accumulate = 0 overwrites D.
__device__ __forceinline__ void wgmma_{name}_n{n}(float* d, u64 da, u64 db, int accumulate) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{pa}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ty}.{ty} "
      "{{{regs}}}, %{da}, %{db}, p, 1, 1{trans};\\n}}"
      : {outs}
      : "l"(da), "l"(db), "r"(accumulate)
      : "memory");
}}
'''


def func(name, ty, k, n, trans):
    nreg = n // 2
    regs = ",".join(f"%{i}" for i in range(nreg))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nreg))
    return FUNC.format(name=name, ty=ty, k=k, n=n, regs=regs, outs=outs, da=nreg, db=nreg + 1,
                       pa=nreg + 2, trans=trans)


body = HEAD
for n in (128, 256):
    body += func("bf16", "bf16", 16, n, ", 0, 0")
    body += func("f16", "f16", 16, n, ", 0, 0")
    body += func("e4m3", "e4m3", 32, n, "")  # fp8: K-major only, no transpose operands
out = pathlib.Path(__file__).resolve().parent.parent / "kernels" / "mma_sm90.cuh"
out.write_text(body)
print(f"wrote {out}")
