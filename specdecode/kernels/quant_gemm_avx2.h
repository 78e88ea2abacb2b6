/* quant_gemm.c's AVX2 body (with AVX-VNNI's 256-bit vpdpbusd where the CPU has it, maddubs + madd where
 * not): quantize_group, the int4 pass of up to MAX_ROWS = 8 activation rows over one 16-lane tile in two
 * 8-lane halves (tile_rows, group_dots) and the int8 pass (tile_rows_i8), with the arithmetic of
 * quant_gemm.c's header (the AVX512 body's, but for the order of quantize_group's float sums); the two
 * kinds of dot product give the same bits.
 * Included by quant_gemm.c after TILE, the prefetch distances (PF_*) and super_groups, which it uses. */
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

/* As the AVX512 body's quantize_group (quant_gemm_avx512.h: same rounding, same results but for the order
 * of the float sum). gs % 8 == 0. */
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
