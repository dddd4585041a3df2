// Attention of new tokens over the KV cache, grouped-query and causal: one block per query head and row.
// q [rows, nh, hd]; k_cache, v_cache [nkv, cap, hd]; out [rows, nh, hd]. Row r is the token at position
// *pos + r (a device value, so one captured graph serves every decode step) and reads positions 0..=*pos + r,
// its own keys and values already appended. Decode is rows = 1; prefill passes its rows at once. Scores live in
// dynamic shared memory (cap floats + 32 scratch).
#include "prelude.h"

extern "C" __global__ void attention_decode(const float* q, const float* k_cache, const float* v_cache, float* out,
                                            const int* pos, int nh, int nkv, int hd, int cap, float scale) {
    extern __shared__ float smem[];
    float* scratch = smem;
    float* scores = smem + 32;
    int h = HEARTH_BID_X;
    int row = HEARTH_BID_Y;
    int kvh = h / (nh / nkv);
    int n = *pos + row + 1;
    const float* qh = q + ((u64)row * nh + h) * hd;
    const float* kh = k_cache + (u64)kvh * cap * hd;
    const float* vh = v_cache + (u64)kvh * cap * hd;
    float mx = -3.0e38f;
    for (int t = HEARTH_TID_X; t < n; t += HEARTH_BDIM_X) {
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += qh[d] * kh[(u64)t * hd + d];
        s *= scale;
        scores[t] = s;
        mx = s > mx ? s : mx;
    }
    mx = hearth_block_max(mx, scratch);
    float sum = 0.0f;
    for (int t = HEARTH_TID_X; t < n; t += HEARTH_BDIM_X) {
        float e = HEARTH_EXP(scores[t] - mx);
        scores[t] = e;
        sum += e;
    }
    sum = hearth_block_sum(sum, scratch);
    hearth_sync();
    for (int d = HEARTH_TID_X; d < hd; d += HEARTH_BDIM_X) {
        float acc = 0.0f;
        for (int t = 0; t < n; t++) acc += scores[t] * vh[(u64)t * hd + d];
        out[((u64)row * nh + h) * hd + d] = acc / sum;
    }
}
