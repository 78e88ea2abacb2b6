/* Row-wise argmax of float32 logits, for greedy decoding and greedy verification.
 *
 * Why native: PyTorch's CPU argmax compares one element at a time on one thread, so over a vocabulary
 * of ~150k it costs a verify a few percent of its forward per row. Here a row is two vector passes
 * (its maximum, then the first lane equal to it) and the rows are shared by the threads.
 *
 * The result is torch.argmax's: the first index of the maximum; where a row holds NaN, the first
 * NaN (argmax treats NaN as the largest value). 256-bit vectors: the same code in the AVX512 and the
 * AVX2 body. */
#include <immintrin.h>
#include <stdint.h>
#include <stddef.h>

static int64_t first_nan(const float *x, int V) {
    for (int i = 0; i < V; i++)
        if (x[i] != x[i]) return i;
    return 0;
}

static int64_t argmax_row(const float *x, int V) {
    /* pass 1: the maximum, four independent chains; max_ps(x, m) returns m where x is NaN, so NaN
     * is only noted here (unordered compare) and handled apart */
    __m256 m0 = _mm256_set1_ps(-__builtin_inff()), m1 = m0, m2 = m0, m3 = m0;
    __m256 bad = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= V; i += 32) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        const __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
        m0 = _mm256_max_ps(a, m0), m1 = _mm256_max_ps(b, m1), m2 = _mm256_max_ps(c, m2), m3 = _mm256_max_ps(d, m3);
        bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q)));
    }
    __m256 mv = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    if (_mm256_movemask_ps(bad)) return first_nan(x, V);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float m = _mm_cvtss_f32(h);
    for (int j = i; j < V; j++) {
        if (x[j] != x[j]) return first_nan(x, V);
        if (x[j] > m) m = x[j];
    }
    /* pass 2: the first index holding it */
    const __m256 mb = _mm256_set1_ps(m);
    int j = 0;
    for (; j + 8 <= V; j += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), mb, _CMP_EQ_OQ));
        if (hit) return j + __builtin_ctz((unsigned)hit);
    }
    for (; j < V; j++)
        if (x[j] == m) return j;
    return 0;
}

/* out[r] = argmax of row r of x [R, V] (rows ld floats apart). */
void specdecode_argmax_rows(const float *x, int R, int V, long ld, int64_t *out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (R > 1)
    for (int r = 0; r < R; r++) out[r] = argmax_row(x + (size_t)r * ld, V);
}
