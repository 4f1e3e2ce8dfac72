/* The output layer's log-softmax over the vocabulary, for grpokit.algo.linear_logprobs'
 * token chunks (grpokit/speed/kernels.py builds and loads this file; the Python side checks
 * every dtype, shape and stride before calling). A bf16 and a float32 form.
 *
 * head_log_softmax: for each row i of x (the chunk's logits as the product left them, in
 * its dtype) and its target t_i,
 *     z_j   = x_ij * scale                       (float32, as the torch path's upcast and
 *                                                 scaling multiply)
 *     ls_j  = (z_j - max z) - log(sum_k exp(z_k - max z))
 *     logp  = ls_t,  lse = z_t - logp            (what the torch path stores)
 *     ent   = -sum_j exp(ls_j) ls_j              (when ent is not NULL)
 *     probs = exp(ls_j) rounded to x's dtype     (when probs is not NULL: the softmax the
 *                                                 backward reads)
 * in three passes over the row (maximum; sum of exps; softmax and entropy), where torch ran
 * an upcast, a scaling multiply, log-softmax, a gather, exp, a dot product a row and a cast
 * over (rows, V) float32 blocks. Sums are float32 over blocks of 256, the blocks' in double. Returns the number of rows
 * whose statistics are not finite (NaN or inf in the row) or whose target is outside 0..V-1:
 * the caller then redoes the chunk with torch's operations, so their values (NaN, or torch's
 * error for a bad index) are torch's.
 *
 * Layouts: x (n, V) rows x_row apart, unit stride; targets (n,) int64; logp, lse, ent (n,)
 * float32; probs (n, V) rows p_row apart. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernel_math.h"

#define HBLOCK 256 /* elements a block: the softmax pass's float32 scratch stays in L1 */

/* The largest of x[0..V-1], as float: an integer maximum over the values' bits made
 * monotonic (sign-magnitude to two's complement), which GCC vectorizes where it leaves a
 * float maximum scalar (NaN rules). A NaN in the row counts as a large or small value here;
 * the sum of exps that follows turns NaN and the caller's finiteness check catches it.
 * Out of line: inlined into OpenMP's outlined function, GCC left the loop scalar. */
__attribute__((noinline)) static float max_bf16(const uint16_t* restrict x, int V) {
    int32_t best = INT16_MIN;
    for (int j = 0; j < V; j++) {
        int32_t b = (int16_t)x[j];
        int32_t key = b ^ ((b >> 15) & 0x7fff);
        best = key > best ? key : best;
    }
    return from_bf16((uint16_t)(best ^ ((best >> 15) & 0x7fff)));
}

__attribute__((noinline)) static float max_f32(const float* restrict x, int V) {
    const int32_t* u = (const int32_t*)x;
    int32_t best = INT32_MIN;
    for (int j = 0; j < V; j++) {
        int32_t key = u[j] ^ ((u[j] >> 31) & 0x7fffffff);
        best = key > best ? key : best;
    }
    union { int32_t i; float f; } c;
    c.i = best ^ ((best >> 31) & 0x7fffffff);
    return c.f;
}

/* scale > 0 (the caller checks): max(x) * scale is the largest x_j * scale, rounding being
 * monotonic. */
#define DEFINE_HEAD(NAME, T_, LOAD, STORE, MAX)                                               \
static int NAME##_row(const T_* restrict x, int V, float scale, long t, float* logp,        \
                      float* lse, float* ent, T_* restrict probs) {                           \
    float m = MAX(x, V) * scale;                                                              \
    double s = 0.; /* block sums in float, the blocks in double */                            \
    for (int j0 = 0; j0 < V; j0 += HBLOCK) {                                                  \
        int nb = V - j0 < HBLOCK ? V - j0 : HBLOCK;                                           \
        float sb = 0.f;                                                                       \
        for (int j = 0; j < nb; j++) sb += exp_poly(LOAD(x[j0 + j]) * scale - m);             \
        s += sb;                                                                              \
    }                                                                                         \
    float ls0 = logf((float)s);                                                               \
    if (!isfinite(m) || !isfinite(ls0) || t < 0 || t >= V) return 1;                          \
    float lp = (LOAD(x[t]) * scale - m) - ls0;                                                \
    *logp = lp;                                                                               \
    *lse = LOAD(x[t]) * scale - lp;                                                           \
    if (!ent && !probs) return 0;                                                             \
    double h = 0.;                                                                            \
    for (int j0 = 0; j0 < V; j0 += HBLOCK) {                                                  \
        int nb = V - j0 < HBLOCK ? V - j0 : HBLOCK;                                           \
        float l[HBLOCK], p[HBLOCK], hb = 0.f;                                                 \
        for (int j = 0; j < nb; j++) {                                                        \
            l[j] = (LOAD(x[j0 + j]) * scale - m) - ls0;                                       \
            p[j] = exp_poly(l[j]);                                                            \
        }                                                                                     \
        for (int j = 0; j < nb; j++) hb += p[j] * l[j];                                       \
        h += hb;                                                                              \
        if (probs)                                                                            \
            for (int j = 0; j < nb; j++) probs[j0 + j] = STORE(p[j]);                         \
    }                                                                                         \
    if (ent) *ent = (float)-h;                                                                \
    return 0;                                                                                 \
}                                                                                             \
                                                                                              \
long NAME(const T_* x, long x_row, int n, int V, float scale, const int64_t* targets,        \
          float* logp, float* lse, float* ent, T_* probs, long p_row) {                       \
    long bad = 0;                                                                             \
    _Pragma("omp parallel for schedule(static) reduction(+ : bad)")                           \
    for (long i = 0; i < n; i++)                                                              \
        bad += NAME##_row(x + i * x_row, V, scale, targets[i], logp + i, lse + i,             \
                          ent ? ent + i : NULL, probs ? probs + i * p_row : NULL);            \
    return bad;                                                                               \
}

DEFINE_HEAD(head_log_softmax_bf16, uint16_t, from_bf16, to_bf16, max_bf16)
DEFINE_HEAD(head_log_softmax_f32, float, LOAD_F32, STORE_F32, max_f32)
