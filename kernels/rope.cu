// Rotary embedding in place on x [rows, heads, hd]; row t is at position pos[t] (a device buffer, so one
// captured decode graph replays at every step). cos and sin are tables [positions, hd / 2].
// interleaved != 0 rotates pairs (2i, 2i+1) (Llama GGUFs), otherwise (i, i + hd/2) (Qwen). sign = -1 rotates
// back: the backward of the embedding is its inverse rotation.
#include "prelude.h"

extern "C" __global__ void rope(float* x, const float* cos_t, const float* sin_t, const int* pos, int heads, int hd,
                                int interleaved, float sign) {
    int row = HEARTH_BID_X / heads;
    int half = hd / 2;
    float* h = x + (u64)HEARTH_BID_X * hd;
    const float* c = cos_t + (u64)pos[row] * half;
    const float* s = sin_t + (u64)pos[row] * half;
    for (int i = HEARTH_TID_X; i < half; i += HEARTH_BDIM_X) {
        int a = interleaved ? 2 * i : i;
        int b = interleaved ? 2 * i + 1 : i + half;
        float xa = h[a], xb = h[b], sn = sign * s[i];
        h[a] = xa * c[i] - xb * sn;
        h[b] = xa * sn + xb * c[i];
    }
}
