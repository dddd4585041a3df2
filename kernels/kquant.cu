// Products with the block types people download, dequantized one weight at a time in the kernel: Q4_0 (32
// weights in 18 bytes), Q4_K (256 in 144), Q5_K (256 in 176) and Q6_K (256 in 210), GGUF layouts read in place.
// The input is f32: these types' CPU kernels round activations differently per CPU (Q8_0 or Q8_K blocks), so
// the GPU keeps the f32 product of the dequantized weights, the reference both are checked against.
// `type` is the GGML type id. One thread per output value.
#include "prelude.h"

#define HEARTH_T_Q4_0 2
#define HEARTH_T_Q4_K 12
#define HEARTH_T_Q5_K 13
#define HEARTH_T_Q6_K 14

static __device__ __forceinline__ int hearth_kq_weights(int type) { return type == HEARTH_T_Q4_0 ? 32 : 256; }

static __device__ __forceinline__ int hearth_kq_bytes(int type) {
    switch (type) {
    case HEARTH_T_Q4_0: return 18;
    case HEARTH_T_Q4_K: return 144;
    case HEARTH_T_Q5_K: return 176;
    default: return 210;
    }
}

static __device__ __forceinline__ float hearth_f16_at(const u8* p) { return hearth_f16((u16)p[0] | ((u16)p[1] << 8)); }

// The 6-bit scale and minimum of sub-block j (0..8) from a Q4_K/Q5_K block's 12 packed bytes.
static __device__ __forceinline__ void hearth_scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Weight i of the block at b.
static __device__ float hearth_kq_weight(int type, const u8* b, int i) {
    if (type == HEARTH_T_Q4_0) {
        const u8* qs = b + 2;
        int q = i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4);
        return hearth_f16_at(b) * (float)(q - 8);
    }
    if (type == HEARTH_T_Q6_K) {
        // Per half of 128: quarters of 32 read ql[l] and ql[l + 32], low then high nibbles, with two bits
        // each of qh[l] and a signed scale per 16.
        int half = i / 128, quarter = i % 128 / 32, l = i % 32;
        const u8* ql = b + 64 * half;
        const u8* qh = b + 128 + 32 * half;
        const i8* sc = (const i8*)(b + 192) + 8 * half;
        int lo = quarter % 2 == 0 ? ql[l] : ql[l + 32];
        int nib = quarter < 2 ? (lo & 0xF) : (lo >> 4);
        int q = (nib | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
        return hearth_f16_at(b + 208) * (float)sc[l / 16 + 2 * quarter] * (float)q;
    }
    // Q4_K and Q5_K: sub-block j of 32; chunks of 32 bytes of qs hold sub-blocks 2c (low nibbles) and 2c + 1
    // (high); Q5_K's fifth bit of weight l of sub-block j is bit j of qh[l].
    int j = i / 32, l = i % 32;
    int sc, m;
    hearth_scale_min_k4(j, b + 4, &sc, &m);
    const u8* qs = b + (type == HEARTH_T_Q5_K ? 48 : 16);
    int byte = qs[(j / 2) * 32 + l];
    int q = j % 2 == 0 ? (byte & 0xF) : (byte >> 4);
    if (type == HEARTH_T_Q5_K) q += ((b[16 + l] >> j) & 1) << 4;
    return hearth_f16_at(b) * (float)sc * (float)q - hearth_f16_at(b + 2) * (float)m;
}

// y[r][o] = sum_i x[r][i] * W[o][i]; W [n_out, k] of `type` blocks, x [m, k], y [m, n_out].
extern "C" __global__ void kq_matmul(const u8* w, const float* x, float* y, int type, int n_out, int k, int m) {
    u64 idx = (u64)HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (idx >= (u64)m * n_out) return;
    int r = (int)(idx / n_out), o = (int)(idx % n_out);
    int qk = hearth_kq_weights(type), bb = hearth_kq_bytes(type);
    const u8* row = w + (u64)o * (k / qk) * bb;
    const float* xr = x + (u64)r * k;
    float acc = 0.0f;
    for (int i = 0; i < k; i++) acc += hearth_kq_weight(type, row + (u64)(i / qk) * bb, i % qk) * xr[i];
    y[idx] = acc;
}

// Training's product with the transpose: dx[r][i] = sum_o dy[r][o] * W[o][i]; dy [m, n_out], dx [m, k].
extern "C" __global__ void kq_matmul_t(const u8* w, const float* dy, float* dx, int type, int n_out, int k, int m) {
    u64 idx = (u64)HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (idx >= (u64)m * k) return;
    int r = (int)(idx / k), i = (int)(idx % k);
    int qk = hearth_kq_weights(type), bb = hearth_kq_bytes(type);
    u64 stride = (u64)(k / qk) * bb;
    const u8* col = w + (u64)(i / qk) * bb;
    const float* g = dy + (u64)r * n_out;
    float acc = 0.0f;
    for (int o = 0; o < n_out; o++) acc += hearth_kq_weight(type, col + o * stride, i % qk) * g[o];
    dx[idx] = acc;
}
