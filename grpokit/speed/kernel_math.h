/* Float helpers shared by grpokit's C kernels (decode_step.c, attention_train.c; built into
 * one library by grpokit/speed/kernels.py, which hashes this file with them): bf16 <-> float32
 * with round to nearest even, and an exp that vectorizes. */
#ifndef GRPOKIT_KERNEL_MATH_H
#define GRPOKIT_KERNEL_MATH_H
#include <math.h>
#include <stdint.h>

static inline float from_bf16(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = ((uint32_t)x) << 16;
    return c.f;
}

static inline uint16_t to_bf16(float f) { /* branch-free, so that loops vectorize */
    union { uint32_t u; float f; } c;
    c.f = f;
    uint32_t rounded = (c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (c.u >> 16) | 0x40u;
    return (uint16_t)((c.u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

static inline float round_bf16(float f) { return from_bf16(to_bf16(f)); }

/* exp(x) in plain arithmetic, so that loops calling it vectorize (libm's expf is a scalar
 * call): 2^k exp(r) with k = round(x / ln 2), r = x - k ln 2 in two parts, exp(r) by a
 * degree-6 polynomial (Cephes' coefficients), within 2 ulp of exp from -87.3 to 88.3;
 * 0 below (exp(-inf) = 0), exp(88.3) above (no overflow to inf). */
static inline float exp_poly(float x0) {
    float x = x0 < -87.3f ? -87.3f : x0; /* selects, not fminf/fmaxf: those do not vectorize */
    x = x > 88.3f ? 88.3f : x;
    int k = (int)floorf(x * 1.44269504088896341f + 0.5f);
    float kf = (float)k;
    /* fmaf: the two-part reduction must not be re-associated (-fassociative-math) */
    float r = fmaf(kf, -0.693359375f, x);
    r = fmaf(kf, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)(k + 127) << 23;
    return x0 < -87.3f ? 0.f : p * c.f;
}

#define LOAD_F32(x) (x)
#define STORE_F32(x) (x)
#define ROUND_F32(x) (x)

#endif
