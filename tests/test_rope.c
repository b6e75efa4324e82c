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
    c.rope[LAYER_ROPE_FIRST].theta = theta;
    c.rope[LAYER_ROPE_FIRST].fraction = fraction;
    c.rope[LAYER_ROPE_FIRST].factor = 1.0f;
    c.rope[LAYER_ROPE_FIRST].original_len = 64;
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
    rope_rotate_head(q, c, LAYER_ROPE_FIRST, m);
    rope_rotate_head(k, c, LAYER_ROPE_FIRST, n);
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
                rope_rotate_head(y, &c, LAYER_ROPE_FIRST, m);
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
        rope_rotate_head(x, &c, LAYER_ROPE_FIRST, pos);
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
    rope_rotate_head(y, &c, LAYER_ROPE_FIRST, 123);
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
        int got = rope_angles_of(&c, LAYER_ROPE_FIRST);
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
    int n = rope_angles_of(&c, LAYER_ROPE_FIRST);
    float *cos_t = malloc(sizeof(float) * c.seq_len * n), *sin_t = malloc(sizeof(float) * c.seq_len * n);
    rope_build_tables(cos_t, sin_t, &c, LAYER_ROPE_FIRST);
    unsigned long long rng = 11;
    int same = 1;
    for (int pos = 0; pos < c.seq_len; pos += 13) {
        float a[32], b[32];
        random_vector(a, 32, &rng);
        memcpy(b, a, sizeof(a));
        rope_rotate_head(a, &c, LAYER_ROPE_FIRST, pos);
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
    double w0 = rope_frequency(&c, LAYER_ROPE_FIRST, 0), wl = rope_frequency(&c, LAYER_ROPE_FIRST, 31), expect = pow(10000.0, -62.0 / 64.0);
    c.rope[LAYER_ROPE_FIRST].scaling = ROPE_SCALING_LINEAR;
    c.rope[LAYER_ROPE_FIRST].factor = 4.0f;
    double scaled = rope_frequency(&c, LAYER_ROPE_FIRST, 5), expect_scaled = pow(10000.0, -10.0 / 64.0) / 4.0;
    check(w0 == 1.0 && fabs(wl - expect) / expect < 1e-6 && fabs(scaled - expect_scaled) / expect_scaled < 1e-6,
          "rope_frequency_is_theta_pow_minus_2i_over_d_divided_by_scale", "wrong frequency");
}

// longrope's factors are one per rotated pair of the file; with more pairs rotating
// (--rope-fraction, refused in main) rope_frequency must not read past them. The
// factors sit in a heap buffer of exactly 2 x pairs floats, so the ASan build catches
// any read beyond: the extra pairs get NaN (which every caller's check refuses).
static void test_longrope_never_reads_past_its_factors(void) {
    Config c = rope_config(16, 10000.0f, 0.5f); // 4 of 8 pairs rotate
    RopeSetting *r = &c.rope[LAYER_ROPE_FIRST];
    r->scaling = ROPE_SCALING_LONGROPE, r->factor = 8.0f, r->original_len = 32, c.seq_len = 64;
    int pairs = rope_angles_of(&c, LAYER_ROPE_FIRST);
    float *factors = malloc(sizeof(float) * 2 * pairs);
    for (int i = 0; i < 2 * pairs; i++) factors[i] = 1.0f + i; // short 1..4, long 5..8
    int loaded = use_longrope_factors(&c, factors) == 0;
    r->fraction = 1.0f; // all 8 pairs: the factors cover only 4
    int within = 1, beyond = 1;
    for (int i = 0; i < rope_angles_of(&c, LAYER_ROPE_FIRST); i++) {
        float omega = rope_frequency(&c, LAYER_ROPE_FIRST, i);
        if (i < pairs) within &= omega == rope_base_frequency(&c, LAYER_ROPE_FIRST, i) / (float)(1 + pairs + i); // the long set
        else beyond &= isnan(omega);
    }
    check(loaded && pairs == 4 && within && beyond, "longrope_never_reads_past_its_factors",
          "a pair beyond the factors read something");
    free(factors);
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

#ifdef USE_SIMD
// Every 16-bit value of a type, widened eight at a time by the SIMD kernel's load,
// against the plain widening, bit for bit.
static int simd_widening_agrees(WeightType type) {
    uint16_t values[8];
    float lanes[8];
    int agree = 1;
    for (unsigned h = 0; h < 65536; h += 8) {
        for (unsigned l = 0; l < 8; l++) values[l] = (uint16_t)(h + l);
        lanes_store(lanes, lanes_load_weights(values, 0, type));
        for (unsigned l = 0; l < 8; l++) {
            float plain = type == WEIGHT_F16 ? f16_to_f32(values[l]) : bf16_to_f32(values[l]);
            agree &= memcmp(&plain, &lanes[l], sizeof(float)) == 0;
        }
    }
    return agree;
}
#endif

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
    lanes_agree = simd_widening_agrees(WEIGHT_F16);
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
    lanes_agree = simd_widening_agrees(WEIGHT_BF16);
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

// Matrix m (n x d, weights of a narrow type) computes the bits of w, the float32
// matrix of its widened weights: matmul (decode rows, threads), matmul_tiled (prefill
// tiles) and the plain loops (use_fast_kernels = 0), each against matmul on w, for 19
// random tokens drawn from rng.
static void check_matmuls_equal_float32(Matrix m, const float *w, int n, int d, unsigned long long *rng,
                                        const char *name) {
    int B = 19;
    float *x = malloc(sizeof(float) * n * B);
    float *ref = malloc(sizeof(float) * d * B), *one = malloc(sizeof(float) * d * B);
    float *block = malloc(sizeof(float) * d * B), *plain = malloc(sizeof(float) * d * B);
    float *scratch = malloc(sizeof(float) * n * (B + TILE_TOKENS));
    random_vector(x, n * B, rng);
    for (int b = 0; b < B; b++) matmul(ref + b * d, x + b * n, f32_matrix(w), n, d);
    for (int b = 0; b < B; b++) matmul(one + b * d, x + b * n, m, n, d);
    matmul_tiled(block, x, m, B, n, d, scratch);
    use_fast_kernels = 0;
    for (int b = 0; b < B; b++) matmul(plain + b * d, x + b * n, m, n, d);
    use_fast_kernels = 1;
    size_t bytes = sizeof(float) * d * B;
    int decode = memcmp(ref, one, bytes) == 0, prefill = memcmp(ref, block, bytes) == 0;
    int plain_same = memcmp(ref, plain, bytes) == 0;
    char detail[96];
    snprintf(detail, sizeof(detail), "n %d d %d: decode %d, prefill tiles %d, plain loops %d", n, d, decode, prefill,
             plain_same);
    check(decode && prefill && plain_same, name, detail);
    free(x), free(ref), free(one), free(block), free(plain), free(scratch);
}

// A 16-bit matrix computes the bits of the float32 matrix holding its widened weights.
static void test_16bit_matmul_equals_widened_f32(WeightType type, int n, int d, const char *what) {
    uint16_t *h = malloc(sizeof(uint16_t) * n * d);
    float *w = malloc(sizeof(float) * n * d);
    unsigned long long rng = 17;
    random_16bit_weights(h, w, (size_t)n * d, type, &rng);
    char name[160];
    snprintf(name, sizeof(name), "%s_matmul_decode_prefill_and_plain_equal_float32_of_widened_weights_bitwise_%s",
             weight_type_names[type], what);
    check_matmuls_equal_float32((Matrix){h, type}, w, n, d, &rng, name);
    free(h), free(w);
}

// Q8_0 blocks of random scales and values (count weights, a multiple of 32): each
// block's scale d a random finite f16 (exponents 0..16: subnormals included, the
// largest a little over 2), its 32 q random int8 (-128 included, which the format's
// readers must take though llama.cpp's quantizer never writes it); *widened gets d * q
// by the definition, in double (exact, and exactly a float32).
static void random_q8_0_weights(unsigned char *blocks, float *widened, size_t count, unsigned long long *rng) {
    for (size_t b = 0; b < count / 32; b++) {
        unsigned r = random_u32(rng), s = r & 1, e = (r >> 1) % 17, f = (r >> 6) & 1023;
        uint16_t h = (uint16_t)(s << 15 | e << 10 | f);
        double d = widened_by_definition(s, e, f, 10, 15);
        unsigned char *block = blocks + b * 34;
        memcpy(block, &h, 2); // little-endian, as the file stores it
        for (int j = 0; j < 32; j++) {
            int8_t q = (int8_t)(random_u32(rng) & 255);
            block[2 + j] = (unsigned char)q;
            widened[b * 32 + j] = (float)(d * q);
        }
    }
}

// A Q8_0 matrix computes the bits of the float32 matrix holding d * q (a Q8_0 tile
// is widened once and reused across its tokens). n: a multiple of 32 (whole blocks).
static void test_q8_0_matmul_equals_dequantized_f32(int n, int d, const char *what) {
    unsigned char *q = malloc((size_t)n * d / 32 * 34);
    float *w = malloc(sizeof(float) * n * d);
    unsigned long long rng = 29 + (unsigned long long)n;
    random_q8_0_weights(q, w, (size_t)n * d, &rng);
    char name[160];
    snprintf(name, sizeof(name), "q8_0_matmul_decode_prefill_and_plain_equal_float32_of_dequantized_weights_bitwise_%s",
             what);
    check_matmuls_equal_float32((Matrix){q, WEIGHT_Q8_0}, w, n, d, &rng, name);
    free(q), free(w);
}

// The 4-, 5- and 6-bit blocks by their definition (llama.cpp's dequantize_row_*,
// ggml-quants.c, written out again as loops over a whole block, in double: every
// value is exact there, and rounding it once to float32 is what the format's float32
// arithmetic gives, since all its products are exact). out: the block's weights.
static double f16_by_definition(const unsigned char *p) {
    unsigned h = p[0] | p[1] << 8;
    return widened_by_definition(h >> 15, (h >> 10) & 31, h & 1023, 10, 15);
}
static void block_by_definition(const unsigned char *x, WeightType type, float *out) {
    double y[256];
    if (type == WEIGHT_Q4_0 || type == WEIGHT_Q4_1 || type == WEIGHT_Q5_0 || type == WEIGHT_Q5_1) {
        int has_min = type == WEIGHT_Q4_1 || type == WEIGHT_Q5_1, five = type == WEIGHT_Q5_0 || type == WEIGHT_Q5_1;
        double d = f16_by_definition(x), m = has_min ? f16_by_definition(x + 2) : 0;
        const unsigned char *qh = x + 2 + 2 * has_min, *qs = qh + 4 * five;
        uint32_t bits = five ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24 : 0;
        int offset = has_min ? 0 : five ? -16 : -8;
        for (int j = 0; j < 16; j++) {
            int x0 = (qs[j] & 15) | (int)((bits >> j) & 1) << 4, x1 = (qs[j] >> 4) | (int)((bits >> (j + 16)) & 1) << 4;
            y[j] = has_min ? x0 * d + m : (x0 + offset) * d; // no "+ 0" (it would turn -0 into +0)
            y[j + 16] = has_min ? x1 * d + m : (x1 + offset) * d;
        }
        for (int j = 0; j < 32; j++) out[j] = (float)y[j];
        return;
    }
    if (type == WEIGHT_Q6_K) {
        double d = f16_by_definition(x + 208);
        for (int n = 0; n < 2; n++) {
            const unsigned char *ql = x + 64 * n, *qh = x + 128 + 32 * n;
            const int8_t *sc = (const int8_t *)x + 192 + 8 * n;
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                y[128 * n + l] = d * sc[is] * (((ql[l] & 15) | (qh[l] & 3) << 4) - 32);
                y[128 * n + l + 32] = d * sc[is + 2] * (((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32);
                y[128 * n + l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
                y[128 * n + l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
            }
        }
    } else { // Q4_K, Q5_K
        double d = f16_by_definition(x), dmin = f16_by_definition(x + 2);
        const unsigned char *scales = x + 4, *qh = x + 16, *ql = x + (type == WEIGHT_Q5_K ? 48 : 16);
        for (int j = 0; j < 8; j++) {
            int sc = j < 4 ? scales[j] & 63 : (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4;
            int m = j < 4 ? scales[j + 4] & 63 : (scales[j + 4] >> 4) | (scales[j] >> 6) << 4;
            for (int l = 0; l < 32; l++) {
                int q = j % 2 ? ql[32 * (j / 2) + l] >> 4 : ql[32 * (j / 2) + l] & 15;
                if (type == WEIGHT_Q5_K && (qh[l] >> j & 1)) q += 16;
                y[32 * j + l] = d * sc * q - dmin * m;
            }
        }
    }
    for (int j = 0; j < 256; j++) out[j] = (float)y[j];
}

// Random blocks of a 4-, 5- or 6-bit type (count weights, whole blocks): random bytes,
// every f16 scale (d; m or dmin) then replaced by a random finite one, of either sign,
// exponents 0..20 (subnormals to 2^5: within these, the definition's double is exact);
// *widened gets each weight by the definition.
static void random_blocks(unsigned char *blocks, float *widened, size_t count, WeightType type,
                          unsigned long long *rng) {
    BlockShape b = block_shapes[type];
    static const int places[][2] = {[WEIGHT_Q4_0] = {0, -1}, [WEIGHT_Q4_1] = {0, 2}, [WEIGHT_Q5_0] = {0, -1},
                                    [WEIGHT_Q5_1] = {0, 2},  [WEIGHT_Q4_K] = {0, 2}, [WEIGHT_Q5_K] = {0, 2},
                                    [WEIGHT_Q6_K] = {208, -1}};
    for (size_t i = 0; i < count / b.weights; i++) {
        unsigned char *block = blocks + i * b.bytes;
        for (int j = 0; j < b.bytes; j++) block[j] = (unsigned char)random_u32(rng);
        for (int s = 0; s < 2 && places[type][s] >= 0; s++) {
            unsigned r = random_u32(rng), h = (r & 1) << 15 | ((r >> 1) % 21) << 10 | ((r >> 6) & 1023);
            block[places[type][s]] = (unsigned char)h, block[places[type][s] + 1] = (unsigned char)(h >> 8);
        }
        block_by_definition(block, type, widened + i * b.weights);
    }
}

// Each 4-, 5- and 6-bit type: random blocks widened one weight at a time (widen) and
// eight at a time (lanes_load_weights) give the definition's values, bit for bit; a
// matrix of them computes the bits of the float32 matrix of those values in decode,
// prefill tiles and the plain loops; and every decode reading order gives the plain
// matmul's bits, on one thread and on two.
static int block_read_orders_match_plain(Matrix m, int n, int d, unsigned long long *rng) {
    float *x = malloc(sizeof(float) * n), *plain = malloc(sizeof(float) * d), *out = malloc(sizeof(float) * d);
    random_vector(x, n, rng);
    use_fast_kernels = 0;
    matmul(plain, x, m, n, d);
    use_fast_kernels = 1;
    ReadOrder saved = read_order;
    int same = 1;
    for (int o = 0; o < N_READ_ORDERS; o++)
        for (int threads = 1; threads <= 2; threads++) {
            read_order = (ReadOrder)o;
#ifdef _OPENMP
            int saved_threads = omp_get_max_threads();
            omp_set_num_threads(threads);
#endif
            memset(out, 0xff, sizeof(float) * d);
            matmul(out, x, m, n, d);
#ifdef _OPENMP
            omp_set_num_threads(saved_threads);
#endif
            same &= memcmp(plain, out, sizeof(float) * d) == 0;
        }
    read_order = saved;
    free(x), free(plain), free(out);
    return same;
}

static void test_block_types_widen_and_multiply_as_their_definition(void) {
    static const WeightType types[] = {WEIGHT_Q4_0, WEIGHT_Q4_1, WEIGHT_Q5_0, WEIGHT_Q5_1,
                                       WEIGHT_Q4_K, WEIGHT_Q5_K, WEIGHT_Q6_K};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        WeightType type = types[t];
        int block = block_shapes[type].weights;
        // rows of one block, a few, and many (threaded, prefetching); d odd and not a multiple of 4
        int sizes[][2] = {{block, 5}, {3 * block, 7}, {block == 32 ? 37 * 32 : 3 * 256, 251},
                          {block == 32 ? PREFETCH_MIN_ROW + 32 : PREFETCH_MIN_ROW + 256, 253}};
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            int n = sizes[s][0], d = sizes[s][1];
            size_t count = (size_t)n * d;
            unsigned char *q = malloc(weight_bytes(type, count));
            float *w = malloc(sizeof(float) * count);
            unsigned long long rng = 41 + (unsigned long long)count + type;
            random_blocks(q, w, count, type, &rng);
            int exact = 1, lanes_agree = 1;
            for (size_t i = 0; i < count; i++) {
                float got = widen(q, i, type);
                exact &= memcmp(&got, &w[i], sizeof(float)) == 0;
            }
#ifdef USE_SIMD
            for (size_t i = 0; i < count; i += 8) {
                float lanes[8];
                lanes_store(lanes, lanes_load_weights(q, i, type));
                lanes_agree &= memcmp(lanes, w + i, sizeof(lanes)) == 0;
            }
#endif
            char name[160], detail[64];
            snprintf(detail, sizeof(detail), "n %d d %d", n, d);
            if (s == 0) {
                snprintf(name, sizeof(name), "%s_widening_equals_the_format_definition_bitwise", weight_type_names[type]);
                check(exact, name, detail);
                snprintf(name, sizeof(name), "%s_simd_widening_equals_the_format_definition_bitwise",
                         weight_type_names[type]);
                check(lanes_agree, name, detail);
            } else if (!exact || !lanes_agree) {
                snprintf(name, sizeof(name), "%s_widening_equals_the_format_definition_bitwise_%dx%d",
                         weight_type_names[type], n, d);
                check(0, name, detail);
            }
            snprintf(name, sizeof(name), "%s_matmul_decode_prefill_and_plain_equal_float32_of_dequantized_weights_"
                     "bitwise_%dx%d", weight_type_names[type], n, d);
            check_matmuls_equal_float32((Matrix){q, type}, w, n, d, &rng, name);
            snprintf(name, sizeof(name), "%s_every_read_order_equals_plain_matmul_bitwise_%dx%d",
                     weight_type_names[type], n, d);
            check(block_read_orders_match_plain((Matrix){q, type}, n, d, &rng), name, detail);
            free(q), free(w);
        }
    }
}

// Every finite f16 scale with every int8 value: the plain widening (q8_0_weight) gives
// d * q by the definition, and the SIMD load gives the same bits, eight lanes at each
// of a block's four places.
static void test_q8_0_widening_is_exact_for_every_scale_and_value(void) {
    unsigned char blocks[8 * 34];
    int exact = 1, lanes_agree = 1;
    for (unsigned h = 0; h < 65536; h++) {
        unsigned s = h >> 15, e = (h >> 10) & 31, f = h & 1023;
        if (e == 31) continue; // not finite: refused at load
        for (int b = 0; b < 8; b++) {
            memcpy(blocks + b * 34, &(uint16_t){(uint16_t)h}, 2);
            for (int j = 0; j < 32; j++) blocks[b * 34 + 2 + j] = (unsigned char)(b * 32 + j); // q = -128 .. 127
        }
        double d = widened_by_definition(s, e, f, 10, 15);
        for (int i = 0; i < 256; i++) {
            float plain = widen(blocks, (size_t)i, WEIGHT_Q8_0), want = (float)(d * (int8_t)(unsigned char)i);
            exact &= memcmp(&plain, &want, sizeof(float)) == 0;
        }
#ifdef USE_SIMD
        for (int i = 0; i < 256; i += 8) {
            float lanes[8];
            lanes_store(lanes, lanes_load_weights(blocks, (size_t)i, WEIGHT_Q8_0));
            for (int l = 0; l < 8; l++) {
                float plain = widen(blocks, (size_t)(i + l), WEIGHT_Q8_0);
                lanes_agree &= memcmp(&plain, &lanes[l], sizeof(float)) == 0;
            }
        }
#endif
    }
    check(exact, "q8_0_widening_equals_d_times_q_for_every_finite_scale_and_value", "a value differs");
    check(lanes_agree, "q8_0_simd_widening_equals_plain_widening_bitwise_for_every_finite_scale_and_value",
          "a lane differs");
}

// greedy decoding picks the first index of the largest value, as llama2.c's loop
// does: ties go to the earlier index, -0 and +0 tie, NaN is never the largest
// unless it is at index 0 (which nothing then beats). The reference is that
// definition written out directly: the largest of the values that are not NaN,
// then its first index. The arrays are drawn from a few values so that ties, zeros
// of both signs, infinities and NaNs all occur, at lengths around the vectors'
// sixteen.
static int first_index_of_largest(const float *p, int n) {
    if (isnan(p[0])) return 0;
    double largest = -INFINITY;
    int any = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(p[i]) && (!any || p[i] > largest)) largest = p[i], any = 1;
    for (int i = 0; i < n; i++)
        if (p[i] == largest) return i;
    return -1;
}

static void test_greedy_choice_is_first_index_of_largest(void) {
    const float values[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, INFINITY, -INFINITY, NAN};
    unsigned long long rng = 7;
    float p[80];
    int bad = 0, first_bad_n = 0;
    for (int trial = 0; trial < 200000; trial++) {
        int n = 1 + random_u32(&rng) % 80;
        for (int i = 0; i < n; i++) p[i] = values[random_u32(&rng) % 8];
        int fast = sample_argmax(p, n), want = first_index_of_largest(p, n);
        use_fast_kernels = 0;
        int plain = sample_argmax(p, n);
        use_fast_kernels = 1;
        if (fast != want || plain != want) {
            if (!bad) first_bad_n = n;
            bad++;
        }
    }
    char detail[96];
    snprintf(detail, sizeof(detail), "%d of 200000 arrays differ (the first of length %d)", bad, first_bad_n);
    check(bad == 0, "greedy_choice_is_first_index_of_largest", detail);
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

// every decode reading order (quarters with and without prefetch, adjacent rows,
// one row at a time) gives, bit for bit, the plain matmul (use_fast_kernels = 0: one
// dot_weights per row), for float32, bf16 and f16 weights, on one thread and on two
static int read_order_matches_plain(ReadOrder order, WeightType type, int n, int d, int threads) {
    size_t count = (size_t)n * d;
    uint16_t *h = malloc(sizeof(uint16_t) * count);
    float *w = malloc(sizeof(float) * count), *x = malloc(sizeof(float) * n);
    float *plain = malloc(sizeof(float) * d), *out = malloc(sizeof(float) * d);
    unsigned long long rng = 23 + (unsigned long long)n * d;
    random_vector(x, n, &rng);
    unsigned char *q = malloc(count / 32 * 34 + 1);
    Matrix m = {w, WEIGHT_F32};
    if (type == WEIGHT_F32) random_vector(w, n * d, &rng);
    else if (type == WEIGHT_Q8_0) random_q8_0_weights(q, w, count, &rng), m = (Matrix){q, type};
    else random_16bit_weights(h, w, count, type, &rng), m = (Matrix){h, type};
    use_fast_kernels = 0;
    matmul(plain, x, m, n, d);
    use_fast_kernels = 1;
    ReadOrder saved = read_order;
    read_order = order;
#ifdef _OPENMP
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(threads);
#else
    (void)threads;
#endif
    memset(out, 0xff, sizeof(float) * d); // NaN: a row not written differs
    matmul(out, x, m, n, d);
#ifdef _OPENMP
    omp_set_num_threads(saved_threads);
#endif
    read_order = saved;
    int same = memcmp(plain, out, sizeof(float) * d) == 0;
    free(h), free(q), free(w), free(x), free(plain), free(out);
    return same;
}

static void test_every_read_order_equals_plain_matmul(void) {
    static const struct {
        int n, d;
    } sizes[] = {{13, 5}, {3, 7}, {37 * 8 + 5, 23}, {37 * 8, 251}, {37 * 8 + 5, 253}, {PREFETCH_MIN_ROW + 13, 251}};
    for (int o = 0; o < N_READ_ORDERS; o++)
        for (WeightType type = WEIGHT_F32; type <= WEIGHT_F16; type++) {
            int ok = 1;
            char detail[128] = "";
            for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
                for (int threads = 1; threads <= 2; threads++)
                    if (!read_order_matches_plain((ReadOrder)o, type, sizes[i].n, sizes[i].d, threads)) {
                        ok = 0;
                        snprintf(detail, sizeof(detail), "n %d d %d, %d threads", sizes[i].n, sizes[i].d, threads);
                    }
            char name[128];
            snprintf(name, sizeof(name), "read_order_%s_equals_plain_matmul_bitwise_%s", read_order_names[o],
                     weight_type_names[type]);
            check(ok, name, detail);
        }
    // Q8_0: rows of whole 32-weight blocks
    static const struct {
        int n, d;
    } q8_sizes[] = {{32, 5}, {64, 7}, {9 * 32, 23}, {9 * 32, 251}, {37 * 32, 253}, {PREFETCH_MIN_ROW + 32, 251}};
    for (int o = 0; o < N_READ_ORDERS; o++) {
        int ok = 1;
        char detail[128] = "", name[128];
        for (size_t i = 0; i < sizeof(q8_sizes) / sizeof(q8_sizes[0]); i++)
            for (int threads = 1; threads <= 2; threads++)
                if (!read_order_matches_plain((ReadOrder)o, WEIGHT_Q8_0, q8_sizes[i].n, q8_sizes[i].d, threads)) {
                    ok = 0;
                    snprintf(detail, sizeof(detail), "n %d d %d, %d threads", q8_sizes[i].n, q8_sizes[i].d, threads);
                }
        snprintf(name, sizeof(name), "read_order_%s_equals_plain_matmul_bitwise_q8_0", read_order_names[o]);
        check(ok, name, detail);
    }
}

// The block options and per-layer choices of ROPE version 2, switched on over a
// loaded llama2.c model (stories260K: 5 layers, dim 64, 8 heads of 8, 4 kv heads), so
// that the forward-pass tests run the variant block too: q/k/v biases, q/k norms, post
// norms, GeGLU, an embedding multiplier, an attention scale, both soft-caps, a second
// RoPE setting, NoPE layers and sliding windows. The extra weights are made up.
enum { VARIANT_FLOATS = 1024 };
static float variant_bias[3][VARIANT_FLOATS], variant_qk_norm[2][VARIANT_FLOATS];
static int variant_layer0 = LAYER_NOPE; // layer 0's rotary choice (the shift tests vary it)
static int variant_window0 = 0;          // layer 0's window (the ring tests slide it)

static int make_variant(Transformer *t) {
    Config *c = &t->config;
    TransformerWeights *w = &t->weights;
    if ((size_t)c->n_layers * c->n_heads * head_size_of(c) > VARIANT_FLOATS || c->n_layers < 4)
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
    RopeSetting *second = &c->rope[LAYER_ROPE_SECOND];
    second->theta = 500.0f, second->fraction = 0.5f, second->factor = 1.0f;
    second->original_len = c->seq_len;
    c->layer_table_bytes = 8ull * c->n_layers; // (as loaded from a table: -m rope and inspect print it)
    int ropes[4] = {variant_layer0, LAYER_ROPE_SECOND, LAYER_ROPE_FIRST, LAYER_NOPE}, windows[4] = {variant_window0, 7, 0, 5};
    for (int l = 0; l < c->n_layers; l++) c->layer[l].rope = ropes[l % 4], c->layer[l].window = windows[l % 4];
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

// count float32 weights (a multiple of 32) as Q8_0 blocks, quantized as llama.cpp's
// quantize_row_q8_0_ref (d = amax / 127, q = roundf(x / d) with the unrounded d, d stored
// as the nearest f16); *widened gets d * q by the definition.
static Matrix quantized_matrix(const float *x, size_t count, Matrix *widened) {
    unsigned char *blocks = malloc(count / 32 * 34);
    float *w = malloc(sizeof(float) * count);
    for (size_t b = 0; b < count / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = f16_nearest(d);
        double stored = widened_by_definition(h >> 15, (h >> 10) & 31, h & 1023, 10, 15);
        memcpy(blocks + b * 34, &h, 2);
        for (int j = 0; j < 32; j++) {
            int8_t q = (int8_t)roundf(x[b * 32 + j] * inv);
            blocks[b * 34 + 2 + j] = (unsigned char)q;
            w[b * 32 + j] = (float)(stored * q);
        }
    }
    *widened = f32_matrix(w);
    return (Matrix){blocks, WEIGHT_Q8_0};
}

// One of the model's matrices (count float32 weights) rounded to `type` (bf16, f16, or
// Q8_0 for rows of whole blocks); *widened gets the float32 copy of the rounded values,
// by the definition.
static Matrix rounded_matrix(Matrix m, size_t count, WeightType type, Matrix *widened) {
    if (type == WEIGHT_Q8_0) return quantized_matrix(m.data, count, widened);
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
// loops (use_fast_kernels = 0) on the 16-bit weights. mixed: the pieces in q8_0, bf16
// and f16 by turns (a file with a type table; q8_0 only where the rows are whole blocks,
// not stories260K's w2 rows of 172), each piece rounded to its own type.
static void test_16bit_forward_equals_widened_float32_forward(const char *checkpoint, WeightType type, int mixed) {
    Transformer a, b, c;
    char name[128];
    snprintf(name, sizeof(name), "%s_forward_fast_and_plain_equals_float32_forward_of_widened_weights_bitwise",
             mixed ? "per_piece_q8_0_bf16_f16" : weight_type_names[type]);
    if (load_model(&a, checkpoint) || load_model(&b, checkpoint) || load_model(&c, checkpoint)) {
        check(0, name, error_message);
        return;
    }
    const Config *cf = &a.config;
    size_t dim = cf->dim, hidden = cf->hidden_dim, kv = (size_t)cf->n_kv_heads * head_size_of(cf);
    enum { PIECES = 1 + 7 * 8 };
    Matrix *narrow[PIECES], *wide[PIECES];
    size_t counts[PIECES], row_lengths[PIECES];
    int n_pieces = 0;
    narrow[n_pieces] = &a.weights.token_embedding, wide[n_pieces] = &b.weights.token_embedding;
    row_lengths[n_pieces] = dim, counts[n_pieces++] = cf->vocab_size * dim;
    for (int l = 0; l < cf->n_layers && l < 8; l++) {
        LayerWeights *la = &a.weights.layer[l], *lb = &b.weights.layer[l];
        Matrix *na[] = {&la->wq, &la->wk, &la->wv, &la->wo, &la->w1, &la->w2, &la->w3};
        Matrix *wb[] = {&lb->wq, &lb->wk, &lb->wv, &lb->wo, &lb->w1, &lb->w2, &lb->w3};
        size_t layer_counts[] = {dim * dim, kv * dim, kv * dim, dim * dim, hidden * dim, dim * hidden, hidden * dim};
        size_t rows_of[] = {dim, dim, dim, dim, dim, hidden, dim};
        for (int i = 0; i < 7; i++) {
            narrow[n_pieces] = na[i], wide[n_pieces] = wb[i], row_lengths[n_pieces] = rows_of[i];
            counts[n_pieces++] = layer_counts[i];
        }
    }
    WeightType turns[] = {WEIGHT_Q8_0, WEIGHT_BF16, WEIGHT_F16};
    for (int i = 0; i < n_pieces; i++) {
        WeightType piece_type = !mixed ? type : turns[i % 3];
        if (piece_type == WEIGHT_Q8_0 && row_lengths[i] % Q8_0_BLOCK) piece_type = WEIGHT_BF16;
        *narrow[i] = rounded_matrix(*narrow[i], counts[i], piece_type, wide[i]);
    }
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
    for (int i = 0; i < n_pieces; i++) {
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
    RopeSetting *ra = &a.config.rope[LAYER_ROPE_FIRST], *rb = &b.config.rope[LAYER_ROPE_FIRST];
    if (use_variant) fraction = ra->fraction; // the variant's settings as they are
    ra->fraction = rb->fraction = fraction;
    if (rule != ROPE_SCALING_NONE) {
        ra->scaling = rb->scaling = rule;
        ra->factor = rb->factor = 4.0f;
        ra->original_len = rb->original_len = 64;
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
    size_t cache_floats = (size_t)c->n_kv_heads * c->layer[0].cache_positions * head_size_of(c); // layer 0's, first
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
    if (c->layer[0].rope == LAYER_NOPE) // a NoPE layer's keys carry no position: moved, they are the fresh ones exactly
        check(key_error == 0 && value_error == 0 && unrotated_error == 0, name, detail);
    else
        check(key_error <= 1e-5 && value_error == 0 && unrotated_error > 1e-2, name, detail);
    free(unshifted);
    free_transformer(&a);
    free_transformer(&b);
}

// --shift rotate on a sliding layer's ring: layer 0 of the variant slides (window 9,
// a ring of 9 + 127 = 136 of the 512 positions) and rotates by the first setting.
// Positions from .. N-1 move down to keep ..; only the positions the next token sees
// (the last W - 1 of the kept ones) must hold the keys and values of a fresh run over
// the kept tokens: moved (their slots overlap, the ring wraps), and, when the moved
// tail is short, the kept head's own. When the head's slots were overwritten since
// (the run went on for more than PREFILL_BLOCK positions past them),
// kv_cache_can_shift refuses.
static void test_ring_shift_keeps_the_visible_keys(const char *checkpoint, int N, int keep, int from, int can,
                                                   const char *name) {
    variant_layer0 = LAYER_ROPE_FIRST, variant_window0 = 9, use_variant = 1;
    Transformer a, b;
    int failed = load_model(&a, checkpoint) || load_model(&b, checkpoint);
    variant_layer0 = LAYER_NOPE, variant_window0 = 0, use_variant = 0;
    if (failed) {
        check(0, name, error_message);
        return;
    }
    const Config *c = &a.config;
    int tokens[512], kept[512], n_kept = 0, W = c->layer[0].window;
    for (int i = 0; i < N; i++) tokens[i] = 3 + (i * 7919 + 13) % (c->vocab_size - 3);
    for (int i = 0; i < keep; i++) kept[n_kept++] = tokens[i];
    for (int i = from; i < N; i++) kept[n_kept++] = tokens[i];
    prefill(&a, tokens, N, 0);
    int ok = c->layer[0].cache_positions == 136 && kv_cache_can_shift(c, keep, from, N - from) == can;
    char detail[160];
    snprintf(detail, sizeof(detail), "layer 0 holds %d positions, kv_cache_can_shift %d (expected 136, %d)",
             c->layer[0].cache_positions, !can, can);
    if (ok && can) {
        kv_cache_shift(&a, keep, from, N - from);
        prefill(&b, kept, n_kept, 0);
        int lo = n_kept - W + 1 > 0 ? n_kept - W + 1 : 0; // what position n_kept sees, but itself
        double key_error = layer0_cache_error(c, a.state.key_cache, b.state.key_cache, lo, n_kept);
        double value_error = layer0_cache_error(c, a.state.value_cache, b.state.value_cache, lo, n_kept);
        snprintf(detail, sizeof(detail), "positions %d..%d: key error %.3g, value error %.3g", lo, n_kept - 1,
                 key_error, value_error);
        ok = key_error <= 1e-5 && value_error == 0;
    }
    check(ok, name, detail);
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

// ---------------------------------------------------------------------------
// The tokenizer's pure-C parts, on hand-made tables: the pre-tokenizer scanners
// (expected words derived by hand from each pattern's regex), NFC (from Unicode's
// definitions), the TOKN loader's checks, rank merging, ROPE v2's layout.

// A tiny Unicode class table: Latin letters by case, a combining mark, Hangul (Lo),
// digits and circled digits (N), White_Space.
static const CodeRange TEST_CLASSES[] = {
    {0x09, 0x0D, CLASS_SPACE}, {0x20, 0x20, CLASS_SPACE}, {0x30, 0x39, CLASS_N}, {0x41, 0x5A, CLASS_LU},
    {0x61, 0x7A, CLASS_LL}, {0xC0, 0xD6, CLASS_LU}, {0xDF, 0xF6, CLASS_LL}, {0x300, 0x36F, CLASS_M},
    {0x1100, 0x11FF, CLASS_LO}, {0x2460, 0x2473, CLASS_N}, {0xAC00, 0xD7A3, CLASS_LO},
};

// The words of text by the pre-tokenizer, joined with '|'.
static void split_words(int pretokenizer, uint32_t flags, const char *text, char *out, size_t out_size) {
    Tokenizer t = {0};
    t.classes = (CodeRange *)TEST_CLASSES;
    t.n_classes = sizeof(TEST_CLASSES) / sizeof(TEST_CLASSES[0]);
    t.pretokenizer = pretokenizer;
    t.flags = flags;
    size_t len = strlen(text), n = 0, used = 0;
    uint32_t cps[256];
    unsigned char cls[256];
    n = utf8_decode((const unsigned char *)text, len, cps);
    for (size_t i = 0; i < n; i++) cls[i] = (unsigned char)char_classes(&t, cps[i]);
    out[0] = '\0';
    for (size_t start = 0; start < n;) { // split_digits as encode_byte_level does it
        size_t end = start + 1;
        if (!(flags & FLAG_SPLIT_DIGITS)) end = n;
        else if (!(cls[start] & CLASS_N))
            while (end < n && !(cls[end] & CLASS_N)) end++;
        Scan s = {cps, cls, end};
        for (size_t i = start; i < end;) {
            size_t e = next_word(&t, &s, i);
            if (used > 0 && used + 1 < out_size) out[used++] = '|';
            for (size_t k = i; k < e && used + 5 < out_size; k++) used += utf8_encode(cps[k], (unsigned char *)out + used);
            out[used] = '\0';
            i = e;
        }
        start = end;
    }
}

static void check_words(const char *name, int pretokenizer, uint32_t flags, const char *text, const char *want) {
    char got[1024], detail[2400];
    split_words(pretokenizer, flags, text, got, sizeof(got));
    snprintf(detail, sizeof(detail), "got \"%s\", expected \"%s\"", got, want);
    check(strcmp(got, want) == 0, name, detail);
}

static void test_pretokenizer_scanners_follow_their_patterns(void) {
    // gpt2: 's only in lower case; \s+(?!\S) leaves the last space to the next word
    check_words("gpt2_splits_letters_numbers_contractions_and_space_runs", PRETOKENIZER_GPT2, 0,
                "Hello world's  end 123!!\n", "Hello| world|'s| | end| 123|!!|\n");
    check_words("gpt2_contractions_are_case_sensitive", PRETOKENIZER_GPT2, 0, "DON'T", "DON|'|T");
    // llama3: (?i) contractions, digits by three, one non-letter before letters, newlines
    check_words("llama3_splits_digits_by_three_and_keeps_newline_runs", PRETOKENIZER_LLAMA3, 0,
                "I'M 12345 a\r\n\nb  (x)", "I|'M| |123|45| a|\r\n\n|b| | (|x|)");
    check_words("llama3_takes_any_non_letter_before_a_word", PRETOKENIZER_LLAMA3, 0, "(hi)\tyo", "(hi|)|\tyo");
    check_words("llama3_gives_trailing_spaces_back_before_a_word", PRETOKENIZER_LLAMA3, 0, "a   b  ", "a|  | b|  ");
    check_words("qwen2_splits_every_digit", PRETOKENIZER_QWEN2, 0, "x12345", "x|1|2|3|4|5");
    // o200k: a word is upper-case letters then lower-case ones; marks go with either
    check_words("o200k_splits_camel_case_and_keeps_upper_case_contractions", PRETOKENIZER_O200K, 0,
                "HelloWorld DON'T x", "Hello|World| DON'T| x");
    check_words("o200k_keeps_combining_marks_in_words", PRETOKENIZER_O200K, 0, "Cafe\xcc\x81s ABc",
                "Cafe\xcc\x81s| ABc");
    check_words("o200k_ends_punctuation_with_slashes_and_newlines", PRETOKENIZER_O200K, 0, "a //\n\nb",
                "a| //\n\n|b");
    check_words("o200k_digits_by_three", PRETOKENIZER_O200K, 0, "1234\xe2\x91\xa0", "123|4\xe2\x91\xa0");
    // SmolLM2: every digit (any \p{N}) its own word, then GPT-2's pattern within the rest
    check_words("split_digits_isolates_each_digit_before_gpt2", PRETOKENIZER_GPT2, FLAG_SPLIT_DIGITS,
                "a12 b \xe2\x91\xa0", "a|1|2| b| |\xe2\x91\xa0");
    check_words("malformed_utf8_is_punctuation_to_the_scanners", PRETOKENIZER_GPT2, 0, "ab\xff\xfe cd", "ab|\xff\xfe| cd");
}

// NFC on a tiny table: e + acute, b + dot below, A + ring, the Angstrom sign's
// singleton, and Devanagari QA (U+0958, excluded from composition).
static const Decomposition TEST_DECOMPOSITIONS[] = {
    {0xC5, 0x41, 0x30A}, {0xE9, 0x65, 0x301}, {0x958, 0x915, 0x93C}, {0x1E05, 0x62, 0x323}, {0x212B, 0xC5, 0},
};
static const Composition TEST_COMPOSITIONS[] = {{0x41, 0x30A, 0xC5}, {0x62, 0x323, 0x1E05}, {0x65, 0x301, 0xE9}};
static const CodeRange TEST_CCC[] = {{0x300, 0x314, 230}, {0x323, 0x323, 220}, {0x93C, 0x93C, 7}};

static void check_nfc(const char *name, const uint32_t *in, size_t n, const uint32_t *want, size_t n_want) {
    Tokenizer t = {0};
    t.decompositions = (Decomposition *)TEST_DECOMPOSITIONS;
    t.n_decompositions = sizeof(TEST_DECOMPOSITIONS) / sizeof(TEST_DECOMPOSITIONS[0]);
    t.compositions = (Composition *)TEST_COMPOSITIONS;
    t.n_compositions = sizeof(TEST_COMPOSITIONS) / sizeof(TEST_COMPOSITIONS[0]);
    t.ccc = (CodeRange *)TEST_CCC;
    t.n_ccc = sizeof(TEST_CCC) / sizeof(TEST_CCC[0]);
    uint32_t out[64];
    uint64_t keys[64];
    size_t m = nfc(&t, in, n, out, keys);
    char detail[256];
    int ok = m == n_want && memcmp(out, want, m * sizeof(uint32_t)) == 0;
    snprintf(detail, sizeof(detail), "got %zu code points, first U+%04X", m, m > 0 ? out[0] : 0);
    check(ok, name, detail);
}

static void test_nfc_on_a_tiny_table(void) {
    check_nfc("nfc_composes_e_acute", (uint32_t[]){0x65, 0x301}, 2, (uint32_t[]){0xE9}, 1);
    // marks are reordered by combining class (220 before 230), then b composes with the dot
    check_nfc("nfc_orders_marks_then_composes", (uint32_t[]){0x62, 0x301, 0x323}, 3, (uint32_t[]){0x1E05, 0x301}, 2);
    check_nfc("nfc_maps_a_singleton_and_recomposes", (uint32_t[]){0x212B}, 1, (uint32_t[]){0xC5}, 1);
    check_nfc("nfc_leaves_composition_exclusions_decomposed", (uint32_t[]){0x958}, 1, (uint32_t[]){0x915, 0x93C}, 2);
    check_nfc("nfc_composes_hangul_jamo_by_arithmetic", (uint32_t[]){0x1112, 0x1161, 0x11AB}, 3, (uint32_t[]){0xD55C}, 1);
    check_nfc("nfc_adds_a_final_jamo_to_a_syllable", (uint32_t[]){0xD558, 0x11AB}, 2, (uint32_t[]){0xD55C}, 1);
    check_nfc("nfc_does_not_compose_across_a_blocking_mark", (uint32_t[]){0x65, 0x302, 0x301}, 3,
              (uint32_t[]){0x65, 0x302, 0x301}, 3);
    check_nfc("nfc_keeps_a_leading_mark", (uint32_t[]){0x301, 0x65}, 2, (uint32_t[]){0x301, 0x65}, 2);
}

// A TOKN section in memory (docs/format.md), for the loader and merge tests.
typedef struct {
    unsigned char data[16384];
    size_t size;
} TestSection;

static void put_i32(TestSection *s, size_t at, int32_t v) {
    for (int k = 0; k < 4; k++) s->data[at + k] = (unsigned char)((uint32_t)v >> (8 * k));
}
static void append_i32(TestSection *s, int32_t v) { put_i32(s, s->size, v), s->size += 4; }

// Byte-level: the 256 bytes, then the pieces made by `merges` (pairs of ids, rank
// order), then <|end|> (control). Pre-tokenizer none: the text is one word.
static int byte_level_section(TestSection *s, const int (*merges)[2], int n_merges, uint32_t flags) {
    char pieces[300][16];
    int lengths[300];
    for (int b = 0; b < 256; b++) pieces[b][0] = (char)b, lengths[b] = 1;
    for (int m = 0; m < n_merges; m++) {
        int l = merges[m][0], r = merges[m][1];
        memcpy(pieces[256 + m], pieces[l], lengths[l]);
        memcpy(pieces[256 + m] + lengths[l], pieces[r], lengths[r]);
        lengths[256 + m] = lengths[l] + lengths[r];
    }
    int n = 256 + n_merges + 1;
    memcpy(pieces[n - 1], "<|end|>", 7);
    lengths[n - 1] = 7;
    memset(s, 0, sizeof(*s));
    put_i32(s, 0, (int32_t)MAGIC_TOKN), put_i32(s, 4, 1), put_i32(s, 8, TOKENIZER_BYTE_LEVEL), put_i32(s, 12, n);
    put_i32(s, 16, 16), put_i32(s, 20, -1), put_i32(s, 28, n - 1), put_i32(s, 32, 1);
    for (int k = 0; k < 8; k++) put_i32(s, 36 + 4 * k, k == 0 ? n - 1 : -1);
    put_i32(s, 72, (int32_t)flags), put_i32(s, 80, n_merges);
    s->size = TOKN_HEADER_BYTES;
    for (int i = 0; i < n; i++) {
        append_i32(s, 0), append_i32(s, i == n - 1 ? PIECE_CONTROL : PIECE_NORMAL), append_i32(s, lengths[i]);
        memcpy(s->data + s->size, pieces[i], lengths[i]);
        s->size += (lengths[i] + 3) / 4 * 4;
    }
    for (int m = 0; m < n_merges; m++) append_i32(s, merges[m][0]), append_i32(s, merges[m][1]);
    return n;
}

static void check_ids(const char *name, const Tokenizer *t, const char *text, const int *want, int n_want) {
    int tokens[64], n = 0;
    int ok = encode(t, text, 0, 0, tokens, &n) == 0 && n == n_want && memcmp(tokens, want, n * sizeof(int)) == 0;
    char detail[256];
    snprintf(detail, sizeof(detail), "%d ids, first %d", n, n > 0 ? tokens[0] : -1);
    check(ok, name, detail);
}

static void test_rank_merges_lowest_rank_first_leftmost_on_ties(void) {
    TestSection s;
    Tokenizer t;
    // ranks: 0 (b, c) -> 256 "bc"; 1 (a, b) -> 257 "ab"; 2 (a, a) -> 258 "aa"; 3 (257 "ab", c) -> 259 "abc"
    static const int merges[][2] = {{'b', 'c'}, {'a', 'b'}, {'a', 'a'}, {257, 'c'}};
    byte_level_section(&s, merges, 4, 0);
    if (build_tokenizer_from_memory(&t, s.data, s.size, 300, "test") != 0) {
        check(0, "rank_merge_tokenizer_loads", error_message);
        return;
    }
    // "abc": (b, c) has rank 0, so a + bc, though "abc" is a piece (reached only from ab + c)
    check_ids("rank_merge_takes_the_lowest_rank_not_the_longest_piece", &t, "abc", (int[]){'a', 256}, 2);
    check_ids("rank_merge_breaks_ties_leftmost", &t, "aaa", (int[]){258, 'a'}, 2);
    check_ids("rank_merge_never_produces_a_control_piece_from_text", &t, "<|end|>",
              (int[]){'<', '|', 'e', 'n', 'd', '|', '>'}, 7);
    check(strcmp(decode(&t, -1, t.eos_ids[0]), "") == 0 && is_end_token(&t, t.n_tokens - 1) &&
              special_token(&t, "<|end|>") == t.n_tokens - 1,
          "control_pieces_decode_to_nothing_and_end_generation", "decode, is_end_token or special_token");
    free_tokenizer(&t);
    // ignore_merges: a word that is a piece is one token, whatever the merges say
    byte_level_section(&s, merges, 4, FLAG_IGNORE_MERGES);
    build_tokenizer_from_memory(&t, s.data, s.size, 300, "test");
    check_ids("ignore_merges_takes_a_whole_word_that_is_a_piece", &t, "abc", (int[]){259}, 1);
    free_tokenizer(&t);
}

// A kind 3 (SentencePiece-style tokenizer.json) section: <unk> <s> </s>, the 256
// byte pieces, then `pieces` (text, type), merges by rank over their ids.
static void sp_json_section(TestSection *s, const char *const *pieces, const int *types, int n_pieces,
                            const int (*merges)[2], int n_merges, uint32_t flags) {
    memset(s, 0, sizeof(*s));
    int n = 3 + 256 + n_pieces;
    put_i32(s, 0, (int32_t)MAGIC_TOKN), put_i32(s, 4, 1), put_i32(s, 8, TOKENIZER_SP_JSON), put_i32(s, 12, n);
    put_i32(s, 16, 16), put_i32(s, 20, 1), put_i32(s, 24, 1), put_i32(s, 28, -1), put_i32(s, 32, 1);
    for (int k = 0; k < 8; k++) put_i32(s, 36 + 4 * k, k == 0 ? 2 : -1);
    put_i32(s, 72, (int32_t)flags), put_i32(s, 80, n_merges);
    s->size = TOKN_HEADER_BYTES;
    for (int i = 0; i < n; i++) {
        char byte_piece[8];
        const char *text = i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : i < 259 ? byte_piece : pieces[i - 259];
        if (i >= 3 && i < 259) snprintf(byte_piece, sizeof(byte_piece), "<0x%02X>", i - 3);
        int type = i < 3 ? PIECE_CONTROL : i < 259 ? PIECE_BYTE : types[i - 259], length = (int)strlen(text);
        append_i32(s, 0), append_i32(s, type), append_i32(s, length);
        memcpy(s->data + s->size, text, length);
        s->size += (length + 3) / 4 * 4;
    }
    for (int m = 0; m < n_merges; m++) append_i32(s, merges[m][0]), append_i32(s, merges[m][1]);
}

static void test_sp_json_prefix_user_pieces_and_byte_fallback(void) {
    // ids: 259 " ", 260 "a", 261 "b", 262 " a" (merge 0: " " + "a"), 263 "<b>" user-defined, 264 "<bb>" user-defined
    static const char *const pieces[] = {" ", "a", "b", " a", "<b>", "<bb>"};
    static const int types[] = {PIECE_NORMAL, PIECE_NORMAL, PIECE_NORMAL, PIECE_NORMAL, PIECE_USER, PIECE_USER};
    static const int merges[][2] = {{259, 260}};
    TestSection s;
    Tokenizer t;
    sp_json_section(&s, pieces, types, 6, merges, 1, FLAG_DUMMY_PREFIX | FLAG_BYTE_FALLBACK);
    if (build_tokenizer_from_memory(&t, s.data, s.size, 300, "test") != 0) {
        check(0, "sp_json_tokenizer_loads", error_message);
        return;
    }
    check_ids("sp_json_adds_the_dummy_prefix_and_merges_by_rank", &t, "ab", (int[]){262, 261}, 2);
    // "<bb>" is matched whole (longest first); the text after it gets no prefix ("first" scheme)
    check_ids("sp_json_matches_user_pieces_whole_longest_first", &t, "a<bb>a<b>", (int[]){262, 264, 260, 263}, 4);
    check_ids("sp_json_falls_back_to_bytes_for_unknown_characters", &t, "\xc3\xa9", (int[]){259, 3 + 0xC3, 3 + 0xA9}, 3);
    check_ids("sp_json_reads_a_typed_lower_one_eighth_block_as_a_space", &t, "b\xe2\x96\x81" "a", (int[]){259, 261, 262}, 3);
    check_ids("sp_json_never_produces_control_pieces_from_text", &t, "<s>", (int[]){259, 3 + '<', 3 + 's', 3 + '>'}, 4);
    check(strcmp(decode(&t, 1, 262), "a") == 0 && strcmp(decode(&t, 261, 262), " a") == 0 &&
              strcmp(decode(&t, 262, 3 + 0x41), "A") == 0,
          "sp_json_decode_drops_the_prefix_after_bos_and_turns_byte_pieces_into_bytes", "decode");
    free_tokenizer(&t);
    // Prepend-normalizer semantics (flag bit 5): every segment between user pieces gets a prefix
    sp_json_section(&s, pieces, types, 6, merges, 1, FLAG_DUMMY_PREFIX | FLAG_BYTE_FALLBACK | FLAG_PREFIX_EACH_SEGMENT);
    build_tokenizer_from_memory(&t, s.data, s.size, 300, "test");
    check_ids("sp_json_prefix_each_segment_prefixes_text_after_user_pieces", &t, "a<bb>a", (int[]){262, 264, 262}, 3);
    free_tokenizer(&t);
    // Gemma: no dummy prefix
    sp_json_section(&s, pieces, types, 6, merges, 1, FLAG_BYTE_FALLBACK);
    build_tokenizer_from_memory(&t, s.data, s.size, 300, "test");
    check_ids("sp_json_without_dummy_prefix_starts_at_the_text", &t, "a a", (int[]){260, 262}, 2);
    free_tokenizer(&t);
}

static void check_rejected(const char *name, TestSection *s, int vocab_size, const char *message) {
    Tokenizer t;
    error_message[0] = '\0';
    int result = build_tokenizer_from_memory(&t, s->data, s->size, vocab_size, "test");
    char detail[700];
    snprintf(detail, sizeof(detail), "result %d, message \"%s\", expected \"%s\"", result, error_message, message);
    check(result != 0 && strstr(error_message, message) != NULL && t.vocab == NULL, name, detail);
    if (result == 0) free_tokenizer(&t);
}

// Flag split_newlines (Gemma 4 from a GGUF file, llama.cpp's gemma4 pre-tokenizer): BPE within runs
// of newlines and runs of other characters; a run of newlines that is a piece is that token.
static void test_sp_json_split_newlines(void) {
    // ids: 259 "a", 260 "\n", 261 "\n\n" (merge 0), 262 "a\n" (merge 1), 263 "\n\n\n" (no merge makes it)
    static const char *const pieces[] = {"a", "\n", "\n\n", "a\n", "\n\n\n"};
    static const int types[] = {PIECE_NORMAL, PIECE_NORMAL, PIECE_NORMAL, PIECE_NORMAL, PIECE_NORMAL};
    static const int merges[][2] = {{260, 260}, {259, 260}};
    TestSection s;
    Tokenizer t;
    sp_json_section(&s, pieces, types, 5, merges, 2, FLAG_BYTE_FALLBACK);
    build_tokenizer_from_memory(&t, s.data, s.size, 300, "test");
    check_ids("sp_json_merges_newline_runs_by_rank_without_the_flag", &t, "a\n\n\n", (int[]){259, 261, 260}, 3);
    free_tokenizer(&t);
    sp_json_section(&s, pieces, types, 5, merges, 2, FLAG_BYTE_FALLBACK | FLAG_SPLIT_NEWLINES);
    if (build_tokenizer_from_memory(&t, s.data, s.size, 300, "test") != 0) {
        check(0, "split_newlines_tokenizer_loads", error_message);
        return;
    }
    check_ids("split_newlines_keeps_bpe_within_runs", &t, "a\na", (int[]){259, 260, 259}, 3);
    check_ids("split_newlines_takes_a_run_that_is_a_piece_whole", &t, "a\n\n\n", (int[]){259, 263}, 2);
    check_ids("split_newlines_merges_a_run_that_is_no_piece", &t, "\n\n\n\n\na", (int[]){261, 261, 260, 259}, 4);
    free_tokenizer(&t);
    sp_json_section(&s, pieces, types, 5, merges, 2, FLAG_DUMMY_PREFIX | FLAG_SPLIT_NEWLINES);
    check_rejected("split_newlines_is_refused_with_a_dummy_prefix", &s, 300, "split_newlines needs kind 3 without");
}

static void test_tokn_loader_refuses_bad_sections(void) {
    static const int merges[][2] = {{'b', 'c'}, {'a', 'b'}};
    TestSection s;
    int n = byte_level_section(&s, merges, 2, 0);
    TestSection bad = s;
    check_rejected("tokn_more_tokens_than_the_model_is_refused", &bad, n - 1, "more than the model's");
    put_i32(&bad, s.size - 8, 'z'); // merge 1 becomes (z, b): "zb" is no piece
    check_rejected("tokn_merge_without_a_result_piece_is_refused", &bad, 300, "makes no piece");
    bad = s;
    put_i32(&bad, s.size - 4, 5000);
    check_rejected("tokn_merge_naming_an_unknown_id_is_refused", &bad, 300, "out of range");
    bad = s;
    bad.size -= 3;
    check_rejected("tokn_truncated_section_is_refused", &bad, 300, "ends inside its merges");
    bad = s;
    put_i32(&bad, 36 + 4, 7); // eos_ids[1] set while n_eos is 1
    check_rejected("tokn_unused_eos_slot_must_be_minus_one", &bad, 300, "unused eos_ids[1]");
    bad = s;
    put_i32(&bad, 12 * 0 + 128 + 4, 9); // token 0's type
    check_rejected("tokn_unknown_piece_type_is_refused", &bad, 300, "bad type 9");
    bad = s;
    put_i32(&bad, 128 + 16 * 1 + 12, 0x00); // token 1's byte becomes 0x00, a second "\0"
    check_rejected("tokn_duplicate_pieces_are_refused", &bad, 300, "are the same piece");
    bad = s;
    bad.data[120] = 1;
    check_rejected("tokn_reserved_header_bytes_must_be_zero", &bad, 300, "reserved header byte 120");
    // class ranges out of order
    bad = s;
    put_i32(&bad, 84, 2);
    append_i32(&bad, 0x61), append_i32(&bad, 0x7A), append_i32(&bad, CLASS_LL);
    append_i32(&bad, 0x41), append_i32(&bad, 0x5A), append_i32(&bad, CLASS_LU);
    check_rejected("tokn_unsorted_class_ranges_are_refused", &bad, 300, "class row 1");
}

// ROPE version 2: tensors at multiples of 64 bytes, then the tokenizer section.
static void test_rope_v2_header_places_tensors_and_tokenizer(void) {
    unsigned char h[HEADER_BYTES] = {0};
    int32_t fields[] = {(int32_t)MAGIC_ROPE, 2, 4, 6, 1, 1, 1, 5, 4, 1}; // tensors of 16 to 96 bytes
    for (int i = 0; i < 10; i++) memcpy(h + 4 * i, &fields[i], 4);
    float f[] = {1e-5f, 10000.0f, 1.0f, 1.0f};
    memcpy(h + 40, f, sizeof(f));
    // by hand: embedding 5*4 floats at 256; rms_att at 384; wq, wk, wv, wo (64 bytes each) at 448,
    // 512, 576, 640; rms_ffn at 704; w1, w2, w3 (96 bytes each) at 768, 896, 1024; rms_final at
    // 1152, ending at 1168; the tokenizer at 1216
    uint64_t offset = 1216, bytes = 300;
    memcpy(h + 96, &offset, 8), memcpy(h + 104, &bytes, 8);
    Config c;
    CheckpointFormat format;
    size_t data_offset;
    uint64_t expected;
    SectionSpan section;
    int ok = parse_header(h, sizeof(h), &c, &format, &data_offset, &expected, &section) == 0;
    check(ok && format == FORMAT_ROPE && c.version == 2 && expected == 1216 + 300 && section.offset == 1216,
          "rope_v2_tokenizer_follows_the_64_byte_aligned_tensors", error_message);
    offset = 1168;
    memcpy(h + 96, &offset, 8);
    check(parse_header(h, sizeof(h), &c, &format, &data_offset, &expected, &section) != 0 &&
              strstr(error_message, "first multiple of 64") != NULL,
          "rope_v2_tokenizer_must_start_at_the_next_multiple_of_64", error_message);
    offset = 1216;
    memcpy(h + 96, &offset, 8);
    h[88] = 12; // weight_type 12: no such type (3 is q8_0, 4 a type table, 11 q6_k)
    check(parse_header(h, sizeof(h), &c, &format, &data_offset, &expected, &section) != 0 &&
              strstr(error_message, "weight_type 12") != NULL,
          "rope_v2_refuses_an_unknown_weight_type", error_message);
    h[88] = 0;
    // the weights map to the same offsets (the config as parsed: the layers' pieces placed)
    parse_header(h, sizeof(h), &c, &format, &data_offset, &expected, &section);
    static float file[1216 / 4] __attribute__((aligned(64)));
    TransformerWeights w;
    map_weights(&w, &c, FORMAT_ROPE, (uintptr_t)file, HEADER_BYTES);
    check((const char *)w.layer[0].wq.data - (const char *)file == 448 &&
              (const char *)w.layer[0].w1.data - (const char *)file == 768 &&
              (const char *)w.rms_final - (const char *)file == 1152,
          "rope_v2_map_weights_aligns_every_tensor", "wq or rms_final misplaced");
}

int main(int argc, char **argv) {
    test_pretokenizer_scanners_follow_their_patterns();
    test_nfc_on_a_tiny_table();
    test_rank_merges_lowest_rank_first_leftmost_on_ties();
    test_sp_json_prefix_user_pieces_and_byte_fallback();
    test_sp_json_split_newlines();
    test_tokn_loader_refuses_bad_sections();
    test_rope_v2_header_places_tensors_and_tokenizer();
    test_rotation_equals_block_diagonal_matrix();
    test_score_depends_only_on_relative_position();
    test_rotation_preserves_norm();
    test_prope_leaves_unrotated_pairs_alone();
    test_rope_angles_is_floor_of_p_times_half_head();
    test_table_rope_equals_plain_rope();
    test_rope_frequencies_follow_theta();
    test_longrope_never_reads_past_its_factors();
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
    test_q8_0_widening_is_exact_for_every_scale_and_value();
    static struct {
        int n, d;
        const char *what;
    } q8_sizes[] = {{9 * 32, 23, "whole_blocks"},
                    {32, 5, "one_block_rows"},
                    {3 * 32, 7, "odd_sizes"},
                    {37 * 32, 251, "threaded"},
                    {PREFETCH_MIN_ROW + 32, 251, "threaded_prefetching"}};
    for (size_t i = 0; i < sizeof(q8_sizes) / sizeof(q8_sizes[0]); i++)
        test_q8_0_matmul_equals_dequantized_f32(q8_sizes[i].n, q8_sizes[i].d, q8_sizes[i].what);
    test_block_types_widen_and_multiply_as_their_definition();
    test_greedy_choice_is_first_index_of_largest();
    test_thread_bands_cover_every_row_once();
    test_row_split_follows_thread_speeds();
    test_uneven_split_keeps_matmul_bitwise(37 * 8, 251, "matmul_under_uneven_thread_split_equals_one_dot_per_row_bitwise");
    test_uneven_split_keeps_matmul_bitwise(37 * 8 + 5, 251,
                                           "matmul_under_uneven_thread_split_equals_one_dot_per_row_bitwise_with_tail");
    test_uneven_split_keeps_matmul_bitwise(PREFETCH_MIN_ROW + 13, 251,
                                           "prefetching_matmul_under_uneven_thread_split_equals_one_dot_per_row_bitwise");
    test_every_read_order_equals_plain_matmul();
    test_cgroup_limit_is_the_smallest_of_its_ancestors();
    if (argc > 1) {
        test_block_forward_equals_token_forward(argv[1]);
        test_fast_forward_equals_plain_forward(argv[1]);
        test_16bit_forward_equals_widened_float32_forward(argv[1], WEIGHT_BF16, 0);
        test_16bit_forward_equals_widened_float32_forward(argv[1], WEIGHT_F16, 0);
        test_16bit_forward_equals_widened_float32_forward(argv[1], WEIGHT_F32, 1);
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
        variant_window0 = 9; // layer 0 slides too: every sliding layer a ring that wraps
        test_block_forward_equals_token_forward(argv[1]);
        test_fast_forward_equals_plain_forward(argv[1]);
        variant_window0 = 0;
        use_variant = 0;
        test_ring_shift_keeps_the_visible_keys(argv[1], 500, 12, 300, 1, "ring_shift_moves_the_visible_keys_rotated");
        // a move of 133 = 136 - 3 positions: each destination the slot of a source 3 positions on,
        // still to move
        test_ring_shift_keeps_the_visible_keys(argv[1], 500, 12, 145, 1,
                                               "ring_shift_onto_overlapping_slots_moves_the_visible_keys");
        test_ring_shift_keeps_the_visible_keys(argv[1], 140, 12, 135, 1,
                                               "ring_shift_of_a_short_tail_keeps_the_visible_head");
        test_ring_shift_keeps_the_visible_keys(argv[1], 305, 12, 300, 0,
                                               "ring_shift_refused_when_the_visible_head_was_overwritten");
    }
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed != 0;
}
