// Training's causal attention over one sequence of `len` positions, grouped-query, in pieces the backward can
// reuse: scores, then `softmax_rows` (causal) to probabilities, then the context; and the three products of the
// backward. q [len, nh, hd], k and v [len, nkv, hd] as the projections leave them; p, dp and ds [nh, len, len].
// Query head h reads kv head h / (nh / nkv). One thread per output value; entries above the diagonal are zero.
#include "prelude.h"

// s[h][i][j] = scale * q[i][h] . k[j][h / g] for j <= i.
extern "C" __global__ void attention_scores(const float* q, const float* k, float* s, int len, int nh, int nkv,
                                            int hd, float scale) {
    u64 idx = (u64)HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (idx >= (u64)nh * len * len) return;
    int j = (int)(idx % len), i = (int)(idx / len % len), h = (int)(idx / ((u64)len * len));
    if (j > i) {
        s[idx] = 0.0f;
        return;
    }
    const float* qr = q + ((u64)i * nh + h) * hd;
    const float* kr = k + ((u64)j * nkv + h / (nh / nkv)) * hd;
    float acc = 0.0f;
    for (int d = 0; d < hd; d++) acc += qr[d] * kr[d];
    s[idx] = acc * scale;
}

// ctx[i][h][d] = sum over j <= i of p[h][i][j] * v[j][h / g][d].
extern "C" __global__ void attention_context(const float* p, const float* v, float* ctx, int len, int nh, int nkv,
                                             int hd) {
    u64 idx = (u64)HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (idx >= (u64)len * nh * hd) return;
    int d = (int)(idx % hd), h = (int)(idx / hd % nh), i = (int)(idx / ((u64)hd * nh));
    const float* pr = p + ((u64)h * len + i) * len;
    int c = h / (nh / nkv);
    float acc = 0.0f;
    for (int j = 0; j <= i; j++) acc += pr[j] * v[((u64)j * nkv + c) * hd + d];
    ctx[idx] = acc;
}

// dp[h][i][j] = dctx[i][h] . v[j][h / g] for j <= i: the probabilities' gradient.
extern "C" __global__ void attention_grad_probs(const float* dctx, const float* v, float* dp, int len, int nh,
                                                int nkv, int hd) {
    u64 idx = (u64)HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (idx >= (u64)nh * len * len) return;
    int j = (int)(idx % len), i = (int)(idx / len % len), h = (int)(idx / ((u64)len * len));
    if (j > i) {
        dp[idx] = 0.0f;
        return;
    }
    const float* gr = dctx + ((u64)i * nh + h) * hd;
    const float* vr = v + ((u64)j * nkv + h / (nh / nkv)) * hd;
    float acc = 0.0f;
    for (int d = 0; d < hd; d++) acc += gr[d] * vr[d];
    dp[idx] = acc;
}

// dq[i][h][d] = scale * sum over j <= i of ds[h][i][j] * k[j][h / g][d], from the scores' gradient ds.
extern "C" __global__ void attention_grad_q(const float* ds, const float* k, float* dq, int len, int nh, int nkv,
                                            int hd, float scale) {
    u64 idx = (u64)HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (idx >= (u64)len * nh * hd) return;
    int d = (int)(idx % hd), h = (int)(idx / hd % nh), i = (int)(idx / ((u64)hd * nh));
    const float* sr = ds + ((u64)h * len + i) * len;
    int c = h / (nh / nkv);
    float acc = 0.0f;
    for (int j = 0; j <= i; j++) acc += sr[j] * k[((u64)j * nkv + c) * hd + d];
    dq[idx] = acc * scale;
}

// For kv head c: dk[j][c][d] = scale * sum over its query heads h and i >= j of ds[h][i][j] * q[i][h][d], and
// dv[j][c][d] = the same sum of p[h][i][j] * dctx[i][h][d].
extern "C" __global__ void attention_grad_kv(const float* ds, const float* p, const float* q, const float* dctx,
                                             float* dk, float* dv, int len, int nh, int nkv, int hd, float scale) {
    u64 idx = (u64)HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (idx >= (u64)len * nkv * hd) return;
    int d = (int)(idx % hd), c = (int)(idx / hd % nkv), j = (int)(idx / ((u64)hd * nkv));
    int g = nh / nkv;
    float acc_k = 0.0f, acc_v = 0.0f;
    for (int h = c * g; h < (c + 1) * g; h++) {
        for (int i = j; i < len; i++) {
            u64 at = ((u64)h * len + i) * len + j;
            u64 row = ((u64)i * nh + h) * hd + d;
            acc_k += ds[at] * q[row];
            acc_v += p[at] * dctx[row];
        }
    }
    dk[idx] = acc_k * scale;
    dv[idx] = acc_v;
}
