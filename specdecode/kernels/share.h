/* Sharing a GEMM's output tiles among a parallel region's threads, with stealing at the end.
 *
 * Why not OpenMP's static schedule: every GEMM ends at a barrier, so with equal shares a call lasts
 * as long as its slowest thread. On a VM or a laptop the cores rarely run at one speed (another
 * process, the hypervisor, a core's clock), and the faster thread waits at every barrier; a process
 * taking a slice of one core stalls both. OpenMP's dynamic schedule balances, but it deals out
 * interleaved chunks, which breaks each thread's one-direction stream that the software prefetch
 * (quant_gemm.c) follows.
 *
 * Here thread i owns the contiguous range [T i / n, T (i + 1) / n) and takes it from the front in
 * chunks of a few tiles, streaming forward as under the static schedule; a thread whose range is
 * empty takes chunks from the back of another's until every range is empty. Chunks shrink near a
 * range's end, so the threads finish about a tile apart. Stolen tiles are not handed on: a range only
 * shrinks, so a compare-and-swap cannot meet an old value again. A tile's outputs do not depend on
 * the thread that computes them, so the results keep their bits.
 *
 * A range is one 64-bit word (lo in the low half, hi in the high half) changed by compare-and-swap,
 * one per cache line so that owners do not share lines. Relaxed ordering is enough: the tiles' outputs
 * are disjoint and the region's closing barrier publishes them. */
#ifndef SPECDECODE_SHARE_H
#define SPECDECODE_SHARE_H
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    _Alignas(64) _Atomic uint64_t range; /* (hi << 32) | lo: tiles [lo, hi) not yet taken */
} tile_range;

/* Ranges for up to `count` (blocks x threads), kept per calling thread for its next call. */
static inline tile_range *tile_ranges(size_t count) {
    static _Thread_local tile_range *ranges;
    static _Thread_local size_t size;
    if (count > size) {
        free(ranges);
        ranges = aligned_alloc(64, count * sizeof(tile_range));
        size = ranges ? count : 0;
    }
    return ranges;
}

/* Before the parallel region: n threads' equal contiguous shares of T tiles. */
static inline void ranges_init(tile_range *r, int n, int T) {
    for (int i = 0; i < n; i++)
        atomic_store_explicit(&r[i].range, (uint64_t)((int64_t)T * (i + 1) / n) << 32 | (uint64_t)((int64_t)T * i / n),
                              memory_order_relaxed);
}

/* Tiles per chunk: ~64 KiB of weights, so that a chunk's compare-and-swap costs ~1 % of streaming it. */
static inline int share_chunk(size_t tile_bytes) {
    const size_t c = ((size_t)64 << 10) / tile_bytes;
    return c > 1 ? (int)c : 1;
}

/* The next tiles [*t0, *t0 + count) of range r: from the front (the owner) or from the back (a thief),
 * `chunk` of them, fewer near the range's end (a quarter of what is left, at least one), so that the
 * threads finish close together. 0 when the range is empty. */
static inline int range_take(tile_range *r, int chunk, int steal, int *t0) {
    uint64_t v = atomic_load_explicit(&r->range, memory_order_relaxed);
    for (;;) {
        const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
        if (lo >= hi) return 0;
        const uint32_t quarter = (hi - lo + 3) / 4, n = quarter < (uint32_t)chunk ? quarter : (uint32_t)chunk;
        const uint64_t next = steal ? (uint64_t)(hi - n) << 32 | lo : (uint64_t)hi << 32 | (lo + n);
        if (atomic_compare_exchange_weak_explicit(&r->range, &v, next, memory_order_relaxed, memory_order_relaxed)) {
            *t0 = (int)(steal ? hi - n : lo);
            return (int)n;
        }
    }
}

/* Inside the region: thread ``me``'s (of ``n``) next tiles, its own range first, then the others' in
 * turn. Returns the count (0: no tile is left anywhere). */
static inline int tiles_next(tile_range *r, int me, int n, int chunk, int *t0) {
    int got = range_take(&r[me], chunk, 0, t0);
    for (int k = 1; !got && k < n; k++) got = range_take(&r[(me + k) % n], chunk, 1, t0);
    return got;
}
#endif
