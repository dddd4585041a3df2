// The MLP's gate: out = silu(g) * u elementwise, and its backward
// dg = dy * u * s * (1 + g * (1 - s)), du = dy * silu(g), with s = sigmoid(g); and Gemma's out = gelu(g) * u
// with GELU's tanh approximation, and its backward.
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

// gelu(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), tanh through exp: tanh(y) = 1 - 2 / (e^2y + 1).
extern "C" __global__ void gelu_mul(const float* g, const float* u, float* out, int n) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i >= n) return;
    float x = g[i];
    float y = 0.7978845608f * x * (1.0f + 0.044715f * x * x);
    float t = 1.0f - 2.0f / (HEARTH_EXP(2.0f * y) + 1.0f);
    out[i] = 0.5f * x * (1.0f + t) * u[i];
}

// With t = tanh(y), y = sqrt(2 / pi) (g + 0.044715 g^3): gelu'(g) = 0.5 (1 + t) + 0.5 g (1 - t^2) y'(g),
// y'(g) = sqrt(2 / pi) (1 + 3 * 0.044715 g^2); dg = dy * u * gelu'(g), du = dy * gelu(g).
extern "C" __global__ void gelu_mul_backward(const float* g, const float* u, const float* dy, float* dg, float* du,
                                             int n) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i >= n) return;
    float x = g[i];
    float y = 0.7978845608f * x * (1.0f + 0.044715f * x * x);
    float t = 1.0f - 2.0f / (HEARTH_EXP(2.0f * y) + 1.0f);
    float dy_dx = 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
    float d = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dy_dx;
    dg[i] = dy[i] * u[i] * d;
    du[i] = dy[i] * 0.5f * x * (1.0f + t);
}
