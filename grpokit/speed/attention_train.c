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
 * Both also come with their products on Intel AMX tiles (attention_forward_amx_bf16,
 * attention_grad_scores_amx_bf16, at the end of this file), for bf16 with D = 32 or 64.
 *
 * Layouts (contiguous): q, o, dO (BH, M, D); k, v (BH, N, D); mask bytes (Bm, M, N), nonzero
 * = attend, batch entry bh / G at mask + (bh / G) * mask_b (mask_b = 0: one mask for all),
 * or NULL (every key); P, dS (BH, M, N).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 4 /* query rows a block */
#define LANES 16 /* keys a block: one AVX-512 float32 vector, two AVX2 ones */

#include "kernel_math.h"

/* One past the last key row i of the mask attends (N when mask is NULL). Eight mask bytes
 * at a time from the end (a causal row of a completion ends in up to ~130 masked keys): the
 * byte-by-byte loop it replaces was ~35% of the AMX forward's samples (perf, config (a)'s
 * training, Intel Xeon family 6 model 167). The highest nonzero byte of a little-endian word
 * is the last attended key in it. */
static long attended_end(const uint8_t* mh, long i, long N) {
    long last = N;
    if (!mh) return N;
    const uint8_t* row = mh + i * N;
    while (last >= 8) {
        uint64_t w;
        memcpy(&w, row + last - 8, 8);
        if (w) return last - 8 + (63 - __builtin_clzll(w)) / 8 + 1;
        last -= 8;
    }
    while (last > 0 && !row[last - 1]) last--;
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

/* attention_forward_amx_bf16: attention_forward_bf16's results with both products on Intel
 * AMX tiles (TDPBF16PS: bf16 pairs, float32 sums), 16 query rows at a time. Per key/value
 * head once, its keys and values in the tiles' pair layout ("VNNI": a 16 x 16-pair tile of
 * B holds, in row p, for each of 16 columns c, the two elements at K-positions 2p, 2p + 1):
 * kb for scores (B = k^T: K-positions along D, columns = keys), vb for the output (B = v:
 * K-positions along keys, columns along D); keys past N zero. Per block of 16 rows: the
 * scores of the keys any of its rows attends (the block's q rows are the A tiles as they
 * lie), the softmax as attention_forward's (scale_mask_max, exp_sum: exps rounded to bf16,
 * the sum of the unrounded), the rounded exps as bf16 rows (A tiles), the output's float32
 * sums in D / 16 tiles, times the reciprocal sum, rounded. The same products as the
 * FMA forward (bf16 x bf16 is exact in float32), summed in the tile unit's order. Needs
 * D = 32 or 64; returns -1 (nothing written) where the build or process has no AMX or D
 * differs, 1 when out of memory, else 0. kernels.py calls these first for bf16 where oneDNN
 * is not capped below AMX (ONEDNN_MAX_CPU_ISA), the FMA kernels otherwise. Measured (16 rows
 * x 3 heads x 387 queries x 184 keys x 64, bf16, 2 threads, Intel Xeon family 6 model 167):
 * forward 5.1-5.9 -> 2.3 ms, backward scores 7.4 -> 3.2 ms. */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && \
    defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <string.h>
int amx_linear_ready(void);
void amx_tiles_16x64(void); /* amx_linear.c: all eight tiles 16 rows of 64 bytes */

/* One head's x (N, D) as the B tiles of x^T (for S = q k^T, dP = dO v^T): for key block n (16
 * keys) and D chunk c (32), tile n * (D / 32) + c, row p, column j = x[16 n + j][32 c + 2 p ..
 * + 1]; keys past N zero. */
static void amx_pack_keys(const uint16_t* xh, long N, int D, long N16, uint16_t* xb) {
    int dc = D / 32;
    for (long n = 0; n < N16 / 16; n++)
        for (int c = 0; c < dc; c++) {
            uint16_t* t = xb + (n * dc + c) * 512;
            for (int j = 0; j < 16; j++) {
                long key = 16 * n + j;
                for (int p = 0; p < 16; p++) {
                    t[p * 32 + 2 * j] = key < N ? xh[key * D + 32 * c + 2 * p] : 0;
                    t[p * 32 + 2 * j + 1] = key < N ? xh[key * D + 32 * c + 2 * p + 1] : 0;
                }
            }
        }
}

/* s (16 x N32, row stride ld floats) = rows (16 x D, as the A tiles) times the packed xb
 * over key blocks 0 .. jend / 16 - 1. */
static void amx_rows_times_keys(const uint16_t* rows, int D, const uint16_t* xb, long jend,
                                float* s, long ld) {
    int dc = D / 32;
    _tile_loadd(5, rows, D * 2);
    if (dc == 2) _tile_loadd(7, rows + 32, D * 2);
    for (long n = 0; n < jend / 16; n++) {
        _tile_zero(4);
        _tile_loadd(6, xb + (n * dc) * 512, 64);
        _tile_dpbf16ps(4, 5, 6);
        if (dc == 2) {
            _tile_loadd(6, xb + (n * dc + 1) * 512, 64);
            _tile_dpbf16ps(4, 7, 6);
        }
        _tile_stored(4, s + n * 16, ld * 4);
    }
}

/* The B tiles of v (for P v): for key chunk c (32 keys) and D block b (16), tile c * (D / 16)
 * + b, row p, column j = the pair v[32 c + 2 p][16 b + j], v[32 c + 2 p + 1][16 b + j]; keys
 * past N zero. */
static void amx_pack_values(const uint16_t* vh, long N, int D, long N32, uint16_t* vb) {
    int db = D / 16;
    for (long c = 0; c < N32 / 32; c++)
        for (int b = 0; b < db; b++) {
            uint16_t* t = vb + (c * db + b) * 512;
            for (int p = 0; p < 16; p++) {
                long k0 = 32 * c + 2 * p, k1 = k0 + 1;
                for (int j = 0; j < 16; j++) {
                    t[p * 32 + 2 * j] = k0 < N ? vh[k0 * D + 16 * b + j] : 0;
                    t[p * 32 + 2 * j + 1] = k1 < N ? vh[k1 * D + 16 * b + j] : 0;
                }
            }
        }
}

/* Rows i0 .. i0 + 15 of one head's (M, D) x as 16 full rows (a zero-padded copy in pad when
 * fewer are left), and one past the last key any of them attends, rounded up to 16. */
static const uint16_t* amx_block_rows(const uint16_t* x, int nr, int D, uint16_t* pad) {
    if (nr == 16) return x;
    memset(pad, 0, sizeof(uint16_t) * 16 * D);
    memcpy(pad, x, sizeof(uint16_t) * nr * D);
    return pad;
}

static long amx_block_keys(const uint8_t* mh, int i0, int nr, long N) {
    long jend = 0;
    for (int r = 0; r < nr; r++) {
        long last = attended_end(mh, i0 + r, N);
        if (last > jend) jend = last;
    }
    return (jend + 15) / 16 * 16;
}

int attention_forward_amx_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                               const uint8_t* mask, long mask_b, int G, int BH, int M, int N,
                               int D, float scale, uint16_t* out) {
    if (!amx_linear_ready() || (D != 32 && D != 64)) return -1;
    long N16 = ((long)N + 15) / 16 * 16, N32 = ((long)N + 31) / 32 * 32;
    int blocks = (M + 15) / 16, per_task = 4, db = D / 16;
    int tasks_bh = (blocks + per_task - 1) / per_task, failed = 0;
    _Pragma("omp parallel")
    {
        /* kb, vb (bf16), s (16 x N32 float32), pb (16 x N32 bf16), qpad (16 x D bf16),
         * acc (16 x D float32) */
        size_t bytes = 2 * (size_t)N16 * D + 2 * (size_t)N32 * D + 4 * 16 * (size_t)N32 +
                       2 * 16 * (size_t)N32 + 2 * 16 * (size_t)D + 4 * 16 * (size_t)D + 256;
        char* mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
        uint16_t* kb = (uint16_t*)mem;
        uint16_t* vb = kb + N16 * D;
        float* s = (float*)(vb + N32 * D);
        uint16_t* pb = (uint16_t*)(s + 16 * N32);
        uint16_t* qpad = pb + 16 * N32;
        float* acc = (float*)(qpad + 16 * D);
        long loaded = -1;
        if (!mem) {
            _Pragma("omp atomic write")
            failed = 1;
        } else {
            amx_tiles_16x64();
        }
        _Pragma("omp for schedule(static)")
        for (long task = 0; task < (long)BH * tasks_bh; task++) {
            if (!mem) continue;
            long bh = task / tasks_bh;
            int b0 = (int)(task % tasks_bh) * per_task;
            int b1 = b0 + per_task < blocks ? b0 + per_task : blocks;
            const uint8_t* mh = mask ? mask + (bh / G) * mask_b : NULL;
            if (loaded != bh) {
                amx_pack_keys(k + bh * (long)N * D, N, D, N16, kb);
                amx_pack_values(v + bh * (long)N * D, N, D, N32, vb);
                loaded = bh;
            }
            for (int blk = b0; blk < b1; blk++) {
                int i0 = blk * 16, nr = M - i0 < 16 ? M - i0 : 16;
                const uint16_t* qb = amx_block_rows(q + (bh * M + i0) * (long)D, nr, D, qpad);
                long jend = amx_block_keys(mh, i0, nr, N);
                amx_rows_times_keys(qb, D, kb, jend, s, N32);
                long lim = jend < N ? jend : N, lim32 = (lim + 31) / 32 * 32;
                float rz[16];
                for (int r = 0; r < 16; r++) {
                    float* sr = s + r * N32;
                    uint16_t* pr = pb + r * N32;
                    const uint8_t* mr = mh && r < nr ? mh + (i0 + r) * (long)N : NULL;
                    float mx = r < nr ? scale_mask_max(sr, mr, lim, scale) : -INFINITY;
                    rz[r] = 0.f;
                    if (mx == -INFINITY) {
                        memset(pr, 0, sizeof(uint16_t) * lim32);
                        continue;
                    }
                    rz[r] = 1.f / exp_sum(sr, lim, mx, 1);
                    const alias_u32* u = (const alias_u32*)sr; /* already bf16 values */
                    for (long j = 0; j < lim; j++) pr[j] = (uint16_t)(u[j] >> 16);
                    for (long j = lim; j < lim32; j++) pr[j] = 0;
                }
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (long c = 0; c < lim32 / 32; c++) {
                    _tile_loadd(5, pb + c * 32, N32 * 2);
                    for (int b = 0; b < db; b++) {
                        _tile_loadd(6, vb + (c * db + b) * 512, 64);
                        switch (b) { /* tile numbers are immediates */
                        case 0: _tile_dpbf16ps(0, 5, 6); break;
                        case 1: _tile_dpbf16ps(1, 5, 6); break;
                        case 2: _tile_dpbf16ps(2, 5, 6); break;
                        default: _tile_dpbf16ps(3, 5, 6); break;
                        }
                    }
                }
                _tile_stored(0, acc, D * 4);
                _tile_stored(1, acc + 16, D * 4);
                if (db == 4) {
                    _tile_stored(2, acc + 32, D * 4);
                    _tile_stored(3, acc + 48, D * 4);
                }
                for (int r = 0; r < nr; r++) {
                    uint16_t* orow = out + (bh * M + i0 + r) * (long)D;
                    for (int d = 0; d < D; d++) orow[d] = to_bf16(acc[r * D + d] * rz[r]);
                }
            }
        }
        if (mem) _tile_release();
        free(mem);
    }
    return failed;
}

/* attention_grad_scores_bf16's P and dS with the two products (q k^T, dO v^T) on AMX tiles,
 * 16 query rows at a time; the rest as there. -1 where the build or process has no AMX or
 * D is not 32 or 64 (nothing written), 1 when out of memory, else 0. */
int attention_grad_scores_amx_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* o, const uint16_t* go, const uint8_t* mask,
                                   long mask_b, int G, int BH, int M, int N, int D,
                                   float scale, uint16_t* P, uint16_t* dS) {
    if (!amx_linear_ready() || (D != 32 && D != 64)) return -1;
    long N16 = ((long)N + 15) / 16 * 16;
    int blocks = (M + 15) / 16, per_task = 4;
    int tasks_bh = (blocks + per_task - 1) / per_task, failed = 0;
    _Pragma("omp parallel")
    {
        size_t bytes = 2 * 2 * (size_t)N16 * D + 2 * 4 * 16 * (size_t)N16 +
                       2 * 2 * 16 * (size_t)D + 256;
        char* mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
        uint16_t* kb = (uint16_t*)mem;
        uint16_t* vtb = kb + N16 * D;
        float* s = (float*)(vtb + N16 * D);
        float* dp = s + 16 * N16;
        uint16_t* qpad = (uint16_t*)(dp + 16 * N16);
        uint16_t* gpad = qpad + 16 * D;
        long loaded = -1;
        if (!mem) {
            _Pragma("omp atomic write")
            failed = 1;
        } else {
            amx_tiles_16x64();
        }
        _Pragma("omp for schedule(static)")
        for (long task = 0; task < (long)BH * tasks_bh; task++) {
            if (!mem) continue;
            long bh = task / tasks_bh;
            int b0 = (int)(task % tasks_bh) * per_task;
            int b1 = b0 + per_task < blocks ? b0 + per_task : blocks;
            const uint8_t* mh = mask ? mask + (bh / G) * mask_b : NULL;
            if (loaded != bh) {
                amx_pack_keys(k + bh * (long)N * D, N, D, N16, kb);
                amx_pack_keys(v + bh * (long)N * D, N, D, N16, vtb);
                loaded = bh;
            }
            for (int blk = b0; blk < b1; blk++) {
                int i0 = blk * 16, nr = M - i0 < 16 ? M - i0 : 16;
                const uint16_t* qb = amx_block_rows(q + (bh * M + i0) * (long)D, nr, D, qpad);
                const uint16_t* gb = amx_block_rows(go + (bh * M + i0) * (long)D, nr, D, gpad);
                long jend = amx_block_keys(mh, i0, nr, N);
                amx_rows_times_keys(qb, D, kb, jend, s, N16);
                amx_rows_times_keys(gb, D, vtb, jend, dp, N16);
                long lim = jend < N ? jend : N;
                for (int r = 0; r < nr; r++) {
                    long i = i0 + r;
                    const uint16_t* gi = go + (bh * M + i) * (long)D;
                    const uint16_t* oi = o + (bh * M + i) * (long)D;
                    float dl = 0.f;
                    for (int d = 0; d < D; d++) dl += from_bf16(gi[d]) * from_bf16(oi[d]);
                    const uint8_t* mr = mh ? mh + i * (long)N : NULL;
                    float* sr = s + r * N16;
                    float* dr = dp + r * N16;
                    float mx = scale_mask_max(sr, mr, lim, scale);
                    uint16_t* pr = P + (bh * M + i) * (long)N;
                    uint16_t* dsr = dS + (bh * M + i) * (long)N;
                    if (mx == -INFINITY) {
                        memset(pr, 0, sizeof(uint16_t) * N);
                        memset(dsr, 0, sizeof(uint16_t) * N);
                        continue;
                    }
                    float rz = 1.f / exp_sum(sr, lim, mx, 0);
                    for (long j = 0; j < lim; j++) {
                        float pj = sr[j] * rz;
                        pr[j] = to_bf16(pj);
                        dsr[j] = to_bf16(pj * (dr[j] - dl) * scale);
                    }
                    for (long j = lim; j < N; j++) pr[j] = dsr[j] = 0;
                }
            }
        }
        if (mem) _tile_release();
        free(mem);
    }
    return failed;
}
#else
int attention_forward_amx_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                               const uint8_t* mask, long mask_b, int G, int BH, int M, int N,
                               int D, float scale, uint16_t* out) {
    (void)q; (void)k; (void)v; (void)mask; (void)mask_b; (void)G; (void)BH; (void)M; (void)N;
    (void)D; (void)scale; (void)out;
    return -1;
}

int attention_grad_scores_amx_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   const uint16_t* o, const uint16_t* go, const uint8_t* mask,
                                   long mask_b, int G, int BH, int M, int N, int D,
                                   float scale, uint16_t* P, uint16_t* dS) {
    (void)q; (void)k; (void)v; (void)o; (void)go; (void)mask; (void)mask_b; (void)G; (void)BH;
    (void)M; (void)N; (void)D; (void)scale; (void)P; (void)dS;
    return -1;
}
#endif
