// Quantized matvec and small-batch matmul over a Q8_0 weight in its GGUF layout:
// y[r][o] = sum_i x[r][i] * W[o][i], W row-major [n_out, k] (k a multiple of 32), x [m, k] f32, y [m, n_out].
// One block per output row and per chunk of 8 input rows (grid = n_out x ceil(m / 8)): decode is m = 1, prefill
// reads each weight once per 8 rows.
#include "prelude.h"

#define HEARTH_ROWS 8

extern "C" __global__ void q8_matmul(const u8* w, const float* x, float* y, int n_out, int k, int m) {
    __shared__ float scratch[32];
    int o = HEARTH_BID_X;
    int r0 = HEARTH_BID_Y * HEARTH_ROWS;
    int rows = m - r0 < HEARTH_ROWS ? m - r0 : HEARTH_ROWS;
    const u8* row = w + (u64)o * (u64)(k / HEARTH_QK8_0) * HEARTH_Q8_0_BYTES;
    const float* xs = x + (u64)r0 * k;
    float acc[HEARTH_ROWS];
    for (int r = 0; r < HEARTH_ROWS; r++) acc[r] = 0.0f;
    for (int i = HEARTH_TID_X; i < k; i += HEARTH_BDIM_X) {
        const u8* blk = row + (i / HEARTH_QK8_0) * HEARTH_Q8_0_BYTES;
        float wv = hearth_q8_scale(blk) * (float)(i8)blk[2 + i % HEARTH_QK8_0];
        for (int r = 0; r < HEARTH_ROWS; r++)
            if (r < rows) acc[r] += wv * xs[(u64)r * k + i];
    }
    for (int r = 0; r < HEARTH_ROWS; r++) {
        if (r < rows) {
            float s = hearth_block_sum(acc[r], scratch);
            if (HEARTH_TID_X == 0) y[(u64)(r0 + r) * n_out + o] = s;
        }
    }
}
