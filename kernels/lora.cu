// The unmerged LoRA products and their gradients, all as one strided f32 product
//   C[i][j] = beta * C[i][j] + alpha * sum_l A[i * a_i + l * a_l] * B[l * b_l + j * b_j],  C row-major [M, N],
// so transposes are strides, not copies: forward t = x A^T then y += s * t B^T; backward u = s * dy B,
// dB = s * dy^T t, dA = u^T x, dx += u A. LoRA ranks are small (K = r for the up products), so one thread per
// output element.
#include "prelude.h"

extern "C" __global__ void lora_gemm(const float* a, const float* b, float* c, int M, int N, int K, int a_i, int a_l,
                                     int b_l, int b_j, float alpha, float beta) {
    u64 idx = (u64)HEARTH_BID_X * HEARTH_BDIM_X + HEARTH_TID_X;
    if (idx >= (u64)M * N) return;
    int i = (int)(idx / N), j = (int)(idx % N);
    float acc = 0.0f;
    for (int l = 0; l < K; l++) acc += a[(u64)i * a_i + (u64)l * a_l] * b[(u64)l * b_l + (u64)j * b_j];
    c[idx] = (beta == 0.0f ? 0.0f : beta * c[idx]) + alpha * acc;
}
