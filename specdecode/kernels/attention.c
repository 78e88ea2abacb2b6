/* Batch-invariant attention over the slot KV cache, for CPU prefill, decode and verify.
 *
 * Why: a fused attention kernel (PyTorch's SDPA) reduces in an order that depends on the call's
 * shape: how many queries it gets, how many keys, where the mask cuts. So the same query gets
 * other bits when it is decoded alone, verified among draft tokens, prefilled in a chunk or run in
 * a batch beside other sequences, and greedy output would change with load and history. Here every
 * query is computed on its own, in one fixed order that depends only on the keys it sees: with the
 * row-invariant linears of quant_gemm.c, a token's hidden state has the same bits whichever way it
 * reaches the model.
 *
 * Arithmetic for one query q (float32 [D]) of kv head c, seeing keys J (ascending cache indices):
 *   s_j = scale * dot(q, k_j)     dot: one 8-lane FMA chain over D, then a fixed 8-lane sum
 *   m = max_j s_j;  p_j = exp(s_j - m) (exp8 below, a fixed polynomial);  z = sum_j p_j in j order
 *   o = (sum_j p_j v_j, 8-lane FMA in j order) / z
 * Keys are bfloat16 (widened exactly) or float32. A task's queries (up to QMAX: a run of tokens of
 * one row times the G query heads of one kv head) share the work of widening each block of keys and
 * values, and go through the dot products and the weighted sums in pairs, each vector of keys or
 * values loaded once for both; nothing is vectorised across queries or keys in a way that changes
 * one query's order, so the AVX512 and AVX2 builds give the same bits too: every chain is 8 lanes
 * wide, and the AVX512 body runs a pair's two chains side by side in one 512-bit register
 * (attention_pairs.h).
 *
 * Visibility: query t of row b sees keys [0, nkeys[b, t]) of its slot, or, when mask is given, the
 * keys j < nkeys[b, t] with mask[b, t, j] != 0 (tree nodes: the prefix and their ancestors).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention_pairs.h"
#include "simd.h"

/* Scores of one query against keys [0, n): 8 keys per pass, each with its own FMA chain (8 chains
 * in flight hide the FMA latency), which is exactly the chain a single key gets. */
static void scores(const float *q, const char *k, size_t kstride, int n, int D, int bf16, float scale, float *s) {
    const int es = bf16 ? 2 : 4;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f a[8] = {{0}};
        const char *k0 = k + (size_t)j * kstride;
        for (int d = 0; d < D; d += 8) {
            const v8f qd = load8(q + d, 0);
            for (int i = 0; i < 8; i++) a[i] = fma8(qd, load8(k0 + i * kstride + (size_t)d * es, bf16), a[i]);
        }
        for (int i = 0; i < 8; i++) s[j + i] = scale * hsum8(a[i]);
    }
    for (; j < n; j++) {
        v8f a = {0};
        const char *kj = k + (size_t)j * kstride;
        for (int d = 0; d < D; d += 8) a = fma8(load8(q + d, 0), load8(kj + (size_t)d * es, bf16), a);
        s[j] = scale * hsum8(a);
    }
}

/* Softmax weights, unnormalised, of the queries s[i * stride + j] (i < nq) that see the same keys
 * j in [0, n) (0 where vis says invisible; vis NULL: all visible), in place; z[i] their sums. Each
 * query's max is exact in any order, its weights go through exp8 (exp16) lane by lane, and its sum runs
 * over j in order; the queries' sums are interleaved so that their chains overlap. */
static void softmax(float *s, size_t stride, int nq, int n, const uint8_t *vis, float *z) {
    for (int i = 0; i < nq; i++) {
        float *si = s + (size_t)i * stride;
        __m256 mv = _mm256_set1_ps(-INFINITY);
        int j = 0;
        if (!vis)
            for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(si + j));
        float mm[8], m;
        _mm256_storeu_ps(mm, mv);
        m = mm[0];
        for (int l = 1; l < 8; l++) m = mm[l] > m ? mm[l] : m;
        for (; j < n; j++)
            if ((!vis || vis[j]) && si[j] > m) m = si[j];
        const v8f mb = {m, m, m, m, m, m, m, m};
        j = 0;
#ifdef __AVX512F__
        for (const __m512 m16 = _mm512_set1_ps(m); j + 16 <= n; j += 16) /* exp16: exp8's bits per lane */
            _mm512_storeu_ps(si + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(si + j), m16)));
#endif
        for (; j + 8 <= n; j += 8) _mm256_storeu_ps(si + j, (__m256)exp8(load8(si + j, 0) - mb));
        if (j < n) { /* the tail through the same instructions, padded */
            float t[8] = {0};
            for (int l = j; l < n; l++) t[l - j] = si[l];
            _mm256_storeu_ps(t, (__m256)exp8(load8(t, 0) - mb));
            for (int l = j; l < n; l++) si[l] = t[l - j];
        }
        if (vis)
            for (j = 0; j < n; j++) si[j] = vis[j] ? si[j] : 0.f;
    }
    for (int i0 = 0; i0 < nq; i0 += 8) { /* invisible keys add +0: a sum is unchanged by them */
        const int m = nq - i0 < 8 ? nq - i0 : 8;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        const float *s0 = s + (size_t)i0 * stride;
        if (m == 8)
            for (int j = 0; j < n; j++)
                for (int i = 0; i < 8; i++) acc[i] += s0[(size_t)i * stride + j];
        else
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) acc[i] += s0[(size_t)i * stride + j];
        for (int i = 0; i < m; i++) z[i0 + i] = acc[i];
    }
}

/* acc[c] += p_j v_j[c] over visible j in [0, n), in j order, for c in [c0, D); v float32 rows of D. Eight vectors of
 * acc (64 floats) at a time, so that they stay in registers across the key loop; each element's
 * chain over j is the same whatever the chunking. */
static void accumulate(const float *p, int n, const uint8_t *vis, const float *v, int D, float *acc, int c0) {
    for (; c0 + 64 <= D; c0 += 64) {
        v8f a[8];
        for (int i = 0; i < 8; i++) a[i] = load8(acc + c0 + 8 * i, 0);
        for (int j = 0; j < n; j++) {
            if (vis && !vis[j]) continue;
            const v8f pj = {p[j], p[j], p[j], p[j], p[j], p[j], p[j], p[j]};
            const float *vj = v + (size_t)j * D + c0;
            for (int i = 0; i < 8; i++) a[i] = fma8(pj, load8(vj + 8 * i, 0), a[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(acc + c0 + 8 * i, (__m256)a[i]);
    }
    for (; c0 < D; c0 += 8) { /* head dims that are not a multiple of 64 */
        v8f a = load8(acc + c0, 0);
        for (int j = 0; j < n; j++) {
            if (vis && !vis[j]) continue;
            const v8f pj = {p[j], p[j], p[j], p[j], p[j], p[j], p[j], p[j]};
            a = fma8(pj, load8(v + (size_t)j * D + c0, 0), a);
        }
        _mm256_storeu_ps(acc + c0, (__m256)a);
    }
}

/* Rows [0, n) of one kv head (stride row bytes) as float32 [n, D] in dst (exact for bfloat16). */
static void widen(const char *src, size_t row, int n, int D, int bf16, float *dst) {
#ifdef __AVX512F__
    if (bf16 && D % 16 == 0) { /* the same shift, 16 at a time */
        for (int j = 0; j < n; j++)
            for (int c = 0; c < D; c += 16) {
                const __m256i h = _mm256_loadu_si256((const __m256i *)(src + (size_t)j * row + (size_t)c * 2));
                _mm512_storeu_ps(dst + (size_t)j * D + c,
                                 _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
            }
        return;
    }
#endif
    for (int j = 0; j < n; j++)
        for (int c = 0; c < D; c += 8)
            _mm256_storeu_ps(dst + (size_t)j * D + c,
                             (__m256)load8(src + (size_t)j * row + (size_t)c * (bf16 ? 2 : 4), bf16));
}

/* scores() of two queries (q1 may be NULL) against the same float32 keys [0, n) (rows of D): each
 * key's vector is loaded once for both, and each (query, key) pair keeps its own FMA chain over D,
 * reduced by hsum8x8, so every score has the bits scores() gives it. */
static void scores2(const float *q0, const float *q1, const float *k, int n, int D, float scale, float *s0,
                    float *s1) {
    int j = 0;
    if (q1)
        for (; j + 4 <= n; j += 4) {
            v8f a[8] = {{0}}; /* a[i]: q0 . key j + i, a[4 + i]: q1 . key j + i */
            const float *k0 = k + (size_t)j * D;
            for (int d = 0; d < D; d += 8) {
                const v8f x0 = load8(q0 + d, 0), x1 = load8(q1 + d, 0);
                for (int i = 0; i < 4; i++) {
                    const v8f kv = load8(k0 + (size_t)i * D + d, 0);
                    a[i] = fma8(x0, kv, a[i]);
                    a[4 + i] = fma8(x1, kv, a[4 + i]);
                }
            }
            const v8f sc = {scale, scale, scale, scale, scale, scale, scale, scale};
            const __m256 r = (__m256)(sc * hsum8x8(a));
            _mm_storeu_ps(s0 + j, _mm256_castps256_ps128(r));
            _mm_storeu_ps(s1 + j, _mm256_extractf128_ps(r, 1));
        }
    else
        for (; j + 8 <= n; j += 8) {
            v8f a[8] = {{0}};
            const float *k0 = k + (size_t)j * D;
            for (int d = 0; d < D; d += 8) {
                const v8f x0 = load8(q0 + d, 0);
                for (int i = 0; i < 8; i++) a[i] = fma8(x0, load8(k0 + (size_t)i * D + d, 0), a[i]);
            }
            const v8f sc = {scale, scale, scale, scale, scale, scale, scale, scale};
            _mm256_storeu_ps(s0 + j, (__m256)(sc * hsum8x8(a)));
        }
    if (j < n) {
        scores(q0, (const char *)(k + (size_t)j * D), (size_t)D * 4, n - j, D, 0, scale, s0 + j);
        if (q1) scores(q1, (const char *)(k + (size_t)j * D), (size_t)D * 4, n - j, D, 0, scale, s1 + j);
    }
}

/* accumulate() for two queries that see the same keys (p1, acc1 may be NULL): each value vector is
 * loaded once for both; every element's chain over j is accumulate()'s. */
static void accumulate2(const float *p0, const float *p1, int n, const uint8_t *vis, const float *v, int D,
                        float *acc0, float *acc1) {
    if (!p1) {
        accumulate(p0, n, vis, v, D, acc0, 0);
        return;
    }
    int c0 = 0;
    for (; c0 + 32 <= D; c0 += 32) {
        v8f a0[4], a1[4];
        for (int i = 0; i < 4; i++) a0[i] = load8(acc0 + c0 + 8 * i, 0), a1[i] = load8(acc1 + c0 + 8 * i, 0);
        for (int j = 0; j < n; j++) {
            if (vis && !vis[j]) continue;
            const v8f b0 = {p0[j], p0[j], p0[j], p0[j], p0[j], p0[j], p0[j], p0[j]};
            const v8f b1 = {p1[j], p1[j], p1[j], p1[j], p1[j], p1[j], p1[j], p1[j]};
            const float *vj = v + (size_t)j * D + c0;
            for (int i = 0; i < 4; i++) {
                const v8f x = load8(vj + 8 * i, 0);
                a0[i] = fma8(b0, x, a0[i]);
                a1[i] = fma8(b1, x, a1[i]);
            }
        }
        for (int i = 0; i < 4; i++) {
            _mm256_storeu_ps(acc0 + c0 + 8 * i, (__m256)a0[i]);
            _mm256_storeu_ps(acc1 + c0 + 8 * i, (__m256)a1[i]);
        }
    }
    if (c0 < D) { /* head dims that are not a multiple of 32 */
        accumulate(p0, n, vis, v, D, acc0, c0);
        accumulate(p1, n, vis, v, D, acc1, c0);
    }
}

#define KB 32 /* keys per block: a block's keys or values, widened (16 KB at D = 128), stay in L1 for all queries */
#define QMAX 96 /* queries per task (tokens x the G heads of a kv head): bounds the scratch at QMAX x keys */
/* Decode and verify calls (at most PF_MAX_TOKENS tokens) over at least PF_MIN_KEYS keys request the next
 * block's keys or values while the current block is worked on: there the cache streams from DRAM with
 * little work per key to hide it. Shorter contexts arrive in time anyway, and prefill chunks, with more
 * work per key, ran slower with it (docs/benchmarks.md, round 33). Prefetching changes no result. */
#define PF_MAX_TOKENS 16
#define PF_MIN_KEYS 512

/* Requests rows [j, j + KB) of a kv head's keys or values (at most n rows), as the next block. */
static inline void prefetch_block(const char *src, size_t row, int j, int n) {
    const size_t bytes = (size_t)(n - j < KB ? n - j : KB) * row;
    for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(src + (size_t)j * row + off, _MM_HINT_T0);
}

/* Tokens t0 .. t0 + nt - 1 of one row, kv head c: the nt x G queries share each widened block of keys
 * and values (a verify's draft tokens and a prefill chunk's tokens read the same prefix of the slot).
 * Query (t, g) is q[t * D + g * qstride] and sees keys [0, nkeys[t]) (vis[t]: mask row, or NULL);
 * each query's scores, weights and sums are computed exactly as if it were alone. T: the call's tokens
 * per row (whether the next blocks are prefetched). */
static void task(const float *q, size_t qstride, const char *k, const char *v, size_t row, const int32_t *nkeys,
                 const uint8_t *mask, int Lm, int nt, int G, int D, int bf16, float scale, float *s, int lmax,
                 float *buf, float *acc, float *z, float *o, float *qp, int T) {
    int n = 0;
    for (int t = 0; t < nt; t++)
        if (nkeys[t] > n) n = nkeys[t];
    const int pf = T <= PF_MAX_TOKENS && n >= PF_MIN_KEYS;
#ifdef __AVX512F__
    for (int t = 0; t < nt; t++) /* heads (g, g + 1) of token t at qp + (t G + g) D */
        for (int g = 0; g + 1 < G; g += 2)
            pack_pair(q + (size_t)t * D + g * qstride, q + (size_t)t * D + (g + 1) * qstride, D,
                      qp + ((size_t)t * G + g) * D);
#else
    (void)qp;
#endif
    for (int j0 = 0; j0 < n; j0 += KB) {
        const int nb = n - j0 < KB ? n - j0 : KB;
        widen(k + (size_t)j0 * row, row, nb, D, bf16, buf);
        if (pf && j0 + KB < n) prefetch_block(k, row, j0 + KB, n);
        for (int t = 0; t < nt; t++) {
            const int m = nkeys[t] - j0 < nb ? nkeys[t] - j0 : nb;
            int g = 0;
#ifdef __AVX512F__
            for (int np; m > 0 && g + 1 < G; g += 2 * np) {
                np = (G - g) / 2 < PAIRS ? (G - g) / 2 : PAIRS;
                float *sg = s + (size_t)(t * G + g) * lmax + j0;
                const int done = pairs_scores(qp + ((size_t)t * G + g) * D, np, buf, m, D, scale, sg, lmax);
                for (int i = 0; done < m && i < 2 * np; i++) /* the keys past the last group of 4 */
                    scores(q + (size_t)t * D + (g + i) * qstride, (const char *)(buf + (size_t)done * D), (size_t)D * 4,
                           m - done, D, 0, scale, sg + (size_t)i * lmax + done);
            }
#endif
            for (; m > 0 && g < G; g += 2) {
                const float *q0 = q + (size_t)t * D + g * qstride;
                float *s0 = s + (size_t)(t * G + g) * lmax + j0;
                scores2(q0, g + 1 < G ? q0 + qstride : NULL, buf, m, D, scale, s0, s0 + lmax);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        softmax(s + (size_t)t * G * lmax, lmax, G, nkeys[t], mask ? mask + (size_t)t * Lm : NULL, z + t * G);
    for (size_t c = 0; c < (size_t)nt * G * D; c++) acc[c] = 0.f;
    for (int j0 = 0; j0 < n; j0 += KB) {
        const int nb = n - j0 < KB ? n - j0 : KB;
        widen(v + (size_t)j0 * row, row, nb, D, bf16, buf);
        if (pf && j0 + KB < n) prefetch_block(v, row, j0 + KB, n);
        for (int t = 0; t < nt; t++) {
            const int m = nkeys[t] - j0 < nb ? nkeys[t] - j0 : nb;
            const uint8_t *vis = mask ? mask + (size_t)t * Lm + j0 : NULL;
            int g = 0;
#ifdef __AVX512F__
            for (int np; m > 0 && g + 1 < G; g += 2 * np) {
                np = (G - g) / 2 < PAIRS ? (G - g) / 2 : PAIRS;
                pairs_accumulate(s + (size_t)(t * G + g) * lmax + j0, lmax, np, m, vis, buf, D,
                                 acc + (size_t)(t * G + g) * D);
            }
#endif
            for (; m > 0 && g < G; g += 2) {
                const int i = t * G + g;
                accumulate2(s + (size_t)i * lmax + j0, g + 1 < G ? s + (size_t)(i + 1) * lmax + j0 : NULL, m, vis,
                            buf, D, acc + (size_t)i * D, g + 1 < G ? acc + (size_t)(i + 1) * D : NULL);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int g = 0; g < G; g++) {
            const int i = t * G + g;
            for (int c = 0; c < D; c += 8) {
                const v8f r = load8(acc + (size_t)i * D + c, 0) / z[i];
                _mm256_storeu_ps(o + (size_t)t * D + g * qstride + c, (__m256)r);
            }
        }
}

/* The calling thread's scratch of at least n floats, 64-byte aligned, kept for its next call: a buffer
 * allocated and freed per call costs page faults (and heap trims) in every layer of every step. Freed
 * when the thread exits (an OpenMP pool released by threads.c). */
typedef struct {
    float *p;
    size_t cap;
} scratch_t;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_free(void *s) {
    free(((scratch_t *)s)->p);
    free(s);
}
static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

/* n rounded up to whole 64-byte lines of floats. */
static inline size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

static float *scratch(size_t n) {
    pthread_once(&scratch_once, scratch_init);
    scratch_t *s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        pthread_setspecific(scratch_key, s);
    }
    if (n > s->cap) {
        free(s->p);
        s->cap = up16(n + n / 4);
        if (!(s->p = aligned_alloc(64, sizeof(float) * s->cap))) s->cap = 0;
    }
    return s->p;
}

/* q, o: float32 [B, H, T, D]; kc, vc: one layer of the cache, [S, Hkv, Lmax, D] (bf16 or float32);
 * slots int32 [B]; nkeys int32 [B, T] (>= 1); mask uint8 [B, T, Lm] or NULL. D % 8 == 0, D <= 256,
 * H / Hkv <= QMAX. Returns 0, or -1 where a scratch buffer could not be allocated. */
int specdecode_attention(const float *q, const void *kc, const void *vc, int bf16, int B, int H, int Hkv,
                         int T, int D, int Lmax, const int32_t *slots, const int32_t *nkeys, const uint8_t *mask,
                         int Lm, float scale, float *o, int nthreads) {
    const int G = H / Hkv;
    const int TQ = QMAX / G < 1 ? 1 : QMAX / G, chunks = (T + TQ - 1) / TQ;
    const size_t es = bf16 ? 2 : 4, row = (size_t)D * es, qstride = (size_t)T * D;
    int lmax = 1, failed = 0;
    for (int i = 0; i < B * T; i++)
        if (nkeys[i] > lmax) lmax = nkeys[i];
    const int Q = (TQ < T ? TQ : T) * G;
#pragma omp parallel num_threads(nthreads)
    {
        /* per thread: scores [Q, lmax], one widened block [KB, D], accumulators [Q, D], sums [Q], the
         * queries packed in pairs [Q, D] (the AVX512 body's pair kernels). The
         * block and the accumulators start on cache lines: their rows are loaded 32 bytes at a time
         * for every query, and a load split across two lines costs the load pipes twice
         * (docs/benchmarks.md, round 34). KB * D floats keep acc aligned after buf. */
        const size_t ns = up16((size_t)Q * lmax);
        float *s = scratch(ns + (size_t)KB * D + 2 * (size_t)Q * D + up16((size_t)Q));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
        float *buf = s + ns, *acc = buf + (size_t)KB * D, *z = acc + (size_t)Q * D, *qp = z + up16((size_t)Q);
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int c = 0; c < Hkv; c++)
                for (int ch = 0; ch < chunks; ch++) {
                    if (!s) continue;
                    const int t0 = ch * TQ, nt = T - t0 < TQ ? T - t0 : TQ;
                    const size_t base = ((size_t)slots[b] * Hkv + (size_t)c) * (size_t)Lmax * row;
                    const size_t qo = ((size_t)b * H + (size_t)c * G) * qstride + (size_t)t0 * D;
                    task(q + qo, qstride, (const char *)kc + base, (const char *)vc + base, row,
                         nkeys + (size_t)b * T + t0, mask ? mask + ((size_t)b * T + t0) * Lm : NULL, Lm, nt, G, D,
                         bf16, scale, s, lmax, buf, acc, z, o + qo, qp, T);
                }
    }
    return failed ? -1 : 0;
}
