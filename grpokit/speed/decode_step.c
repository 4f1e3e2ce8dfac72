/* The decode step's work between its matrix products, for grpokit's decode loop
 * (grpokit/speed/kernels.py builds and loads this file; the Python side checks every dtype,
 * shape and stride before calling). Each function has a bf16 and a float32 form.
 *
 * decode_attention:      one query token per row against the cache (online softmax).
 * decode_rope_attention: rotary on the step's q and k (from the fused q/k/v product's
 *                        output), k and v written into the cache at the step's slot, then
 *                        the attention above: what torch did in ~10 operations a layer.
 *                        Rows of one prompt (its cached slots copied to each) read those
 *                        slots once for all their queries, then each row its own slots.
 * decode_add_rms:        the residual add, then Llama's RMSNorm of the sum.
 * decode_silu_mul:       silu(gate) * up from the fused gate/up product's output.
 * decode_sample_f32/_bf16: one token a row drawn from softmax(logits / temperature),
 *                        min-p applied (the sampler's work after the head).
 *
 * Rounding follows torch's operations one by one: every value torch rounds to the tensor's
 * dtype (bf16 products in rotary, the residual sum, the norm before its scale, silu before
 * the product) is rounded here too, to nearest even; sums (attention scores and softmax, the
 * norm's mean square) are float32 as in torch, in another order.
 *
 * The attention: for row i and key/value head h, the g query heads sharing h attend over
 * the slots 0..S-1 that row i's mask allows. Keys and values are read once per (row, head)
 * for all g queries, and the softmax runs online over blocks of slots (a running maximum
 * and sum, rescaled when the maximum grows), so the score buffer is one block whatever S is.
 *
 * Layouts (element strides):
 *   q    (n, KV, g, D): row i at q + i * q_row, head h at + h * g * D, query j at + j * D
 *   qkv  (n, (H + 2 KV) D): row i at qkv + i * qkv_row; q heads, then k heads, then v heads
 *   k, v (n, KV, T, D): contiguous (the cache, T slots)
 *   mask (n, S) bytes:  row i at mask + i * mask_row, nonzero = attend
 *   gs   (nc + 1,) int64: row chunk c is rows gs[c] .. gs[c + 1] - 1, sharing slots < P
 *   cos, sin (positions, D): contiguous tables; pos (n,) int64: each row's position
 *   out  (n, KV, g, D) = (n, H D): contiguous
 */
#pragma GCC target("prefer-vector-width=512")
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_G 16
#define MAX_D 256

#include "kernel_math.h"

/* Online-softmax state of up to MAX_Q float32 queries (row-major, D apart). The queries, their
 * sums and a block's float32 keys and values are all rows D apart, not MAX_D: with MAX_D apart a
 * 64-wide head's rows sat 1 KiB apart in 160 KB of stack and fell on the same few L1 sets.
 * (a)'s decode attention shapes (32 rows x 3 key/value heads x 3 queries, 40 prompt slots shared
 * by 8 rows, 128 steps, 30 layers' caches), old .so against new in one process, alternating,
 * outputs bit-identical: 0.960 -> 0.875 s a round (6 of 7 pairs lower; AMD EPYC family 25
 * model 17, 2 threads). */
#define MAX_Q 64

/* DEFINE_ATTEND reads a block's keys, computes, then reads its values: one stream at a time
 * per thread, and a new 4 KiB page of each every block (a (row, head)'s 32 slots of 64 bf16),
 * which the hardware prefetchers do not cross. With this on it asks for the block's value
 * rows while it converts the keys, and for the next block's key rows while it converts the
 * values, so both streams are in flight together. 1,024 slots, 32 rows x 3 key/value heads x
 * 3 queries, 30 layers' caches (755 MB, past the caches), alternating, two runs: 57.9-59.3
 * -> 44.9-46.3 ms (13.0 -> 16.8 GB/s; a plain pass over as many bytes 27.5-29); prefetching
 * whole blocks ahead instead (1 to 16) gained <= 4%. Intel Xeon family 6 model 167, 2
 * threads. 0: off (for comparisons). */
int attend_prefetch = 1;

static inline void prefetch_row(const void* row, int bytes) {
    for (int x = 0; x < bytes; x += 64) __builtin_prefetch((const char*)row + x);
}
typedef struct {
    float acc[MAX_Q * MAX_D], mx[MAX_Q], sum[MAX_Q]; /* query j's sums at acc + j D */
} attn_state;

static void state_init(attn_state* st, int nq, int D) {
    for (int j = 0; j < nq; j++) {
        st->mx[j] = -INFINITY;
        st->sum[j] = 0.f;
        for (int d = 0; d < D; d++) st->acc[j * D + d] = 0.f;
    }
}

/* Scores of nq queries against nk <= 16 keys (rows of kf, D apart, float32) when D is a
 * multiple of 16: each (query, key) pair's 16-lane partial products, then the 16 keys' sums
 * reduced together in four levels of shuffles and adds (pairs of halves, quarters, eighths,
 * lanes) instead of one horizontal sum per pair. After the levels, lane L holds the sum of
 * the key whose index is L's 4-bit reversal; the last shuffle puts key k in lane k. Keys past
 * nk must be zero rows (their scores are computed and not read). */
typedef float v16f __attribute__((vector_size(64), aligned(4)));
typedef int v16i __attribute__((vector_size(64)));
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (v16i){__VA_ARGS__})
static v16f reduce16(v16f* a) {
    v16f r[8], s[4], t[2];
    for (int i = 0; i < 8; i++)
        r[i] = SHUF(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUF(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        s[i] = SHUF(r[2 * i], r[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
               SHUF(r[2 * i], r[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        t[i] = SHUF(s[2 * i], s[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
               SHUF(s[2 * i], s[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    v16f u = SHUF(t[0], t[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
             SHUF(t[0], t[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    return __builtin_shuffle(u, (v16i){0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15});
}

static void scores16(const float* qf, int nq, int D, const float* kf, int nk, float* sc,
                     int sc_row) {
    for (int j = 0; j < nq; j++) {
        v16f part[16];
        for (int k = 0; k < 16; k++) part[k] = (v16f){0};
        for (int d = 0; d < D; d += 16) {
            v16f q = *(const v16f*)(qf + j * D + d);
            for (int k = 0; k < 16; k++) part[k] += q * *(const v16f*)(kf + k * D + d);
        }
        v16f out = reduce16(part);
        for (int k = 0; k < nk; k++) sc[j * sc_row + k] = out[k];
    }
}

/* The largest of a block's BLOCK (32) scores, as two 16-lane maxima folded in four shuffles:
 * the scalar loop it replaces ran one dependent compare a score. Lanes past the block's slots
 * hold -inf (their scores are set so). */
static inline float block_max(const float* s) {
    v16f a = *(const v16f*)s, b = *(const v16f*)(s + 16);
    v16i gt = a > b;
    v16f m = (v16f)((gt & (v16i)a) | (~gt & (v16i)b));
    static const v16i fold[4] = {{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
                                 {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
                                 {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
                                 {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}};
    for (int f = 0; f < 4; f++) {
        v16f o = __builtin_shuffle(m, fold[f]);
        gt = m > o;
        m = (v16f)((gt & (v16i)m) | (~gt & (v16i)o));
    }
    return m[0];
}

/* acc += sum over the nv value rows of p[slot[r]] * vf[r] (D a multiple of 16, D <= MAX_D):
 * the query's running sum stays in registers over the block's values. */
static void values16(float* acc, int D, const float* vf, int nv, const float* p,
                     const int* slot) {
    v16f a[MAX_D / 16];
    int nc = D / 16;
    for (int c = 0; c < nc; c++) a[c] = *(const v16f*)(acc + 16 * c);
    for (int r = 0; r < nv; r++) {
        float w = p[slot[r]];
        for (int c = 0; c < nc; c++) a[c] += w * *(const v16f*)(vf + r * D + 16 * c);
    }
    for (int c = 0; c < nc; c++) *(v16f*)(acc + 16 * c) = a[c];
}

#define BLOCK 32 /* slots a block of the online softmax (DEFINE_ATTEND) */

/* values16 for D = 64, four queries at a time: their 16 running sums stay in registers
 * (values16's, indexed by a runtime count, live in memory, so each multiply-add waited on the
 * last one's store) and each value row is read once for the four. The same sums in the same
 * order as values16. acc[i], p[i]: query i's sums and block weights; a missing query (fewer
 * than four left) points at scratch sums and zero weights. */
static void values64x4(float* acc[4], const float* p[4], const float* vf, int nv,
                       const int* slot) {
    v16f a[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) a[i][c] = *(const v16f*)(acc[i] + 16 * c);
    for (int r = 0; r < nv; r++) {
        const float* vr = vf + 64 * r;
        v16f v0 = *(const v16f*)vr, v1 = *(const v16f*)(vr + 16);
        v16f v2 = *(const v16f*)(vr + 32), v3 = *(const v16f*)(vr + 48);
        int s_ = slot[r];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            float w = p[i][s_];
            a[i][0] += w * v0;
            a[i][1] += w * v1;
            a[i][2] += w * v2;
            a[i][3] += w * v3;
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) *(v16f*)(acc[i] + 16 * c) = a[i][c];
}

static void values64(float* acc, int nq, const float* vf, int nv, float (*sc)[BLOCK],
                     const int* slot) {
    static const float zeros[BLOCK];
    float scratch[64] __attribute__((aligned(64)));
    for (int j = 0; j < nq; j += 4) {
        float* a[4];
        const float* p[4];
        for (int i = 0; i < 4; i++) {
            a[i] = j + i < nq ? acc + (j + i) * 64 : scratch;
            p[i] = j + i < nq ? sc[j + i] : zeros;
        }
        values64x4(a, p, vf, nv, slot);
    }
}

/* nq float32 queries (already scaled; st's rows j0 .. j0 + nq - 1) over slots s_begin .. S - 1
 * of k and v, BLOCK slots at a time: the block's scores, one running-maximum update per
 * query, the block's exps in one vectorised loop (exp_poly), then the values weighted by
 * them. Called once over a row's slots, or over a shared prefix for every query of the rows
 * that share it and then over each row's own slots (the state carries across). */
#define DEFINE_ATTEND(NAME, T_, LOAD)                                                         \
static void NAME(const float* qf, int nq, int D, const T_* kb, const T_* vb,                \
                 const uint8_t* m, long s_begin, long S, attn_state* st, int j0) {            \
    float sc[MAX_Q][BLOCK], kf[MAX_D], vf[MAX_D];                                             \
    float kblk[BLOCK * MAX_D] __attribute__((aligned(64))); /* rows D apart */              \
    int slot[BLOCK];                                                                          \
    float* acc = st->acc + j0 * D; /* query j's sums at acc + j D */                         \
    float* mx = st->mx + j0;                                                                  \
    float* sum = st->sum + j0;                                                                \
    for (long s0 = s_begin; s0 < S; s0 += BLOCK) {                                            \
        int nb = S - s0 < BLOCK ? (int)(S - s0) : BLOCK;                                      \
        int any = 0;                                                                          \
        if (D % 16 == 0) { /* keys as float rows (masked and missing ones zero), scores16 */  \
            for (int b = 0; b < BLOCK; b++) {                                                 \
                int on = b < nb && m[s0 + b];                                                 \
                const T_* kr = kb + (s0 + b) * D;                                             \
                if (on) {                                                                     \
                    for (int d = 0; d < D; d++) kblk[b * D + d] = LOAD(kr[d]);                \
                    if (attend_prefetch) /* the slot's value row, read after the exps */      \
                        prefetch_row(vb + (s0 + b) * D, D * (int)sizeof(T_));                 \
                } else                                                                        \
                    for (int d = 0; d < D; d++) kblk[b * D + d] = 0.f;                        \
                any |= on;                                                                    \
            }                                                                                 \
            if (!any) continue;                                                               \
            for (int b = 0; b < nb; b += 16)                                                  \
                scores16(qf, nq, D, kblk + b * D, nb - b < 16 ? nb - b : 16, &sc[0][b], BLOCK); \
            for (int b = 0; b < nb; b++)                                                      \
                if (!m[s0 + b])                                                               \
                    for (int j = 0; j < nq; j++) sc[j][b] = -INFINITY;                        \
        } else                                                                                \
        for (int b = 0; b < nb; b++) {                                                        \
            if (!m[s0 + b]) {                                                                 \
                for (int j = 0; j < nq; j++) sc[j][b] = -INFINITY;                            \
                continue;                                                                     \
            }                                                                                 \
            any = 1;                                                                          \
            const T_* kr = kb + (s0 + b) * D;                                                 \
            for (int d = 0; d < D; d++) kf[d] = LOAD(kr[d]);                                  \
            for (int j = 0; j < nq; j++) {                                                    \
                float t = 0.f;                                                                \
                for (int d = 0; d < D; d++) t += qf[j * D + d] * kf[d];                       \
                sc[j][b] = t;                                                                 \
            }                                                                                 \
        }                                                                                     \
        if (!any) continue;                                                                   \
        for (int j = 0; j < nq; j++) {                                                        \
            for (int b = nb; b < BLOCK; b++) sc[j][b] = -INFINITY;                            \
            float bm = block_max(sc[j]);                                                      \
            if (bm > mx[j]) { /* rescale what came before (exp(-inf) = 0 at the start) */     \
                float r = exp_poly(mx[j] - bm);                                               \
                sum[j] *= r;                                                                  \
                for (int d = 0; d < D; d++) acc[j * D + d] *= r;                              \
                mx[j] = bm;                                                                   \
            }                                                                                 \
            float z = 0.f, mj = mx[j];                                                        \
            for (int b = 0; b < nb; b++) {                                                    \
                float p = exp_poly(sc[j][b] - mj); /* masked: exp(-inf) = 0 */                \
                sc[j][b] = p;                                                                 \
                z += p;                                                                       \
            }                                                                                 \
            sum[j] += z;                                                                      \
        }                                                                                     \
        if (D % 16 == 0) { /* values as float rows (kblk again), each query's sum in registers */ \
            int nv = 0;                                                                       \
            for (int b = 0; b < nb; b++) {                                                    \
                if (!m[s0 + b]) continue;                                                     \
                const T_* vr = vb + (s0 + b) * D;                                             \
                for (int d = 0; d < D; d++) kblk[nv * D + d] = LOAD(vr[d]);                   \
                if (attend_prefetch && s0 + BLOCK + b < S) /* the next block's key row */     \
                    prefetch_row(kb + (s0 + BLOCK + b) * D, D * (int)sizeof(T_));             \
                slot[nv++] = b;                                                               \
            }                                                                                 \
            if (D == 64)                                                                      \
                values64(acc, nq, kblk, nv, sc, slot);                                        \
            else                                                                              \
                for (int j = 0; j < nq; j++) values16(acc + j * D, D, kblk, nv, sc[j], slot); \
            continue;                                                                         \
        }                                                                                     \
        for (int b = 0; b < nb; b++) {                                                        \
            if (!m[s0 + b]) continue;                                                         \
            const T_* vr = vb + (s0 + b) * D;                                                 \
            for (int d = 0; d < D; d++) vf[d] = LOAD(vr[d]);                                  \
            for (int j = 0; j < nq; j++) {                                                    \
                float p = sc[j][b];                                                           \
                for (int d = 0; d < D; d++) acc[j * D + d] += p * vf[d];                      \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
}

/* st's queries j0 .. j0 + nq - 1 divided by their sums into ob (nq rows, D apart). */
#define DEFINE_FINISH(NAME, T_, STORE)                                                        \
static void NAME(const attn_state* st, int j0, int nq, int D, T_* ob) {                      \
    for (int j = 0; j < nq; j++) {                                                            \
        float s_ = st->sum[j0 + j];                                                           \
        float r = s_ > 0.f ? 1.f / s_ : 0.f; /* no slot attended: zeros */                    \
        for (int d = 0; d < D; d++) ob[j * D + d] = STORE(st->acc[(j0 + j) * D + d] * r);     \
    }                                                                                         \
}

#define DEFINE_ATTENTION(NAME, ATTEND, FINISH, T_, LOAD)                                      \
void NAME(const T_* q, long q_row, const T_* k, const T_* v, const uint8_t* mask,            \
          long mask_row, T_* out, int n, int KV, int g, int D, long T, long S, float scale) { \
    _Pragma("omp parallel for schedule(static)")                                              \
    for (long bh = 0; bh < (long)n * KV; bh++) {                                              \
        long i = bh / KV, h = bh % KV;                                                        \
        float qf[MAX_G * MAX_D]; /* query j at qf + j D */                                    \
        attn_state st;                                                                        \
        const T_* qb = q + i * q_row + h * (long)g * D;                                       \
        for (int j = 0; j < g; j++)                                                           \
            for (int d = 0; d < D; d++) qf[j * D + d] = LOAD(qb[j * D + d]) * scale;          \
        state_init(&st, g, D);                                                                \
        ATTEND(qf, g, D, k + bh * T * D, v + bh * T * D, mask + i * mask_row, 0, S, &st, 0);  \
        FINISH(&st, 0, g, D, out + bh * (long)g * D);                                         \
    }                                                                                         \
}

/* Llama's rotary, x * cos + rotate_half(x) * sin, each product and the sum rounded as torch
 * rounds them in the tensors' dtype; rotate_half(x) = (-x[half:], x[:half]). */
#define DEFINE_ROPE(NAME, T_, LOAD, ROUND)                                                    \
static inline void NAME(const T_* x, const T_* c, const T_* s, int D, float* out) {          \
    int half = D / 2;                                                                         \
    for (int d = 0; d < D; d++) {                                                             \
        float rot = d < half ? -LOAD(x[d + half]) : LOAD(x[d - half]);                        \
        out[d] = ROUND(ROUND(LOAD(x[d]) * LOAD(c[d])) + ROUND(rot * LOAD(s[d])));             \
    }                                                                                         \
}

/* Rows gs[c] .. gs[c + 1] - 1 (at most MAX_Q / g of them) form chunk c: rows whose cache
 * slots 0 .. P - 1 hold the same keys and values and the same mask bits (the completions of
 * one prompt, its keys and values copied to each), so those slots are read once, from the
 * chunk's first row, for every query of the chunk, and each row's own slots P .. S - 1 after
 * that. One row a chunk and P = 0: each row alone. Work is split over (chunk, head). */
#define DEFINE_ROPE_ATTENTION(NAME, ROPE, ATTEND, FINISH, T_, LOAD, STORE)                    \
void NAME(const T_* qkv, long qkv_row, int H, int KV, int D, const T_* cos, const T_* sin,   \
          const int64_t* pos, T_* kc, T_* vc, long T, long slot, const uint8_t* mask,         \
          long mask_row, long S, float scale, T_* out, const int64_t* gs, int nc, long P) {   \
    int g = H / KV;                                                                           \
    _Pragma("omp parallel for schedule(static)")                                              \
    for (long ch = 0; ch < (long)nc * KV; ch++) {                                             \
        long c = ch / KV, h = ch % KV, i0 = gs[c], i1 = gs[c + 1];                            \
        float qf[MAX_Q * MAX_D], kr[MAX_D]; /* query j at qf + j D */                         \
        attn_state st;                                                                        \
        for (long i = i0; i < i1; i++) {                                                      \
            const T_* row = qkv + i * qkv_row;                                                \
            const T_* c_ = cos + pos[i] * D;                                                  \
            const T_* s_ = sin + pos[i] * D;                                                  \
            long bh = i * KV + h;                                                             \
            ROPE(row + (long)(H + h) * D, c_, s_, D, kr);                                     \
            T_* kdst = kc + (bh * T + slot) * D;                                              \
            T_* vdst = vc + (bh * T + slot) * D;                                              \
            const T_* vsrc = row + (long)(H + KV + h) * D;                                    \
            for (int d = 0; d < D; d++) {                                                     \
                kdst[d] = STORE(kr[d]);                                                       \
                vdst[d] = vsrc[d];                                                            \
            }                                                                                 \
            for (int j = 0; j < g; j++) {                                                     \
                float* qj = qf + ((i - i0) * g + j) * D;                                      \
                ROPE(row + (h * (long)g + j) * D, c_, s_, D, qj);                             \
                for (int d = 0; d < D; d++) qj[d] *= scale;                                   \
            }                                                                                 \
        }                                                                                     \
        int nq = (int)(i1 - i0) * g;                                                          \
        long lead = i0 * KV + h, Pc = P < S ? P : S;                                          \
        state_init(&st, nq, D);                                                               \
        ATTEND(qf, nq, D, kc + lead * T * D, vc + lead * T * D, mask + i0 * mask_row, 0, Pc,  \
               &st, 0);                                                                       \
        for (long i = i0; i < i1; i++) {                                                      \
            long bh = i * KV + h;                                                             \
            int j0 = (int)(i - i0) * g;                                                       \
            ATTEND(qf + j0 * D, g, D, kc + bh * T * D, vc + bh * T * D, mask + i * mask_row,  \
                   Pc, S, &st, j0);                                                           \
            FINISH(&st, j0, g, D, out + bh * (long)g * D);                                    \
        }                                                                                     \
    }                                                                                         \
}

/* x = x + y (rounded; skipped when y is NULL), then h = w * norm(x): the norm in float32,
 * rounded before the scale as transformers' LlamaRMSNorm does. */
#define DEFINE_ADD_RMS(NAME, T_, LOAD, STORE, ROUND)                                          \
void NAME(T_* x, const T_* y, const T_* w, float eps, T_* h, int n, int C) {                 \
    _Pragma("omp parallel for schedule(static) if ((long)n * C >= 16384)")                    \
    for (long i = 0; i < n; i++) {                                                            \
        T_* xr = x + i * C;                                                                   \
        T_* hr = h + i * C;                                                                   \
        float ss = 0.f;                                                                       \
        if (y) {                                                                              \
            const T_* yr = y + i * C;                                                         \
            for (int c = 0; c < C; c++) {                                                     \
                float t = ROUND(LOAD(xr[c]) + LOAD(yr[c]));                                   \
                xr[c] = STORE(t);                                                             \
                ss += t * t;                                                                  \
            }                                                                                 \
        } else {                                                                              \
            for (int c = 0; c < C; c++) ss += LOAD(xr[c]) * LOAD(xr[c]);                      \
        }                                                                                     \
        float r = 1.f / sqrtf(ss / (float)C + eps);                                           \
        for (int c = 0; c < C; c++) hr[c] = STORE(LOAD(w[c]) * ROUND(LOAD(xr[c]) * r));       \
    }                                                                                         \
}

/* out = silu(gu[:, :I]) * gu[:, I:], silu rounded before the product as torch does. */
#define DEFINE_SILU_MUL(NAME, T_, LOAD, STORE, ROUND)                                         \
void NAME(const T_* gu, T_* out, int n, int I) {                                              \
    _Pragma("omp parallel for schedule(static) if ((long)n * I >= 16384)")                    \
    for (long i = 0; i < n; i++) {                                                            \
        const T_* g = gu + i * 2L * I;                                                        \
        const T_* u = g + I;                                                                  \
        T_* o = out + i * (long)I;                                                            \
        for (int c = 0; c < I; c++) {                                                         \
            float a = LOAD(g[c]);                                                             \
            o[c] = STORE(ROUND(a / (1.f + exp_poly(-a))) * LOAD(u[c]));                           \
        }                                                                                     \
    }                                                                                         \
}

DEFINE_ATTEND(attend_bf16, uint16_t, from_bf16)
DEFINE_ATTEND(attend_f32, float, LOAD_F32)
DEFINE_FINISH(finish_bf16, uint16_t, to_bf16)
DEFINE_FINISH(finish_f32, float, STORE_F32)
DEFINE_ATTENTION(decode_attention_bf16, attend_bf16, finish_bf16, uint16_t, from_bf16)
DEFINE_ATTENTION(decode_attention_f32, attend_f32, finish_f32, float, LOAD_F32)
DEFINE_ROPE(rope_bf16, uint16_t, from_bf16, round_bf16)
DEFINE_ROPE(rope_f32, float, LOAD_F32, ROUND_F32)
DEFINE_ROPE_ATTENTION(decode_rope_attention_bf16, rope_bf16, attend_bf16, finish_bf16, uint16_t,
                      from_bf16, to_bf16)
DEFINE_ROPE_ATTENTION(decode_rope_attention_f32, rope_f32, attend_f32, finish_f32, float,
                      LOAD_F32, STORE_F32)
DEFINE_ADD_RMS(decode_add_rms_bf16, uint16_t, from_bf16, to_bf16, round_bf16)
DEFINE_ADD_RMS(decode_add_rms_f32, float, LOAD_F32, STORE_F32, ROUND_F32)
DEFINE_SILU_MUL(decode_silu_mul_bf16, uint16_t, from_bf16, to_bf16, round_bf16)
DEFINE_SILU_MUL(decode_silu_mul_f32, float, LOAD_F32, STORE_F32, ROUND_F32)

/* One token a row by inverse transform sampling: row i's index j is the first whose running
 * sum of e_j = exp(s_j - max s) passes u_i * sum e, with s = logits / temp (divided, as torch
 * divides) and e_j = 0 where s_j - max s < log_min_p (min-p; -inf: off). What the torch
 * path does with softmax, cumsum and searchsorted, in three passes over the row instead of
 * ~5 single-threaded operations on (n, V). The exps are summed in float blocks of
 * SAMPLE_BLOCK and the blocks in double; the walk finds the block in the block sums and the
 * token in the block, so a token of probability 0 is never drawn. A row that is not
 * finite (NaN, +inf, every score -inf) is left to the caller: the return value counts them
 * and out[i] = -1 marks each. */
#define SAMPLE_BLOCK 512
static long sample_row(const float* l, int V, float temp, float log_min_p, float u, float* e,
                       double* bs) {
    /* max of l / temp = (max of l) / temp (division by temp > 0 keeps the order); 16 lanes
     * of selects, which vectorize where a max reduction would not (NaN rules) */
    float lane[16], m = -INFINITY;
    for (int k = 0; k < 16; k++) lane[k] = -INFINITY;
    int j = 0;
    for (; j + 16 <= V; j += 16)
        for (int k = 0; k < 16; k++) lane[k] = l[j + k] > lane[k] ? l[j + k] : lane[k];
    for (; j < V; j++) m = l[j] > m ? l[j] : m;
    for (int k = 0; k < 16; k++) m = lane[k] > m ? lane[k] : m;
    m = m / temp;
    if (!isfinite(m)) return -1;
    int nb = (V + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
    double total = 0.;
    for (int b = 0; b < nb; b++) {
        int j1 = (b + 1) * SAMPLE_BLOCK < V ? (b + 1) * SAMPLE_BLOCK : V;
        float acc = 0.f;
        for (j = b * SAMPLE_BLOCK; j < j1; j++) {
            float d = l[j] / temp - m;
            float v = d < log_min_p ? 0.f : exp_poly(d);
            e[j] = v;
            acc += v;
        }
        bs[b] = acc;
        total += acc;
    }
    if (!(total > 0.) || !isfinite(total)) return -1;
    double target = (double)u * total, cum = 0.;
    int b = 0;
    while (b < nb - 1 && cum + bs[b] <= target) cum += bs[b++];
    int j1 = (b + 1) * SAMPLE_BLOCK < V ? (b + 1) * SAMPLE_BLOCK : V;
    long last = -1;
    for (j = b * SAMPLE_BLOCK; j < j1; j++) {
        if (e[j] > 0.f) {
            last = j;
            cum += e[j];
            if (cum > target) return j;
        }
    }
    return last; /* the block's float sum rounded above its running double sum */
}

/* Rows at logits + i * row (elements), float32 or (bf16 != 0) bf16. A bf16 row is first
 * widened into a per-thread float32 row (in cache) with the values torch's .float() makes,
 * so both forms draw the same tokens; this spares the decode step torch's separate
 * conversion of the whole (n, V) output into a new tensor. */
static long sample_rows(const void* logits, int bf16, long row, int n, int V, float temp,
                        float log_min_p, const float* u, int64_t* out) {
    long bad = 0;
    int nb = (V + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
    _Pragma("omp parallel reduction(+ : bad) if ((long)n * V >= 65536)")
    {
        float* e = malloc(sizeof(float) * (size_t)V);
        double* bs = malloc(sizeof(double) * (size_t)nb);
        float* wide = bf16 ? malloc(sizeof(float) * (size_t)V) : NULL;
        _Pragma("omp for schedule(static)")
        for (long i = 0; i < n; i++) {
            long j = -1;
            if (e && bs && (wide || !bf16)) {
                const float* l = (const float*)logits + i * row;
                if (bf16) {
                    const uint16_t* r = (const uint16_t*)logits + i * row;
                    for (int c = 0; c < V; c++) wide[c] = from_bf16(r[c]);
                    l = wide;
                }
                j = sample_row(l, V, temp, log_min_p, u[i], e, bs);
            }
            out[i] = j;
            bad += j < 0;
        }
        free(e);
        free(bs);
        free(wide);
    }
    return bad;
}

long decode_sample_f32(const float* logits, long row, int n, int V, float temp,
                       float log_min_p, const float* u, int64_t* out) {
    return sample_rows(logits, 0, row, n, V, temp, log_min_p, u, out);
}

long decode_sample_bf16(const uint16_t* logits, long row, int n, int V, float temp,
                        float log_min_p, const float* u, int64_t* out) {
    return sample_rows(logits, 1, row, n, V, temp, log_min_p, u, out);
}
