// Training's output head on the scored positions: each row's logits [rows, vocab] become its log-probability of
// its targets, weighted (one token with weight 1, or a teacher's few tokens), and the backward's logit gradient.
// Targets of row r are ids/weights[offsets[r] .. offsets[r + 1]] (none: the row scores 0). One block per row.
#include "prelude.h"

// lp[r] = sum_t w_t (logits[r][id_t] - logsumexp(logits[r])); the row is then overwritten by its softmax, which
// the backward reads.
extern "C" __global__ void head_logps(float* logits, const int* offsets, const int* ids, const float* weights,
                                      float* lp, int vocab) {
    __shared__ float scratch[32];
    int r = HEARTH_BID_X;
    float* x = logits + (u64)r * vocab;
    float mx = -3.0e38f;
    for (int j = HEARTH_TID_X; j < vocab; j += HEARTH_BDIM_X) mx = x[j] > mx ? x[j] : mx;
    mx = hearth_block_max(mx, scratch);
    float sum = 0.0f;
    for (int j = HEARTH_TID_X; j < vocab; j += HEARTH_BDIM_X) sum += HEARTH_EXP(x[j] - mx);
    sum = hearth_block_sum(sum, scratch);
    float lse = mx + HEARTH_LOG(sum);
    if (HEARTH_TID_X == 0) {
        float acc = 0.0f;
        for (int t = offsets[r]; t < offsets[r + 1]; t++) acc += weights[t] * (x[ids[t]] - lse);
        lp[r] = acc;
    }
    // Every thread has read what it needs of the logits before any is overwritten.
    hearth_sync();
    for (int j = HEARTH_TID_X; j < vocab; j += HEARTH_BDIM_X) x[j] = HEARTH_EXP(x[j] - lse);
}

// In place over head_logps's probabilities p: d[r][j] = dlp[r] * (sum_t w_t [j == id_t] - (sum_t w_t) p[r][j]).
extern "C" __global__ void head_logps_backward(float* probs, const int* offsets, const int* ids, const float* weights,
                                               const float* dlp, int vocab) {
    int r = HEARTH_BID_X;
    float* p = probs + (u64)r * vocab;
    int first = offsets[r], end = offsets[r + 1];
    float wsum = 0.0f;
    for (int t = first; t < end; t++) wsum += weights[t];
    float g = dlp[r];
    for (int j = HEARTH_TID_X; j < vocab; j += HEARTH_BDIM_X) {
        float onehot = 0.0f;
        for (int t = first; t < end; t++) onehot += ids[t] == j ? weights[t] : 0.0f;
        p[j] = g * (onehot - wsum * p[j]);
    }
}
