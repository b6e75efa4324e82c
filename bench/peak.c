/* bench/peak.c: peak single-precision arithmetic, the ceiling a prefill works under.

   A prefill multiplies blocks of tokens by the weight matrices: for each weight it
   reads, it does many multiply-adds, so it is bound by the vector units, not by
   memory. This kernel measures what those units give with no memory traffic at all:
   every thread runs ACC independent chains x = x * m + x on vectors held in
   registers (a fused multiply-add where the target has one, two flops per lane;
   x the addend, as ARM's fmla wants it, so that no register needs copying).
   One chain would wait for each result (an FMA's latency, about 4 cycles, against
   2 or more issued per cycle), so there are enough chains to cover latency times
   throughput (8 on x86 cores with two FMA pipes, 16 on ARM cores with four) and
   few enough that they stay in registers with m (16 vector registers on AVX2, 32
   on AVX-512 and NEON): 12 and 24. Measured on AMD Zen 5, one thread: AVX-512 gives
   126 GFLOP/s with 8 chains and 218 with 12, 16 or 24; AVX2 100 with 8, 109 with
   12 to 15, and 67 with 16, which no longer fit. The vectors are GCC's vector types, so one source serves every
   target: 64 bytes with AVX-512, 32 with AVX, 16 with NEON or SSE, and the compiler
   splits them into whatever the target has otherwise. Build with -O3 -march=native
   (or -mcpu=native) and -ffp-contract=fast, which lets x * m + x become one FMA.
   Reported, in GFLOP/s (1e9 flops per second, all threads together): the best of
   several passes (the peak) and all passes' flops over all passes' time.

   Usage: peak [-r REPS] [-t MS] [THREADS ...]     (default: 10 reps of about 50 ms, 1 2)
   Output, one line per thread count:
       threads N peak GFLOP/s X mean Y isa I lanes L accumulators A fma F
   (I: the vector instructions compiled for; F: 1 when x * m + x is one fused
   instruction, 0 when a multiply and an add.) Without OpenMP every count runs on
   one thread; the line then ends "(no OpenMP)". */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__)
#define VBYTES 64
#define ACC 24
#define ISA "avx512"
#elif defined(__AVX__)
#define VBYTES 32
#define ACC 12
#define ISA "avx"
#elif defined(__aarch64__) || defined(__ARM_NEON)
#define VBYTES 16
#define ACC 24
#define ISA "neon"
#elif defined(__SSE2__)
#define VBYTES 16
#define ACC 12
#define ISA "sse"
#else
#define VBYTES 16
#define ACC 8
#define ISA "generic"
#endif
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__aarch64__)
#define FUSED 1
#else
#define FUSED 0
#endif
#define LANES (VBYTES / (int)sizeof(float))

typedef float vfloat __attribute__((vector_size(VBYTES)));

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// m, read as the program runs so that the compiler cannot fold the chains. With m =
// 2^-30, x * m is below half of x's last place, so x * m + x rounds to x: the values
// never drift toward denormals or infinities, which would slow the arithmetic.
static volatile float m_start = 0x1p-30f;

// ACC chains of `iters` steps each; returns a sum of the results, for the checksum.
static float chains(long iters) {
    vfloat m, x[ACC];
    for (int l = 0; l < LANES; l++) m[l] = m_start;
    for (int k = 0; k < ACC; k++)
        for (int l = 0; l < LANES; l++) x[k][l] = 1.0f + (float)(k * LANES + l) * 1e-3f;
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 32
        for (int k = 0; k < ACC; k++) x[k] = x[k] * m + x[k];
    }
    float s = 0.0f;
    for (int k = 0; k < ACC; k++)
        for (int l = 0; l < LANES; l++) s += x[k][l];
    return s;
}

// One pass: `threads` threads, each running the chains `iters` steps; its seconds.
static double pass(long iters, int threads, float *sink) {
    double t0 = now();
    float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
    total += chains(iters);
#else
    (void)threads;
    total = chains(iters);
#endif
    double t1 = now();
    *sink += total;
    return t1 - t0;
}

int main(int argc, char **argv) {
    int reps = 10, ms = 50;
    int threads[16], n_threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) ms = atoi(argv[++i]);
        else if (n_threads < 16 && atoi(argv[i]) > 0) threads[n_threads++] = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: peak [-r REPS] [-t MS] [THREADS ...]\n");
            return 2;
        }
    }
    if (n_threads == 0) {
        threads[0] = 1;
        threads[1] = 2;
        n_threads = 2;
    }
    if (reps < 1 || ms < 1) {
        fprintf(stderr, "peak: -r and -t must be positive\n");
        return 2;
    }

    float sink = 0.0f;
    // steps per pass: about `ms` milliseconds on one thread, from a short trial
    long iters = 1 << 16;
    double trial;
    while ((trial = pass(iters, 1, &sink)) < 0.01) iters *= 2;
    iters = (long)(iters * (ms * 1e-3 / trial)) + 1;

    double flops_per_thread = 2.0 * LANES * ACC * (double)iters;
    for (int t = 0; t < n_threads; t++) {
        pass(iters, threads[t], &sink); // warm-up: the thread pool, the clocks
        double best = 1e30, total = 0.0;
        for (int r = 0; r < reps; r++) {
            double s = pass(iters, threads[t], &sink);
            if (s < best) best = s;
            total += s;
        }
#ifdef _OPENMP
        int used = threads[t];
        const char *note = "";
#else
        int used = 1;
        const char *note = " (no OpenMP)";
#endif
        double flops = flops_per_thread * used;
        printf("threads %d peak GFLOP/s %.1f mean %.1f isa %s lanes %d accumulators %d fma %d%s\n", threads[t],
               flops / best / 1e9, flops * reps / total / 1e9, ISA, LANES, ACC, FUSED, note);
    }
    fprintf(stderr, "peak: %ld steps per pass, best of %d, checksum %g\n", iters, reps, (double)sink);
    return 0;
}
