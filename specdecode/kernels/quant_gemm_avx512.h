/* quant_gemm.c's AVX512-VNNI body: the activations' int8 quantization (quantize_group), the int4 pass
 * of up to MAX_ROWS = 10 activation rows over one 16-lane tile (tile_rows: 512-bit vpdpbusd, then the
 * per-group float epilogue group_scales / group_row that the AMX pass shares) and the int8 pass
 * (tile_rows_i8). Every body defines SPECDECODE_ISA, MAX_ROWS, INT8_UNSIGNED_BIAS and these three
 * functions, with the arithmetic of quant_gemm.c's header.
 * Included by quant_gemm.c after TILE, the prefetch distances (PF_*) and super_groups, which it uses. */
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
