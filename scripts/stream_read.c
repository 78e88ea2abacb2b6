/* Read bandwidth: how fast the CPU streams a buffer from memory, the yardstick of a decode step (which
 * reads every weight once). bench_runtime.py builds it as a shared library and calls
 * stream_read(p, n, threads) on buffers far beyond the caches, in 4 KiB and in 2 MiB pages, beside
 * torch's x.sum(), and takes the fastest of the three as the ceiling.
 *
 * Each thread sums its contiguous share of the floats with eight independent 256-bit accumulators
 * (256 bytes per iteration: loads, never the adds, bound it) and requests lines PF bytes ahead into L1
 * (stream_read) or also PF_FAR bytes ahead into L2 (stream_read_pf with far set), as the int4 kernel
 * does for its weights; the threads start together and the call returns when the last
 * one is done, so the time covers the slowest share.
 *
 *     gcc -O2 -mavx2 -shared -fPIC scripts/stream_read.c -o /tmp/stream_read.so -lpthread
 */
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>

#define PF 4096      /* into L1, as the int4 kernel's PF_NEAR */
#define PF_FAR 16384 /* into L2 (the T2 hint), as its PF_FAR: the second level where ``far`` is set */

typedef struct {
    const float *p;
    size_t n;
    int far;
    float sum;
} share;

static void *sum_share(void *arg) {
    share *s = arg;
    __m256 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= s->n; i += 64) {
        if (s->far)
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(s->p + i) + PF_FAR + 64 * l, _MM_HINT_T2);
        for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(s->p + i) + PF + 64 * l, _MM_HINT_T0);
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

/* The sum of p[0 .. n) read by ``threads`` threads (the caller's among them), up to 64; far: also request
 * lines PF_FAR bytes ahead into L2, as the int4 kernel streams its weights (one level alone reads slower
 * than the kernel streams on some Intel hosts). */
float stream_read_pf(const float *p, size_t n, int threads, int far) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    share s[64];
    pthread_t t[64];
    size_t per = (n / threads) & ~(size_t)63;
    for (int k = 0; k < threads; k++) {
        s[k].p = p + per * k;
        s[k].n = k == threads - 1 ? n - per * k : per;
        s[k].far = far;
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

float stream_read(const float *p, size_t n, int threads) { return stream_read_pf(p, n, threads, 0); }
