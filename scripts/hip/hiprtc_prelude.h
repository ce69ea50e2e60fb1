// Offline stand-in for what hipRTC pre-includes, for scripts/hip_compile_check.sh: the HIP
// keywords, thread-index variables, barrier, atomics and math functions that kernels/*.cu
// use, written against clang's AMDGPU builtins. Only what the kernels use, so a kernel that
// reaches for more fails here as it might under hipRTC; add an entry when a kernel needs one.
// Never shipped: at run time hipRTC's own headers take this place.
#pragma once

#define __HIPCC_RTC__ 1

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
// HIP's spelling (hip/amd_detail/host_defines.h): clang's CUDA launch_bounds attribute is
// ignored for AMDGPU, which would leave the default 1024-thread budget (a quarter of the
// registers a 256-thread kernel may have).
#define __mp_launch_bounds0(t) __attribute__((amdgpu_flat_work_group_size(1, t)))
#define __mp_launch_bounds1(t, b) \
  __attribute__((amdgpu_flat_work_group_size(1, t), amdgpu_waves_per_eu(b)))
#define __mp_launch_bounds_pick(_1, _2, name, ...) name
#define __launch_bounds__(...) \
  __mp_launch_bounds_pick(__VA_ARGS__, __mp_launch_bounds1, __mp_launch_bounds0, )(__VA_ARGS__)

struct __mp_uint3 {
  unsigned x, y, z;
};
#define threadIdx                                                                  \
  (__mp_uint3{__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(), \
              __builtin_amdgcn_workitem_id_z()})
#define blockIdx                                                                     \
  (__mp_uint3{__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), \
              __builtin_amdgcn_workgroup_id_z()})
#define blockDim                                                          \
  (__mp_uint3{(unsigned)__builtin_amdgcn_workgroup_size_x(),              \
              (unsigned)__builtin_amdgcn_workgroup_size_y(),              \
              (unsigned)__builtin_amdgcn_workgroup_size_z()})
#define gridDim                                                            \
  (__mp_uint3{__builtin_amdgcn_grid_size_x() / blockDim.x,                 \
              __builtin_amdgcn_grid_size_y() / blockDim.y,                 \
              __builtin_amdgcn_grid_size_z() / blockDim.z})

// A workgroup barrier that also orders LDS and global memory, as __syncthreads must.
static __device__ inline void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// HIP's 16-byte vector type (a struct of four lanes, 16-byte aligned) and integer min/max.
struct __attribute__((aligned(16))) uint4 {
  unsigned x, y, z, w;
};
static __device__ inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4{x, y, z, w};
}
static __device__ inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static __device__ inline int min(int a, int b) { return a < b ? a : b; }
static __device__ inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static __device__ inline int max(int a, int b) { return a > b ? a : b; }

static __device__ inline float __uint_as_float(unsigned u) { return __builtin_bit_cast(float, u); }
static __device__ inline unsigned __float_as_uint(float f) { return __builtin_bit_cast(unsigned, f); }

// Device-scope relaxed read-modify-write, returning the old value (CUDA semantics).
static __device__ inline int atomicAdd(int* p, int v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ inline unsigned atomicMax(unsigned* p, unsigned v) {
  return __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

// Math: LLVM intrinsics where the AMDGPU backend has one, ROCm's ocml otherwise (linked from
// rocm-device-libs bitcode, as hipRTC does).
extern "C" __device__ float __ocml_exp_f32(float);
extern "C" __device__ float __ocml_erf_f32(float);
extern "C" __device__ float __ocml_tanh_f32(float);
static __device__ inline float fabsf(float x) { return __builtin_fabsf(x); }
static __device__ inline float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
static __device__ inline float fminf(float a, float b) { return __builtin_fminf(a, b); }
static __device__ inline float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
static __device__ inline float rintf(float x) { return __builtin_rintf(x); }
static __device__ inline float expf(float x) { return __ocml_exp_f32(x); }
static __device__ inline float erff(float x) { return __ocml_erf_f32(x); }
static __device__ inline float tanhf(float x) { return __ocml_tanh_f32(x); }  // GELU_TANH

// ocml reads the ISA version from a control constant that hipRTC links from rocm-device-libs'
// oclc_isa_version_*.bc; Debian's rocm-device-libs has none for gfx942/gfx950, so the check
// script defines it from the arch (9402 for gfx942).
#ifdef MP_OCLC_ISA_VERSION
extern "C" __constant__ const int __oclc_ISA_version = MP_OCLC_ISA_VERSION;
#endif
