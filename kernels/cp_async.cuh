// Asynchronous global -> shared copies (cp.async, sm_80+) and the shared-state-space address
// of a pointer, for the CUDA families that copy into shared memory: the wgmma family's rings
// and the stream family's staged activation rows (SW_XSHARED). Under MP_HOST, the emulator's
// forms (scripts/emu/mma_sm90_host.cuh): a copy lands at the wait that the ISA allows last.
#pragma once
#include "moeplug_port.h"
#ifdef MP_HOST
#include "mma_sm90_host.cuh"
#endif

__device__ __forceinline__ u32 smem_addr(const void* p) {
#ifdef MP_HOST  // the emulator (scripts/emu): the block's emulated dynamic shared memory
  return emu_shared_addr(p);
#else
  return (u32)__cvta_generic_to_shared(p);
#endif
}

// 16 bytes global -> shared, asynchronously; `bytes` 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
#ifdef MP_HOST
  emu_cp_async(dst, src, bytes);  // scripts/emu/mma_sm90_host.cuh
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
#endif
}
// cp_async16 with the zero fill as a predicate (the instruction's ignore-src operand): zeros
// when `zero`, without a select of the byte count.
__device__ __forceinline__ void cp_async16_or_zero(u32 dst, const void* src, bool zero) {
#ifdef MP_HOST
  emu_cp_async(dst, src, zero ? 0 : 16);
#else
  asm volatile(
      "{\n.reg .pred z;\nsetp.ne.b32 z, %2, 0;\ncp.async.cg.shared.global [%0], [%1], 16, z;\n}"
      ::"r"(dst), "l"(src), "r"((int)zero)
      : "memory");
#endif
}
// 4 bytes global -> shared (4-byte copies go through L1: .ca), zeros when `zero`.
__device__ __forceinline__ void cp_async4_or_zero(u32 dst, const void* src, bool zero) {
#ifdef MP_HOST
  emu_cp_async_n(dst, src, 4, zero ? 0 : 4);
#else
  asm volatile(
      "{\n.reg .pred z;\nsetp.ne.b32 z, %2, 0;\ncp.async.ca.shared.global [%0], [%1], 4, z;\n}"
      ::"r"(dst), "l"(src), "r"((int)zero)
      : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef MP_HOST
  emu_cp_commit();
#else
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef MP_HOST
  emu_cp_wait(N);
#else
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
