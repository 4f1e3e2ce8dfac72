/* Llama's RMSNorm for training, forward and backward, for grpokit/speed/layers.py's RMSNorm
 * function (grpokit/speed/kernels.py builds and loads this file; the Python side checks
 * every dtype, shape and stride before calling). The input x in bf16 or float32, the weight
 * and the output float32 (the residual stream and weights under autocast); rows of C
 * contiguous elements.
 *
 * rms_norm_forward:  r_i = 1 / sqrt(mean_c x_ic^2 + eps)            (float32, saved)
 *                    y_ic = w_c * round(x_ic * r_i)                  (round: to x's dtype)
 * rms_norm_backward: dn_ic = round(dy_ic * w_c)                     (autograd's gradient of
 *                                                                    the rounded x_ic r_i)
 *                    dx_ic = round(dn_ic r_i - r_i^3 / C * x_ic * sum_k dn_ik x_ik)
 *                    dw_c  = sum_i dy_ic * round(x_ic * r_i)
 * what transformers' LlamaRMSNorm computes (upcast, pow, mean, rsqrt, two products, cast)
 * and autograd's ~10 passes back through it, in one pass over each row each way. Sums are
 * float32 in another order than torch's; dw sums each thread's rows, then the threads' sums
 * in thread order (the same split of rows for a given thread count: reproducible). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernel_math.h"

#define DEFINE_RMS(SFX, T_, LOAD, STORE, ROUND)                                               \
__attribute__((noinline)) static float sumsq_##SFX(const T_* restrict x, int C) {            \
    float s = 0.f;                                                                            \
    for (int c = 0; c < C; c++) s += LOAD(x[c]) * LOAD(x[c]);                                 \
    return s;                                                                                 \
}                                                                                             \
                                                                                              \
__attribute__((noinline)) static void scale_row_##SFX(const T_* restrict x,                  \
                                                      const float* restrict w, float r,       \
                                                      float* restrict y, int C) {             \
    for (int c = 0; c < C; c++) y[c] = w[c] * ROUND(LOAD(x[c]) * r);                          \
}                                                                                             \
                                                                                              \
void rms_norm_forward_##SFX(const T_* x, const float* w, float eps, float* y, float* r,      \
                            long n, int C) {                                                  \
    _Pragma("omp parallel for schedule(static) if (n * C >= 16384)")                          \
    for (long i = 0; i < n; i++) {                                                            \
        float ri = 1.f / sqrtf(sumsq_##SFX(x + i * C, C) / (float)C + eps);                   \
        r[i] = ri;                                                                            \
        scale_row_##SFX(x + i * C, w, ri, y + i * C, C);                                      \
    }                                                                                         \
}                                                                                             \
                                                                                              \
/* one row's dx, and its dy * n added into the thread's dw */                                 \
__attribute__((noinline)) static void back_row_##SFX(const float* restrict dy,               \
                                                     const T_* restrict x,                    \
                                                     const float* restrict w, float ri,       \
                                                     T_* restrict dx, float* restrict dw,     \
                                                     int C) {                                 \
    float dot = 0.f;                                                                          \
    for (int c = 0; c < C; c++) dot += ROUND(dy[c] * w[c]) * LOAD(x[c]);                      \
    float k = ri * ri * ri / (float)C * dot;                                                  \
    for (int c = 0; c < C; c++) dx[c] = STORE(ROUND(dy[c] * w[c]) * ri - k * LOAD(x[c]));     \
    if (dw)                                                                                   \
        for (int c = 0; c < C; c++) dw[c] += dy[c] * ROUND(LOAD(x[c]) * ri);                  \
}                                                                                             \
                                                                                              \
/* dw (C,) float32 is written (not added to) when not NULL; returns 1 when out of memory */  \
int rms_norm_backward_##SFX(const float* dy, const T_* x, const float* w, const float* r,    \
                            T_* dx, float* dw, long n, int C) {                               \
    int nt = omp_get_max_threads();                                                           \
    if (n * C < 16384) nt = 1;                                                                \
    float* part = NULL;                                                                       \
    if (dw) {                                                                                 \
        part = calloc((size_t)nt * C, sizeof(float));                                         \
        if (!part) return 1;                                                                  \
    }                                                                                         \
    _Pragma("omp parallel num_threads(nt)")                                                   \
    {                                                                                         \
        int t = omp_get_thread_num(), tn = omp_get_num_threads();                            \
        long i0 = n * t / tn, i1 = n * (t + 1) / tn;                                          \
        float* mine = part ? part + (long)t * C : NULL;                                       \
        for (long i = i0; i < i1; i++)                                                        \
            back_row_##SFX(dy + i * C, x + i * C, w, r[i], dx + i * C, mine, C);              \
    }                                                                                         \
    if (dw) {                                                                                 \
        memcpy(dw, part, sizeof(float) * C);                                                  \
        for (int t = 1; t < nt; t++)                                                          \
            for (int c = 0; c < C; c++) dw[c] += part[(long)t * C + c];                       \
        free(part);                                                                           \
    }                                                                                         \
    return 0;                                                                                 \
}

DEFINE_RMS(bf16, uint16_t, from_bf16, to_bf16, round_bf16)
DEFINE_RMS(f32, float, LOAD_F32, STORE_F32, ROUND_F32)
