/* One decoder layer of the Llama family (Llama, Qwen2/2.5/3, Mistral) in one call, for CPU
 * inference over the slot KV cache: RMSNorm, the q/k/v projection (+ bias), q/k norm, RoPE, the
 * cache write, attention, the output projection, the residual, RMSNorm, gate/up, SiLU x up, down,
 * the residual.
 *
 * Why: the matrices of a decode step are native (quant_gemm.c) and near the bandwidth limit, but
 * driving them from Python costs ~10-20 us per operation (module calls, views, small PyTorch ops),
 * ~0.2 ms per layer, a fifth of a 1.5B decode step. Here a layer is one call.
 *
 * Exactness: every step is the very function or the very IEEE operation sequence of the unfused
 * path (models/llama.py with the cpu-native attention backend, the native linears, the native
 * RMSNorm and specdecode_silu_mul), so the two give the same bits and may be mixed freely (the
 * fused path runs where its preconditions hold, the unfused one elsewhere). Rows stay independent:
 * a row's result does not depend on the other rows of the call. Compiled with -ffp-contract=off,
 * so a*b + c*d stays two roundings and an add, as PyTorch's separate ops round.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

void specdecode_int4_gemm(const float *x, int R, int K, int N, int gs, const uint8_t *w, const uint8_t *sub,
                          const uint16_t *sup, float *y, int8_t *xq, float *sx, float *xsum, int threads);
void specdecode_int8_gemm(const float *x, int R, int K, int N, const uint8_t *w, const float *ws, float *y,
                          int8_t *xq, float *sx, float *xsum, float *xqsum, float *corr, int threads);
void specdecode_rmsnorm(const float *x, const float *w, float *y, int R, int D, float eps);
int specdecode_attention(const float *q, const void *kc, const void *vc, int bf16, int B, int H, int Hkv,
                         int T, int D, int Lmax, const int32_t *slots, const int32_t *nkeys, const uint8_t *mask,
                         int Lm, float scale, float *o, int nthreads);

/* A native linear layer (layers/quant): y [R, N] = x [R, K] @ W^T (+ bias). */
typedef struct {
    int32_t kind;          /* 4: int4, 8: int8, in quant_gemm.c's packed formats */
    int32_t K, N, gs;      /* in features, out features, int4 group size */
    const uint8_t *w;      /* packed codes */
    const void *s;         /* int4: uint8 sub-scales [N/16, K/gs, 2, 16]; int8: float wscale [N] */
    const uint16_t *z;     /* int4: half bits of the super-scales [N/16, K/(gs S), 2, 16]; int8: unused */
    const float *bias;     /* [N] or NULL */
} sd_linear;

typedef struct {
    int32_t hidden, H, Hkv, D, inter;
    float eps;
    const float *in_norm, *post_norm; /* [hidden] */
    const float *q_norm, *k_norm;     /* [D] each, or NULL */
    sd_linear qkv;                    /* rows [q (H D); k (Hkv D); v (Hkv D)] */
    sd_linear o;                      /* H D -> hidden */
    sd_linear gate_up;                /* rows [gate (inter); up (inter)] */
    sd_linear down;                   /* inter -> hidden */
    /* An EAGLE-3 draft head's layer (specdecode_eagle3_layer; NULL / 0 for the target's layers): q/k/v
     * read [embed_norm(e), in_norm(x)] (qkv.K = 2 hidden) for the token embeddings e beside x, and
     * with norm_residual the residual is in_norm(x) instead of x. */
    const float *embed_norm;          /* [hidden] or NULL */
    int32_t norm_residual;
} sd_layer;

/* One forward's batch: B rows of T queries, of which row b has num_new[b] (the rest pad it to T).
 * The layer's activations are the N packed rows: activation row n is query (b, t) = (pos[n] / T,
 * pos[n] % T); pos NULL means N = B T and pos[n] = n. Packing a ragged batch (drafts of different
 * lengths verified together) keeps the padding out of the matrices, where a row costs its full
 * share; attention still takes [B, T] (a padding query sees one key). */
typedef struct {
    int32_t B, T, N;
    const int32_t *pos;                      /* [N] or NULL */
    const int32_t *slots, *starts, *num_new; /* [B]: cache slot, tokens already cached, new tokens */
    const int32_t *nkeys;                    /* [B, T]: attention.c's visibility */
    const uint8_t *mask;                     /* [B, T, Lm] or NULL */
    int32_t Lm;
    const float *cos, *sin;                  /* [B T, D] */
    int32_t bf16, Lmax;                      /* cache element type; cache layer [S, Hkv, Lmax, D] */
    float scale;                             /* attention scale */
} sd_batch;

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t gemm_scratch(int R, int K) { return up64((size_t)R * K) + 4 * (3 * (size_t)R * (K / 32) + R); }

static void linear(const sd_linear *l, const float *x, int R, float *y, char *scratch, int threads) {
    int8_t *xq = (int8_t *)scratch;
    float *f = (float *)(scratch + up64((size_t)R * l->K));
    if (l->kind == 4) {
        const size_t g = (size_t)R * (l->K / l->gs);
        specdecode_int4_gemm(x, R, l->K, l->N, l->gs, l->w, (const uint8_t *)l->s, l->z, y, xq, f, f + g, threads);
    } else {
        const size_t g = (size_t)R * (l->K / 32);
        specdecode_int8_gemm(x, R, l->K, l->N, l->w, (const float *)l->s, y, xq, f, f + g, f + 2 * g, f + 3 * g,
                             threads);
    }
    if (l->bias)
        for (int r = 0; r < R; r++)
            for (int n = 0; n < l->N; n++) y[(size_t)r * l->N + n] += l->bias[n];
}

/* PyTorch's float -> bfloat16: round to nearest even, NaN -> 0x7FC0. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f) return 0x7FC0;
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* dst = src * cos + rotate_half(src) * sin over one head of D, rotate_half(x) = [-x2, x1]. */
static void rope(const float *src, const float *c, const float *s, int D, float *dst) {
    const int h = D / 2;
    for (int i = 0; i < h; i++) dst[i] = src[i] * c[i] + (-src[i + h]) * s[i];
    for (int i = h; i < D; i++) dst[i] = src[i] * c[i] + src[i - h] * s[i];
}

static void store(void *cache, size_t idx, const float *v, int D, int bf16) {
    if (bf16) {
        uint16_t *d = (uint16_t *)cache + idx;
        for (int i = 0; i < D; i++) d[i] = to_bf16(v[i]);
    } else {
        memcpy((float *)cache + idx, v, sizeof(float) * D);
    }
}

/* out[r, i] = silu(gu[r, i]) * gu[r, I + i] for i in [i0, i1) of row r of gu [R, 2 I] (i0, i1 multiples
 * of 8). silu(x) = x * sigmoid(x) with sigmoid from exp8 (exp16) of -|x| (they take x <= 0): 1 / (1 + e) for
 * x >= 0, e / (1 + e) below, one division per lane of the numerator it needs (a division rounds correctly, so
 * choosing the numerator first gives the bits of choosing between two quotients). Each element on its own:
 * any split of the work gives the same bits. */
static void silu_mul_span(const float *gu, int I, int r, int i0, int i1, float *out) {
    const v8f one = {1, 1, 1, 1, 1, 1, 1, 1}, zero = {0};
    const float *g = gu + (size_t)r * 2 * I, *u = g + I;
    float *o = out + (size_t)r * I;
    int i = i0;
#ifdef __AVX512F__
    for (; i + 16 <= i1; i += 16) { /* the same operations on 16 lanes (exp16: exp8's bits per lane) */
        const __m512 x = _mm512_loadu_ps(g + i), one16 = _mm512_set1_ps(1.f);
        const __m512 neg = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
        const __m512 e = exp16(neg), d = _mm512_add_ps(one16, e);
        const __mmask16 below = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
        const __m512 sig = _mm512_div_ps(_mm512_mask_blend_ps(below, one16, e), d);
        _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(x, sig), _mm512_loadu_ps(u + i)));
    }
#endif
    for (; i < i1; i += 8) {
        const v8f x = load8(g + i, 0);
        const v8f neg = (v8f)_mm256_or_ps((__m256)x, _mm256_set1_ps(-0.f)); /* -|x| */
        const v8f e = exp8(neg);
        const v8f d = one + e;
        const __m256 below = _mm256_cmp_ps((__m256)x, (__m256)zero, _CMP_LT_OQ);
        const v8f sig = (v8f)_mm256_blendv_ps((__m256)one, (__m256)e, below) / d;
        _mm256_storeu_ps(o + i, (__m256)(x * sig * load8(u + i, 0)));
    }
}

/* out [R, I] = silu(gu[:, :I]) * gu[:, I:] for gu [R, 2 I], I % 8 == 0, on a team of `threads`: each row
 * in `threads` spans of whole vectors. Between the gate/up and down projections the other threads would
 * otherwise wait on this exp8 pass, which grows with the rows (docs/benchmarks.md, round 34). */
void specdecode_silu_mul(const float *gu, int R, int I, float *out, int threads) {
    const int parts = threads > 1 ? threads : 1, span = (I / 8 + parts - 1) / parts * 8;
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int c = 0; c < R * parts; c++) {
        const int r = c / parts, i0 = (c % parts) * span, i1 = i0 + span < I ? i0 + span : I;
        if (i0 < i1) silu_mul_span(gu, I, r, i0, i1, out);
    }
}

static int kmax(const sd_layer *L) {
    int k = L->qkv.K > L->inter ? L->qkv.K : L->inter;
    return k > L->H * L->D ? k : L->H * L->D;
}

/* Floats of the activations' scratch for R rows: the normed input [R, qkv.K] (qkv.K = hidden but for an
 * EAGLE-3 head's 2 hidden), qkv, q, o, a, gate/up, act, y (specdecode_decoder_layer's layout). */
static size_t act_floats(const sd_layer *L, size_t R) {
    const size_t nqkv = (size_t)(L->H + 2 * L->Hkv) * L->D, hd = (size_t)L->H * L->D;
    return R * ((size_t)L->qkv.K + L->hidden + nqkv + 3 * hd + 3 * (size_t)L->inter);
}

/* Bytes of scratch specdecode_decoder_layer (or specdecode_eagle3_layer) needs for R activation rows. */
size_t specdecode_layer_scratch(const sd_layer *L, int R) {
    return up64(4 * act_floats(L, R)) + gemm_scratch(R, kmax(L));
}

/* specdecode_decoder_layer (e NULL) and specdecode_eagle3_layer (e the token embeddings), below. */
static int layer(const sd_layer *L, const sd_batch *bt, void *kc, void *vc, float *x, const float *e, void *scratch,
                 int threads) {
    const int B = bt->B, T = bt->T, R = bt->N, H = L->H, Hkv = L->Hkv, D = L->D, hd = L->hidden, I = L->inter;
    const int nqkv = (H + 2 * Hkv) * D, K = L->qkv.K;
    float *h = (float *)scratch;                    /* [R, K]: normed input (K = hidden, or 2 hidden with e) */
    float *qkv = h + (size_t)R * K;                 /* [R, nqkv] */
    const size_t BT = (size_t)B * T;
    float *q = qkv + (size_t)R * nqkv;              /* [B, H, T, D]: rotated queries */
    float *o = q + BT * H * D;                      /* [B, H, T, D]: attention output */
    float *a = o + BT * H * D;                      /* [R, H D] */
    float *gu = a + (size_t)R * H * D;              /* [R, 2 inter] */
    float *act = gu + (size_t)R * 2 * I;            /* [R, inter] */
    float *y = act + (size_t)R * I;                 /* [R, hidden] */
    char *gs = (char *)scratch + up64(4 * act_floats(L, BT));

    if (e) /* an EAGLE-3 head: rows [embed_norm(e), in_norm(x)]; rmsnorm treats each row on its own */
        for (int n = 0; n < R; n++) {
            float *hn = h + (size_t)n * K;
            specdecode_rmsnorm(e + (size_t)n * hd, L->embed_norm, hn, 1, hd, L->eps);
            specdecode_rmsnorm(x + (size_t)n * hd, L->in_norm, hn + hd, 1, hd, L->eps);
            if (L->norm_residual) memcpy(x + (size_t)n * hd, hn + hd, sizeof(float) * hd);
        }
    else
        specdecode_rmsnorm(x, L->in_norm, h, R, hd, L->eps);
    linear(&L->qkv, h, R, qkv, gs, threads);
    if (bt->pos) memset(q, 0, sizeof(float) * BT * H * D); /* padding queries: finite, unused */
    for (int n = 0; n < R; n++) {
        const int r = bt->pos ? bt->pos[n] : n, b = r / T, t = r % T;
        float *src = qkv + (size_t)n * nqkv;
        if (L->q_norm) /* in place, per head: the unfused path norms a copy, the same bits */
            for (int i = 0; i < H + Hkv; i++)
                specdecode_rmsnorm(src + (size_t)i * D, i < H ? L->q_norm : L->k_norm, src + (size_t)i * D, 1, D,
                                   L->eps);
        const float *c = bt->cos + (size_t)r * D, *s = bt->sin + (size_t)r * D;
        for (int i = 0; i < H; i++) rope(src + (size_t)i * D, c, s, D, q + (((size_t)b * H + i) * T + t) * D);
        if (t >= bt->num_new[b]) continue; /* padding: nothing to cache */
        float kr[256]; /* D <= 256 */
        for (int i = 0; i < Hkv; i++) {
            const size_t idx = (((size_t)bt->slots[b] * Hkv + i) * bt->Lmax + bt->starts[b] + t) * D;
            rope(src + (size_t)(H + i) * D, c, s, D, kr);
            store(kc, idx, kr, D, bt->bf16);
            store(vc, idx, src + (size_t)(H + Hkv + i) * D, D, bt->bf16);
        }
    }
    if (specdecode_attention(q, kc, vc, bt->bf16, B, H, Hkv, T, D, bt->Lmax, bt->slots, bt->nkeys, bt->mask, bt->Lm,
                             bt->scale, o, threads))
        return -1;
    for (int n = 0; n < R; n++) { /* [B, H, T, D] -> [R, H D] */
        const int r = bt->pos ? bt->pos[n] : n, b = r / T, t = r % T;
        for (int i = 0; i < H; i++)
            memcpy(a + ((size_t)n * H + i) * D, o + (((size_t)b * H + i) * T + t) * D, sizeof(float) * D);
    }
    linear(&L->o, a, R, y, gs, threads);
    for (size_t i = 0; i < (size_t)R * hd; i++) x[i] = x[i] + y[i];
    specdecode_rmsnorm(x, L->post_norm, h, R, hd, L->eps);
    linear(&L->gate_up, h, R, gu, gs, threads);
    specdecode_silu_mul(gu, R, I, act, threads);
    linear(&L->down, act, R, y, gs, threads);
    for (size_t i = 0; i < (size_t)R * hd; i++) x[i] = x[i] + y[i];
    return 0;
}

/* x [N, hidden] float32 (the packed rows), updated in place to the layer's output; writes the new
 * tokens' keys and values (queries t < num_new[b]) at cache indices starts[b] + t of slot slots[b] in
 * kc, vc (this layer's cache). scratch: specdecode_layer_scratch bytes for B T rows, 64-byte aligned.
 * Returns 0, or -1 where attention could not allocate its scratch. */
int specdecode_decoder_layer(const sd_layer *L, const sd_batch *bt, void *kc, void *vc, float *x, void *scratch,
                             int threads) {
    return layer(L, bt, kc, vc, x, NULL, scratch, threads);
}

/* An EAGLE-3 draft head's decoder layer (models/eagle.py's step): as specdecode_decoder_layer, with x
 * the head's hidden input (its projected target features, or its previous output) and e [N, hidden]
 * the token embeddings beside it (packed as x); L->embed_norm is set and L->qkv.K = 2 hidden. */
int specdecode_eagle3_layer(const sd_layer *L, const sd_batch *bt, void *kc, void *vc, float *x, const float *e,
                            void *scratch, int threads) {
    return layer(L, bt, kc, vc, x, e, scratch, threads);
}

/* Layers [0, n) in order over the same batch and rows: layers[i] with its cache kc[i], vc[i]. A
 * stretch of layers is one call from Python instead of one per layer. capture: NULL, or n pointers
 * of which capture[i], where not NULL, receives a copy of layer i's output x [N, hidden] (the states a
 * drafter reads), so that capturing does not split the call. Returns 0, or -1 as above. */
int specdecode_decoder_layers(const sd_layer *const *layers, void *const *kc, void *const *vc, int n,
                              const sd_batch *bt, float *x, void *scratch, int threads, float *const *capture) {
    for (int i = 0; i < n; i++) {
        if (specdecode_decoder_layer(layers[i], bt, kc[i], vc[i], x, scratch, threads)) return -1;
        if (capture && capture[i]) memcpy(capture[i], x, sizeof(float) * (size_t)bt->N * layers[i]->hidden);
    }
    return 0;
}
