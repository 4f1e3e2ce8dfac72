/* Two elementwise chains of a Llama decoder layer's training forward and backward, each one
 * pass over its tensors where torch ran several (grpokit/speed/layers.py calls them through
 * grpokit/speed/kernels.py, which checks dtypes, shapes and strides first). bf16 or float32
 * tensors; every sum and product is float32, and every value torch rounds to the tensor's
 * dtype is rounded here too (to nearest even), in torch's order. Floating-point contraction
 * is off for the rotary pass, so a * b + c * d is two products and a sum as in torch's
 * kernels (bit for bit); on for the SiLU pass (its exp polynomial's fused multiply-adds:
 * 1.84 -> 1.15 ms for (16, 129, 1536) bf16, 2 threads, with 512-bit vectors: torch's silu and
 * mul together took 1.13).
 *
 * Rotary position embedding (transformers' apply_rotary_pos_emb, x of q's or k's dtype and
 * float32 cos/sin, the residual stream's dtype under autocast), per vector of D = 2 h:
 *   rope_forward:   y_i = x_i c_i - x_{i+h} s_i   (i < h)      output: x's dtype (bf16:
 *                   y_i = x_i c_i + x_{i-h} s_i   (i >= h)     the cast the attention makes)
 *   rope_backward:  a_i = round(g_i c_i), b_i = round(g_i s_i)  (autograd: each product's
 *                   dx_i = round(a_i + b_{i+h})   (i < h)       gradient cast to x's dtype,
 *                   dx_i = round(a_i - b_{i-h})   (i >= h)      then the two paths summed)
 * x, y, g, dx are (B, H, T, D) with element strides (b, h, t) and unit stride along D; cos
 * and sin (B or 1, T, D) with strides (cb, ct).
 *
 * SwiGLU's product (grpokit's SiLUMul: silu(g) * u, keeping g and u):
 *   silu_mul_forward:   y = round(round(g / (1 + exp(-g))) * u)
 *   silu_mul_backward:  dg = round(round(dy u) * s * (1 + g (1 - s))), s = 1 / (1 + exp(-g))
 *                       du = round(dy * round(g / (1 + exp(-g))))
 * torch's silu, mul and silu_backward; exp is kernel_math.h's (within 2 ulp of libm's), so a
 * result can differ from torch's in its last bf16 bit. Flat contiguous tensors of n. */
#pragma GCC target("prefer-vector-width=512")
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "kernel_math.h"

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
/* One (b, t) position's H vectors of D = 2 h: the forward's rotation, or the backward's. */
#define DEFINE_ROPE_ROWS(SFX, T_, LOAD, STORE, ROUND)                                         \
static inline void rope_rows_fwd_##SFX(const T_* x, long xh, T_* y, long yh, int H, int h,   \
                                       const float* c, const float* s) {                     \
    for (int j = 0; j < H; j++, x += xh, y += yh)                                             \
        for (int i = 0; i < h; i++) {                                                         \
            float lo = LOAD(x[i]), hi = LOAD(x[i + h]);                                       \
            float p = lo * c[i], q = -hi * s[i];                                              \
            y[i] = STORE(p + q);                                                              \
            float p2 = hi * c[i + h], q2 = lo * s[i + h];                                     \
            y[i + h] = STORE(p2 + q2);                                                        \
        }                                                                                     \
}                                                                                             \
                                                                                              \
static inline void rope_rows_bwd_##SFX(const T_* g, long gh, T_* dx, long dh, int H, int h,  \
                                       const float* c, const float* s) {                     \
    for (int j = 0; j < H; j++, g += gh, dx += dh)                                            \
        for (int i = 0; i < h; i++) {                                                         \
            float glo = LOAD(g[i]), ghi = LOAD(g[i + h]);                                     \
            float alo = ROUND(glo * c[i]), ahi = ROUND(ghi * c[i + h]);                       \
            float blo = ROUND(glo * s[i]), bhi = ROUND(ghi * s[i + h]);                       \
            dx[i] = STORE(alo + bhi);                                                         \
            dx[i + h] = STORE(ahi - blo);                                                     \
        }                                                                                     \
}

/* x (B, H, T, D) strided (b, h, t) -> y strided likewise, one position's heads at a time */
#define DEFINE_ROPE_PASS(NAME, ROWS, T_)                                                      \
void NAME(const T_* x, long xb, long xh, long xt, int B, int H, int T, int D,                \
          const float* cs, const float* sn, long cb, long ct, T_* y, long yb, long yh,        \
          long yt) {                                                                          \
    long n = (long)B * T;                                                                     \
    _Pragma("omp parallel for schedule(static) if (n * H * D >= 16384)")                      \
    for (long bt = 0; bt < n; bt++) {                                                         \
        long b = bt / T, t = bt % T;                                                          \
        ROWS(x + b * xb + t * xt, xh, y + b * yb + t * yt, yh, H, D / 2, cs + b * cb + t * ct,  \
             sn + b * cb + t * ct);                                                           \
    }                                                                                         \
}

#define DEFINE_SILU_TRAIN(SFX, T_, LOAD, STORE, ROUND)                                        \
void silu_mul_forward_##SFX(const T_* g, const T_* u, T_* y, long n) {                       \
    _Pragma("omp parallel for schedule(static) if (n >= 65536)")                              \
    for (long i = 0; i < n; i++) {                                                            \
        float a = LOAD(g[i]);                                                                 \
        y[i] = STORE(ROUND(a / (1.f + exp_poly(-a))) * LOAD(u[i]));                           \
    }                                                                                         \
}                                                                                             \
                                                                                              \
/* dg or du may be NULL (that gradient not wanted) */                                         \
void silu_mul_backward_##SFX(const T_* dy, const T_* g, const T_* u, T_* dg, T_* du,         \
                             long n) {                                                        \
    _Pragma("omp parallel for schedule(static) if (n >= 65536)")                              \
    for (long i = 0; i < n; i++) {                                                            \
        float a = LOAD(g[i]), d = LOAD(dy[i]);                                                \
        float e = 1.f + exp_poly(-a);                                                         \
        if (dg) {                                                                             \
            float s = 1.f / e;                                                                \
            dg[i] = STORE(ROUND(d * LOAD(u[i])) * s * (1.f + a * (1.f - s)));                 \
        }                                                                                     \
        if (du) du[i] = STORE(d * ROUND(a / e));                                              \
    }                                                                                         \
}                                                                                             \
                                                                                              \
/* silu_mul_backward's dg and du and, in the same pass, y as silu_mul_forward writes it:    \
 * for a product whose weight gradient needs y again after its input gradient dy is known   \
 * (the down projection); one exp and one read of g, u an element. The six arrays are        \
 * distinct (simd: GCC otherwise checks their overlap at run time, and with six pointers it  \
 * gives up vectorizing: 17 ms against 2.5 for (2171, 1536) bf16). */                        \
void silu_mul_backward_remake_##SFX(const T_* dy, const T_* g, const T_* u, T_* y, T_* dg,   \
                                    T_* du, long n) {                                         \
    _Pragma("omp parallel for simd schedule(static) if (n >= 65536)")                         \
    for (long i = 0; i < n; i++) {                                                            \
        float a = LOAD(g[i]), d = LOAD(dy[i]), b = LOAD(u[i]);                                \
        float e = 1.f + exp_poly(-a);                                                         \
        float s = 1.f / e;                                                                    \
        float sg = ROUND(a / e);                                                              \
        y[i] = STORE(sg * b);                                                                 \
        dg[i] = STORE(ROUND(d * b) * s * (1.f + a * (1.f - s)));                              \
        du[i] = STORE(d * sg);                                                                \
    }                                                                                         \
}

DEFINE_ROPE_ROWS(bf16, uint16_t, from_bf16, to_bf16, round_bf16)
DEFINE_ROPE_ROWS(f32, float, LOAD_F32, STORE_F32, ROUND_F32)
DEFINE_ROPE_PASS(rope_forward_bf16, rope_rows_fwd_bf16, uint16_t)
DEFINE_ROPE_PASS(rope_backward_bf16, rope_rows_bwd_bf16, uint16_t)
DEFINE_ROPE_PASS(rope_forward_f32, rope_rows_fwd_f32, float)
DEFINE_ROPE_PASS(rope_backward_f32, rope_rows_bwd_f32, float)
#pragma GCC pop_options
DEFINE_SILU_TRAIN(bf16, uint16_t, from_bf16, to_bf16, round_bf16)
DEFINE_SILU_TRAIN(f32, float, LOAD_F32, STORE_F32, ROUND_F32)


/* Dropout's keep mask and the kept input, for grpokit/speed/layers.py's DropoutLinear:
 * entry i is kept when its 32-bit uniform r_i >= k (k = ceil(p 2^32): probability 1 - p to
 * within 2^-32), r_{2j} and r_{2j+1} the high and low halves of SplitMix64's output for the
 * counter seed + (j + 1) * 0x9E3779B97F4A7C15 (a hash of (seed, index): the same mask
 * whatever the thread count; layers.keep_mask's numpy form computes the same numbers):
 * keep (n bytes) = 0/1. keep_times: xd = x * keep, as torch's product with the uint8 mask
 * (-0 for a dropped negative, NaN stays NaN). */
static inline uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void dropout_keep(long n, uint64_t seed, uint64_t k, uint8_t* keep) {
    long pairs = n / 2;
    _Pragma("omp parallel for schedule(static) if (n >= 65536)")
    for (long j = 0; j < pairs; j++) {
        uint64_t h = splitmix64(seed + (uint64_t)(j + 1) * 0x9E3779B97F4A7C15ull);
        keep[2 * j] = (h >> 32) >= k;
        keep[2 * j + 1] = (h & 0xFFFFFFFFull) >= k;
    }
    if (n % 2) keep[n - 1] = (splitmix64(seed + (uint64_t)(pairs + 1) * 0x9E3779B97F4A7C15ull) >> 32) >= k;
}

#define DEFINE_KEEP_TIMES(SFX, T_, LOAD, STORE)                                               \
void keep_times_##SFX(const T_* x, const uint8_t* keep, long n, T_* xd) {                    \
    _Pragma("omp parallel for schedule(static) if (n >= 65536)")                              \
    for (long i = 0; i < n; i++) xd[i] = STORE(LOAD(x[i]) * (float)keep[i]);                  \
}
#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* keep_times for bf16 by the bits, 32 values a step, with the float product's results: a kept
 * value is x itself, a dropped one x's sign and zero, except that NaN comes out quiet (x | 0x40,
 * as to_bf16) whatever the mask and a dropped infinity is the float product's NaN (inf * 0:
 * x86's default NaN, 0xFFC0). The float-product loop it replaces, (2,125, 576) bf16, 2 threads,
 * warm caches (AMD EPYC family 25 model 17): 0.134 -> 0.053 ms; (2,125, 1,536): 0.331 -> 0.130
 * (a plain copy of the same values: 0.035 / 0.074). bench/speed.py's (c) makes ~960 such
 * products a step (LoRA dropout's masked inputs, forward and backward). */
void keep_times_bf16(const uint16_t* x, const uint8_t* keep, long n, uint16_t* xd) {
    long blocks = n / 32;
    _Pragma("omp parallel for schedule(static) if (n >= 65536)")
    for (long b = 0; b < blocks; b++) {
        __m512i u = _mm512_loadu_si512((const void*)(x + 32 * b));
        __m256i kb = _mm256_loadu_si256((const __m256i*)(keep + 32 * b));
        __mmask32 kept = _mm256_test_epi8_mask(kb, kb);
        __m512i mag = _mm512_and_si512(u, _mm512_set1_epi16(0x7fff));
        __mmask32 nan = _mm512_cmpgt_epu16_mask(mag, _mm512_set1_epi16(0x7f80));
        __mmask32 inf = _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7f80));
        __m512i r = _mm512_mask_blend_epi16(kept, _mm512_and_si512(u, _mm512_set1_epi16((short)0x8000)), u);
        r = _mm512_mask_mov_epi16(r, inf & ~kept, _mm512_set1_epi16((short)0xffc0));
        r = _mm512_mask_mov_epi16(r, nan, _mm512_or_si512(u, _mm512_set1_epi16(0x40)));
        _mm512_storeu_si512((void*)(xd + 32 * b), r);
    }
    for (long i = 32 * blocks; i < n; i++) xd[i] = to_bf16(from_bf16(x[i]) * (float)keep[i]);
}
#else
DEFINE_KEEP_TIMES(bf16, uint16_t, from_bf16, to_bf16)
#endif
DEFINE_KEEP_TIMES(f32, float, LOAD_F32, STORE_F32)

/* transpose_u16: dst (C, R), contiguous = the transpose of src (R, C) of 16-bit values (bf16,
 * fp16) whose rows lie ld elements apart, in 16 x 16 blocks (8 shuffle rounds of 256-bit
 * registers a block; rows and columns past the last whole block one by one). Why: a weight's
 * gradient g^T x (g: the (tokens, out) output gradient) is a product whose first operand is
 * transposed, and oneDNN on AMX runs some of those shapes at half its rate; torch's own copy
 * of a transposed bf16 tensor moves 1-2.5 GB/s here, this 15-37 (Intel Xeon, family 6 model
 * 167, 2 threads; grpokit/speed/layers.py's weight_grad). Values are only moved. */
#ifdef __AVX2__
static inline void transpose_block16(const uint16_t* s, long ls, uint16_t* d, long ld) {
    __m256i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm256_loadu_si256((const __m256i*)(s + i * ls));
    for (int i = 0; i < 16; i += 2) {  /* pairs of rows: 16-bit interleaves */
        t[i] = _mm256_unpacklo_epi16(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi16(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  /* 32-bit interleaves */
        r[i] = _mm256_unpacklo_epi32(t[i], t[i + 2]);
        r[i + 1] = _mm256_unpackhi_epi32(t[i], t[i + 2]);
        r[i + 2] = _mm256_unpacklo_epi32(t[i + 1], t[i + 3]);
        r[i + 3] = _mm256_unpackhi_epi32(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)  /* 64-bit interleaves */
        for (int j = 0; j < 4; j++) {
            t[i + 2 * j] = _mm256_unpacklo_epi64(r[i + j], r[i + j + 4]);
            t[i + 2 * j + 1] = _mm256_unpackhi_epi64(r[i + j], r[i + j + 4]);
        }
    for (int j = 0; j < 8; j++) {  /* 128-bit halves: rows 0-7 with rows 8-15 */
        _mm256_storeu_si256((__m256i*)(d + j * ld), _mm256_permute2x128_si256(t[j], t[j + 8], 0x20));
        _mm256_storeu_si256((__m256i*)(d + (j + 8) * ld),
                            _mm256_permute2x128_si256(t[j], t[j + 8], 0x31));
    }
}
#endif

void transpose_u16(const uint16_t* src, long R, long C, long ld, uint16_t* dst) {
    long RB = 0, CB = 0;
#ifdef __AVX2__
    RB = R / 16, CB = C / 16;
    _Pragma("omp parallel for schedule(static) if (R * C >= 65536)")
    for (long cb = 0; cb < CB; cb++)
        for (long rb = 0; rb < RB; rb++)
            transpose_block16(src + rb * 16 * ld + cb * 16, ld, dst + cb * 16 * R + rb * 16, R);
#endif
    for (long j = 0; j < C; j++) {  /* what the blocks left: the last rows, the last columns */
        long i0 = j < CB * 16 ? RB * 16 : 0;
        for (long i = i0; i < R; i++) dst[j * R + i] = src[i * ld + j];
    }
}

/* sum_bf16_as_f32: out (n floats) = ((p[0] + p[1]) + p[2]) + ... of k bf16 tensors of n, each
 * widened to float32 and added in that order, every sum rounded to float32: what
 * ``p[0].float()``, then ``.add_(p[i].float())`` for i = 1.. computes (bit for bit; no
 * reassociation here), in one pass where those are 2k - 1 (the input gradient of layers
 * sharing one input: grpokit/speed/layers.py's SharedCastLinears). m: NULL, or k uint8 0/1
 * masks of n, NULL for a part without one: a masked part is p[j] * m[j] (keep_times' values:
 * a LoRA adapter's input gradient through its dropout), with no pass of its own. The widening
 * is written out here: GCC does not inline from_bf16 (other optimize options) into this
 * region, and a call an element kept the loops scalar. */
#pragma GCC push_options
#pragma GCC optimize("no-associative-math")
#define WIDEN_BF16(v) ({ union { uint32_t u; float f; } c_; c_.u = (uint32_t)(v) << 16; c_.f; })
void sum_bf16_as_f32(const uint16_t* const* p, const uint8_t* const* m, int k, long n,
                     float* out) {
    _Pragma("omp parallel for schedule(static) if (n >= 65536)")
    for (long b = 0; b < n; b += 1024) {
        long e = b + 1024 < n ? b + 1024 : n;
        for (int j = 0; j < k; j++) {
            const uint16_t* q = p[j];
            const uint8_t* mj = m ? m[j] : NULL;
            if (j == 0 && mj)
                for (long i = b; i < e; i++) out[i] = WIDEN_BF16(q[i]) * (float)mj[i];
            else if (j == 0)
                for (long i = b; i < e; i++) out[i] = WIDEN_BF16(q[i]);
            else if (mj)
                for (long i = b; i < e; i++) out[i] += WIDEN_BF16(q[i]) * (float)mj[i];
            else
                for (long i = b; i < e; i++) out[i] += WIDEN_BF16(q[i]);
        }
    }
}
#undef WIDEN_BF16
#pragma GCC pop_options

/* bf16_into_f32: dst (float32, contiguous) = or += src (bf16, rows ld apart) widened, where
 * the source is (R, C) and dst (R, C), or (C, R) when transposed: a weight's gradient from the
 * product that makes it (in bf16, as autocast rounds it) added into the weight's float32
 * gradient, or made one, in one pass. What autograd does with it is a float32 cast, then an
 * add into the gradient (two passes, a float32 temporary; the same sums). Transposed: the
 * product made the gradient's transpose (x^T g, grpokit/speed/layers.py's weight_grads),
 * turned in 16 x 16 blocks by transpose_block16. */
static inline void widen_into(const uint16_t* s, float* d, long n, int add) {
    if (add)
        for (long k = 0; k < n; k++) d[k] += from_bf16(s[k]);
    else
        for (long k = 0; k < n; k++) d[k] = from_bf16(s[k]);
}

void bf16_into_f32(const uint16_t* src, long R, long C, long ld, int transposed, int add,
                   float* dst) {
    if (!transposed) {
        _Pragma("omp parallel for schedule(static) if (R * C >= 65536)")
        for (long i = 0; i < R; i++) widen_into(src + i * ld, dst + i * C, C, add);
        return;
    }
    long RB = 0, CB = 0;
#ifdef __AVX2__
    RB = R / 16, CB = C / 16;
    _Pragma("omp parallel for schedule(static) if (R * C >= 65536)")
    for (long cb = 0; cb < CB; cb++) {
        uint16_t t[16 * 16];
        for (long rb = 0; rb < RB; rb++) {
            transpose_block16(src + rb * 16 * ld + cb * 16, ld, t, 16);
            for (int j = 0; j < 16; j++)
                widen_into(t + j * 16, dst + (cb * 16 + j) * R + rb * 16, 16, add);
        }
    }
#endif
    for (long j = 0; j < C; j++) {  /* what the blocks left: the last rows, the last columns */
        long i0 = j < CB * 16 ? RB * 16 : 0;
        for (long i = i0; i < R; i++) {
            float v = from_bf16(src[i * ld + j]);
            dst[j * R + i] = add ? dst[j * R + i] + v : v;
        }
    }
}
