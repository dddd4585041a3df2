// The glue of a decode or prefill step: the residual and bias adds, DoRA's row factors, row gathers and the KV cache
// append, so a whole step
// stays on the device.
#include "prelude.h"

// x[i] += d[i % period] over n values: the residual add (period = n) and a bias added to every row.
extern "C" __global__ void add_into(float* x, const float* d, int n, int period) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i < n) x[i] += d[i % period];
}

// x[i] *= f[i % period] over n values: DoRA's factor on every row of a projection's output.
extern "C" __global__ void mul_rows(float* x, const float* f, int n, int period) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i < n) x[i] *= f[i % period];
}

// dst[r] = src[idx[r]] for rows of n values (gather), or dst[idx[r]] = src[r] (scatter): training's head
// projects only the positions that are scored.
extern "C" __global__ void gather_rows(const float* src, const int* idx, float* dst, int rows, int n) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i >= rows * n) return;
    dst[i] = src[(u64)idx[i / n] * n + i % n];
}

extern "C" __global__ void scatter_rows(const float* src, const int* idx, float* dst, int rows, int n) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i >= rows * n) return;
    dst[(u64)idx[i / n] * n + i % n] = src[i];
}

// Writes rows tokens' keys or values src [rows, kv_heads, hd] at positions *pos .. *pos + rows - 1 of cache
// [kv_heads, cap, hd]. The position is a device value, so one captured graph replays at every step.
extern "C" __global__ void kv_append(float* cache, const float* src, const int* pos, int rows, int kv_heads, int cap,
                                     int hd) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i >= rows * kv_heads * hd) return;
    int r = i / (kv_heads * hd), h = (i / hd) % kv_heads, d = i % hd;
    cache[((u64)h * cap + *pos + r) * hd + d] = src[i];
}

// *len += by, once (one thread): after both caches are written.
extern "C" __global__ void advance(int* len, int by) {
    if (HEARTH_BID_X == 0 && HEARTH_TID_X == 0) *len += by;
}
