/* The decode loop's matrix products on Intel AMX: y (M, N) = x (M, K) W^T (+ bias), bf16 in
 * and out, float32 sums, for the few rows of a decode step (any M; 32 at a time) against a
 * weight packed once per rollout (grpokit/speed/fastdecode.py; grpokit/speed/kernels.py
 * builds and loads this file). Why: at 32 rows a decode product reads each weight once from
 * memory and does 32 multiply-adds with it, so its time is the weight's bytes over the
 * memory rate; oneDNN's packed product (torch.ops.mkldnn._linear_pointwise) streamed
 * SmolLM2-135M's 120 fused layer weights at 12.3-15.8 GB/s where a plain sum over the same
 * bytes reads 20-25 GB/s, and this kernel 20-22 (Intel Xeon, family 6 model 167, 2 threads;
 * docs/speed.md). Each thread walks its own columns' tiles in the order they lie in memory,
 * and the tile unit does the sums.
 *
 * Packed layout (amx_pack_bf16): for each block of 16 output columns, for each chunk of 32
 * of K, one 1 KB tile of 16 rows: row r holds, for columns c = 0..15, the pair
 * W[c][2r], W[c][2r + 1] (the "VNNI" pairs TDPBF16PS multiplies). Blocks one after another,
 * chunks within a block one after another: a block's weights are one contiguous run.
 * Needs K % 32 == 0 and N % 16 == 0 (the caller checks and otherwise keeps oneDNN).
 *
 * Sums: per output, float32 over K in chunks of 32 (within a chunk, the tile unit's order),
 * then one rounding to bf16 (nearest even, as torch): not the order oneDNN sums in, so
 * results match it within float32 rounding before the bf16 cast.
 *
 * Without AMX at build time (-march=native on another CPU) the functions exist and
 * amx_linear_ready returns 0.
 *
 * The same packed layout feeds AVX512-BF16's VDPBF16PS (avx512_linear_bf16 below, for CPUs
 * with native bf16 but no AMX, such as AMD's Zen 4 and 5): a tile row, 32 bf16, is one
 * 512-bit register of 16 columns' pairs for one pair of K, and the instruction multiplies it
 * by one pair of x broadcast to all lanes. packed_linear_bf16 runs either. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__x86_64__)
#define HAVE_AVX512BF16 1
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && \
    defined(__x86_64__) && defined(__linux__)
#define HAVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* 1 when this build has the AMX code and the kernel let this process use the tile data
 * (Linux asks each process to request it: arch_prctl ARCH_REQ_XCOMP_PERM); else 0. */
int amx_linear_ready(void) {
#ifdef HAVE_AMX
    static int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                   18 /* XFEATURE_XTILEDATA */) == 0;
    return state;
#else
    return 0;
#endif
}

/* W (N, K) bf16 row-major -> out (N * K elements) in the packed layout above. */
void amx_pack_bf16(const uint16_t* W, long N, long K, uint16_t* out) {
    long chunks = K / 32;
    _Pragma("omp parallel for schedule(static)")
    for (long nb = 0; nb < N / 16; nb++) {
        for (long kc = 0; kc < chunks; kc++) {
            uint16_t* tile = out + (nb * chunks + kc) * 512;
            for (int r = 0; r < 16; r++)
                for (int c = 0; c < 16; c++) {
                    const uint16_t* w = W + (nb * 16 + c) * K + kc * 32 + 2 * r;
                    tile[r * 32 + 2 * c] = w[0];
                    tile[r * 32 + 2 * c + 1] = w[1];
                }
        }
    }
}

#ifdef HAVE_AMX
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Tiles, all 16 rows of 64 bytes (also attention_train.c's AMX kernels' layout). Here: 0..3
 * sums (rows 0-15 | 16-31 of a group of 32) x (block b | b + 1), 4..5 those rows of x, 6..7
 * the two blocks' weights. */
void amx_tiles_16x64(void) {
    /* a constant in memory: GCC 12 dropped the stores of a stack copy filled field by field
     * before LDTILECFG (it does not see the instruction read them) once this function was no
     * longer inlined, and the tile unit faulted on the half-written configuration */
    static const tile_config cfg __attribute__((aligned(64))) = {
        .palette = 1,
        .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
        .rows = {16, 16, 16, 16, 16, 16, 16, 16},
    };
    _tile_loadconfig(&cfg);
}

/* 16 float32 sums (+ bias) -> bf16, nearest even. */
static inline void store_row(const float* s, const uint16_t* bias, uint16_t* y) {
    __m512 v = _mm512_loadu_ps(s);
    if (bias) {
        __m256i b = _mm256_loadu_si256((const __m256i*)bias);
        v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
    }
    _mm256_storeu_si256((__m256i*)y, (__m256i)_mm512_cvtneps_pbh(v));
}

/* pair_group asks for the weight tiles amx_prefetch K chunks ahead of the ones it loads
 * (past its last chunk: the next pair's, which the same thread reads next under the static
 * schedule). At the decode loop's 32 rows the product is a read of the weights; the tile
 * loads alone read them at ~21.5 GB/s, with this at ~23.7 (SmolLM2-135M's 30 layers + the
 * output layer, 270 MB a step, alternating in one process: 12.4-12.6 -> 11.2-11.3 ms; a
 * distance of 1-3 alike, 4-8 less; Intel Xeon family 6 model 167, 2 threads). 0: off (for
 * comparisons). */
int amx_prefetch = 2;

/* Columns of blocks b0 (and b0 + 1 when two) for the rows of x (16 * halves of them, the
 * real ones `rows`) into y's rows; sums float32 over the K chunks in order. */
static void pair_group(const uint16_t* x, long K, const uint16_t* w0, long chunks, int two,
                       int halves, int rows, const uint16_t* bias, long col, uint16_t* y,
                       long N) {
    float sums[4][16 * 16] __attribute__((aligned(64)));
    const uint16_t* w1 = w0 + chunks * 512;
    size_t xs = (size_t)K * 2;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long kc = 0; kc < chunks; kc++) {
        if (amx_prefetch) { /* both blocks' chunk kc + amx_prefetch, or the next pair's */
            long a = kc + amx_prefetch;
            const char* p0 = (const char*)(a < chunks ? w0 + a * 512 : w0 + (chunks + a) * 512);
            const char* p1 = p0 + (two ? chunks * 1024 : 0);
            for (int l = 0; l < 1024; l += 64) {
                _mm_prefetch(p0 + l, _MM_HINT_T0);
                if (two) _mm_prefetch(p1 + l, _MM_HINT_T0);
            }
        }
        _tile_loadd(4, x + kc * 32, xs);
        _tile_loadd(6, w0 + kc * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two) {
            _tile_loadd(7, w1 + kc * 512, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (halves == 2) {
            _tile_loadd(5, x + 16 * K + kc * 32, xs);
            _tile_dpbf16ps(2, 5, 6);
            if (two) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, sums[0], 64);
    if (two) _tile_stored(1, sums[1], 64);
    if (halves == 2) {
        _tile_stored(2, sums[2], 64);
        if (two) _tile_stored(3, sums[3], 64);
    }
    for (int r = 0; r < rows; r++)
        for (int side = 0; side < 1 + two; side++)
            store_row(sums[2 * (r / 16) + side] + (r % 16) * 16, bias ? bias + col + 16 * side : NULL,
                      y + r * N + col + 16 * side);
}
#endif

/* y (M, N) bf16, row stride N = x (M, K) bf16 (row stride K) times the packed W, + bias
 * (N bf16, or NULL). Rows are taken 32 at a time for each pair of column blocks (the pair's
 * weights, 2 x K x 32 bytes, stay in cache for the next 32); a last group of fewer than 16
 * or 32 rows is read from a zero-padded copy. Returns 0, or -1 when this build or process
 * cannot (nothing written). */
int amx_linear_bf16(const uint16_t* x, long M, long K, const uint16_t* packed, long N,
                    const uint16_t* bias, uint16_t* y) {
#ifdef HAVE_AMX
    if (!amx_linear_ready() || M < 1 || K < 32 || K % 32 || N < 16 || N % 16) return -1;
    long chunks = K / 32, blocks = N / 16, pairs = (blocks + 1) / 2;
    long full = M / 32 * 32, tail = M - full;  /* rows in whole groups of 32; the rest */
    uint16_t* pad = NULL;
    if (tail) {
        pad = calloc((size_t)32 * K, sizeof *pad);
        if (!pad) return -1;
        memcpy(pad, x + full * K, (size_t)tail * K * sizeof *pad);
    }
    _Pragma("omp parallel")
    {
        amx_tiles_16x64();
        _Pragma("omp for schedule(static)")
        for (long p = 0; p < pairs; p++) {
            long b0 = 2 * p;
            int two = b0 + 1 < blocks;
            const uint16_t* w0 = packed + b0 * chunks * 512;
            for (long g = 0; g < full; g += 32)
                pair_group(x + g * K, K, w0, chunks, two, 2, 32, bias, b0 * 16, y + g * N, N);
            if (tail)
                pair_group(pad, K, w0, chunks, two, tail > 16 ? 2 : 1, (int)tail, bias,
                           b0 * 16, y + full * N, N);
        }
        _tile_release();
    }
    free(pad);
    return 0;
#else
    (void)x; (void)M; (void)K; (void)packed; (void)N; (void)bias; (void)y;
    return -1;
#endif
}

#ifdef HAVE_AVX512BF16
/* Rows 0..R-1 of x (row stride K) times column blocks 0..B-1 of w (a block's K/32 chunks of
 * 512 values each, blocks one after another) into y's columns col .. col + 16 B - 1 (+ bias).
 * R x B float32 sums of 16 lanes stay in registers for all of K (R = 8, B = 3: 24 of the 32
 * registers); per pair of K, B weight loads and R broadcasts of x's pair. Sums: float32 over
 * the pairs of K in order, then one rounding to bf16 (nearest even). R and B are constants
 * at each call (the function is inlined), so the arrays below are registers. */
static inline __attribute__((always_inline)) void dp_block(const uint16_t* x, long K, int R,
                                                           const uint16_t* w, long chunks, int B,
                                                           const uint16_t* bias, long col,
                                                           uint16_t* y, long N) {
    __m512 acc[8][3];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) acc[r][b] = _mm512_setzero_ps();
    for (long kc = 0; kc < chunks; kc++) {
        const uint16_t* wk = w + kc * 512;
        const uint16_t* xk = x + kc * 32;
        for (int p = 0; p < 16; p++) {
            __m512bh wv[3];
            for (int b = 0; b < B; b++)
                wv[b] = (__m512bh)_mm512_loadu_si512(wk + (long)b * chunks * 512 + p * 32);
            for (int r = 0; r < R; r++) {
                int32_t pair;
                memcpy(&pair, xk + (long)r * K + 2 * p, sizeof pair);
                __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
                for (int b = 0; b < B; b++) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xv, wv[b]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) {
            __m512 v = acc[r][b];
            if (bias) {
                __m256i bb = _mm256_loadu_si256((const __m256i*)(bias + col + 16 * b));
                v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bb), 16)));
            }
            _mm256_storeu_si256((__m256i*)(y + (long)r * N + col + 16 * b),
                                (__m256i)_mm512_cvtneps_pbh(v));
        }
}

/* All M rows for B (1..3) blocks starting at block b0: rows 8 at a time, then 4, 2, 1. */
static void dp_rows(const uint16_t* x, long M, long K, const uint16_t* packed, long chunks,
                    long b0, int B, const uint16_t* bias, uint16_t* y, long N) {
    const uint16_t* w = packed + b0 * chunks * 512;
    long col = b0 * 16, r = 0;
#define DP_CASE(RR)                                                                           \
    for (; r + RR <= M; r += RR) {                                                            \
        if (B == 3) dp_block(x + r * K, K, RR, w, chunks, 3, bias, col, y + r * N, N);        \
        else if (B == 2) dp_block(x + r * K, K, RR, w, chunks, 2, bias, col, y + r * N, N);   \
        else dp_block(x + r * K, K, RR, w, chunks, 1, bias, col, y + r * N, N);               \
    }
    DP_CASE(8)
    DP_CASE(4)
    DP_CASE(2)
    DP_CASE(1)
#undef DP_CASE
}
#endif

/* amx_linear_bf16's product on AVX512-BF16 (same packed weights, arguments and result up to
 * float32 summation order); the two threads split the column blocks, three at a time.
 * Returns 0, or -1 when this build has no AVX512-BF16 or the shapes do not fit. */
int avx512_linear_bf16(const uint16_t* x, long M, long K, const uint16_t* packed, long N,
                       const uint16_t* bias, uint16_t* y) {
#ifdef HAVE_AVX512BF16
    if (M < 1 || K < 32 || K % 32 || N < 16 || N % 16) return -1;
    long chunks = K / 32, blocks = N / 16, groups = (blocks + 2) / 3;
    _Pragma("omp parallel for schedule(static)")
    for (long g = 0; g < groups; g++) {
        long b0 = 3 * g;
        int B = blocks - b0 < 3 ? (int)(blocks - b0) : 3;
        dp_rows(x, M, K, packed, chunks, b0, B, bias, y, N);
    }
    return 0;
#else
    (void)x; (void)M; (void)K; (void)packed; (void)N; (void)bias; (void)y;
    return -1;
#endif
}

/* What packed_linear_bf16 can run here: 2 AMX (this process granted the tiles), 1
 * AVX512-BF16, 0 neither. */
int packed_linear_isa(void) {
    if (amx_linear_ready()) return 2;
#ifdef HAVE_AVX512BF16
    return 1;
#else
    return 0;
#endif
}

/* The packed product on AMX (isa 2) or AVX512-BF16 (isa 1): the caller chooses, so that a
 * process told to keep off AMX (oneDNN capped below it) keeps its products off it too. */
int packed_linear_bf16(int isa, const uint16_t* x, long M, long K, const uint16_t* packed,
                       long N, const uint16_t* bias, uint16_t* y) {
    if (isa == 2) return amx_linear_bf16(x, M, K, packed, N, bias, y);
    if (isa == 1) return avx512_linear_bf16(x, M, K, packed, N, bias, y);
    return -1;
}
