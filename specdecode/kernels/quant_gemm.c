/* Weight-only int4 and int8 GEMM for CPU decode and verify: y[R, N] = x[R, K] @ W[N, K]^T.
 *
 * Why kernels of our own: PyTorch's CPU int4 and int8 kernels widen every weight to bfloat16 before
 * the dot product, so one core handles ~7-10 GB/s of weights (compute-bound, well below DRAM bandwidth), and
 * it works in blocks of 4 activation rows, so verifying 5-8 tokens costs ~3x one token. Here the
 * activations are quantized to int8 per group (as llama.cpp does for its Q4 x Q8 dot products) and the
 * 4-bit codes meet them in integer dot-product instructions (AVX512-VNNI vpdpbusd, AVX-VNNI's 256-bit
 * vpdpbusd, or AVX2 maddubs+madd): unpacking a weight costs ~1/32 instruction, it is shared by every activation row,
 * and each row adds ~1 instruction per 64 multiply-adds. Decode becomes bandwidth-bound and a verify
 * of up to 10 rows (8 on AVX2) reads the weights once.
 *
 * int4 weight format (packed by specdecode/kernels/__init__.py:pack_int4 and Int4Linear): codes c in
 * 0..15, and per group g = k / gs an 8-bit sub-scale sc and sub-minimum m under 16-bit super-scales
 * d and dm shared by the S groups of a super-block (b = g / S; S = super_groups(K / gs) below):
 *   w[n, k] = c[n, k] * d[n, b] * sc[n, g]  +  dm[n, b] * m[n, g]      (sc uint8, m int8)
 * GGUF's Q4_K is this with S = 8 (6-bit sc and m, dm = -dmin), so its blocks load without rounding.
 * Per 32 weights: 16 bytes of codes, 2 of sub-scales, 0.5 of super-scales: 4.625 bits per weight
 * (a half scale and zero per group: 5.0).
 * Outputs come in tiles of 16 rows (n = 16 t + l). Within tile t and group g the 16 x gs codes fill
 * gs / 8 chunks of 64 bytes; byte 4 l + b of chunk j holds
 *   low nibble:  c[16 t + l, g gs + 8 j + b]      high nibble: c[16 t + l, g gs + 8 j + 4 + b]
 * so one 64-byte load gives, per nibble half, 4 consecutive codes of each of the 16 rows: exactly
 * the operand of one vpdpbusd against 4 activation bytes broadcast to all lanes.
 *   packed: uint8 [N/16, K/gs, gs/8, 64]
 *   sub:    uint8 [N/16, K/gs, 2, 16]   (sc of the 16 lanes, then m as int8)
 *   sup:    uint16 (half bits) [N/16, K/(gs S), 2, 16]   (d, then dm)
 *
 * Activations: per row r and group g, sx = max|x| / 127, xq = rint(x / sx) in [-127, 127], and
 * xsum = sum of the float x. Then, exactly,
 *   y[r, n] = sum_g  d sc * sx * sum_k c * xq  +  dm m * xsum        (k in group g)
 * where only the activation rounding (|x - sx xq| <= sx / 2) departs from the float product.
 * The quantized activations are stored group-major (quantize_rows): a pass over one group of a tile
 * reads its rows' bytes and scales at constant offsets from one pointer, with no per-row addresses
 * held in registers (with row-major storage a 9-row pass spilled them to the stack).
 *
 * int8 weight format (pack_int8): w[n, k] = q[n, k] * wscale[n], q in -127..127 stored as the
 * unsigned byte u = q + 128 (vpdpbusd multiplies unsigned by signed bytes), in the same 16-row tiles:
 * byte 4 l + b of chunk j (64 bytes) of tile t holds u[16 t + l, 4 j + b].
 *   packed: uint8 [N/16, K/4, 64]      wscale: float32 [N]
 * With the same int8 activations (groups of gs = 32) and xqsum = sum of xq per group:
 *   y[r, n] = wscale[n] * (sum_g sx (sum_k u xq) - 128 sum_g sx xqsum)
 * and the second term does not depend on n: one subtraction per row at the end.
 */
#define _GNU_SOURCE /* syscall(), for AMX's permission request */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stddef.h>

#define TILE 16
#include "share.h"

/* Groups per super-block: the largest divisor of G up to 8 (8 when K % (8 gs) == 0, as in Q4_K);
 * layers/quant/formats.py:super_groups is the same function. */
static inline int super_groups(int G) {
    int S = 8;
    while (G % S) S--;
    return S;
}
/* Software prefetch of the packed weights, in two levels: a thread streams its tiles in order, and
 * each group's lines are requested PF_FAR bytes ahead into L2 (the T2 hint; L2 on Intel, the nearest
 * level on cores that do not distinguish) and again PF_NEAR bytes ahead into L1. Without software
 * prefetch one row's GEMV streams its weights ~15-20 % slower (Zen 4, Intel Xeon); adding the far
 * level to a single L1 level made one row stream ~7 % faster on an Intel Xeon (docs/benchmarks.md,
 * round 21). */
#ifndef PF_FAR
#define PF_FAR 16384
#endif
#ifndef PF_NEAR
#define PF_NEAR 4096
#endif
/* The sub-scales and the super-blocks' scales are two more streams beside the codes (2 x 16 bytes per
 * group, and 64 bytes per super-block of 8 groups, against the codes' 256 per group: an eighth and a
 * thirty-second of their rate), requested at least as far ahead in time as the codes' far level, into L1
 * (they are few). Left to the hardware prefetcher, a pass of one to three rows, bound by the streams,
 * waits on their lines (docs/benchmarks.md, round 42). */
#ifndef PF_SUB
#define PF_SUB (PF_FAR / 8)
#endif
#ifndef PF_SUP
#define PF_SUP (PF_FAR / 16)
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SPECDECODE_ISA "avx512vnni"
/* Activation rows per pass over a tile's weights: 2 registers each (of 32), so that a verify of up
 * to 10 tokens reads the weights once. */
#define MAX_ROWS 10
#define INT8_UNSIGNED_BIAS 1 /* vpdpbusd sees u = q + 128: the kernel subtracts 128 sum(sx xq) */

/* One activation group p[0 .. gs) -> q int8 and its max |x|, float sum and integer sum of q:
 * q = rint(x * (127 / max|x|)) (the current rounding mode: nearest even, as lrintf), 0 for an
 * all-zero group. gs % 16 == 0. */
static inline void quantize_group(const float *p, int gs, int8_t *q, float *amax, float *sum, int32_t *qsum) {
    __m512 vmax = _mm512_setzero_ps(), vsum = _mm512_setzero_ps();
    for (int i = 0; i < gs; i += 16) {
        const __m512 v = _mm512_loadu_ps(p + i);
        vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
        vsum = _mm512_add_ps(vsum, v);
    }
    *amax = _mm512_reduce_max_ps(vmax);
    const __m512 inv = _mm512_set1_ps(*amax > 0.f ? 127.f / *amax : 0.f);
    __m512i vq = _mm512_setzero_si512();
    for (int i = 0; i < gs; i += 16) {
        const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p + i), inv)); /* |.| <= 127 */
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtsepi32_epi8(qi));
        vq = _mm512_add_epi32(vq, qi);
    }
    *sum = _mm512_reduce_add_ps(vsum);
    *qsum = _mm512_reduce_add_epi32(vq);
}

/* Group g's float epilogue, shared by the VNNI and AMX passes so that both give a row the same bits:
 * the lanes' scale d sc and minimum dm m from the sub-scale bytes sg, then per row
 * acc += (dot * sx) * (d sc) + (dm m) * xsum, in this order. */
static inline __attribute__((always_inline)) void group_scales(const uint8_t *sg, __m512 dv, __m512 dmv,
                                                              __m512 *sv, __m512 *mv) {
    *sv = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sg))));
    *mv = _mm512_mul_ps(dmv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sg + TILE)))));
}

static inline __attribute__((always_inline)) void group_row(__m512 *acc, __m512i dot, const float *sx,
                                                            const float *xsum, __m512 sv, __m512 mv) {
    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(*sx));
    *acc = _mm512_fmadd_ps(f, sv, *acc);
    *acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(*xsum), *acc);
}

/* Rows [r0, r0 + RB) of R against tile t: RB and gs are compile-time constants after inlining, so
 * every activation byte and scale is one immediate offset from the group's base pointer. */
static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t *w, const uint8_t *sub, const uint16_t *sup, int K, const int gs, int t, const int8_t *xq,
    const float *sx, const float *xsum, int R, int r0, const int RB, float *y, int N) {
    const int G = K / gs, C = gs / 8, S = super_groups(G);
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[MAX_ROWS];
    for (int i = 0; i < RB; i++) acc[i] = _mm512_setzero_ps();
    __m512 dv = _mm512_setzero_ps(), dmv = _mm512_setzero_ps();
    const uint16_t *sp = sup + (size_t)t * (G / S) * 2 * TILE; /* the tile's first super-block */
    for (int g = 0, left = 0; g < G; g++, left--) {
        const size_t tg = (size_t)t * G + g;
        if (left == 0) { /* a new super-block: its d and dm for the 16 lanes (no division per group) */
            dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sp));
            dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp + TILE)));
            _mm_prefetch((const char *)sp + PF_SUP, _MM_HINT_T0);
            sp += 2 * TILE;
            left = S;
        }
        const uint8_t *wg = w + tg * (size_t)(C * 64);
        const int8_t *xg = xq + ((size_t)g * R + r0) * gs;
        for (int j = 0; j < C; j++) _mm_prefetch((const char *)(wg + PF_FAR + (size_t)j * 64), _MM_HINT_T2);
        for (int j = 0; j < C; j++) _mm_prefetch((const char *)(wg + PF_NEAR + (size_t)j * 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(sub + tg * 2 * TILE + PF_SUB), _MM_HINT_T0);
        __m512i dot[MAX_ROWS];
        for (int i = 0; i < RB; i++) dot[i] = _mm512_setzero_si512();
        for (int j = 0; j < C; j++) {
            const __m512i b = _mm512_loadu_si512((const void *)(wg + (size_t)j * 64));
            const __m512i lo = _mm512_and_si512(b, low);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), low);
            for (int i = 0; i < RB; i++) {
                const int8_t *xp = xg + i * gs + 8 * j;
                dot[i] = _mm512_dpbusd_epi32(dot[i], lo, _mm512_set1_epi32(*(const int32_t *)xp));
                dot[i] = _mm512_dpbusd_epi32(dot[i], hi, _mm512_set1_epi32(*(const int32_t *)(xp + 4)));
            }
        }
        __m512 sv, mv;
        group_scales(sub + tg * 2 * TILE, dv, dmv, &sv, &mv);
        const size_t rg = (size_t)g * R + r0;
        for (int i = 0; i < RB; i++) group_row(&acc[i], dot[i], sx + rg + i, xsum + rg + i, sv, mv);
    }
    for (int i = 0; i < RB; i++) _mm512_storeu_ps(y + (size_t)(r0 + i) * N + (size_t)t * TILE, acc[i]);
}

/* int8: rows [r0, r0 + RB) against tile t; acc holds sum_g sx * dot before the per-row terms. */
static inline __attribute__((always_inline)) void tile_rows_i8(
    const uint8_t *w, const float *ws, int K, int t, const int8_t *xq, const float *sx, const float *corr,
    int R, int r0, const int RB, float *y, int N) {
    const int G = K / 32;
    __m512 acc[MAX_ROWS];
    for (int i = 0; i < RB; i++) acc[i] = _mm512_setzero_ps();
    const uint8_t *wt = w + (size_t)t * TILE * K;
    for (int g = 0; g < G; g++) {
        for (int j = 0; j < 8; j++) _mm_prefetch((const char *)(wt + PF_FAR + ((size_t)g * 8 + j) * 64), _MM_HINT_T2);
        for (int j = 0; j < 8; j++) _mm_prefetch((const char *)(wt + PF_NEAR + ((size_t)g * 8 + j) * 64), _MM_HINT_T0);
        const int8_t *xg = xq + ((size_t)g * R + r0) * 32;
        __m512i dot[MAX_ROWS];
        for (int i = 0; i < RB; i++) dot[i] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            const __m512i b = _mm512_loadu_si512((const void *)(wt + ((size_t)g * 8 + j) * 64));
            for (int i = 0; i < RB; i++) {
                const int32_t v = *(const int32_t *)(xg + i * 32 + 4 * j);
                dot[i] = _mm512_dpbusd_epi32(dot[i], b, _mm512_set1_epi32(v));
            }
        }
        for (int i = 0; i < RB; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), _mm512_set1_ps(sx[(size_t)g * R + r0 + i]), acc[i]);
    }
    const __m512 sv = _mm512_loadu_ps(ws + (size_t)t * TILE);
    for (int i = 0; i < RB; i++)
        _mm512_storeu_ps(y + (size_t)(r0 + i) * N + (size_t)t * TILE,
                         _mm512_mul_ps(_mm512_sub_ps(acc[i], _mm512_set1_ps(corr[r0 + i])), sv));
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#ifdef __AVXVNNI__
#define SPECDECODE_ISA "avx2+avxvnni" /* the int4 dots from 256-bit vpdpbusd (group_dots) */
#else
#define SPECDECODE_ISA "avx2"
#endif
#define MAX_ROWS 8 /* activation rows per pass (AVX2 has 16 registers: more rows spill) */
#define INT8_UNSIGNED_BIAS 0 /* the AVX2 body multiplies q itself */

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float hsum8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

/* As the AVX512 quantize_group above (same rounding, same results but for the order of the float
 * sum). gs % 8 == 0. */
static inline void quantize_group(const float *p, int gs, int8_t *q, float *amax, float *sum, int32_t *qsum) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 vmax = _mm256_setzero_ps(), vsum = _mm256_setzero_ps();
    for (int i = 0; i < gs; i += 8) {
        const __m256 v = _mm256_loadu_ps(p + i);
        vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, v));
        vsum = _mm256_add_ps(vsum, v);
    }
    *amax = hmax8(vmax);
    const __m256 inv = _mm256_set1_ps(*amax > 0.f ? 127.f / *amax : 0.f);
    __m256i vq = _mm256_setzero_si256();
    for (int i = 0; i < gs; i += 8) {
        const __m256i qi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p + i), inv)); /* |.| <= 127 */
        const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
        _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(w16, w16));
        vq = _mm256_add_epi32(vq, qi);
    }
    *sum = hsum8(vsum);
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(vq), _mm256_extracti128_si256(vq, 1));
    const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    *qsum = _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xB1)));
}

/* Group g's int32 dot products, for activation rows i < RB and the tile's output lanes 8 (h0 + hh) ..
 * 8 (h0 + hh) + 7 (hh < NH), into dot[i][hh]. Without AVX-VNNI there is no vpdpbusd: maddubs multiplies the codes by 2
 * activation bytes and adds the pairs in int16, and up to 8 such products are summed in int16 before
 * one widening madd (exact: |pair| <= 2 * 15 * 127 and 8 * 3810 < 32767), which nearly halves the multiply
 * port's work against widening each one. */
static inline __attribute__((always_inline)) void group_dots(const uint8_t *wg, const int8_t *xg, const int gs,
                                                            const int RB, int h0, const int NH, __m256i dot[][2]) {
    const int C = gs / 8;
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < RB; i++)
        for (int hh = 0; hh < NH; hh++) dot[i][hh] = _mm256_setzero_si256();
#ifdef __AVXVNNI__
    /* AVX-VNNI (Intel client cores since Alder Lake, Zen 5): the 256-bit vpdpbusd does the
     * multiply, the pair sums and the widening add in one instruction, with the same integer
     * results (it does not saturate). */
    for (int j = 0; j < C; j++)
        for (int hh = 0; hh < NH; hh++) {
            const __m256i b = _mm256_loadu_si256((const __m256i *)(wg + (size_t)j * 64 + 32 * (h0 + hh)));
            const __m256i lo = _mm256_and_si256(b, low), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
            for (int i = 0; i < RB; i++) {
                const int8_t *xp = xg + i * gs + 8 * j;
                dot[i][hh] = _mm256_dpbusd_avx_epi32(dot[i][hh], lo, _mm256_set1_epi32(*(const int32_t *)xp));
                dot[i][hh] = _mm256_dpbusd_avx_epi32(dot[i][hh], hi, _mm256_set1_epi32(*(const int32_t *)(xp + 4)));
            }
        }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    for (int j0 = 0; j0 < C; j0 += 4) {
        __m256i p16[MAX_ROWS][2];
        for (int i = 0; i < RB; i++)
            for (int hh = 0; hh < NH; hh++) p16[i][hh] = _mm256_setzero_si256();
        for (int j = j0; j < j0 + 4 && j < C; j++) {
            for (int hh = 0; hh < NH; hh++) {
                const __m256i b = _mm256_loadu_si256((const __m256i *)(wg + (size_t)j * 64 + 32 * (h0 + hh)));
                const __m256i lo = _mm256_and_si256(b, low);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
                for (int i = 0; i < RB; i++) {
                    const int8_t *xp = xg + i * gs + 8 * j;
                    p16[i][hh] = _mm256_add_epi16(p16[i][hh], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(*(const int32_t *)xp)));
                    p16[i][hh] = _mm256_add_epi16(p16[i][hh], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(*(const int32_t *)(xp + 4))));
                }
            }
        }
        for (int i = 0; i < RB; i++)
            for (int hh = 0; hh < NH; hh++) dot[i][hh] = _mm256_add_epi32(dot[i][hh], _mm256_madd_epi16(p16[i][hh], ones));
    }
#endif
}

/* Rows [r0, r0 + RB) against tile t. Up to 3 rows take both 8-lane halves of the tile in one pass
 * (more independent dependency chains per loaded weight); more rows take one half per pass, so that
 * up to 8 rows' accumulators and partial sums stay in the 16 registers (both halves at once spill
 * from 4 rows on). The second half's weights are then read again from L1/L2 (a tile is 8 x K bytes). */
static inline __attribute__((always_inline)) void tile_rows(
    const uint8_t *w, const uint8_t *sub, const uint16_t *sup, int K, const int gs, int t, const int8_t *xq,
    const float *sx, const float *xsum, int R, int r0, const int RB, float *y, int N) {
    const int G = K / gs, C = gs / 8, NH = RB <= 3 ? 2 : 1, S = super_groups(G);
    for (int h0 = 0; h0 < 2; h0 += NH) {
        __m256 acc[MAX_ROWS][2];
        for (int i = 0; i < RB; i++)
            for (int hh = 0; hh < NH; hh++) acc[i][hh] = _mm256_setzero_ps();
        const uint16_t *next = sup + (size_t)t * (G / S) * 2 * TILE, *sp = next; /* the tile's first super-block */
        for (int g = 0, left = 0; g < G; g++, left--) {
            const size_t tg = (size_t)t * G + g;
            if (left == 0) { /* this super-block's d, dm (no division per group) */
                sp = next;
                if (h0 == 0) _mm_prefetch((const char *)sp + PF_SUP, _MM_HINT_T0);
                next += 2 * TILE;
                left = S;
            }
            const uint8_t *wg = w + tg * (size_t)(C * 64);
            if (h0 == 0) { /* a second pass over the tile finds its lines in cache */
                for (int j = 0; j < C; j++) _mm_prefetch((const char *)(wg + PF_FAR + (size_t)j * 64), _MM_HINT_T2);
                for (int j = 0; j < C; j++) _mm_prefetch((const char *)(wg + PF_NEAR + (size_t)j * 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(sub + tg * 2 * TILE + PF_SUB), _MM_HINT_T0);
            }
            __m256i dot[MAX_ROWS][2];
            group_dots(wg, xq + ((size_t)g * R + r0) * gs, gs, RB, h0, NH, dot);
            for (int hh = 0; hh < NH; hh++) {
                const int l0 = 8 * (h0 + hh); /* first lane of this half */
                const uint8_t *sg = sub + tg * 2 * TILE + l0;
                const __m256 sv = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + l0))),
                                                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sg))));
                const __m256 mv = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + TILE + l0))),
                                                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sg + TILE)))));
                for (int i = 0; i < RB; i++) {
                    const size_t rg = (size_t)g * R + r0 + i;
                    const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[i][hh]), _mm256_set1_ps(sx[rg]));
                    acc[i][hh] = _mm256_fmadd_ps(f, sv, acc[i][hh]);
                    acc[i][hh] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xsum[rg]), acc[i][hh]);
                }
            }
        }
        for (int i = 0; i < RB; i++)
            for (int hh = 0; hh < NH; hh++)
                _mm256_storeu_ps(y + (size_t)(r0 + i) * N + (size_t)t * TILE + 8 * (h0 + hh), acc[i][hh]);
    }
}

/* int8, AVX2: as the AVX512 body, 8 lanes at a time. */
static inline __attribute__((always_inline)) void tile_rows_i8(
    const uint8_t *w, const float *ws, int K, int t, const int8_t *xq, const float *sx, const float *corr,
    int R, int r0, const int RB, float *y, int N) {
    const int G = K / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MAX_ROWS][2];
    for (int i = 0; i < RB; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const uint8_t *wt = w + (size_t)t * TILE * K;
    for (int g = 0; g < G; g++) {
        for (int j = 0; j < 8; j++) _mm_prefetch((const char *)(wt + PF_FAR + ((size_t)g * 8 + j) * 64), _MM_HINT_T2);
        for (int j = 0; j < 8; j++) _mm_prefetch((const char *)(wt + PF_NEAR + ((size_t)g * 8 + j) * 64), _MM_HINT_T0);
        const int8_t *xg = xq + ((size_t)g * R + r0) * 32;
        __m256i dot[MAX_ROWS][2];
        for (int i = 0; i < RB; i++) dot[i][0] = dot[i][1] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            for (int h = 0; h < 2; h++) {
                const __m256i b = _mm256_loadu_si256((const __m256i *)(wt + ((size_t)g * 8 + j) * 64 + 32 * h));
                const __m256i q = _mm256_xor_si256(b, _mm256_set1_epi8((char)0x80)); /* u - 128 */
                const __m256i aq = _mm256_abs_epi8(q);
                for (int i = 0; i < RB; i++) {
                    const int32_t v = *(const int32_t *)(xg + i * 32 + 4 * j);
                    /* u up to 255 would saturate maddubs pairs (2 * 255 * 127 > 32767), so
                     * multiply |q| by x carrying q's sign: pairs <= 2 * 127 * 127 (llama.cpp's trick). */
                    const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(v), q);
                    dot[i][h] = _mm256_add_epi32(dot[i][h], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, xs), ones));
                }
            }
        }
        for (int i = 0; i < RB; i++)
            for (int h = 0; h < 2; h++)
                acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][h]), _mm256_set1_ps(sx[(size_t)g * R + r0 + i]),
                                            acc[i][h]);
    }
    for (int i = 0; i < RB; i++)
        for (int h = 0; h < 2; h++) {
            const __m256 sv = _mm256_loadu_ps(ws + (size_t)t * TILE + 8 * h);
            _mm256_storeu_ps(y + (size_t)(r0 + i) * N + (size_t)t * TILE + 8 * h,
                             _mm256_mul_ps(_mm256_sub_ps(acc[i][h], _mm256_set1_ps(corr[r0 + i])), sv));
        }
}

#else
#error "quant_gemm.c needs AVX512-VNNI or AVX2+FMA+F16C (the loader falls back to PyTorch's kernel)"
#endif

#if defined(__AVX512VNNI__) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && !defined(SPECDECODE_NO_AMX)
/* AMX (Sapphire Rapids and later Xeons) for passes of 12 or more rows: prefill, long verifies, wide
 * batches. Beyond ~8 rows the VNNI body is bound by its vector ports: per row and group, 8 vpdpbusd
 * and 4 float operations. One TDPBSUD computes a group's dots for up to 16 rows x 16 lanes (the 128
 * vpdpbusd of those rows) on the tile unit, leaving the vector ports the float epilogue alone. Each
 * group has its own scales, so the dots leave the tile after every group (K = 32 per multiply), and
 * the epilogue is the VNNI body's, operation for operation: the same integers meet the same float
 * operations in the same order, so every output has the same bits as the VNNI body gives it
 * (tests/test_int4_kernel.py). Groups of 32 only (every Q4_K tensor); other sizes use VNNI. */
#define SPECDECODE_AMX 1
#define AMX_ROWS 16
/* Fewer rows per pass than this stay on VNNI: below ~11 rows each group's fixed tile traffic (codes
 * in, dots out) costs more than the vpdpbusd it saves (measured cache-hot, one thread). */
#define AMX_MIN_ROWS 12
/* The tiles' height for a call of R rows: its passes of that many rows run on AMX, the rest on VNNI. */
static inline int amx_height(int R) { return R < AMX_ROWS ? R : AMX_ROWS; }
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Linux grants a process the tile state only on request; without it the first tile instruction
 * faults. Asked once; a kernel that refuses leaves every pass on VNNI. Benign race: concurrent
 * first callers make the same request and store the same answer. */
static int amx_granted(void) {
    static volatile int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return state;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Per thread (tile configuration is thread state). tmm0-2: dots of three groups, M rows x 16 int32
 * lanes each; tmm3: M activation rows x one group of 32 int8; tmm4: the group's codes, 8 rows (4
 * inputs each) x 16 lanes x 4 bytes, AMX's B layout. */
static void amx_begin(int M) {
    amx_config c = {0};
    c.palette = 1;
    for (int i = 0; i < 3; i++) c.rows[i] = M, c.colsb[i] = 64;
    c.rows[3] = M, c.colsb[3] = 32;
    c.rows[4] = 8, c.colsb[4] = 64;
    _tile_loadconfig(&c);
}

/* Tile t's codes one byte each, as consecutive B tiles: chunk j (64 bytes) of the packed layout gives
 * B row 2 j (its low nibbles: inputs 8 j .. 8 j + 3 of each lane) and 2 j + 1 (the high ones). So
 * group g's B tile is the 512 bytes at b + 512 g. b: K * 16 bytes. */
static void amx_unpack(const uint8_t *w, int K, int t, uint8_t *b) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const size_t bytes = (size_t)K * TILE / 2;
    const uint8_t *wt = w + (size_t)t * bytes;
    for (size_t off = 0; off < bytes; off += 64) {
        const __m512i v = _mm512_loadu_si512((const void *)(wt + off));
        _mm512_store_si512((void *)(b + 2 * off), _mm512_and_si512(v, low));
        _mm512_store_si512((void *)(b + 2 * off + 64), _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
    }
}

/* The VNNI body's epilogue for group g of rows [r0, r0 + M): dots [M rows][16 lanes] int32. */
static inline __attribute__((always_inline)) void amx_epilogue(
    __m512 *acc, const int32_t *dots, const uint8_t *sub, const uint16_t *sup, int G, int S, int t, int g,
    const float *sx, const float *xsum, int R, int r0, const int M) {
    const uint16_t *sp = sup + ((size_t)t * (G / S) + g / S) * 2 * TILE;
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sp));
    const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp + TILE)));
    __m512 sv, mv;
    group_scales(sub + ((size_t)t * G + g) * 2 * TILE, dv, dmv, &sv, &mv);
    const size_t rg = (size_t)g * R + r0;
    for (int i = 0; i < M; i++)
        group_row(&acc[i], _mm512_load_si512((const void *)(dots + i * TILE)), sx + rg + i, xsum + rg + i, sv, mv);
}

/* Group g's dots into tile C (tile numbers are immediates). tmm3, tmm4: the activations and codes. */
#define AMX_ISSUE(C, g)                                                        \
    do {                                                                       \
        _tile_zero(C);                                                         \
        _tile_loadd(3, xq + ((size_t)(g) * R + r0) * 32, 32);                  \
        _tile_loadd(4, b + (size_t)(g) * 512, 64);                             \
        _tile_dpbsud(C, 3, 4);                                                 \
    } while (0)
#define AMX_EPI(g, d)                                                                        \
    do {                                                                                     \
        if (next)                                                                            \
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(next + (size_t)(g) * 256 + 64 * l), _MM_HINT_T2); \
        amx_epilogue(acc, d, sub, sup, G, S, t, g, sx, xsum, R, r0, M);                      \
    } while (0)

/* Rows [r0, r0 + 16) against tile t, whose codes amx_unpack left in b (gs = 32). Software-pipelined
 * three deep, group g in dot tile g % 3 and buffer g % 3: while the vector units scale group g, group
 * g + 1's dots travel from their tile to memory and the tile unit computes group g + 2's. next: the
 * packed codes of the tile this thread unpacks next (NULL: none), requested into L2 a group at a time
 * (256 bytes) while this one computes: amx_unpack reads a whole tile before any of its groups
 * computes, so without this the pass alternates between waiting for memory and leaving it idle. */
static inline __attribute__((always_inline)) void amx_tile_rows(
    const uint8_t *b, const uint8_t *sub, const uint16_t *sup, int K, int t, const int8_t *xq, const float *sx,
    const float *xsum, int R, int r0, float *y, int N, const uint8_t *next, const int M) {
    const int G = K / 32, S = super_groups(G);
    __attribute__((aligned(64))) int32_t dots[3][AMX_ROWS * TILE];
    __m512 acc[AMX_ROWS];
    for (int i = 0; i < M; i++) acc[i] = _mm512_setzero_ps();
    AMX_ISSUE(0, 0);
    if (G > 1) AMX_ISSUE(1, 1);
    _tile_stored(0, dots[0], 64);
    for (int g = 0; g < G; g += 3) { /* here: group g is in dots[0], group g + 1 issued to tile 1 */
        if (g + 2 < G) AMX_ISSUE(2, g + 2);
        if (g + 1 < G) _tile_stored(1, dots[1], 64);
        AMX_EPI(g, dots[0]);
        if (g + 1 >= G) break;
        if (g + 3 < G) AMX_ISSUE(0, g + 3);
        if (g + 2 < G) _tile_stored(2, dots[2], 64);
        AMX_EPI(g + 1, dots[1]);
        if (g + 2 >= G) break;
        if (g + 4 < G) AMX_ISSUE(1, g + 4);
        if (g + 3 < G) _tile_stored(0, dots[0], 64);
        AMX_EPI(g + 2, dots[2]);
    }
    for (int i = 0; i < M; i++) _mm512_storeu_ps(y + (size_t)(r0 + i) * N + (size_t)t * TILE, acc[i]);
}

/* A pass of M rows, AMX_MIN_ROWS <= M <= AMX_ROWS (the tiles' configured height), M a constant in
 * each body. */
static void amx_rows(const uint8_t *b, const uint8_t *sub, const uint16_t *sup, int K, int t, const int8_t *xq,
                     const float *sx, const float *xsum, int R, int r0, float *y, int N, const uint8_t *next, int M) {
    switch (M) {
#define AMX_CASE(m) case m: amx_tile_rows(b, sub, sup, K, t, xq, sx, xsum, R, r0, y, N, next, m); break;
    AMX_CASE(12) AMX_CASE(13) AMX_CASE(14) AMX_CASE(15) AMX_CASE(16) /* AMX_MIN_ROWS .. AMX_ROWS */
#undef AMX_CASE
    default: break;
    }
}

/* A thread's unpacked-codes buffer, kept for its next call: pool threads live as long as the pool
 * (release_threads ends them, a few times per process; their buffers are not reclaimed). */
static uint8_t *amx_buffer(size_t bytes) {
    static _Thread_local uint8_t *buf;
    static _Thread_local size_t size;
    if (bytes > size) {
        free(buf);
        buf = aligned_alloc(64, bytes);
        size = buf ? bytes : 0;
    }
    return buf;
}
#endif

/* x [R, K] float -> the activations in group-major order, so that a pass over one group of a tile
 * finds its rows' bytes and scales at fixed offsets from one base: xq int8 [K / gs, R, gs], sx / xsum
 * float [K / gs, R] (sx = max|x| / 127, xsum = the float sum of x); xqsum (may be NULL): the integer
 * sums of xq per group, as float, [K / gs, R]. Called inside a parallel region: the team shares the
 * groups (each is independent) and meets at the loop's barrier, so the tiles start on complete
 * activations. */
static void quantize_rows(const float *x, int R, int K, int gs, int8_t *xq, float *sx, float *xsum, float *xqsum) {
    const int G = K / gs;
#pragma omp for schedule(static)
    for (int gr = 0; gr < G * R; gr++) {
        const int g = gr / R, r = gr % R;
        float amax;
        int32_t qsum;
        quantize_group(x + (size_t)r * K + (size_t)g * gs, gs, xq + (size_t)gr * gs, &amax, &xsum[gr], &qsum);
        sx[gr] = amax / 127.f;
        if (xqsum) xqsum[gr] = (float)qsum;
    }
}

/* The VNNI / AVX2 passes of tile t for rows [r0, r1) of R: gs a constant where the caller passes one. */
static inline __attribute__((always_inline)) void tile_passes(
    const uint8_t *w, const uint8_t *s, const uint16_t *z, int K, const int gs, int t, const int8_t *xq,
    const float *sx, const float *xsum, int R, int r0, int r1, float *y, int N) {
    for (; r0 + MAX_ROWS <= r1; r0 += MAX_ROWS)
        tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, MAX_ROWS, y, N);
    switch (r1 - r0) { /* one specialised body per remainder, so the row loops unroll */
    case 1: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 1, y, N); break;
    case 2: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 2, y, N); break;
    case 3: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 3, y, N); break;
    case 4: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 4, y, N); break;
    case 5: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 5, y, N); break;
    case 6: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 6, y, N); break;
    case 7: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 7, y, N); break;
#if MAX_ROWS > 8
    case 8: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 8, y, N); break;
    case 9: tile_rows(w, s, z, K, gs, t, xq, sx, xsum, R, r0, 9, y, N); break;
#endif
    default: break;
    }
}

/* Rows [r0, r1) of R against tile t. amx: a buffer of K * 16 bytes where AMX takes this call's passes of
 * amx_height(R) rows (the tiles' height, set by amx_begin), else NULL; the rows left over run on VNNI. */
static void tile(const uint8_t *w, const uint8_t *s, const uint16_t *z, int K, int gs, int t,
                 const int8_t *xq, const float *sx, const float *xsum, int R, int r0, int r1, float *y, int N,
                 uint8_t *amx) {
#ifdef SPECDECODE_AMX
    if (amx) {
        amx_unpack(w, K, t, amx);
        const int M = amx_height(R);
        const uint8_t *next = (t + 1) * TILE < N ? w + (size_t)(t + 1) * K * TILE / 2 : NULL;
        for (; r0 + M <= r1; r0 += M, next = NULL) amx_rows(amx, s, z, K, t, xq, sx, xsum, R, r0, y, N, next, M);
    }
#else
    (void)amx;
#endif
    if (gs == 32) /* every Q4_K tensor: the chunk loops unroll and the row offsets become immediates */
        tile_passes(w, s, z, K, 32, t, xq, sx, xsum, R, r0, r1, y, N);
    else
        tile_passes(w, s, z, K, gs, t, xq, sx, xsum, R, r0, r1, y, N);
}

static void tile_i8(const uint8_t *w, const float *ws, int K, int t, const int8_t *xq, const float *sx,
                    const float *corr, int R, float *y, int N) {
    int r0 = 0;
    for (; r0 + MAX_ROWS <= R; r0 += MAX_ROWS) tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, MAX_ROWS, y, N);
    switch (R - r0) {
    case 1: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 1, y, N); break;
    case 2: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 2, y, N); break;
    case 3: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 3, y, N); break;
    case 4: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 4, y, N); break;
    case 5: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 5, y, N); break;
    case 6: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 6, y, N); break;
    case 7: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 7, y, N); break;
#if MAX_ROWS > 8
    case 8: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 8, y, N); break;
    case 9: tile_rows_i8(w, ws, K, t, xq, sx, corr, R, r0, 9, y, N); break;
#endif
    default: break;
    }
}

/* Rows per block of a many-row call (a prompt chunk), in whole passes of MAX_ROWS. Every tile reads all
 * of its block's int8 activations (rows x K bytes): a 512-token chunk of the 8960-wide down projection
 * is 4.6 MB, fetched from L3 again for every 16 outputs. Blocks of <= 256 KiB stay in any of our cores'
 * L2 (Zen 3: 512 KiB) next to the tile's weights; the weights are then read once per block, which a
 * compute-bound chunk hides. Decode and verify calls (R <= MAX_ROWS) are one block. */
#ifndef ROW_BLOCK_BYTES
#define ROW_BLOCK_BYTES (256 << 10)
#endif
static inline int row_block(int K) {
    const int rows = ROW_BLOCK_BYTES / K / MAX_ROWS * MAX_ROWS;
    return rows > MAX_ROWS ? rows : MAX_ROWS;
}

#ifdef SPECDECODE_AMX
const char *specdecode_isa(void) { return amx_granted() ? SPECDECODE_ISA "+amx" : SPECDECODE_ISA; }
#else
const char *specdecode_isa(void) { return SPECDECODE_ISA; }
#endif

/* y [R, N] = x [R, K] @ W^T. scratch: R * K bytes + 2 * R * (K / gs) floats, caller-owned.
 * Preconditions (checked by the caller): N % 16 == 0, K % gs == 0, gs % 8 == 0, R >= 1. */
void specdecode_int4_gemm(const float *x, int R, int K, int N, int gs, const uint8_t *w, const uint8_t *sub,
                          const uint16_t *sup, float *y, int8_t *xq, float *sx, float *xsum, int threads) {
    const int T = N / TILE;
#ifdef SPECDECODE_AMX
    const int amx = R >= AMX_MIN_ROWS && gs == 32 && amx_granted();
    const int RB = amx ? R : row_block(K); /* AMX widens each tile once per call: one block */
#else
    const int RB = row_block(K);
#endif
    /* Each thread streams its contiguous range of tiles (prefetch-friendly) and then helps the others
     * (share.h); every row block has its own ranges. */
    const int nb = (R + RB - 1) / RB, chunk = share_chunk((size_t)K * TILE / 2);
    tile_range *ranges = tile_ranges((size_t)nb * threads);
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num(), team = omp_get_num_threads();
        if (ranges) {
#pragma omp single nowait
            for (int b = 0; b < nb; b++) ranges_init(ranges + (size_t)b * team, team, T);
        }
        quantize_rows(x, R, K, gs, xq, sx, xsum, NULL); /* ends at a barrier: the ranges are set */
        uint8_t *buf = NULL;
#ifdef SPECDECODE_AMX
        if (amx && (buf = amx_buffer((size_t)K * TILE)) != NULL) amx_begin(amx_height(R));
#endif
        for (int b = 0, r0 = 0; r0 < R; b++, r0 += RB) { /* no barrier between blocks: their outputs are disjoint */
            const int r1 = R - r0 < RB ? R : r0 + RB;
            if (ranges) {
                for (int t0, n; (n = tiles_next(ranges + (size_t)b * team, me, team, chunk, &t0)) > 0;)
                    for (int t = t0; t < t0 + n; t++) tile(w, sub, sup, K, gs, t, xq, sx, xsum, R, r0, r1, y, N, buf);
            } else {
#pragma omp for schedule(static) nowait
                for (int t = 0; t < T; t++) tile(w, sub, sup, K, gs, t, xq, sx, xsum, R, r0, r1, y, N, buf);
            }
        }
#ifdef SPECDECODE_AMX
        if (buf) _tile_release();
#endif
    }
}

/* y [R, N] = x [R, K] @ (wscale * q)^T. scratch: R * K bytes + 3 * R * (K / 32) floats (+ R floats),
 * caller-owned. Preconditions (checked by the caller): N % 16 == 0, K % 32 == 0, R >= 1. */
void specdecode_int8_gemm(const float *x, int R, int K, int N, const uint8_t *w, const float *ws, float *y,
                          int8_t *xq, float *sx, float *xsum, float *xqsum, float *corr, int threads) {
    const int G = K / 32, T = N / TILE, chunk = share_chunk((size_t)K * TILE);
    tile_range *ranges = tile_ranges((size_t)threads);
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num(), team = omp_get_num_threads();
        if (ranges) {
#pragma omp single nowait
            ranges_init(ranges, team, T);
        }
        quantize_rows(x, R, K, 32, xq, sx, xsum, xqsum);
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) { /* 128 sum_g sx xqsum: the +128 bias of the unsigned weights */
            float c = 0.f;
            for (int g = 0; g < G; g++) c += sx[(size_t)g * R + r] * xqsum[(size_t)g * R + r];
            corr[r] = INT8_UNSIGNED_BIAS ? 128.f * c : 0.f;
        }
        if (ranges) {
            for (int t0, n; (n = tiles_next(ranges, me, team, chunk, &t0)) > 0;)
                for (int t = t0; t < t0 + n; t++) tile_i8(w, ws, K, t, xq, sx, corr, R, y, N);
        } else {
#pragma omp for schedule(static) nowait
            for (int t = 0; t < T; t++) tile_i8(w, ws, K, t, xq, sx, corr, R, y, N);
        }
    }
}
