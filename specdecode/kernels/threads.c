/* The OpenMP thread pool of the calling thread.
 *
 * Why: libgomp keeps one pool of worker threads per thread that opened a parallel region, and once
 * it manages more threads than the machine has CPUs it stops spin-waiting between regions
 * ("throttled" spinning: ~100 iterations instead of ~300k). A decode step opens ~150 short parallel
 * regions, so throttled workers sleep and wake between them: a one-row GEMV took ~28 % longer when
 * the server's engine thread ran it while the main thread, which had loaded the model, still held
 * its own pool. Releasing the main thread's pool before the engine thread takes over brings the
 * count back within the CPUs. */
#include <omp.h>

/* Frees the calling thread's pool (its workers exit); a later parallel region on this thread builds
 * a new one. Returns 0, or -1 when called inside a parallel region. */
int specdecode_release_threads(void) { return omp_pause_resource_all(omp_pause_hard); }
