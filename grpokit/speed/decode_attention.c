/* Decode-step attention for grpokit's decode loop (grpokit/speed/kernels.py builds and loads
 * this file; the Python side checks every shape and stride before calling).
 *
 * One query token per row: for row i and key/value head h, the g query heads that share h
 * attend over the cache slots 0..S-1 that row i's mask allows. Keys and values are read once
 * per (row, head) for all g queries, and the softmax runs online (a running maximum and sum,
 * rescaled when the maximum grows), so no score buffer is needed whatever S is. Sums are in
 * float32; a bf16 output is rounded to nearest even, as torch rounds.
 *
 * Layouts (element strides):
 *   q    (n, KV, g, D): row i at q + i * q_row, head h at + h * g * D, query j at + j * D
 *   k, v (n, KV, T, D): contiguous
 *   mask (n, S) bytes:  row i at mask + i * mask_row, nonzero = attend
 *   out  (n, KV, g, D): contiguous
 */
#include <math.h>
#include <stdint.h>

#define MAX_G 16
#define MAX_D 256

static inline float from_bf16(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = ((uint32_t)x) << 16;
    return c.f;
}

static inline uint16_t to_bf16(float f) {
    union { uint32_t u; float f; } c;
    c.f = f;
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((c.u >> 16) | 0x40u); /* NaN */
    c.u += 0x7fffu + ((c.u >> 16) & 1u);
    return (uint16_t)(c.u >> 16);
}

#define DEFINE_KERNEL(NAME, T_, LOAD, STORE)                                                  \
void NAME(const T_* q, long q_row, const T_* k, const T_* v, const uint8_t* mask,            \
          long mask_row, T_* out, int n, int KV, int g, int D, long T, long S, float scale) { \
    _Pragma("omp parallel for schedule(static)")                                              \
    for (long bh = 0; bh < (long)n * KV; bh++) {                                              \
        long i = bh / KV, h = bh % KV;                                                        \
        float qf[MAX_G][MAX_D], acc[MAX_G][MAX_D], kf[MAX_D], vf[MAX_D];                      \
        float mx[MAX_G], sum[MAX_G], p[MAX_G];                                                \
        const T_* qb = q + i * q_row + h * (long)g * D;                                       \
        for (int j = 0; j < g; j++) {                                                         \
            mx[j] = -INFINITY;                                                                \
            sum[j] = 0.f;                                                                     \
            for (int d = 0; d < D; d++) {                                                     \
                qf[j][d] = LOAD(qb[j * D + d]) * scale;                                       \
                acc[j][d] = 0.f;                                                              \
            }                                                                                 \
        }                                                                                     \
        const T_* kb = k + bh * T * D;                                                        \
        const T_* vb = v + bh * T * D;                                                        \
        const uint8_t* m = mask + i * mask_row;                                               \
        for (long s = 0; s < S; s++) {                                                        \
            if (!m[s]) continue;                                                              \
            for (int d = 0; d < D; d++) kf[d] = LOAD(kb[s * D + d]);                          \
            for (int d = 0; d < D; d++) vf[d] = LOAD(vb[s * D + d]);                          \
            for (int j = 0; j < g; j++) {                                                     \
                float t = 0.f;                                                                \
                for (int d = 0; d < D; d++) t += qf[j][d] * kf[d];                            \
                if (t > mx[j]) {                                                              \
                    float r = expf(mx[j] - t); /* 0 for the first slot */                     \
                    sum[j] *= r;                                                              \
                    for (int d = 0; d < D; d++) acc[j][d] *= r;                               \
                    mx[j] = t;                                                                \
                }                                                                             \
                p[j] = expf(t - mx[j]);                                                       \
                sum[j] += p[j];                                                               \
                for (int d = 0; d < D; d++) acc[j][d] += p[j] * vf[d];                        \
            }                                                                                 \
        }                                                                                     \
        T_* ob = out + bh * (long)g * D;                                                      \
        for (int j = 0; j < g; j++) {                                                         \
            float r = sum[j] > 0.f ? 1.f / sum[j] : 0.f; /* no slot attended: zeros */        \
            for (int d = 0; d < D; d++) ob[j * D + d] = STORE(acc[j][d] * r);                 \
        }                                                                                     \
    }                                                                                         \
}

#define LOAD_F32(x) (x)
#define STORE_F32(x) (x)
DEFINE_KERNEL(decode_attention_bf16, uint16_t, from_bf16, to_bf16)
DEFINE_KERNEL(decode_attention_f32, float, LOAD_F32, STORE_F32)
