// Shared by every kernel: one source compiles under NVRTC (NVIDIA), hiprtc (AMD) and clang-19's HIP
// device-only mode (the CPU machine's compile check). No system headers exist under NVRTC, so the fixed-width
// types and the few intrinsics the kernels use are defined here.
#pragma once

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef unsigned long long u64;

#if defined(__HIP__) || defined(__HIPCC_RTC__)
#define HEARTH_HIP 1
#endif

#if defined(HEARTH_HIP) && !defined(__HIPCC_RTC__)
// clang -x hip -nogpuinc: no HIP headers, so the keywords and built-in variables hiprtc predefines are
// spelled out here over clang's AMDGPU builtins.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define HEARTH_TID_X ((int)__builtin_amdgcn_workitem_id_x())
#define HEARTH_BID_X ((int)__builtin_amdgcn_workgroup_id_x())
#define HEARTH_BID_Y ((int)__builtin_amdgcn_workgroup_id_y())
#define HEARTH_BDIM_X ((int)__builtin_amdgcn_workgroup_size_x())
#define HEARTH_WARP ((int)__builtin_amdgcn_wavefrontsize())
static __device__ __forceinline__ void hearth_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
static __device__ __forceinline__ float hearth_shfl_xor(float v, int mask) {
    int lane = (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
    int src = lane ^ mask;
    return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src << 2, __builtin_bit_cast(int, v)));
}
#define HEARTH_EXP(x) __builtin_expf(x)
#define HEARTH_LOG(x) __builtin_logf(x)
#define HEARTH_SQRT(x) __builtin_sqrtf(x)
#define HEARTH_ROUND(x) __builtin_roundf(x)
#define HEARTH_FABS(x) __builtin_fabsf(x)
#define HEARTH_FMAX(a, b) __builtin_fmaxf(a, b)
#else
#define HEARTH_TID_X ((int)threadIdx.x)
#define HEARTH_BID_X ((int)blockIdx.x)
#define HEARTH_BID_Y ((int)blockIdx.y)
#define HEARTH_BDIM_X ((int)blockDim.x)
#define HEARTH_WARP ((int)warpSize)
static __device__ __forceinline__ void hearth_sync() { __syncthreads(); }
#if defined(HEARTH_HIP)
static __device__ __forceinline__ float hearth_shfl_xor(float v, int mask) { return __shfl_xor(v, mask); }
#else
static __device__ __forceinline__ float hearth_shfl_xor(float v, int mask) {
    return __shfl_xor_sync(0xffffffffu, v, mask);
}
#endif
#define HEARTH_EXP(x) expf(x)
#define HEARTH_LOG(x) logf(x)
#define HEARTH_SQRT(x) sqrtf(x)
#define HEARTH_ROUND(x) roundf(x)
#define HEARTH_FABS(x) fabsf(x)
#define HEARTH_FMAX(a, b) fmaxf(a, b)
#endif

// A GGUF f16 (IEEE binary16, little-endian bits) as f32.
static __device__ __forceinline__ float hearth_f16(u16 bits) {
#if defined(HEARTH_HIP)
    return (float)__builtin_bit_cast(_Float16, bits);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
#endif
}

// x rounded to the nearest f16 and back: a Q8_0 scale as a block stores it.
static __device__ __forceinline__ float hearth_round_f16(float x) {
#if defined(HEARTH_HIP)
    return (float)(_Float16)x;
#else
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return hearth_f16(h);
#endif
}

// Q8_0 as GGUF stores it: per 32 weights an f16 scale then 32 int8, 34 bytes.
#define HEARTH_QK8_0 32
#define HEARTH_Q8_0_BYTES 34

static __device__ __forceinline__ float hearth_q8_scale(const u8* block) {
    return hearth_f16((u16)block[0] | ((u16)block[1] << 8));
}

// Sum over a block of any size, any warp width (32 on NVIDIA and RDNA, 64 on CDNA). `scratch` holds one float
// per warp; every thread gets the total.
static __device__ __forceinline__ float hearth_block_sum(float v, float* scratch) {
    int warp = HEARTH_WARP;
    for (int o = warp / 2; o > 0; o >>= 1) v += hearth_shfl_xor(v, o);
    int lane = HEARTH_TID_X % warp, w = HEARTH_TID_X / warp, nw = (HEARTH_BDIM_X + warp - 1) / warp;
    hearth_sync();
    if (lane == 0) scratch[w] = v;
    hearth_sync();
    float total = 0.0f;
    for (int i = 0; i < nw; i++) total += scratch[i];
    return total;
}

static __device__ __forceinline__ float hearth_block_max(float v, float* scratch) {
    int warp = HEARTH_WARP;
    for (int o = warp / 2; o > 0; o >>= 1) {
        float u = hearth_shfl_xor(v, o);
        v = u > v ? u : v;
    }
    int lane = HEARTH_TID_X % warp, w = HEARTH_TID_X / warp, nw = (HEARTH_BDIM_X + warp - 1) / warp;
    hearth_sync();
    if (lane == 0) scratch[w] = v;
    hearth_sync();
    float m = scratch[0];
    for (int i = 1; i < nw; i++) m = scratch[i] > m ? scratch[i] : m;
    return m;
}
