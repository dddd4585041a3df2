// Row softmax (optionally causal over square per-head score blocks: row r keeps columns 0..=r % cols) and its
// backward dx = y * (dy - sum(y * dy)). One block per row.
#include "prelude.h"

extern "C" __global__ void softmax_rows(const float* x, float* y, int cols, int causal) {
    __shared__ float scratch[32];
    u64 off = (u64)HEARTH_BID_X * cols;
    int valid = causal ? HEARTH_BID_X % cols + 1 : cols;
    float mx = -3.0e38f;
    for (int j = HEARTH_TID_X; j < valid; j += HEARTH_BDIM_X) mx = x[off + j] > mx ? x[off + j] : mx;
    mx = hearth_block_max(mx, scratch);
    float sum = 0.0f;
    for (int j = HEARTH_TID_X; j < valid; j += HEARTH_BDIM_X) sum += HEARTH_EXP(x[off + j] - mx);
    sum = hearth_block_sum(sum, scratch);
    for (int j = HEARTH_TID_X; j < cols; j += HEARTH_BDIM_X)
        y[off + j] = j < valid ? HEARTH_EXP(x[off + j] - mx) / sum : 0.0f;
}

extern "C" __global__ void softmax_backward(const float* y, const float* dy, float* dx, int cols) {
    __shared__ float scratch[32];
    u64 off = (u64)HEARTH_BID_X * cols;
    float dot = 0.0f;
    for (int j = HEARTH_TID_X; j < cols; j += HEARTH_BDIM_X) dot += y[off + j] * dy[off + j];
    dot = hearth_block_sum(dot, scratch);
    for (int j = HEARTH_TID_X; j < cols; j += HEARTH_BDIM_X) dx[off + j] = y[off + j] * (dy[off + j] - dot);
}
