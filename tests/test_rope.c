// Unit tests of the RoPE code and the kernels in run.c, against the definitions.
// Build: see `make test`. Usage: tests/test_rope [stories260K.bin]
#define RUN_TESTING
#include "../run.c"

static int n_passed = 0, n_failed = 0;

static void check(int ok, const char *name, const char *detail) {
    if (ok) {
        n_passed++;
        printf("ok   %s\n", name);
    } else {
        n_failed++;
        printf("FAIL %s: %s\n", name, detail);
    }
}

// A config with only what the RoPE code reads.
static Config rope_config(int head_size, float theta, float fraction) {
    Config c = {0};
    c.dim = head_size;
    c.n_heads = 1;
    c.n_kv_heads = 1;
    c.rope_theta = theta;
    c.rope_fraction = fraction;
    c.rope_factor = 1.0f;
    c.rope_original_len = 64;
    return c;
}

static void random_vector(float *v, int n, unsigned long long *rng) {
    for (int i = 0; i < n; i++) v[i] = random_f32(rng) * 2.0f - 1.0f;
}

// RoFormer's R(theta, m): block diagonal, block i = [[cos, -sin], [sin, cos]] of
// angle m * theta^(-2i/d) for the rotated pairs, the identity for the rest. Built
// in double from the definition, independent of rope_frequency().
static void rotation_matrix(double *R, int d, double theta, int n_rotated, int m) {
    memset(R, 0, sizeof(double) * d * d);
    for (int i = 0; i < d / 2; i++) {
        double a = i < n_rotated ? m * pow(theta, -2.0 * i / d) : 0.0;
        R[(2 * i) * d + 2 * i] = cos(a);
        R[(2 * i) * d + 2 * i + 1] = -sin(a);
        R[(2 * i + 1) * d + 2 * i] = sin(a);
        R[(2 * i + 1) * d + 2 * i + 1] = cos(a);
    }
}

static double score_at(const Config *c, const float *q0, const float *k0, int m, int n) {
    float q[256], k[256];
    int d = head_size_of(c);
    memcpy(q, q0, d * sizeof(float));
    memcpy(k, k0, d * sizeof(float));
    rope_rotate_head(q, c, m);
    rope_rotate_head(k, c, n);
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)q[i] * k[i];
    return s;
}

static void test_rotation_equals_block_diagonal_matrix(void) {
    static const float fractions[] = {1.0f, 0.75f, 0.5f, 0.25f, 0.0f};
    static const float thetas[] = {10000.0f, 500000.0f};
    unsigned long long rng = 42;
    double worst = 0;
    for (int fi = 0; fi < 5; fi++)
        for (int ti = 0; ti < 2; ti++)
            for (int m = 0; m < 300; m += 37) {
                int d = 16;
                Config c = rope_config(d, thetas[ti], fractions[fi]);
                float x[16], y[16];
                double R[16 * 16];
                random_vector(x, d, &rng);
                memcpy(y, x, sizeof(x));
                rope_rotate_head(y, &c, m);
                rotation_matrix(R, d, thetas[ti], (int)(fractions[fi] * d / 2), m);
                for (int r = 0; r < d; r++) {
                    double expect = 0;
                    for (int j = 0; j < d; j++) expect += R[r * d + j] * x[j];
                    double err = fabs(expect - y[r]);
                    if (err > worst) worst = err;
                }
            }
    char detail[64];
    snprintf(detail, sizeof(detail), "max abs error %g", worst);
    check(worst < 1e-4, "rotation_equals_block_diagonal_matrix_R(theta,m)", detail);
}

static void test_score_depends_only_on_relative_position(void) {
    static const float fractions[] = {1.0f, 0.5f, 0.0f};
    unsigned long long rng = 7;
    double worst = 0;
    for (int fi = 0; fi < 3; fi++) {
        Config c = rope_config(64, 10000.0f, fractions[fi]);
        float q[64], k[64];
        random_vector(q, 64, &rng);
        random_vector(k, 64, &rng);
        static const int offsets[] = {0, 1, 5, 17, 100};
        for (int oi = 0; oi < 5; oi++) {
            int delta = offsets[oi];
            double base = score_at(&c, q, k, delta, 0);
            static const int shifts[] = {1, 3, 50, 200};
            for (int si = 0; si < 4; si++) {
                double s = score_at(&c, q, k, delta + shifts[si], shifts[si]);
                double err = fabs(s - base) / (fabs(base) + 1e-6);
                if (err > worst) worst = err;
            }
        }
    }
    char detail[64];
    snprintf(detail, sizeof(detail), "max relative change %g", worst);
    check(worst < 1e-4, "score_q_m_k_n_depends_only_on_m_minus_n", detail);
}

static void test_rotation_preserves_norm(void) {
    unsigned long long rng = 3;
    double worst = 0;
    Config c = rope_config(128, 10000.0f, 1.0f);
    for (int pos = 0; pos < 4096; pos += 97) {
        float x[128];
        random_vector(x, 128, &rng);
        double before = 0, after = 0;
        for (int i = 0; i < 128; i++) before += (double)x[i] * x[i];
        rope_rotate_head(x, &c, pos);
        for (int i = 0; i < 128; i++) after += (double)x[i] * x[i];
        double err = fabs(sqrt(after) - sqrt(before)) / sqrt(before);
        if (err > worst) worst = err;
    }
    char detail[64];
    snprintf(detail, sizeof(detail), "max relative norm change %g", worst);
    check(worst < 1e-5, "rotation_preserves_vector_norms", detail);
}

static void test_prope_leaves_unrotated_pairs_alone(void) {
    Config c = rope_config(16, 10000.0f, 0.5f); // 4 of 8 pairs rotate
    float x[16], y[16];
    unsigned long long rng = 9;
    random_vector(x, 16, &rng);
    memcpy(y, x, sizeof(x));
    rope_rotate_head(y, &c, 123);
    int untouched = memcmp(x + 8, y + 8, 8 * sizeof(float)) == 0;
    int rotated = memcmp(x, y, 8 * sizeof(float)) != 0;
    check(untouched && rotated, "prope_rotates_first_pairs_and_leaves_the_rest_bitwise", "pairs >= rope_angles changed");
}

static void test_rope_angles_is_floor_of_p_times_half_head(void) {
    // floor(p * d / 2), with p as stored in float32: 0.7 * 20 / 2 is 7, not 6
    struct { int d; float p; int expect; } cases[] = {
        {8, 1.0f, 4}, {8, 0.75f, 3}, {8, 0.5f, 2}, {8, 0.25f, 1}, {8, 0.0f, 0}, {8, 0.3f, 1},
        {20, 0.7f, 7}, {64, 0.1f, 3}, {128, 0.999f, 63}, {16, 0.4375f, 3}};
    int ok = 1;
    char detail[96] = "";
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Config c = rope_config(cases[i].d, 10000.0f, cases[i].p);
        int got = rope_angles_of(&c);
        if (got != cases[i].expect) {
            ok = 0;
            snprintf(detail, sizeof(detail), "d=%d p=%g: got %d, expected %d", cases[i].d, cases[i].p, got, cases[i].expect);
        }
    }
    check(ok, "rope_angles_is_floor_of_p_times_half_head_size", detail);
}

static void test_table_rope_equals_plain_rope(void) {
    Config c = rope_config(32, 500000.0f, 0.75f);
    c.seq_len = 300;
    int n = rope_angles_of(&c);
    float *cos_t = malloc(sizeof(float) * c.seq_len * n), *sin_t = malloc(sizeof(float) * c.seq_len * n);
    rope_build_tables(cos_t, sin_t, &c);
    unsigned long long rng = 11;
    int same = 1;
    for (int pos = 0; pos < c.seq_len; pos += 13) {
        float a[32], b[32];
        random_vector(a, 32, &rng);
        memcpy(b, a, sizeof(a));
        rope_rotate_head(a, &c, pos);
        rope_apply(b, 1, 32, n, cos_t + pos * n, sin_t + pos * n);
        same &= memcmp(a, b, sizeof(a)) == 0;
    }
    free(cos_t);
    free(sin_t);
    check(same, "table_driven_rope_apply_equals_plain_rope_bitwise", "differs");
}

static void test_rope_frequencies_follow_theta(void) {
    // omega_i = theta^(-2i/d): omega_0 = 1, and omega_{d/2-1} = theta^(-(d-2)/d)
    Config c = rope_config(64, 10000.0f, 1.0f);
    double w0 = rope_frequency(&c, 0), wl = rope_frequency(&c, 31), expect = pow(10000.0, -62.0 / 64.0);
    c.rope_scaling = ROPE_SCALING_LINEAR;
    c.rope_factor = 4.0f;
    double scaled = rope_frequency(&c, 5), expect_scaled = pow(10000.0, -10.0 / 64.0) / 4.0;
    check(w0 == 1.0 && fabs(wl - expect) / expect < 1e-6 && fabs(scaled - expect_scaled) / expect_scaled < 1e-6,
          "rope_frequency_is_theta_pow_minus_2i_over_d_divided_by_scale", "wrong frequency");
}

// the kernels: matmul and matmul_tiled against a double-precision plain loop, and
// matmul against its plain form, one dot() per row, bit for bit. n a multiple of
// eight takes the kernels' in-register lane sums, n = 8k + 5 their tail. d = 23
// rows (five groups of four and three left over) is below PARALLEL_MIN_WORK, one
// thread; d = 251 is above it, split across threads.
static void test_matmul_kernels_agree(int n, int d, const char *close_name, const char *exact_name,
                                      const char *plain_name) {
    int B = 19; // partial tiles of rows and tokens
    float *w = malloc(sizeof(float) * n * d), *x = malloc(sizeof(float) * n * B);
    float *one = malloc(sizeof(float) * d * B), *block = malloc(sizeof(float) * d * B);
    float *scratch = malloc(sizeof(float) * n * (B + TILE_TOKENS)); // B rounded up to whole tiles
    unsigned long long rng = 5;
    random_vector(w, n * d, &rng);
    random_vector(x, n * B, &rng);
    for (int b = 0; b < B; b++) matmul(one + b * d, x + b * n, f32_matrix(w), n, d);
    matmul_tiled(block, x, f32_matrix(w), B, n, d, scratch);
    double worst = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < d; i++) {
            double ref = 0;
            for (int j = 0; j < n; j++) ref += (double)w[i * n + j] * x[b * n + j];
            double err = fabs(ref - one[b * d + i]);
            if (err > worst) worst = err;
        }
    char detail[96];
    snprintf(detail, sizeof(detail), "max abs error vs double %g; block==single: %d", worst,
             memcmp(one, block, sizeof(float) * d * B) == 0);
    check(worst < 1e-4, close_name, detail);
    check(memcmp(one, block, sizeof(float) * d * B) == 0, exact_name, detail);
    int plain = 1;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < d; i++) plain &= one[b * d + i] == dot(w + (size_t)i * n, x + b * n, n);
    check(plain, plain_name, "a row differs from dot()");
    free(w);
    free(x);
    free(one);
    free(block);
    free(scratch);
}

// The 16-bit weight types, widened by the definitions (IEEE 754 binary16; bf16 the
// top half of a binary32), in double arithmetic, independently of run.c's widen():
// sign s, exponent field e, fraction f of `fraction_bits` bits, exponent bias `bias`.
static double widened_by_definition(unsigned s, unsigned e, unsigned f, int fraction_bits, int bias) {
    double magnitude = e == 0 ? ldexp(f, 1 - bias - fraction_bits)                           // subnormal
                              : ldexp((double)f + ldexp(1, fraction_bits), (int)e - bias - fraction_bits);
    return s ? -magnitude : magnitude;
}

// every one of the 65536 f16 values: f16_to_f32 (the plain path) gives the value of
// the definition (inf as inf; NaN as a quiet NaN), and the SIMD widening gives the
// same bits
static void test_f16_widening_is_exact_for_every_half(void) {
    int exact = 1, lanes_agree = 1;
    for (unsigned h = 0; h < 65536; h++) {
        unsigned s = h >> 15, e = (h >> 10) & 31, f = h & 1023;
        float got = f16_to_f32((uint16_t)h);
        uint32_t bits;
        memcpy(&bits, &got, sizeof(bits));
        if (e == 31 && f != 0) exact &= isnan(got) && (bits & 0x400000u) && (bits >> 31) == s;
        else if (e == 31) exact &= isinf(got) && (got < 0) == (s == 1);
        else exact &= (double)got == widened_by_definition(s, e, f, 10, 15) && (bits >> 31) == s; // -0 keeps its sign
    }
#ifdef USE_SIMD
    uint16_t halves[8];
    float lanes[8];
    for (unsigned h = 0; h < 65536; h += 8) {
        for (unsigned l = 0; l < 8; l++) halves[l] = (uint16_t)(h + l);
        lanes_store(lanes, lanes_load_weights(halves, 0, WEIGHT_F16));
        for (unsigned l = 0; l < 8; l++) {
            float plain = f16_to_f32(halves[l]);
            lanes_agree &= memcmp(&plain, &lanes[l], sizeof(float)) == 0;
        }
    }
#endif
    check(exact, "f16_widening_equals_the_ieee_definition_for_every_half", "a value differs");
    check(lanes_agree, "f16_simd_widening_equals_plain_widening_bitwise_for_every_half", "a lane differs");
}

// every bf16 value: the plain and the SIMD widening give its float32 (the bits
// shifted up), by the definition for the finite ones
static void test_bf16_widening_is_exact_for_every_value(void) {
    int exact = 1, lanes_agree = 1;
    for (unsigned h = 0; h < 65536; h++) {
        unsigned s = h >> 15, e = (h >> 7) & 255, f = h & 127;
        float got = bf16_to_f32((uint16_t)h);
        if (e != 255) exact &= (double)got == widened_by_definition(s, e, f, 7, 127);
        else exact &= f ? isnan(got) : isinf(got);
    }
#ifdef USE_SIMD
    uint16_t values[8];
    float lanes[8];
    for (unsigned h = 0; h < 65536; h += 8) {
        for (unsigned l = 0; l < 8; l++) values[l] = (uint16_t)(h + l);
        lanes_store(lanes, lanes_load_weights(values, 0, WEIGHT_BF16));
        for (unsigned l = 0; l < 8; l++) {
            float plain = bf16_to_f32(values[l]);
            lanes_agree &= memcmp(&plain, &lanes[l], sizeof(float)) == 0;
        }
    }
#endif
    check(exact, "bf16_widening_equals_the_definition_for_every_value", "a value differs");
    check(lanes_agree, "bf16_simd_widening_equals_plain_widening_bitwise_for_every_value", "a lane differs");
}

// Random finite 16-bit weights of `type` and their values by the definition, as
// float32 (exact: every such value is a float32). f16 exponents 0..16 (subnormals
// included, magnitudes below 4); bf16 exponents 0 (subnormal) and 112..128.
static void random_16bit_weights(uint16_t *h, float *widened, size_t count, WeightType type, unsigned long long *rng) {
    for (size_t i = 0; i < count; i++) {
        unsigned r = random_u32(rng), s = r & 1, e, f;
        if (type == WEIGHT_F16) {
            e = (r >> 1) % 17, f = (r >> 6) & 1023;
            h[i] = (uint16_t)(s << 15 | e << 10 | f);
            widened[i] = (float)widened_by_definition(s, e, f, 10, 15);
        } else {
            e = (r >> 1) % 18, f = (r >> 6) & 127;
            e = e == 0 ? 0 : e + 111;
            h[i] = (uint16_t)(s << 15 | e << 7 | f);
            widened[i] = (float)widened_by_definition(s, e, f, 7, 127);
        }
    }
}

// A 16-bit matrix computes the bits of the float32 matrix holding its widened
// weights: matmul (decode rows, threads), matmul_tiled (prefill tiles) and the plain
// loops (use_fast_kernels = 0), against matmul on the float32 matrix.
static void test_16bit_matmul_equals_widened_f32(WeightType type, int n, int d, const char *what) {
    int B = 19;
    uint16_t *h = malloc(sizeof(uint16_t) * n * d);
    float *w = malloc(sizeof(float) * n * d), *x = malloc(sizeof(float) * n * B);
    float *ref = malloc(sizeof(float) * d * B), *one = malloc(sizeof(float) * d * B);
    float *block = malloc(sizeof(float) * d * B), *plain = malloc(sizeof(float) * d * B);
    float *scratch = malloc(sizeof(float) * n * (B + TILE_TOKENS));
    unsigned long long rng = 17;
    random_16bit_weights(h, w, (size_t)n * d, type, &rng);
    random_vector(x, n * B, &rng);
    Matrix m = {h, type};
    for (int b = 0; b < B; b++) matmul(ref + b * d, x + b * n, f32_matrix(w), n, d);
    for (int b = 0; b < B; b++) matmul(one + b * d, x + b * n, m, n, d);
    matmul_tiled(block, x, m, B, n, d, scratch);
    use_fast_kernels = 0;
    for (int b = 0; b < B; b++) matmul(plain + b * d, x + b * n, m, n, d);
    use_fast_kernels = 1;
    size_t bytes = sizeof(float) * d * B;
    int decode = memcmp(ref, one, bytes) == 0, prefill = memcmp(ref, block, bytes) == 0;
    int plain_same = memcmp(ref, plain, bytes) == 0;
    char name[160], detail[96];
    snprintf(name, sizeof(name), "%s_matmul_decode_prefill_and_plain_equal_float32_of_widened_weights_bitwise_%s",
             weight_type_names[type], what);
    snprintf(detail, sizeof(detail), "n %d d %d: decode %d, prefill tiles %d, plain loops %d", n, d, decode, prefill,
             plain_same);
    check(decode && prefill && plain_same, name, detail);
    free(h), free(w), free(x), free(ref), free(one), free(block), free(plain), free(scratch);
}

// the decode split: for any shares (uneven, one of them zero, summing to 1 only up
// to rounding) the threads' bands of rows follow each other and cover 0..rows-1,
// each row once
static void test_thread_bands_cover_every_row_once(void) {
    double shares[][4] = {{1.0}, {0.5, 0.5}, {0.9, 0.1}, {0.0, 1.0}, {0.3, 0.3, 0.4}, {0.1, 0.2, 0.3, 0.4 + 1e-12},
                          {0.25, 0.0, 0.5, 0.25 - 1e-12}};
    int n_threads[] = {1, 2, 2, 2, 3, 4, 4}, ok = 1;
    for (size_t c = 0; c < sizeof(n_threads) / sizeof(n_threads[0]); c++)
        for (int rows = 0; rows <= 70; rows++) {
            int next = 0;
            for (int k = 0; k < n_threads[c]; k++) {
                int lo, hi;
                band_of_thread(shares[c], k, n_threads[c], rows, &lo, &hi);
                ok &= lo == next && hi >= lo;
                next = hi;
            }
            ok &= next == rows;
        }
    check(ok, "thread_bands_cover_every_row_once", "a band overlaps, leaves a gap, or misses the end");
}

// the decode split moves towards the measured speeds: a thread twice as fast ends
// with twice the rows, and the shares still sum to 1; threads equally fast up to
// a 1% jitter keep an equal split exactly
static void test_row_split_follows_thread_speeds(void) {
    RowSplit split, steady;
    split_equally(&split, 2);
    split_equally(&steady, 2);
    for (int step = 0; step < 20 * SPLIT_WINDOW; step++) {
        // each thread's time is its share over its speed; thread 1 is twice as fast
        double seconds[2] = {split.share[0] / 1.0, split.share[1] / 2.0};
        double jitter[2] = {1e-3 * (step % 2 ? 1.01 : 1.0), 1e-3 * (step % 2 ? 1.0 : 1.01)};
        record_thread_times(&split, seconds);
        record_thread_times(&steady, jitter);
    }
    char detail[96];
    snprintf(detail, sizeof(detail), "shares %.3f %.3f and %.3f %.3f", split.share[0], split.share[1],
             steady.share[0], steady.share[1]);
    check(fabs(split.share[1] - 2.0 / 3.0) < SPLIT_DEADBAND && fabs(split.share[0] + split.share[1] - 1.0) < 1e-12,
          "row_split_gives_a_thread_twice_as_fast_twice_the_rows", detail);
    check(steady.share[0] == 0.5 && steady.share[1] == 0.5, "row_split_stays_equal_when_threads_are_equally_fast",
          detail);
}

// a threaded matmul under uneven shares (the last thread 80% of the rows) is still
// one dot() per row, bit for bit: no row is skipped or done twice
static void test_uneven_split_keeps_matmul_bitwise(int n, int d, const char *name) {
    float *w = malloc(sizeof(float) * n * d), *x = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * d);
    unsigned long long rng = 11;
    random_vector(w, n * d, &rng);
    random_vector(x, n, &rng);
    RowSplit saved = row_split;
    memset(&row_split, 0, sizeof(row_split));
    matmul(out, x, f32_matrix(w), n, d); // sets equal shares for this run's threads
    int threads = row_split.n_threads > 0 ? row_split.n_threads : 1, plain = 1;
    for (int k = 0; k < threads; k++) row_split.share[k] = threads == 1 ? 1.0 : k == threads - 1 ? 0.8 : 0.2 / (threads - 1);
    memset(out, 0, sizeof(float) * d);
    matmul(out, x, f32_matrix(w), n, d);
    for (int i = 0; i < d; i++) plain &= out[i] == dot(w + (size_t)i * n, x, n);
    row_split = saved;
    char detail[64];
    snprintf(detail, sizeof(detail), "%d threads", threads);
    check(plain, name, detail);
    free(w);
    free(x);
    free(out);
}

// The block options and per-layer choices of ROPE version 2, switched on over a
// loaded llama2.c model (stories260K: 5 layers, dim 64, 8 heads of 8, 4 kv heads), so
// that the forward-pass tests run the variant block too: q/k/v biases, q/k norms, post
// norms, GeGLU, an embedding multiplier, an attention scale, both soft-caps, a second
// RoPE setting, NoPE layers and sliding windows. The extra weights are made up.
enum { VARIANT_FLOATS = 1024 };
static float variant_bias[3][VARIANT_FLOATS], variant_qk_norm[2][VARIANT_FLOATS];
static int variant_layer0 = LAYER_NOPE; // layer 0's rotary choice (the shift tests vary it)

static int make_variant(Transformer *t) {
    Config *c = &t->config;
    TransformerWeights *w = &t->weights;
    if ((size_t)c->n_layers * q_dim_of(c) > VARIANT_FLOATS || c->n_layers < 4)
        return fail("the variant needs a model of at least 4 layers and at most %d query floats", VARIANT_FLOATS);
    unsigned long long rng = 99;
    for (int i = 0; i < 3; i++) random_vector(variant_bias[i], VARIANT_FLOATS, &rng);
    for (int i = 0; i < 2; i++) {
        random_vector(variant_qk_norm[i], VARIANT_FLOATS, &rng);
        for (int j = 0; j < VARIANT_FLOATS; j++) variant_qk_norm[i][j] = 1.0f + 0.1f * variant_qk_norm[i][j];
    }
    c->qkv_bias = c->qk_norm = c->post_norms = 1;
    w->bq = variant_bias[0], w->bk = variant_bias[1], w->bv = variant_bias[2];
    w->q_norm = variant_qk_norm[0], w->k_norm = variant_qk_norm[1];
    w->rms_post_att = w->rms_ffn, w->rms_post_ffn = w->rms_att; // any norm weights of the right shape
    c->activation = ACTIVATION_GEGLU_TANH;
    c->embedding_multiplier = 1.5f;
    c->attention_scale = 0.3f;
    c->attention_softcap = 5.0f;
    c->final_softcap = 20.0f;
    c->rope2.rope_theta = 500.0f, c->rope2.rope_fraction = 0.5f, c->rope2.rope_factor = 1.0f;
    c->rope2.rope_original_len = c->seq_len;
    c->layer_table_bytes = 8ull * c->n_layers; // (as loaded from a table: -m rope and inspect print it)
    int ropes[4] = {variant_layer0, LAYER_ROPE_SECOND, LAYER_ROPE_FIRST, LAYER_NOPE}, windows[4] = {0, 7, 0, 5};
    for (int l = 0; l < c->n_layers; l++) c->layer_rope[l] = ropes[l % 4], c->layer_window[l] = windows[l % 4];
    return 0;
}

static int use_variant = 0; // load_model: the checkpoint as it is, or with make_variant's block

// a checkpoint loaded with its run state, ready for forward(); nonzero (and
// error_message set) when either fails
static int load_model(Transformer *t, const char *checkpoint) {
    return load_checkpoint(t, checkpoint) || (use_variant && make_variant(t)) ||
           build_run_state(&t->state, &t->config);
}

// the forward pass: a prompt in blocks gives the same logits as token by token
static void test_block_forward_equals_token_forward(const char *checkpoint) {
    Transformer a, b;
    if (load_model(&a, checkpoint) || load_model(&b, checkpoint)) {
        check(0, "block_forward_equals_token_forward", error_message);
        return;
    }
    int V = a.config.vocab_size, n = 2 * PREFILL_BLOCK + 6; // two blocks and a partial one
    int tokens[2 * PREFILL_BLOCK + 6];
    for (int i = 0; i < n; i++) tokens[i] = (i * 37 + 11) % V;
    float *block_logits = malloc(sizeof(float) * V * n);
    for (int i = 0; i < n; i += PREFILL_BLOCK) {
        int len = n - i < PREFILL_BLOCK ? n - i : PREFILL_BLOCK;
        memcpy(block_logits + (size_t)i * V, forward_block(&a, tokens + i, len, i, LOGITS_ALL), sizeof(float) * V * len);
    }
    int same = 1;
    for (int i = 0; i < n; i++) same &= memcmp(forward(&b, tokens[i], i), block_logits + (size_t)i * V, sizeof(float) * V) == 0;
    check(same, use_variant ? "variant_block_forward_equals_token_by_token_forward_bitwise"
                      : "block_forward_equals_token_by_token_forward_bitwise",
          "logits differ");
    free(block_logits);
    free_transformer(&a);
    free_transformer(&b);
}

// the fast kernels ("Making it fast") against the plain loops of the forward pass
// (use_fast_kernels = 0): a prompt in blocks, then decoding steps, the same logits
// bit for bit
static void test_fast_forward_equals_plain_forward(const char *checkpoint) {
    Transformer a, b;
    if (load_model(&a, checkpoint) || load_model(&b, checkpoint)) {
        check(0, "fast_forward_equals_plain_forward", error_message);
        return;
    }
    int V = a.config.vocab_size, n = PREFILL_BLOCK + 9, same = 1;
    int tokens[PREFILL_BLOCK + 9];
    for (int i = 0; i < n; i++) tokens[i] = (i * 53 + 7) % V;
    float *fast = malloc(sizeof(float) * V);
    for (int step = 0; step < 2; step++) { // a prefill of n tokens, then 5 decoding steps
        for (int i = 0; i < (step == 0 ? 1 : 5); i++) {
            int pos = step == 0 ? 0 : n + i, token = (pos * 31 + 3) % V;
            use_fast_kernels = 1;
            const float *lf = step == 0 ? prefill(&a, tokens, n, 0) : forward(&a, token, pos);
            memcpy(fast, lf, sizeof(float) * V);
            use_fast_kernels = 0;
            const float *lp = step == 0 ? prefill(&b, tokens, n, 0) : forward(&b, token, pos);
            same &= memcmp(fast, lp, sizeof(float) * V) == 0;
        }
    }
    use_fast_kernels = 1;
    check(same, use_variant ? "variant_fast_kernels_forward_equals_plain_loops_forward_bitwise"
                      : "fast_kernels_forward_equals_plain_loops_forward_bitwise",
          "logits differ");
    free(fast);
    free_transformer(&a);
    free_transformer(&b);
}

// x rounded to the nearest bf16 / f16, ties to even (the test's own conversions;
// f16: finite |x| below 65504). bf16: add 0x7FFF plus the lowest kept bit, keep the
// top half. f16: |x| = m 2^(e-10) with m in [1024, 2048) rounded to an integer (the
// current rounding mode is to nearest even), or a multiple of 2^-24 below 2^-14.
static uint16_t bf16_nearest(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

static uint16_t f16_nearest(float x) {
    double a = fabs((double)x);
    unsigned sign = signbit(x) ? 1 : 0, bits;
    if (a < ldexp(1, -14)) {
        bits = (unsigned)nearbyint(ldexp(a, 24)); // 1024 (rounded up to the smallest normal) encodes right
    } else {
        int e = ilogb(a);
        unsigned m = (unsigned)nearbyint(ldexp(a, 10 - e));
        if (m == 2048) m = 1024, e++;
        bits = (unsigned)(e + 15) << 10 | (m - 1024);
    }
    return (uint16_t)(sign << 15 | bits);
}

// One of the model's matrices (count float32 weights) rounded to `type`; *widened
// gets the float32 copy of the rounded values, by the definition.
static Matrix rounded_matrix(Matrix m, size_t count, WeightType type, Matrix *widened) {
    uint16_t *h = malloc(sizeof(uint16_t) * count);
    float *w = malloc(sizeof(float) * count);
    for (size_t i = 0; i < count; i++) {
        float x = ((const float *)m.data)[i];
        h[i] = type == WEIGHT_BF16 ? bf16_nearest(x) : f16_nearest(x);
        unsigned s = h[i] >> 15;
        w[i] = (float)(type == WEIGHT_BF16 ? widened_by_definition(s, (h[i] >> 7) & 255, h[i] & 127, 7, 127)
                                           : widened_by_definition(s, (h[i] >> 10) & 31, h[i] & 1023, 10, 15));
    }
    *widened = f32_matrix(w);
    return (Matrix){h, type};
}

// A whole forward pass (a prompt in blocks, then decoding steps) of stories260K with
// its matrices and embedding rounded to bf16 (or f16) gives, bit for bit, the logits of
// the same model holding the widened values as float32: the fast kernels, and the plain
// loops (use_fast_kernels = 0) on the 16-bit weights.
static void test_16bit_forward_equals_widened_float32_forward(const char *checkpoint, WeightType type) {
    Transformer a, b, c;
    char name[96];
    snprintf(name, sizeof(name), "%s_forward_fast_and_plain_equals_float32_forward_of_widened_weights_bitwise",
             weight_type_names[type]);
    if (load_model(&a, checkpoint) || load_model(&b, checkpoint) || load_model(&c, checkpoint)) {
        check(0, name, error_message);
        return;
    }
    const Config *cf = &a.config;
    size_t dim = cf->dim, hidden = cf->hidden_dim, layers = cf->n_layers, kv = kv_dim_of(cf);
    Matrix *narrow[] = {&a.weights.token_embedding, &a.weights.wq, &a.weights.wk, &a.weights.wv, &a.weights.wo,
                        &a.weights.w1, &a.weights.w2, &a.weights.w3};
    Matrix *wide[] = {&b.weights.token_embedding, &b.weights.wq, &b.weights.wk, &b.weights.wv, &b.weights.wo,
                      &b.weights.w1, &b.weights.w2, &b.weights.w3};
    size_t counts[] = {cf->vocab_size * dim, layers * dim * dim, layers * kv * dim, layers * kv * dim,
                       layers * dim * dim, layers * hidden * dim, layers * dim * hidden, layers * hidden * dim};
    for (int i = 0; i < 8; i++) *narrow[i] = rounded_matrix(*narrow[i], counts[i], type, wide[i]);
    a.weights.wcls = a.weights.token_embedding; // stories260K shares its classifier
    b.weights.wcls = b.weights.token_embedding;
    c.weights = a.weights;
    int V = cf->vocab_size, n = PREFILL_BLOCK + 9, same = 1;
    int tokens[PREFILL_BLOCK + 9];
    for (int i = 0; i < n; i++) tokens[i] = (i * 53 + 7) % V;
    float *fast16 = malloc(sizeof(float) * V), *plain16 = malloc(sizeof(float) * V);
    for (int step = 0; step < 6; step++) { // a prefill of n tokens, then 5 decoding steps
        int pos = step == 0 ? 0 : n + step - 1, token = (pos * 31 + 3) % V;
        memcpy(fast16, step == 0 ? prefill(&a, tokens, n, 0) : forward(&a, token, pos), sizeof(float) * V);
        use_fast_kernels = 0;
        memcpy(plain16, step == 0 ? prefill(&c, tokens, n, 0) : forward(&c, token, pos), sizeof(float) * V);
        use_fast_kernels = 1;
        const float *f32 = step == 0 ? prefill(&b, tokens, n, 0) : forward(&b, token, pos);
        same &= memcmp(fast16, f32, sizeof(float) * V) == 0 && memcmp(plain16, f32, sizeof(float) * V) == 0;
    }
    check(same, name, "logits differ");
    for (int i = 0; i < 8; i++) {
        free((void *)narrow[i]->data);
        free((void *)wide[i]->data);
    }
    free(fast16);
    free(plain16);
    free_transformer(&a);
    free_transformer(&b);
    free_transformer(&c);
}

// The KV cache starts on a 2 MB boundary (where Linux can back it with huge pages)
// and holds every position of every layer: its last float can be written (an
// allocation rounded down would show here, under AddressSanitizer in `make test`).
static void test_kv_cache_sits_on_huge_page_boundaries(const char *checkpoint) {
    Transformer t;
    if (load_model(&t, checkpoint)) {
        check(0, "kv_cache_starts_on_huge_page_boundaries", error_message);
        return;
    }
    const Config *c = &t.config;
    size_t last = kv_cache_offset(c, c->n_layers - 1, c->n_kv_heads - 1, c->seq_len - 1) + head_size_of(c) - 1;
    t.state.key_cache[last] = 1.0f;
    t.state.value_cache[last] = 2.0f;
    check((uintptr_t)t.state.key_cache % HUGE_PAGE_BYTES == 0 && (uintptr_t)t.state.value_cache % HUGE_PAGE_BYTES == 0 &&
              t.state.key_cache[last] + t.state.value_cache[last] == 3.0f,
          "kv_cache_starts_on_huge_page_boundaries", "a cache is not 2 MB aligned");
    free_transformer(&t);
}

// Largest |a - b| over the layer-0 key (or value) vectors at positions lo..hi-1,
// relative to the largest |b| of the same head vector.
static double layer0_cache_error(const Config *c, const float *a, const float *b, int lo, int hi) {
    int head_size = head_size_of(c);
    double worst = 0;
    for (int kvh = 0; kvh < c->n_kv_heads; kvh++) {
        for (int pos = lo; pos < hi; pos++) {
            const float *x = a + kv_cache_offset(c, 0, kvh, pos), *y = b + kv_cache_offset(c, 0, kvh, pos);
            double scale = 0, err = 0;
            for (int i = 0; i < head_size; i++) {
                scale = fmax(scale, fabs(y[i]));
                err = fmax(err, fabs((double)x[i] - y[i]));
            }
            worst = fmax(worst, err / scale);
        }
    }
    return worst;
}

// --shift rotate: a run of 500 tokens drops positions 12..299 and moves the last
// 200 down to 12..211, re-rotating the cached keys. Layer 0's keys depend only on
// the token and its position, so they must equal the keys of a fresh run over
// the kept 212 tokens. A move that skipped the re-rotation must fail that check.
// rule: a RoPE scaling rule with factor 4 relative to 64 positions, or
// ROPE_SCALING_NONE; the shift must stay exact under each (a rule changes only the
// frequencies, and yarn's attention factor is in the cached keys already).
static void test_shifted_keys_equal_fresh_keys(const char *checkpoint, float fraction, RopeScaling rule,
                                               const char *name) {
    Transformer a, b;
    if (load_checkpoint(&a, checkpoint) || load_checkpoint(&b, checkpoint) ||
        (use_variant && (make_variant(&a) || make_variant(&b)))) {
        check(0, name, error_message);
        return;
    }
    if (use_variant) fraction = a.config.rope_fraction; // the variant's settings as they are
    a.config.rope_fraction = b.config.rope_fraction = fraction;
    if (rule != ROPE_SCALING_NONE) {
        a.config.rope_scaling = b.config.rope_scaling = rule;
        a.config.rope_factor = b.config.rope_factor = 4.0f;
        a.config.rope_original_len = b.config.rope_original_len = 64;
    }
    if (build_run_state(&a.state, &a.config) || build_run_state(&b.state, &b.config)) {
        check(0, name, error_message);
        return;
    }
    const Config *c = &a.config;
    enum { N = 500, KEEP = 12, FROM = 300 };
    int tokens[N], kept[N];
    for (int i = 0; i < N; i++) tokens[i] = 3 + (i * 7919 + 13) % (c->vocab_size - 3);
    int n_kept = 0;
    for (int i = 0; i < KEEP; i++) kept[n_kept++] = tokens[i];
    for (int i = FROM; i < N; i++) kept[n_kept++] = tokens[i];

    prefill(&a, tokens, N, 0);
    size_t cache_floats = (size_t)c->n_layers * c->n_kv_heads * c->seq_len * head_size_of(c);
    float *unshifted = malloc(cache_floats * sizeof(float));
    memcpy(unshifted, a.state.key_cache, cache_floats * sizeof(float));
    kv_cache_shift(&a, KEEP, FROM, N - FROM);
    prefill(&b, kept, n_kept, 0);

    double key_error = layer0_cache_error(c, a.state.key_cache, b.state.key_cache, 0, n_kept);
    double value_error = layer0_cache_error(c, a.state.value_cache, b.state.value_cache, 0, n_kept);
    // the same move without re-rotation: the old keys at the new positions
    for (int kvh = 0; kvh < c->n_kv_heads; kvh++)
        for (int j = 0; j < N - FROM; j++)
            memcpy(unshifted + kv_cache_offset(c, 0, kvh, KEEP + j), unshifted + kv_cache_offset(c, 0, kvh, FROM + j),
                   head_size_of(c) * sizeof(float));
    double unrotated_error = layer0_cache_error(c, unshifted, b.state.key_cache, 0, n_kept);
    char detail[160];
    snprintf(detail, sizeof(detail), "key error %.3g, value error %.3g, error without re-rotation %.3g", key_error,
             value_error, unrotated_error);
    printf("     (%s)\n", detail);
    if (c->layer_rope[0] == LAYER_NOPE) // a NoPE layer's keys carry no position: moved, they are the fresh ones exactly
        check(key_error == 0 && value_error == 0 && unrotated_error == 0, name, detail);
    else
        check(key_error <= 1e-5 && value_error == 0 && unrotated_error > 1e-2, name, detail);
    free(unshifted);
    free_transformer(&a);
    free_transformer(&b);
}

// A NoPE layer's cached keys depend on the token alone: the same token at positions
// 1, 2 and 40 leaves bit-identical keys in layer 0 of the variant (layer 0 NoPE), and
// different ones when layer 0 rotates (the check can fail).
static void test_nope_keys_do_not_depend_on_position(const char *checkpoint) {
    int same[2] = {0, 0};
    for (int rotates = 0; rotates < 2; rotates++) {
        variant_layer0 = rotates ? LAYER_ROPE_FIRST : LAYER_NOPE;
        Transformer t;
        if (load_model(&t, checkpoint)) {
            check(0, "nope_keys_do_not_depend_on_position", error_message);
            variant_layer0 = LAYER_NOPE;
            return;
        }
        const Config *c = &t.config;
        int tokens[41];
        for (int i = 0; i < 41; i++) tokens[i] = 3 + (i * 7 + 5) % (c->vocab_size - 3);
        tokens[1] = tokens[2] = tokens[40] = 77;
        prefill(&t, tokens, 41, 0);
        same[rotates] = 1;
        for (int kvh = 0; kvh < c->n_kv_heads; kvh++) {
            const float *k1 = t.state.key_cache + kv_cache_offset(c, 0, kvh, 1);
            same[rotates] &= memcmp(k1, t.state.key_cache + kv_cache_offset(c, 0, kvh, 2), head_size_of(c) * sizeof(float)) == 0;
            same[rotates] &= memcmp(k1, t.state.key_cache + kv_cache_offset(c, 0, kvh, 40), head_size_of(c) * sizeof(float)) == 0;
        }
        free_transformer(&t);
    }
    variant_layer0 = LAYER_NOPE;
    check(same[0] && !same[1], "nope_layer_keys_do_not_depend_on_position_rotating_ones_do",
          same[0] ? "the rotating layer's keys did not change with position" : "NoPE keys differ across positions");
}

// Writes text to dir/name (dir/name created as needed is the caller's job).
static void write_text(const char *dir, const char *name, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

// A cgroup's memory limit is the smallest of its own and its parents' (the kernel
// enforces every ancestor's), "max" is none, and a cgroup with no file has none. A
// tree made in a temporary directory stands in for /sys/fs/cgroup.
static void test_cgroup_limit_is_the_smallest_of_its_ancestors(void) {
    char root[] = "/tmp/test_rope_cgroupXXXXXX", a[PATH_MAX], b[PATH_MAX], c[PATH_MAX];
    if (!mkdtemp(root)) {
        check(0, "cgroup_limit_is_the_smallest_of_its_ancestors", "mkdtemp failed");
        return;
    }
    snprintf(a, sizeof(a), "%s/a", root);
    snprintf(b, sizeof(b), "%s/a/b", root);
    snprintf(c, sizeof(c), "%s/a/b/c", root);
    mkdir(a, 0700), mkdir(b, 0700), mkdir(c, 0700);
    write_text(root, "memory.max", "max\n");
    write_text(a, "memory.max", "3221225472\n"); // 3 GiB
    write_text(b, "memory.max", "max\n");
    write_text(c, "memory.max", "8589934592\n"); // 8 GiB, under a 3 GiB parent
    uint64_t from_c = cgroup_file_limit(root, "/a/b/c", "memory.max"), from_b = cgroup_file_limit(root, "/a/b", "memory.max");
    uint64_t from_root = cgroup_file_limit(root, "/", "memory.max"), missing = cgroup_file_limit(root, "/a", "nope");
    char detail[200];
    snprintf(detail, sizeof(detail), "c %llu, b %llu, root %llu, no file %llu (want 3 GiB, 3 GiB, none, none)",
             (unsigned long long)from_c, (unsigned long long)from_b, (unsigned long long)from_root,
             (unsigned long long)missing);
    check(from_c == 3ull << 30 && from_b == 3ull << 30 && from_root == UINT64_MAX && missing == UINT64_MAX,
          "cgroup_limit_is_the_smallest_of_its_ancestors", detail);
    const char *dirs[] = {c, b, a, root};
    for (int i = 0; i < 4; i++) {
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/memory.max", dirs[i]);
        remove(path);
        rmdir(dirs[i]);
    }
}

int main(int argc, char **argv) {
    test_rotation_equals_block_diagonal_matrix();
    test_score_depends_only_on_relative_position();
    test_rotation_preserves_norm();
    test_prope_leaves_unrotated_pairs_alone();
    test_rope_angles_is_floor_of_p_times_half_head();
    test_table_rope_equals_plain_rope();
    test_rope_frequencies_follow_theta();
    test_matmul_kernels_agree(37 * 8, 23, "matmul_equals_double_precision_plain_loop",
                              "matmul_tiled_equals_matmul_token_by_token_bitwise", "matmul_equals_one_dot_per_row_bitwise");
    test_matmul_kernels_agree(37 * 8 + 5, 23, "matmul_equals_double_precision_plain_loop_with_tail",
                              "matmul_tiled_equals_matmul_token_by_token_bitwise_with_tail",
                              "matmul_equals_one_dot_per_row_bitwise_with_tail");
    check(37 * 8 * 23 < PARALLEL_MIN_WORK && 37 * 8 * 251 >= PARALLEL_MIN_WORK,
          "kernel_tests_cover_one_thread_and_threaded_matmul", "PARALLEL_MIN_WORK moved: change d");
    test_matmul_kernels_agree(37 * 8, 251, "threaded_matmul_equals_double_precision_plain_loop",
                              "matmul_tiled_equals_threaded_matmul_bitwise", "threaded_matmul_equals_one_dot_per_row_bitwise");
    // rows of PREFETCH_MIN_ROW floats or more take the prefetching path of dot_rows4:
    // + 8 ends with one vector past the last whole cache line, + 13 with a tail too
    check(37 * 8 + 5 < PREFETCH_MIN_ROW, "kernel_tests_cover_rows_too_short_to_prefetch", "PREFETCH_MIN_ROW moved");
    test_matmul_kernels_agree(PREFETCH_MIN_ROW + 8, 23, "long_row_matmul_equals_double_precision_plain_loop",
                              "matmul_tiled_equals_prefetching_matmul_bitwise",
                              "prefetching_matmul_equals_one_dot_per_row_bitwise");
    test_matmul_kernels_agree(PREFETCH_MIN_ROW + 13, 251, "threaded_long_row_matmul_equals_double_precision_plain_loop",
                              "matmul_tiled_equals_threaded_prefetching_matmul_bitwise_with_tail",
                              "threaded_prefetching_matmul_equals_one_dot_per_row_bitwise_with_tail");
    test_f16_widening_is_exact_for_every_half();
    test_bf16_widening_is_exact_for_every_value();
    // (a table the compiler does not fold into constant sizes: gcc's clones for a
    // constant n warn that a tail loop could run past eight lanes, which it cannot)
    static struct {
        int n, d;
        const char *what;
    } sizes[] = {{37 * 8, 23, "whole_vectors"},
                 {37 * 8 + 5, 23, "with_tail"},
                 {13, 5, "odd_sizes"},
                 {3, 7, "rows_shorter_than_a_vector"},
                 {37 * 8, 251, "threaded"},
                 {PREFETCH_MIN_ROW + 13, 251, "threaded_prefetching_with_tail"}};
    for (WeightType type = WEIGHT_BF16; type <= WEIGHT_F16; type++)
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
            test_16bit_matmul_equals_widened_f32(type, sizes[i].n, sizes[i].d, sizes[i].what);
    test_thread_bands_cover_every_row_once();
    test_row_split_follows_thread_speeds();
    test_uneven_split_keeps_matmul_bitwise(37 * 8, 251, "matmul_under_uneven_thread_split_equals_one_dot_per_row_bitwise");
    test_uneven_split_keeps_matmul_bitwise(37 * 8 + 5, 251,
                                           "matmul_under_uneven_thread_split_equals_one_dot_per_row_bitwise_with_tail");
    test_uneven_split_keeps_matmul_bitwise(PREFETCH_MIN_ROW + 13, 251,
                                           "prefetching_matmul_under_uneven_thread_split_equals_one_dot_per_row_bitwise");
    test_cgroup_limit_is_the_smallest_of_its_ancestors();
    if (argc > 1) {
        test_block_forward_equals_token_forward(argv[1]);
        test_fast_forward_equals_plain_forward(argv[1]);
        test_16bit_forward_equals_widened_float32_forward(argv[1], WEIGHT_BF16);
        test_16bit_forward_equals_widened_float32_forward(argv[1], WEIGHT_F16);
        test_kv_cache_sits_on_huge_page_boundaries(argv[1]);
        test_shifted_keys_equal_fresh_keys(argv[1], 1.0f, ROPE_SCALING_NONE, "shifted_keys_equal_fresh_keys_in_layer_0_rope");
        test_shifted_keys_equal_fresh_keys(argv[1], 0.5f, ROPE_SCALING_NONE,
                                           "shifted_keys_equal_fresh_keys_in_layer_0_p_rope_half");
        test_shifted_keys_equal_fresh_keys(argv[1], 1.0f, ROPE_SCALING_LINEAR,
                                           "shifted_keys_equal_fresh_keys_in_layer_0_linear_scaling");
        test_shifted_keys_equal_fresh_keys(argv[1], 1.0f, ROPE_SCALING_NTK, "shifted_keys_equal_fresh_keys_in_layer_0_ntk");
        test_shifted_keys_equal_fresh_keys(argv[1], 1.0f, ROPE_SCALING_YARN, "shifted_keys_equal_fresh_keys_in_layer_0_yarn");
        test_shifted_keys_equal_fresh_keys(argv[1], 0.5f, ROPE_SCALING_YARN,
                                           "shifted_keys_equal_fresh_keys_in_layer_0_yarn_p_rope_half");
        test_shifted_keys_equal_fresh_keys(argv[1], 1.0f, ROPE_SCALING_LLAMA3,
                                           "shifted_keys_equal_fresh_keys_in_layer_0_llama3");
        // the same forward-pass checks on the variant block (make_variant)
        use_variant = 1;
        test_block_forward_equals_token_forward(argv[1]);
        test_fast_forward_equals_plain_forward(argv[1]);
        test_nope_keys_do_not_depend_on_position(argv[1]);
        test_shifted_keys_equal_fresh_keys(argv[1], 0, ROPE_SCALING_NONE, "variant_shifted_keys_in_nope_layer_0_are_exact");
        variant_layer0 = LAYER_ROPE_SECOND;
        test_shifted_keys_equal_fresh_keys(argv[1], 0, ROPE_SCALING_NONE,
                                           "variant_shifted_keys_equal_fresh_keys_in_layer_0_second_setting");
        variant_layer0 = LAYER_NOPE;
        use_variant = 0;
    }
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed != 0;
}
