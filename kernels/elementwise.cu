// The glue of a decode step: the residual add and the KV cache append, so a whole step stays on the device.
#include "prelude.h"

// x += d over n values.
extern "C" __global__ void add_into(float* x, const float* d, int n) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i < n) x[i] += d[i];
}

// Writes one token's keys or values src [kv_heads, hd] at position *len of cache [kv_heads, cap, hd]. The
// position is a device value, so one captured graph replays at every step.
extern "C" __global__ void kv_append(float* cache, const float* src, const int* len, int kv_heads, int cap, int hd) {
    int i = HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (i >= kv_heads * hd) return;
    int h = i / hd, d = i % hd;
    cache[((u64)h * cap + *len) * hd + d] = src[i];
}

// *len += by, once (one thread): after both caches are written.
extern "C" __global__ void advance(int* len, int by) {
    if (HEARTH_BID_X == 0 && HEARTH_TID_X == 0) *len += by;
}
