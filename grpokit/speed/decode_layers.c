/* A decode step's decoder layers in one call, for grpokit's decode loop where every product of
 * the layers is a packed one on AMX or AVX512-BF16 (isa 2 or 1, amx_linear.c;
 * grpokit/speed/fastdecode.py, FastDecoder._step_kernels; grpokit/speed/kernels.py builds
 * and loads this file with the others and checks every shape before calling).
 *
 * The same kernels in the same order as the per-layer Python loop it replaces, so the values
 * are bit-identical to it: before the first layer its input norm; per layer the fused q/k/v
 * product (packed_linear_bf16), rotary + cache write + attention (decode_step.c), the output
 * product, the residual add + post-attention norm, the fused gate/up product, SiLU x up, the
 * down product, and the residual add + the next layer's input norm (the model's final norm
 * after the last layer). What goes is the Python between them: seven calls a layer, each
 * checking its arguments, allocating its output and crossing ctypes while the second thread
 * waits in OpenMP (the threads' waits were ~12% of a generation round's samples).
 *
 * work: one buffer for a step's intermediates, n * ((H + 2 KV) D + H D + C + 3 I) bf16.
 * kc[l], vc[l]: layer l's key and value caches (n, KV, T, D). Returns 0, or -1 when a
 * product refused (no such ISA in this build or process: nothing past that layer is
 * written). */
#include <stddef.h>
#include <stdint.h>

int packed_linear_bf16(int isa, const uint16_t* x, long M, long K, const uint16_t* packed,
                       long N, const uint16_t* bias, uint16_t* y);
void decode_rope_attention_bf16(const uint16_t* qkv, long qkv_row, int H, int KV, int D,
                                const uint16_t* cos, const uint16_t* sin, const int64_t* pos,
                                uint16_t* kc, uint16_t* vc, long T, long slot,
                                const uint8_t* mask, long mask_row, long S, float scale,
                                uint16_t* out, const int64_t* gs, int nc, long P);
void decode_add_rms_bf16(uint16_t* x, const uint16_t* y, const uint16_t* w, float eps,
                         uint16_t* h, int n, int C);
void decode_silu_mul_bf16(const uint16_t* gu, uint16_t* out, int n, int I);

/* One layer: its four products packed by amx_pack_bf16 (q/k/v, o, gate/up, down) with their
 * biases (NULL: none), its two norms' weights (C,) and epsilons. kernels.py mirrors it. */
typedef struct {
    const uint16_t* w[4];
    const uint16_t* b[4];
    const uint16_t* ln1;
    const uint16_t* ln2;
    float eps1, eps2;
} decode_layer_bf16;

int decode_layers_bf16(int isa, const decode_layer_bf16* layers, int L, const uint16_t* norm_w,
                       float norm_eps, int n, int C, int H, int KV, int D, int I, uint16_t* x,
                       uint16_t* h, uint16_t* work, const uint16_t* cos, const uint16_t* sin,
                       const int64_t* pos, uint16_t* const* kc, uint16_t* const* vc, long T,
                       long slot, const uint8_t* mask, long S, float scale, const int64_t* gs,
                       int nc, long P) {
    long QKV = (long)(H + 2 * KV) * D, HD = (long)H * D;
    uint16_t* qkv = work;                 /* n x QKV */
    uint16_t* att = qkv + n * QKV;        /* n x H D */
    uint16_t* y = att + n * HD;           /* n x C */
    uint16_t* gu = y + (long)n * C;       /* n x 2 I */
    uint16_t* act = gu + (long)n * 2 * I; /* n x I */
    decode_add_rms_bf16(x, NULL, layers[0].ln1, layers[0].eps1, h, n, C);
    for (int l = 0; l < L; l++) {
        const decode_layer_bf16* ly = layers + l;
        if (packed_linear_bf16(isa, h, n, C, ly->w[0], QKV, ly->b[0], qkv)) return -1;
        decode_rope_attention_bf16(qkv, QKV, H, KV, D, cos, sin, pos, kc[l], vc[l], T, slot,
                                   mask, S, S, scale, att, gs, nc, P);
        if (packed_linear_bf16(isa, att, n, HD, ly->w[1], C, ly->b[1], y)) return -1;
        decode_add_rms_bf16(x, y, ly->ln2, ly->eps2, h, n, C);
        if (packed_linear_bf16(isa, h, n, C, ly->w[2], 2L * I, ly->b[2], gu)) return -1;
        decode_silu_mul_bf16(gu, act, n, I);
        if (packed_linear_bf16(isa, act, n, I, ly->w[3], C, ly->b[3], y)) return -1;
        int last = l + 1 == L;
        decode_add_rms_bf16(x, y, last ? norm_w : layers[l + 1].ln1,
                            last ? norm_eps : layers[l + 1].eps1, h, n, C);
    }
    return 0;
}
