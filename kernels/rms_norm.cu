// RMSNorm and its backward, one block per row of n values.
// Forward: y = x / sqrt(mean(x^2) + eps) * w (divided, as the CPU path does, so roundings match).
// Backward, with r = 1 / sqrt(mean(x^2) + eps):
//   dx_j = r * w_j * dy_j - r^3 * x_j / n * sum_i dy_i * w_i * x_i, and r per row for the weight's gradient;
//   dw_j = sum_rows dy_j * x_j * r (rms_norm_backward_weight, one thread per column, no atomics: deterministic).
#include "prelude.h"

extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (u64)HEARTH_BID_X * n;
    float* yr = y + (u64)HEARTH_BID_X * n;
    float ss = 0.0f;
    for (int i = HEARTH_TID_X; i < n; i += HEARTH_BDIM_X) ss += xr[i] * xr[i];
    float m = HEARTH_SQRT(hearth_block_sum(ss, scratch) / (float)n + eps);
    for (int i = HEARTH_TID_X; i < n; i += HEARTH_BDIM_X) yr[i] = xr[i] / m * w[i];
}

extern "C" __global__ void rms_norm_backward(const float* x, const float* w, const float* dy, float* dx,
                                             float* rinv, int n, float eps) {
    __shared__ float scratch[32];
    u64 off = (u64)HEARTH_BID_X * n;
    float ss = 0.0f, dot = 0.0f;
    for (int i = HEARTH_TID_X; i < n; i += HEARTH_BDIM_X) {
        ss += x[off + i] * x[off + i];
        dot += dy[off + i] * w[i] * x[off + i];
    }
    float r = 1.0f / HEARTH_SQRT(hearth_block_sum(ss, scratch) / (float)n + eps);
    dot = hearth_block_sum(dot, scratch);
    float c = r * r * r * dot / (float)n;
    for (int i = HEARTH_TID_X; i < n; i += HEARTH_BDIM_X) dx[off + i] = r * w[i] * dy[off + i] - c * x[off + i];
    if (HEARTH_TID_X == 0) rinv[HEARTH_BID_X] = r;
}

extern "C" __global__ void rms_norm_backward_weight(const float* x, const float* dy, const float* rinv, float* dw,
                                                    int rows, int n) {
    int j = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (j >= n) return;
    float acc = 0.0f;
    for (int r = 0; r < rows; r++) acc += dy[(u64)r * n + j] * x[(u64)r * n + j] * rinv[r];
    dw[j] = acc;
}
