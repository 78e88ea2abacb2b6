/* 8-lane float vectors shared by attention.c, norm.c and layer.c: 256-bit in both the AVX512 and the AVX2
 * body, so the two give the same bits. Elementwise loops may take 16 lanes at a time on the AVX512 body
 * (exp16: exp8's instructions on 16 lanes), and attention_pairs.h runs two 8-lane chains side by side in
 * one 512-bit register: both keep every element's bits. */
#ifndef SPECDECODE_SIMD_H
#define SPECDECODE_SIMD_H
#include <immintrin.h>

typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const void *p, int bf16) {
    if (bf16) /* bfloat16 -> float32 is a 16-bit shift: exact */
        return (v8f)_mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    return (v8f)_mm256_loadu_ps((const float *)p);
}

static inline v8f fma8(v8f a, v8f b, v8f c) { return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }

static inline float hsum8(v8f v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* Cephes' expf: n = floor(x log2(e) + 1/2), r = x - n ln2 (ln2 in two parts), the polynomial EXP_POLY in r,
 * then 2^n; exp8 and exp16 share these constants, so their lanes agree bit for bit. */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_UNDER -87.f /* below it exp is 0 */
static const float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                                  1.6666665459e-1f, 5.0000001201e-1f};

/* exp(x) per lane for x <= 0 (Cephes' expf polynomial, ~1 ulp); 0 below -87. Every lane goes
 * through the same instructions, so a key's weight does not depend on its neighbours. */
static inline v8f exp8(v8f v) {
    const __m256 x = (__m256)v;
    const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(EXP_LN2_HI)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(EXP_LN2_LO)));
    __m256 p = _mm256_set1_ps(EXP_POLY[0]);
    for (int i = 1; i < 6; i++) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_POLY[i]));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.f));
    const __m256 e = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_max_ps(n, _mm256_set1_ps(-127.f))), _mm256_set1_epi32(127)), 23));
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_UNDER), _CMP_LT_OQ);
    return (v8f)_mm256_andnot_ps(under, _mm256_mul_ps(p, e));
}

/* hsum8 of eight vectors at once: lane i of the result is hsum8(a[i]), bit for bit. The same
 * additions in the same order (low half + high half, then lanes 0 + 2 and 1 + 3, then those two),
 * done on four or two vectors' worth of lanes per instruction instead of one. */
static inline v8f hsum8x8(const v8f a[8]) {
    __m256 p[4];
    for (int i = 0; i < 4; i++) /* [s(a_i), s(a_i+4)]: s = low half + high half */
        p[i] = _mm256_add_ps(_mm256_permute2f128_ps((__m256)a[i], (__m256)a[i + 4], 0x20),
                             _mm256_permute2f128_ps((__m256)a[i], (__m256)a[i + 4], 0x31));
    __m256 u = _mm256_add_ps(_mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 w = _mm256_add_ps(_mm256_shuffle_ps(p[2], p[3], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(p[2], p[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return (v8f)_mm256_add_ps(_mm256_shuffle_ps(u, w, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm256_shuffle_ps(u, w, _MM_SHUFFLE(3, 1, 3, 1)));
}

#ifdef __AVX512F__
/* exp8's instructions on 16 lanes (AVX512 body): every lane gets exp8's bits, so a loop may take its
 * elements 16 at a time and its tail 8 at a time. */
static inline __m512 exp16(__m512 x) {
    const __m512 t = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)), _mm512_set1_ps(0.5f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(EXP_LN2_HI)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(EXP_LN2_LO)));
    __m512 p = _mm512_set1_ps(EXP_POLY[0]);
    for (int i = 1; i < 6; i++) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(EXP_POLY[i]));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.f));
    const __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_max_ps(n, _mm512_set1_ps(-127.f))), _mm512_set1_epi32(127)), 23));
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_UNDER), _CMP_LT_OQ);
    return _mm512_maskz_mul_ps((__mmask16)~under, p, e); /* +0 where under, as exp8's andnot */
}
#endif

#endif
