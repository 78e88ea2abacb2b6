/* Inverse-CDF sampling of float32 probability rows: sampling.sample's rule, bit for bit.
 *
 * Why native: sample() in PyTorch converts each row to float64, takes its cumulative sum and counts
 * its non-zero entries, three passes over ~150k entries with two full-size temporaries per row; in a
 * sampled batch of 8 that is a few milliseconds a step. Here a row is one pass (the running sum, the
 * positive count) plus a walk over at most CHECK entries.
 *
 * The rule (sampling.sample): cdf = the row's running sum in float64, in index order (PyTorch's CPU
 * cumsum is sequential); t = u * cdf[V - 1] in float64; the token is the first index whose cdf
 * exceeds t (searchsorted, right), V - 1 if none does; a row with exactly one positive entry gives
 * that entry's index (its argmax). The running sum is kept at every CHECK-th entry, so the walk starts
 * from the exact sum at the start of the block that holds the token and redoes the same additions.
 * A row with a NaN, an infinity or a negative entry is left to the caller (-1): PyTorch's own path
 * decides it. */
#include <float.h>
#include <immintrin.h>
#include <stdint.h>
#include <stddef.h>

#define CHECK 1024

/* The entries > 0, and whether any is NaN, infinite or negative (bad): 256-bit vectors, as argmax.c. */
static int scan_row(const float *x, int V, int *bad) {
    const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(FLT_MAX);
    __m256 flag = zero;
    int positive = 0, i = 0;
    for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        positive += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_GT_OQ)));
        flag = _mm256_or_ps(flag, _mm256_or_ps(_mm256_cmp_ps(v, zero, _CMP_NGE_UQ), _mm256_cmp_ps(v, top, _CMP_GT_OQ)));
    }
    int b = _mm256_movemask_ps(flag) != 0;
    for (; i < V; i++) {
        positive += x[i] > 0.f;
        b |= !(x[i] >= 0.f) | (x[i] > FLT_MAX);
    }
    *bad = b;
    return positive;
}

static int64_t sample_row(const float *x, int V, double u) {
    const int nb = (V + CHECK - 1) / CHECK;
    double marks[nb]; /* marks[b]: the running sum after block b */
    int bad;
    const int positive = scan_row(x, V, &bad);
    if (bad) return -1;
    if (positive == 1) /* its argmax: the positive entry */
        for (int i = 0; i < V; i++)
            if (x[i] > 0.f) return i;
    double acc = 0.0;
    for (int b = 0; b < nb; b++) { /* the one sequential chain: nothing else in this loop */
        const int end = (b + 1) * CHECK < V ? (b + 1) * CHECK : V;
        for (int i = b * CHECK; i < end; i++) acc += (double)x[i];
        marks[b] = acc;
    }
    const double t = u * acc;
    for (int b = 0; b < nb; b++) {
        if (!(marks[b] > t)) continue;
        double run = b ? marks[b - 1] : 0.0;
        const int end = (b + 1) * CHECK < V ? (b + 1) * CHECK : V;
        for (int i = b * CHECK; i < end; i++) {
            run += (double)x[i];
            if (run > t) return i;
        }
        return end - 1; /* not reached: the block's last sum is marks[b] > t */
    }
    return V - 1;
}

/* out[r] = the sampled index of row rows[r] (r when rows is NULL) of x (rows ld floats apart), with
 * the uniform u[r]; -1 for a row the caller must decide. */
void specdecode_sample_rows(const float *x, const int64_t *rows, int R, int V, long ld, const double *u,
                            int64_t *out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (R > 1)
    for (int r = 0; r < R; r++) out[r] = sample_row(x + (size_t)(rows ? rows[r] : r) * ld, V, u[r]);
}
