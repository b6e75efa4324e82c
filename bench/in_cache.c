/* bench/in_cache.c: decode's arithmetic ceiling for each weight type, with run.c's own kernel.

   Decode multiplies each weight once a token, so it is bound either by memory (the
   bytes come no faster than the read bandwidth bench/stream measures) or by the work
   of turning each weight into a float32 multiply-add. A float32 weight needs one
   multiply-add; a bf16 one two more vector operations to widen it (zero-extend, shift);
   a Q8_0 one three (sign-extend, convert, multiply by the block's scale), all exact,
   so that the result is the float32 file's bit for bit. Which bound holds depends on
   the CPU. This probe measures the second with the first out of the way: every thread
   multiplies its own matrix of 64 rows of 768 weights (196 KB in float32, 52 KB in
   Q8_0: held in its core's L2 cache) by a vector, again and again, with run.c's
   decode kernel (matmul_rows: section 2 of "Making it fast", one thread's band), and
   prints the weights per second: the fastest decode could go on this CPU if memory
   were free. Decode's weights per second (tok/s x the matrices' weights) over this
   rate says how close to its arithmetic ceiling decode runs; near 100%, more
   bandwidth would not make it faster.
   Usage: in_cache [-r REPS] [-t MS] [-w TYPE] [THREADS ...]
   (default: 10 passes of about 50 ms, every type, 1 and 2 threads)
   Output, one line per thread count and weight type:
       threads N TYPE Gweights/s X mean Y
   (X the best pass, Y all passes' weights over their time, 1e9 weights a second, all
   threads together; TYPE f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k.) */
#define RUN_TESTING
#include "../run.c"

#define ROWS 64 // rows of each thread's matrix (a multiple of 4: decode's groups of four)
#define COLS 768 // weights a row: the 110M shape's dim (a multiple of 32: whole Q8_0 blocks)

// A ROWS x COLS matrix of `type` holding random weights (seeded by `seed`).
static void *random_matrix(WeightType type, unsigned seed) {
    size_t n = (size_t)ROWS * COLS, bytes = weight_bytes(type, n);
    unsigned char *m = malloc(bytes);
    if (!m) return NULL;
    srand(seed);
    if (is_block_type(type)) { // random bytes, then each scale (d; m or dmin) near 0.004-0.008
        BlockShape b = block_shapes[type];
        for (size_t i = 0; i < bytes; i++) m[i] = (unsigned char)rand();
        for (size_t i = 0; i < n / b.weights; i++)
            for (int s = 0; s < 2 && scale_places[type][s] >= 0; s++) {
                uint16_t d = (uint16_t)(0x1c00 + rand() % 0x400);
                memcpy(m + i * b.bytes + scale_places[type][s], &d, sizeof(d));
            }
        return m;
    }
    for (size_t i = 0; i < n; i++) {
        float w = (float)rand() / RAND_MAX - 0.5f;
        if (type == WEIGHT_F32) {
            memcpy(m + 4 * i, &w, 4);
        } else { // a 16-bit value: bf16 is float32's top half; an f16 of the same size
            uint32_t bits;
            memcpy(&bits, &w, 4);
            uint16_t h = type == WEIGHT_BF16 ? (uint16_t)(bits >> 16) : (uint16_t)(0x3000 + rand() % 0x1000);
            memcpy(m + 2 * i, &h, 2);
        }
    }
    return m;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// One pass: every thread multiplies its matrix `calls` times. Returns the seconds.
// (The sizes are read from here at run time, so that the compiler cannot specialise
// run.c's kernel for them: decode's matrices have their sizes from the file.)
static volatile int rows_v = ROWS, cols_v = COLS;

static double one_pass(void **matrices, WeightType type, int threads, long calls) {
    int rows = rows_v, cols = cols_v;
    double t0 = seconds_now();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        int k = 0;
#ifdef _OPENMP
        k = omp_get_thread_num();
#endif
        float x[COLS], out[ROWS];
        for (int i = 0; i < COLS; i++) x[i] = (float)((i * 37 + k) % 101) / 101.0f - 0.5f;
        Matrix w = {matrices[k], type};
        for (long c = 0; c < calls; c++) {
            matmul_rows(out, x, w, cols, rows);
            x[c % COLS] += out[c % ROWS] * 1e-9f; // the next call depends on this one
        }
    }
    return seconds_now() - t0;
}

int main(int argc, char **argv) {
    int reps = 10, ms = 50, counts[16], n_counts = 0, only = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-w") && i + 1 < argc) {
            i++;
            for (int t = 0; t < N_WEIGHT_TYPES; t++)
                if (t != WEIGHT_TYPE_PER_PIECE && !strcmp(argv[i], weight_type_names[t])) only = t;
            if (only < 0) {
                fprintf(stderr, "in_cache: -w takes a weight type (f32, bf16, f16, q8_0, q4_0 ... q6_k), not %s\n",
                        argv[i]);
                return 1;
            }
        }
        else if (n_counts < 16 && atoi(argv[i]) > 0) counts[n_counts++] = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: in_cache [-r REPS] [-t MS] [-w TYPE] [THREADS ...]\n");
            return 1;
        }
    }
    if (reps < 1 || ms < 1) {
        fprintf(stderr, "in_cache: -r and -t take positive numbers\n");
        return 1;
    }
    if (n_counts == 0) counts[n_counts++] = 1, counts[n_counts++] = 2;
    WeightType types[] = {WEIGHT_F32,  WEIGHT_BF16, WEIGHT_F16,  WEIGHT_Q8_0, WEIGHT_Q4_0, WEIGHT_Q4_1,
                          WEIGHT_Q5_0, WEIGHT_Q5_1, WEIGHT_Q4_K, WEIGHT_Q5_K, WEIGHT_Q6_K};
    for (int ci = 0; ci < n_counts; ci++) {
        int threads = counts[ci];
#ifndef _OPENMP
        threads = 1;
#endif
        for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
            WeightType type = types[ti];
            if (only >= 0 && (int)type != only) continue;
            void **matrices = calloc(threads, sizeof(void *));
            for (int k = 0; k < threads; k++)
                if (!(matrices[k] = random_matrix(type, 1 + k))) {
                    fprintf(stderr, "in_cache: out of memory\n");
                    return 1;
                }
            long calls = 1;
            while (one_pass(matrices, type, threads, calls) < ms * 1e-3) calls *= 2; // also warms the caches
            double best = 0, weights = 0, total = 0;
            for (int r = 0; r < reps; r++) {
                double s = one_pass(matrices, type, threads, calls), w = (double)threads * calls * ROWS * COLS;
                if (w / s > best) best = w / s;
                weights += w, total += s;
            }
            printf("threads %d %s Gweights/s %.2f mean %.2f%s\n", counts[ci], weight_type_names[type], best / 1e9,
                   weights / total / 1e9,
#ifdef _OPENMP
                   ""
#else
                   " (no OpenMP)"
#endif
            );
            fflush(stdout);
            for (int k = 0; k < threads; k++) free(matrices[k]);
            free(matrices);
        }
    }
    return 0;
}
