/* The AVX512 body's attention kernels over query pairs (attention.c): the 8-lane chains of two queries side by
 * side in one 16-lane register (lanes 0-7 the first query's, 8-15 the second's), so that one 512-bit FMA
 * advances both chains by the FMA that the 256-bit code gives each: every score and every output keeps the
 * bits that attention.c's one-query arithmetic (and the AVX2 body) gives it, with half the FMA instructions
 * (two 512-bit FMA ports on Intel Xeons; Zen 4 splits them into the 256-bit halves it would have run
 * anyway). Up to PAIRS pairs that see the same keys (the query heads of one token) share each load of a key
 * or value vector. */
#ifndef SPECDECODE_ATTENTION_PAIRS_H
#define SPECDECODE_ATTENTION_PAIRS_H
#include <stddef.h>
#include <stdint.h>

#include "simd.h"

#ifdef __AVX512F__
#define PAIRS 3

/* The 8 floats at p in both halves. */
static inline __m512 dup8(const float *p) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)p)));
}

/* [a] * 8 in lanes 0-7, [b] * 8 in lanes 8-15. */
static inline __m512 pair1(float a, float b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)),
                                               _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}

static inline v8f lo8(__m512 a) { return (v8f)_mm512_castps512_ps256(a); }
static inline v8f hi8(__m512 a) { return (v8f)_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }

/* The 8 floats at a in lanes 0-7 and those at b in lanes 8-15; and back. */
static inline __m512 load_pair(const float *a, const float *b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(a))),
                                               _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}
static inline void store_pair(__m512 v, float *a, float *b) {
    _mm256_storeu_ps(a, (__m256)lo8(v));
    _mm256_storeu_ps(b, (__m256)hi8(v));
}

/* Queries q0, q1 [D] interleaved 8 dims at a time: qp [D / 8][16], lanes 0-7 q0's, 8-15 q1's. */
static void pack_pair(const float *q0, const float *q1, int D, float *qp) {
    for (int d = 0; d < D; d += 8) _mm512_storeu_ps(qp + 2 * d, load_pair(q0 + d, q1 + d));
}

/* Scores of NP pairs (packed by pack_pair, qp + 2 D p for pair p) against the float32 keys [0, n) (rows of
 * D), 4 keys at a time; pair p's two queries' scores go to s + 2 p lmax + j and s + (2 p + 1) lmax + j.
 * Returns the keys done (n rounded down to 4): the caller scores the rest with scores(). */
static inline __attribute__((always_inline)) int scores_pairs(const float *qp, const int NP, const float *k, int n,
                                                              int D, float scale, float *s, size_t lmax) {
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        __m512 a[PAIRS][4];
        for (int p = 0; p < NP; p++)
            for (int i = 0; i < 4; i++) a[p][i] = _mm512_setzero_ps();
        const float *k0 = k + (size_t)j * D;
        for (int d = 0; d < D; d += 8) {
            __m512 kb[4];
            for (int i = 0; i < 4; i++) kb[i] = dup8(k0 + (size_t)i * D + d);
            for (int p = 0; p < NP; p++) {
                const __m512 x = _mm512_loadu_ps(qp + (size_t)p * 2 * D + 2 * d);
                for (int i = 0; i < 4; i++) a[p][i] = _mm512_fmadd_ps(x, kb[i], a[p][i]);
            }
        }
        const v8f sc = {scale, scale, scale, scale, scale, scale, scale, scale};
        for (int p = 0; p < NP; p++) { /* scores2's arrangement: [q0 . keys, q1 . keys] */
            v8f h[8];
            for (int i = 0; i < 4; i++) h[i] = lo8(a[p][i]), h[4 + i] = hi8(a[p][i]);
            const __m256 r = (__m256)(sc * hsum8x8(h));
            _mm_storeu_ps(s + 2 * p * lmax + j, _mm256_castps256_ps128(r));
            _mm_storeu_ps(s + (2 * p + 1) * lmax + j, _mm256_extractf128_ps(r, 1));
        }
    }
    return j;
}

/* accumulate2() for NP pairs whose queries see the same keys [0, n) (vis: one mask row, or NULL): query i
 * (i < 2 NP) has weights w[i] and accumulators acc[i]. 64 dims of every pair at a time (8 registers a pair),
 * then 8 at a time; every element's chain over j is accumulate()'s. */
static inline __attribute__((always_inline)) void accumulate_pairs(const float *const *w, const int NP, int n,
                                                                   const uint8_t *vis, const float *v, int D,
                                                                   float *const *acc) {
    int c0 = 0;
    for (; c0 + 64 <= D; c0 += 64) {
        __m512 a[PAIRS][8];
        for (int p = 0; p < NP; p++)
            for (int i = 0; i < 8; i++) a[p][i] = load_pair(acc[2 * p] + c0 + 8 * i, acc[2 * p + 1] + c0 + 8 * i);
        for (int j = 0; j < n; j++) {
            if (vis && !vis[j]) continue;
            const float *vj = v + (size_t)j * D + c0;
            __m512 b[PAIRS];
            for (int p = 0; p < NP; p++) b[p] = pair1(w[2 * p][j], w[2 * p + 1][j]);
            for (int i = 0; i < 8; i++) {
                const __m512 x = dup8(vj + 8 * i);
                for (int p = 0; p < NP; p++) a[p][i] = _mm512_fmadd_ps(b[p], x, a[p][i]);
            }
        }
        for (int p = 0; p < NP; p++)
            for (int i = 0; i < 8; i++) store_pair(a[p][i], acc[2 * p] + c0 + 8 * i, acc[2 * p + 1] + c0 + 8 * i);
    }
    for (; c0 < D; c0 += 8) { /* head dims that are not a multiple of 64 */
        __m512 a[PAIRS];
        for (int p = 0; p < NP; p++) a[p] = load_pair(acc[2 * p] + c0, acc[2 * p + 1] + c0);
        for (int j = 0; j < n; j++) {
            if (vis && !vis[j]) continue;
            const __m512 x = dup8(v + (size_t)j * D + c0);
            for (int p = 0; p < NP; p++) a[p] = _mm512_fmadd_ps(pair1(w[2 * p][j], w[2 * p + 1][j]), x, a[p]);
        }
        for (int p = 0; p < NP; p++) store_pair(a[p], acc[2 * p] + c0, acc[2 * p + 1] + c0);
    }
}

/* Scores of np <= PAIRS pairs (packed at qp) against one block of m keys; returns the keys done (the
 * rest, past the last whole group of 4, go through the caller's scores()). */
static int pairs_scores(const float *qp, int np, const float *buf, int m, int D, float scale, float *s, size_t lmax) {
    switch (np) {
    case 1: return scores_pairs(qp, 1, buf, m, D, scale, s, lmax);
    case 2: return scores_pairs(qp, 2, buf, m, D, scale, s, lmax);
    default: return scores_pairs(qp, 3, buf, m, D, scale, s, lmax);
    }
}

/* The weighted sums of np <= PAIRS pairs of queries (rows s + i lmax of the weights, acc + i D of the
 * accumulators, i < 2 np) over one block of m values. */
static void pairs_accumulate(const float *s, size_t lmax, int np, int m, const uint8_t *vis, const float *buf, int D,
                             float *acc) {
    const float *w[2 * PAIRS];
    float *a[2 * PAIRS];
    for (int i = 0; i < 2 * np; i++) w[i] = s + i * lmax, a[i] = acc + (size_t)i * D;
    switch (np) {
    case 1: accumulate_pairs(w, 1, m, vis, buf, D, a); break;
    case 2: accumulate_pairs(w, 2, m, vis, buf, D, a); break;
    default: accumulate_pairs(w, 3, m, vis, buf, D, a); break;
    }
}
#endif

#endif
