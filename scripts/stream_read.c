/* Read bandwidth: how fast the CPU streams a buffer from memory, the yardstick of a decode step (which
 * reads every weight once). bench_runtime.py builds it as a shared library and calls
 * stream_read(p, n, threads) on buffers far beyond the caches, in 4 KiB and in 2 MiB pages, beside
 * torch's x.sum(), and takes the fastest of the three as the ceiling.
 *
 * Each thread sums its contiguous share of the floats with eight independent 256-bit accumulators
 * (256 bytes per iteration: loads, never the adds, bound it) and requests lines PF bytes ahead, as
 * the int4 kernel does for its weights; the threads start together and the call returns when the last
 * one is done, so the time covers the slowest share.
 *
 *     gcc -O2 -mavx2 -shared -fPIC scripts/stream_read.c -o /tmp/stream_read.so -lpthread
 */
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>

#define PF 4096

typedef struct {
    const float *p;
    size_t n;
    float sum;
} share;

static void *sum_share(void *arg) {
    share *s = arg;
    __m256 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= s->n; i += 64) {
        _mm_prefetch((const char *)(s->p + i) + PF, _MM_HINT_T0);
        _mm_prefetch((const char *)(s->p + i) + PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)(s->p + i) + PF + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)(s->p + i) + PF + 192, _MM_HINT_T0);
        for (int k = 0; k < 8; k++) a[k] = _mm256_add_ps(a[k], _mm256_loadu_ps(s->p + i + 8 * k));
    }
    float out[8], total = 0.f;
    for (int k = 1; k < 8; k++) a[0] = _mm256_add_ps(a[0], a[k]);
    _mm256_storeu_ps(out, a[0]);
    for (int k = 0; k < 8; k++) total += out[k];
    for (; i < s->n; i++) total += s->p[i];
    s->sum = total;
    return NULL;
}

/* The sum of p[0 .. n) read by ``threads`` threads (the caller's among them), up to 64. */
float stream_read(const float *p, size_t n, int threads) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    share s[64];
    pthread_t t[64];
    size_t per = (n / threads) & ~(size_t)63;
    for (int k = 0; k < threads; k++) {
        s[k].p = p + per * k;
        s[k].n = k == threads - 1 ? n - per * k : per;
    }
    for (int k = 1; k < threads; k++) pthread_create(&t[k], NULL, sum_share, &s[k]);
    sum_share(&s[0]);
    float total = s[0].sum;
    for (int k = 1; k < threads; k++) {
        pthread_join(t[k], NULL);
        total += s[k].sum;
    }
    return total;
}
