/* bench/stream.c: read bandwidth, the way a decode step reads its weights.

   A decode step streams every weight matrix from memory once, front to back, each
   thread taking a contiguous band of rows (run.c's `omp parallel for` over rows),
   and does one multiply-add per float. This kernel does the same reads with less
   arithmetic: a sum over a large float array (default 1 GiB, far bigger than the
   caches), split into contiguous static chunks across threads, with 64 independent
   partial sums (eight AVX registers' worth) so that the adds never limit the rate.
   Reported, in GB/s (1e9 bytes per second): the best of several passes (the peak),
   and all passes' bytes over all passes' time (what a reader sustains over that
   span, which on a shared machine includes the moments others take from it).

   Usage: stream [-m MIB] [-r REPS] [THREADS ...]     (default: 1024 MiB, 10 reps, 1 2)
   Output, one line per thread count:  threads N read GB/s X mean Y
   Without OpenMP every count runs on one thread; the line then says "(no OpenMP)". */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define LANES 64 // independent partial sums; the compiler keeps them in vector registers

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Sum of a[0..n), n a multiple of LANES. Lane l takes a[l], a[l+LANES], ...: the
// inner loop is a plain vector add per register, with no dependency between them.
static float sum_chunk(const float *a, size_t n) {
    float acc[LANES] = {0};
    for (size_t j = 0; j < n; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[j + l];
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

// One pass over the array with `threads` threads, each summing one contiguous chunk.
static double read_pass(const float *a, size_t n, int threads, float *sink) {
    size_t blocks = n / LANES;
    double t0 = now();
    float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = blocks * id / nt, hi = blocks * (id + 1) / nt;
        total += sum_chunk(a + lo * LANES, (hi - lo) * LANES);
    }
#else
    (void)threads;
    total = sum_chunk(a, blocks * LANES);
#endif
    double t1 = now();
    *sink += total;
    return t1 - t0;
}

int main(int argc, char **argv) {
    size_t mib = 1024;
    int reps = 10;
    int threads[16], n_threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-m") == 0 && i + 1 < argc) mib = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (n_threads < 16 && atoi(argv[i]) > 0) threads[n_threads++] = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: stream [-m MIB] [-r REPS] [THREADS ...]\n");
            return 2;
        }
    }
    if (n_threads == 0) {
        threads[0] = 1;
        threads[1] = 2;
        n_threads = 2;
    }
    if (mib == 0 || reps < 1) {
        fprintf(stderr, "stream: -m and -r must be positive\n");
        return 2;
    }
    size_t n = (mib << 20) / sizeof(float);
    n -= n % LANES;
    float *a = aligned_alloc(64, n * sizeof(float));
    if (!a) {
        fprintf(stderr, "stream: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    // first touch in parallel, in the same static split as the reads, so the pages
    // are spread the way the reading threads will use them
    size_t i;
#pragma omp parallel for schedule(static)
    for (i = 0; i < n; i++) a[i] = (float)(i & 1023) * 1e-3f;

    float sink = 0.0f;
    for (int t = 0; t < n_threads; t++) {
        read_pass(a, n, threads[t], &sink); // warm-up: page tables, thread pool
        double best = 1e30, total = 0.0;
        for (int r = 0; r < reps; r++) {
            double s = read_pass(a, n, threads[t], &sink);
            if (s < best) best = s;
            total += s;
        }
        double bytes = (double)n * sizeof(float);
#ifdef _OPENMP
        printf("threads %d read GB/s %.2f mean %.2f\n", threads[t], bytes / best / 1e9, bytes * reps / total / 1e9);
#else
        printf("threads %d read GB/s %.2f mean %.2f (no OpenMP)\n", threads[t], bytes / best / 1e9,
               bytes * reps / total / 1e9);
#endif
    }
    fprintf(stderr, "stream: %zu MiB, best of %d, checksum %g\n", mib, reps, (double)sink);
    free(a);
    return 0;
}
