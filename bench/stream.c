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
   Output, one line per thread count:  threads N read GB/s X mean Y streams S
   (S: 1 or 4 streams per thread, whichever read faster in the warm-up passes)
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

// The same sum over four streams at once, a quarter of the chunk apart, the way
// run.c's decode matmul reads its rows (dot_rows4): 16 partial sums per stream.
// Some CPUs read faster this way, some with one stream (measured on AMD Zen 4, 2
// threads: 41-46 GB/s against 30-32), so a reading takes the faster of the two.
static float sum_chunk_4streams(const float *a, size_t n) {
    enum { STREAM_LANES = 16 };
    size_t quarter = n / 4 / STREAM_LANES * STREAM_LANES;
    float acc[4][STREAM_LANES] = {{0}};
    for (size_t j = 0; j < quarter; j += STREAM_LANES)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < STREAM_LANES; l++) acc[s][l] += a[s * quarter + j + l];
    float total = 0.0f;
    for (int s = 0; s < 4; s++)
        for (int l = 0; l < STREAM_LANES; l++) total += acc[s][l];
    for (size_t j = 4 * quarter; j < n; j++) total += a[j];
    return total;
}

static float sum_chunk_as(int four_streams, const float *a, size_t n) {
    return four_streams ? sum_chunk_4streams(a, n) : sum_chunk(a, n);
}

// One pass over the array with `threads` threads, each summing one contiguous chunk.
static double read_pass(const float *a, size_t n, int threads, int four_streams, float *sink) {
    size_t blocks = n / LANES;
    double t0 = now();
    float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = blocks * id / nt, hi = blocks * (id + 1) / nt;
        total += sum_chunk_as(four_streams, a + lo * LANES, (hi - lo) * LANES);
    }
#else
    (void)threads;
    total = sum_chunk_as(four_streams, a, blocks * LANES);
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
        // warm-up (page tables, thread pool), and which pattern reads faster here
        double one = 1e30, four = 1e30;
        for (int r = 0; r < 2; r++) {
            double s1 = read_pass(a, n, threads[t], 0, &sink), s4 = read_pass(a, n, threads[t], 1, &sink);
            one = s1 < one ? s1 : one;
            four = s4 < four ? s4 : four;
        }
        int four_streams = four < one;
        double best = 1e30, total = 0.0;
        for (int r = 0; r < reps; r++) {
            double s = read_pass(a, n, threads[t], four_streams, &sink);
            if (s < best) best = s;
            total += s;
        }
        double bytes = (double)n * sizeof(float);
#ifdef _OPENMP
        printf("threads %d read GB/s %.2f mean %.2f streams %d\n", threads[t], bytes / best / 1e9,
               bytes * reps / total / 1e9, four_streams ? 4 : 1);
#else
        printf("threads %d read GB/s %.2f mean %.2f streams %d (no OpenMP)\n", threads[t], bytes / best / 1e9,
               bytes * reps / total / 1e9, four_streams ? 4 : 1);
#endif
    }
    fprintf(stderr, "stream: %zu MiB, best of %d, checksum %g\n", mib, reps, (double)sink);
    free(a);
    return 0;
}
