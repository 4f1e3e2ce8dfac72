/* The elementwise middle of the training attention's backward, for grpokit/speed/attention.py
 * (grpokit/speed/kernels.py builds and loads this file; the Python side checks every dtype,
 * shape and stride before calling). A bf16 and a float32 form.
 *
 * attention_grad_scores: for every (batch x key/value head) bh and query row i,
 *     s_j  = scale * q_i . k_j           (float32 sums of the inputs' values)
 *     p_j  = softmax_j(s_j) over the keys the mask allows (0 elsewhere; a row that allows
 *            none is all 0)
 *     dp_j = dO_i . v_j,  delta = dO_i . O_i
 *     ds_j = p_j (dp_j - delta) scale
 * and writes P and dS in the inputs' dtype (rounded to nearest even): what attention.py's
 * torch backward computed in ~12 passes over float32 (rows, heads, queries, keys) tensors
 * (two float32 sgemms among them), here in one pass whose (queries, keys) tile stays in the
 * cache. The three products that consume P and dS stay torch's (bf16 products).
 *
 * The products are blocked four query rows x sixteen keys at a time over a transposed float32
 * copy of the head's keys and values, so the compiler keeps the block's sums in vector
 * registers; key columns past the last one any row of the block may attend are skipped.
 *
 * attention_forward: O_i = sum_j round(p_j) v_j / sum_j p_j with p_j = exp(s_j - max_j s_j) over
 * the allowed keys (a row that allows none: 0), s_j as above: SDPA's CPU flash forward for
 * these lengths (one key block: exp rounded to the inputs' dtype before the product with V,
 * the sum of the unrounded exps, the accumulator times the sum's reciprocal), in one pass per
 * key/value head and block of query rows.
 *
 * Layouts (contiguous): q, o, dO (BH, M, D); k, v (BH, N, D); mask bytes (Bm, M, N), nonzero
 * = attend, batch entry bh / G at mask + (bh / G) * mask_b (mask_b = 0: one mask for all),
 * or NULL (every key); P, dS (BH, M, N).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define ROWS 4 /* query rows a block */
#define LANES 16 /* keys a block: one AVX-512 float32 vector, two AVX2 ones */

#include "kernel_math.h"

/* One past the last key row i of the mask attends (N when mask is NULL). */
static long attended_end(const uint8_t* mh, long i, long N) {
    long last = N;
    if (mh)
        while (last > 0 && !mh[i * N + last - 1]) last--;
    return last;
}

/* xt (D, Np) = x (N, D) transposed to float32, zero past N. */
#define DEFINE_TRANSPOSE(NAME, T_, LOAD)                                                      \
static void NAME(const T_* x, int D, long N, long Np, float* xt) {                           \
    for (int d = 0; d < D; d++) {                                                             \
        for (long j = 0; j < N; j++) xt[d * Np + j] = LOAD(x[j * D + d]);                     \
        for (long j = N; j < Np; j++) xt[d * Np + j] = 0.f;                                   \
    }                                                                                         \
}
DEFINE_TRANSPOSE(transpose_bf16, uint16_t, from_bf16)
DEFINE_TRANSPOSE(transpose_f32, float, LOAD_F32)

typedef uint32_t alias_u32 __attribute__((may_alias));
typedef int32_t alias_i32 __attribute__((may_alias));

/* A row's scores times scale, -inf where the mask (NULL: none) forbids; returns their max
 * (-inf for none). The max over the floats' bits turned into integers of the same order
 * (sign-magnitude to two's complement): GCC vectorizes an integer max, not a float one
 * without -ffinite-math-only. Each loop is plain, over arrays (the macros' bodies inline into
 * OpenMP's outlined function, where GCC left such loops scalar). */
__attribute__((noinline)) static float scale_mask_max(float* sr, const uint8_t* mr, long lim,
                                                      float scale) {
    if (mr)
        for (long j = 0; j < lim; j++) sr[j] = mr[j] ? sr[j] * scale : -INFINITY;
    else
        for (long j = 0; j < lim; j++) sr[j] = sr[j] * scale;
    const alias_i32* u = (const alias_i32*)sr;
    int32_t best = INT32_MIN;
    for (long j = 0; j < lim; j++) {
        int32_t key = u[j] ^ ((u[j] >> 31) & 0x7fffffff);
        best = key > best ? key : best;
    }
    if (lim == 0) return -INFINITY;
    union { int32_t i; float f; } c;
    c.i = best ^ ((best >> 31) & 0x7fffffff);
    return c.f;
}

/* sr[j] = exp(sr[j] - mx) (bf16: then rounded to bf16, to nearest even, the sum taking the
 * float values); returns the sum. Integer rounding in its own loop: both loops vectorize. */
__attribute__((noinline)) static float exp_sum(float* sr, long lim, float mx, int bf16) {
    float z = 0.f;
    for (long j = 0; j < lim; j++) {
        float e = exp_poly(sr[j] - mx);
        z += e;
        sr[j] = e;
    }
    if (bf16) {
        alias_u32* u = (alias_u32*)sr;
        for (long j = 0; j < lim; j++) /* exps are finite and >= 0: no NaN case */
            u[j] = ((u[j] + 0x7fffu + ((u[j] >> 16) & 1u)) >> 16) << 16;
    }
    return z;
}

typedef float vfloat __attribute__((vector_size(LANES * sizeof(float)), aligned(4)));

/* One key/value head's rows i0 .. i0 + nr - 1 (nr <= ROWS): their scores and dO . v over key
 * columns 0 .. jend - 1 (a multiple of LANES; kt, vt are (D, Np) float32, zero past N). */
static void block_products(const float* qf, const float* gf, const float* kt, const float* vt,
                           int D, long Np, long jend, float* s, float* dp) {
    for (long j0 = 0; j0 < jend; j0 += LANES) {
        vfloat as[ROWS], ad[ROWS];
        for (int r = 0; r < ROWS; r++) as[r] = ad[r] = (vfloat){0};
        for (int d = 0; d < D; d++) {
            vfloat kr = *(const vfloat*)(kt + d * Np + j0);
            vfloat vr = *(const vfloat*)(vt + d * Np + j0);
            for (int r = 0; r < ROWS; r++) {
                as[r] += qf[r * D + d] * kr;
                ad[r] += gf[r * D + d] * vr;
            }
        }
        for (int r = 0; r < ROWS; r++) {
            *(vfloat*)(s + r * Np + j0) = as[r];
            *(vfloat*)(dp + r * Np + j0) = ad[r];
        }
    }
}

/* The scores alone (block_products without dO . v), for the forward. */
static void block_scores(const float* qf, const float* kt, int D, long Np, long jend, float* s) {
    for (long j0 = 0; j0 < jend; j0 += LANES) {
        vfloat as[ROWS];
        for (int r = 0; r < ROWS; r++) as[r] = (vfloat){0};
        for (int d = 0; d < D; d++) {
            vfloat kr = *(const vfloat*)(kt + d * Np + j0);
            for (int r = 0; r < ROWS; r++) as[r] += qf[r * D + d] * kr;
        }
        for (int r = 0; r < ROWS; r++) *(vfloat*)(s + r * Np + j0) = as[r];
    }
}

/* acc (ROWS x D) = s (ROWS rows, Np apart) x vf (N x D, row-major) over keys 0 .. lim - 1;
 * four vectors of D at a time in registers when D is a multiple of 4 LANES (64, 128, ...). */
static void block_values(const float* s, long Np, const float* vf, int D, long lim, float* acc) {
    if (D % (4 * LANES)) {
        for (int x = 0; x < ROWS * D; x++) acc[x] = 0.f;
        for (long j = 0; j < lim; j++)
            for (int r = 0; r < ROWS; r++) {
                float p = s[r * Np + j];
                for (int d = 0; d < D; d++) acc[r * D + d] += p * vf[j * D + d];
            }
        return;
    }
    for (int c0 = 0; c0 < D; c0 += 4 * LANES) {
        vfloat a[ROWS][4];
        for (int r = 0; r < ROWS; r++)
            for (int c = 0; c < 4; c++) a[r][c] = (vfloat){0};
        for (long j = 0; j < lim; j++) {
            vfloat vc[4];
            for (int c = 0; c < 4; c++) vc[c] = *(const vfloat*)(vf + j * D + c0 + c * LANES);
            for (int r = 0; r < ROWS; r++) {
                float p = s[r * Np + j];
                for (int c = 0; c < 4; c++) a[r][c] += p * vc[c];
            }
        }
        for (int r = 0; r < ROWS; r++)
            for (int c = 0; c < 4; c++) *(vfloat*)(acc + r * D + c0 + c * LANES) = a[r][c];
    }
}

#define DEFINE_GRAD_SCORES(NAME, TRANSPOSE, T_, LOAD, STORE)                                           \
int NAME(const T_* q, const T_* k, const T_* v, const T_* o, const T_* go,                   \
          const uint8_t* mask, long mask_b, int G, int BH, int M, int N, int D, float scale,  \
          T_* P, T_* dS) {                                                                    \
    long Np = ((long)N + LANES - 1) / LANES * LANES;                                          \
    int blocks = (M + ROWS - 1) / ROWS;                                                       \
    int per_task = 16; /* row blocks a task: each task transposes its head's keys once */      \
    int tasks_bh = (blocks + per_task - 1) / per_task, failed = 0;                            \
    _Pragma("omp parallel")                                                                   \
    {                                                                                         \
        float* kt = malloc(sizeof(float) * (2 * D * Np + 4 * ROWS * Np + 3 * ROWS * D));      \
        float* vt = kt + D * Np;                                                              \
        float* s = vt + D * Np;                                                               \
        float* dp = s + ROWS * Np;                                                            \
        float* qf = dp + ROWS * Np;                                                           \
        float* gf = qf + ROWS * D;                                                            \
        float* delta = gf + ROWS * D;                                                         \
        long loaded = -1;                                                                     \
        if (!kt) {                                                                            \
            _Pragma("omp atomic write")                                                       \
            failed = 1;                                                                       \
        }                                                                                     \
        _Pragma("omp for schedule(static)")                                                   \
        for (long task = 0; task < (long)BH * tasks_bh; task++) {                             \
            if (!kt) continue;                                                                \
            long bh = task / tasks_bh;                                                        \
            int b0 = (int)(task % tasks_bh) * per_task;                                       \
            int b1 = b0 + per_task < blocks ? b0 + per_task : blocks;                         \
            const T_* kh = k + bh * (long)N * D;                                              \
            const T_* vh = v + bh * (long)N * D;                                              \
            const uint8_t* mh = mask ? mask + (bh / G) * mask_b : NULL;                       \
            if (loaded != bh) {                                                               \
                TRANSPOSE(kh, D, N, Np, kt);                                                  \
                TRANSPOSE(vh, D, N, Np, vt);                                                  \
                loaded = bh;                                                                  \
            }                                                                                 \
            for (int blk = b0; blk < b1; blk++) {                                             \
                int i0 = blk * ROWS, nr = M - i0 < ROWS ? M - i0 : ROWS;                      \
                long jend = 0; /* past the last key any row of the block attends */           \
                for (int r = 0; r < ROWS; r++) {                                              \
                    long i = i0 + (r < nr ? r : 0);                                           \
                    const T_* qi = q + (bh * M + i) * (long)D;                                \
                    const T_* gi = go + (bh * M + i) * (long)D;                               \
                    const T_* oi = o + (bh * M + i) * (long)D;                                \
                    float dl = 0.f;                                                           \
                    for (int d = 0; d < D; d++) {                                             \
                        qf[r * D + d] = LOAD(qi[d]);                                          \
                        gf[r * D + d] = LOAD(gi[d]);                                          \
                        dl += gf[r * D + d] * LOAD(oi[d]);                                    \
                    }                                                                         \
                    delta[r] = dl;                                                            \
                    long last = attended_end(mh, i, N);                                       \
                    if (last > jend) jend = last;                                             \
                }                                                                             \
                jend = (jend + LANES - 1) / LANES * LANES;                                    \
                block_products(qf, gf, kt, vt, D, Np, jend, s, dp);                           \
                for (int r = 0; r < nr; r++) {                                                \
                    long i = i0 + r;                                                          \
                    const uint8_t* mr = mh ? mh + i * (long)N : NULL;                         \
                    float* sr = s + r * Np;                                                   \
                    float* dr = dp + r * Np;                                                  \
                    long lim = jend < N ? jend : N;                                           \
                    float mx = scale_mask_max(sr, mr, lim, scale);                            \
                    T_* pr = P + (bh * M + i) * (long)N;                                      \
                    T_* dsr = dS + (bh * M + i) * (long)N;                                    \
                    if (mx == -INFINITY) { /* no key: P and dS are 0 (torch: NaN, zeroed) */  \
                        for (long j = 0; j < N; j++) pr[j] = dsr[j] = STORE(0.f);             \
                        continue;                                                             \
                    }                                                                         \
                    float rz = 1.f / exp_sum(sr, lim, mx, 0), dl = delta[r];                  \
                    for (long j = 0; j < lim; j++) {                                          \
                        float p = sr[j] * rz;                                                 \
                        pr[j] = STORE(p);                                                     \
                        dsr[j] = STORE(p * (dr[j] - dl) * scale);                             \
                    }                                                                         \
                    for (long j = lim; j < N; j++) pr[j] = dsr[j] = STORE(0.f);               \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        free(kt);                                                                             \
    }                                                                                         \
    return failed; /* 1: out of memory, P and dS incomplete */                                \
}

DEFINE_GRAD_SCORES(attention_grad_scores_bf16, transpose_bf16, uint16_t, from_bf16, to_bf16)
DEFINE_GRAD_SCORES(attention_grad_scores_f32, transpose_f32, float, LOAD_F32, STORE_F32)

/* The forward (see the top): per task one head's transposed keys and row-major values in
 * float32, then per block of ROWS query rows the scores, the softmax's exps and the products
 * with V into acc (ROWS x D). */
#define DEFINE_FORWARD(NAME, TRANSPOSE, T_, LOAD, STORE)                                               \
int NAME(const T_* q, const T_* k, const T_* v, const uint8_t* mask, long mask_b, int G,     \
         int BH, int M, int N, int D, float scale, T_* out) {                                 \
    long Np = ((long)N + LANES - 1) / LANES * LANES;                                          \
    int blocks = (M + ROWS - 1) / ROWS;                                                       \
    int per_task = 16;                                                                        \
    int tasks_bh = (blocks + per_task - 1) / per_task, failed = 0;                            \
    _Pragma("omp parallel")                                                                   \
    {                                                                                         \
        float* kt = malloc(sizeof(float) * (2 * D * Np + ROWS * Np + 2 * ROWS * D));          \
        float* vf = kt + D * Np;                                                              \
        float* s = vf + D * Np;                                                               \
        float* qf = s + ROWS * Np;                                                            \
        float* acc = qf + ROWS * D;                                                           \
        long loaded = -1;                                                                     \
        if (!kt) {                                                                            \
            _Pragma("omp atomic write")                                                       \
            failed = 1;                                                                       \
        }                                                                                     \
        _Pragma("omp for schedule(static)")                                                   \
        for (long task = 0; task < (long)BH * tasks_bh; task++) {                             \
            if (!kt) continue;                                                                \
            long bh = task / tasks_bh;                                                        \
            int b0 = (int)(task % tasks_bh) * per_task;                                       \
            int b1 = b0 + per_task < blocks ? b0 + per_task : blocks;                         \
            const T_* kh = k + bh * (long)N * D;                                              \
            const T_* vh = v + bh * (long)N * D;                                              \
            const uint8_t* mh = mask ? mask + (bh / G) * mask_b : NULL;                       \
            if (loaded != bh) {                                                               \
                TRANSPOSE(kh, D, N, Np, kt);                                                  \
                for (long x = 0; x < (long)N * D; x++) vf[x] = LOAD(vh[x]);                   \
                loaded = bh;                                                                  \
            }                                                                                 \
            for (int blk = b0; blk < b1; blk++) {                                             \
                int i0 = blk * ROWS, nr = M - i0 < ROWS ? M - i0 : ROWS;                      \
                long jend = 0;                                                                \
                for (int r = 0; r < ROWS; r++) {                                              \
                    long i = i0 + (r < nr ? r : 0);                                           \
                    const T_* qi = q + (bh * M + i) * (long)D;                                \
                    for (int d = 0; d < D; d++) qf[r * D + d] = LOAD(qi[d]);                  \
                    long last = attended_end(mh, i, N);                                       \
                    if (last > jend) jend = last;                                             \
                }                                                                             \
                jend = (jend + LANES - 1) / LANES * LANES;                                    \
                block_scores(qf, kt, D, Np, jend, s);                                                             \
                long lim = jend < N ? jend : N;                                               \
                float rz[ROWS];                                                               \
                for (int r = 0; r < ROWS; r++) {                                              \
                    const uint8_t* mr = mh && r < nr ? mh + (i0 + r) * (long)N : NULL;        \
                    float* sr = s + r * Np;                                                   \
                    float mx = scale_mask_max(sr, mr, lim, scale);                            \
                    if (r >= nr || mx == -INFINITY) { /* no key: 0 (SDPA: NaN, never used) */ \
                        for (long j = 0; j < lim; j++) sr[j] = 0.f;                           \
                        rz[r] = 0.f;                                                          \
                        continue;                                                             \
                    }                                                                         \
                    rz[r] = 1.f / exp_sum(sr, lim, mx, sizeof(T_) == 2);                      \
                }                                                                             \
                block_values(s, Np, vf, D, lim, acc);                                         \
                for (int r = 0; r < nr; r++) {                                                \
                    T_* orow = out + (bh * M + i0 + r) * (long)D;                             \
                    for (int d = 0; d < D; d++) orow[d] = STORE(acc[r * D + d] * rz[r]);      \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        free(kt);                                                                             \
    }                                                                                         \
    return failed;                                                                            \
}

DEFINE_FORWARD(attention_forward_bf16, transpose_bf16, uint16_t, from_bf16, to_bf16)
DEFINE_FORWARD(attention_forward_f32, transpose_f32, float, LOAD_F32, STORE_F32)
