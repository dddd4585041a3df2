// The MLP's gate: out = silu(g) * u elementwise, and its backward
// dg = dy * u * s * (1 + g * (1 - s)), du = dy * silu(g), with s = sigmoid(g).
#include "prelude.h"

extern "C" __global__ void silu_mul(const float* g, const float* u, float* out, int n) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i >= n) return;
    float s = 1.0f / (1.0f + HEARTH_EXP(-g[i]));
    out[i] = g[i] * s * u[i];
}

extern "C" __global__ void silu_mul_backward(const float* g, const float* u, const float* dy, float* dg, float* du,
                                             int n) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i >= n) return;
    float s = 1.0f / (1.0f + HEARTH_EXP(-g[i]));
    dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    du[i] = dy[i] * g[i] * s;
}
