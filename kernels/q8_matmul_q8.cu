// The serving products with int8 activations, as the CPU path and llama.cpp compute them: each 32 values of an
// input row are quantized like a Q8_0 block (scale amax / 127, rounded half away from zero; the scale kept as
// f16 rounds it), then y[r][o] = sum over blocks of d_w * d_x * sum_j w_q[j] * x_q[j].
#include "prelude.h"

#define HEARTH_ROWS 8

// x [blocks, 32] f32 -> q [blocks, 32] int8 and d [blocks]: one thread per block of 32 values.
extern "C" __global__ void quantize_q8(const float* x, i8* q, float* d, int blocks) {
    int b = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (b >= blocks) return;
    const float* xb = x + (u64)b * HEARTH_QK8_0;
    float amax = 0.0f;
    for (int j = 0; j < HEARTH_QK8_0; j++) amax = HEARTH_FMAX(amax, HEARTH_FABS(xb[j]));
    float scale = amax / 127.0f;
    float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (int j = 0; j < HEARTH_QK8_0; j++) q[(u64)b * HEARTH_QK8_0 + j] = (i8)HEARTH_ROUND(xb[j] * inv);
    d[b] = hearth_round_f16(scale);
}

// y [m, n_out] from a Q8_0 weight [n_out, k] in its GGUF layout and the rows' int8 values q [m, k] with their
// block scales d [m, k / 32]; grid = n_out x ceil(m / 8), as q8_matmul.
extern "C" __global__ void q8_matmul_q8(const u8* w, const i8* q, const float* d, float* y, int n_out, int k,
                                        int m) {
    __shared__ float scratch[32];
    int o = HEARTH_BID_X;
    int r0 = HEARTH_BID_Y * HEARTH_ROWS;
    int rows = m - r0 < HEARTH_ROWS ? m - r0 : HEARTH_ROWS;
    int nb = k / HEARTH_QK8_0;
    const u8* row = w + (u64)o * (u64)nb * HEARTH_Q8_0_BYTES;
    float acc[HEARTH_ROWS];
    for (int r = 0; r < HEARTH_ROWS; r++) acc[r] = 0.0f;
    for (int i = HEARTH_TID_X; i < k; i += HEARTH_BDIM_X) {
        int b = i / HEARTH_QK8_0;
        const u8* blk = row + (u64)b * HEARTH_Q8_0_BYTES;
        int wq = (int)(i8)blk[2 + i % HEARTH_QK8_0];
        float dw = hearth_q8_scale(blk);
        for (int r = 0; r < HEARTH_ROWS; r++)
            if (r < rows) {
                u64 xr = (u64)(r0 + r);
                acc[r] += (float)(wq * (int)q[xr * k + i]) * (dw * d[xr * nb + b]);
            }
    }
    for (int r = 0; r < HEARTH_ROWS; r++) {
        if (r < rows) {
            float s = hearth_block_sum(acc[r], scratch);
            if (HEARTH_TID_X == 0) y[(u64)(r0 + r) * n_out + o] = s;
        }
    }
}
