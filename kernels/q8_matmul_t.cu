// Training's backward through a frozen Q8_0 weight: the product with its transpose, read from the GGUF layout
// in place. dx[r][i] = sum_o dy[r][o] * W[o][i], W [n_out, k], dy [m, n_out], dx [m, k].
// One thread per column i (adjacent threads read adjacent bytes of a row), grid = ceil(k / block) x ceil(m / 8).
#include "prelude.h"

#define HEARTH_ROWS 8

extern "C" __global__ void q8_matmul_t(const u8* w, const float* dy, float* dx, int n_out, int k, int m) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i >= k) return;
    int r0 = HEARTH_BID_Y * HEARTH_ROWS;
    int rows = m - r0 < HEARTH_ROWS ? m - r0 : HEARTH_ROWS;
    u64 row_bytes = (u64)(k / HEARTH_QK8_0) * HEARTH_Q8_0_BYTES;
    u64 col = (u64)(i / HEARTH_QK8_0) * HEARTH_Q8_0_BYTES;
    float acc[HEARTH_ROWS];
    for (int r = 0; r < HEARTH_ROWS; r++) acc[r] = 0.0f;
    for (int o = 0; o < n_out; o++) {
        const u8* blk = w + (u64)o * row_bytes + col;
        float wv = hearth_q8_scale(blk) * (float)(i8)blk[2 + i % HEARTH_QK8_0];
        for (int r = 0; r < HEARTH_ROWS; r++)
            if (r < rows) acc[r] += wv * dy[(u64)(r0 + r) * n_out + o];
    }
    for (int r = 0; r < rows; r++) dx[(u64)(r0 + r) * k + i] = acc[r];
}
