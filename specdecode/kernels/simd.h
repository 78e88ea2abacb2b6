/* 8-lane float vectors shared by attention.c and norm.c: 256-bit in both the AVX512 and the AVX2
 * body, so the two give the same bits. */
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

#endif
