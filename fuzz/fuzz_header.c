// libFuzzer harness: checkpoint headers of the formats (legacy, llama2.c v1, ROPE v1
// and v2, whose tokenizer section, when the file has one, is built too).
//
// The input is a whole checkpoint file. parse_header must either fail with a
// message or return a config that validate_config accepts, a data offset inside the
// expected size, and an expected size that no product overflowed. When the input
// has exactly the size the header implies (the seed corpus holds tiny complete
// models), the weights are mapped into an aligned copy, every tensor is checked to
// lie inside it, and one forward step plus one top-p sample are run on a context
// cut to a few positions (cheap: inputs are at most a few KB).
// (This sampling step found nothing new: llama2.c's probindex[-1] read in
// sample_topp, for NaN logits or vocab_size 1, was fixed before the first run.)
#include "fuzz_common.h"


// [p, p + n floats) lies inside [lo, hi)
static void check_inside(const float *p, uint64_t n, const char *lo, const char *hi) {
    CHECK(p != NULL);
    CHECK((const char *)p >= lo);
    CHECK(n <= (uint64_t)(hi - (const char *)p) / sizeof(float));
}

static int logits_finite(const float *logits, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(logits[i])) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Config c;
    CheckpointFormat format;
    size_t offset = 0;
    uint64_t expected = 0;
    SectionSpan section;
    error_message[0] = '\0';
    if (parse_header(data, size, &c, &format, &offset, &expected, &section) != 0) {
        CHECK(error_message[0] != '\0'); // every failure says why
        return 0;
    }
    CHECK(validate_config(&c) == 0);
    CHECK(offset == (format == FORMAT_LLAMA2C_LEGACY ? LEGACY_HEADER_BYTES : HEADER_BYTES));
    CHECK(expected > offset);
    if (section.bytes == 0) CHECK(section.offset == 0 && (expected - offset) % sizeof(float) == 0);
    else CHECK(format == FORMAT_ROPE_V2 && section.offset % 64 == 0 && section.offset + section.bytes == expected);
    // the bound that keeps the products from overflowing: far below 2^63
    CHECK(expected < (1ull << 62));
    CHECK(rope_angles_of(&c) >= 0 && rope_angles_of(&c) <= head_size_of(&c) / 2);
    if (expected != size) return 0;

    // An aligned private copy, as mmap would give (the formats keep floats 4-aligned).
    size_t alloc = (size + 63) & ~(size_t)63;
    char *copy = aligned_alloc(64, alloc);
    if (!copy) return 0;
    memcpy(copy, data, size);
    const char *lo = copy + offset, *hi = copy + size;

    Transformer t;
    memset(&t, 0, sizeof(t));
    t.config = c;
    t.format = format;
    map_weights(&t.weights, &c, format, (const float *)lo);
    const TransformerWeights *w = &t.weights;
    uint64_t dim = c.dim, layers = c.n_layers, hidden = c.hidden_dim, kv = kv_dim_of(&c);
    uint64_t q_dim = (uint64_t)c.n_heads * head_size_of(&c);
    check_inside(w->token_embedding, (uint64_t)c.vocab_size * dim, lo, hi);
    check_inside(w->rms_att, layers * dim, lo, hi);
    check_inside(w->rms_ffn, layers * dim, lo, hi);
    check_inside(w->rms_final, dim, lo, hi);
    check_inside(w->wq, layers * q_dim * dim, lo, hi);
    check_inside(w->wk, layers * kv * dim, lo, hi);
    check_inside(w->wv, layers * kv * dim, lo, hi);
    check_inside(w->wo, layers * dim * q_dim, lo, hi);
    check_inside(w->w1, layers * hidden * dim, lo, hi);
    check_inside(w->w2, layers * dim * hidden, lo, hi);
    check_inside(w->w3, layers * hidden * dim, lo, hi);
    check_inside(w->wcls, (uint64_t)c.vocab_size * dim, lo, hi);
    if (section.bytes > 0) { // the tokenizer inside: after the tensors, and it loads or fails cleanly
        const char *end_of_weights = (const char *)(w->wcls + (uint64_t)c.vocab_size * dim);
        if (c.shared_classifier) end_of_weights = (const char *)(w->rms_final + dim);
        CHECK(end_of_weights <= copy + section.offset);
        Tokenizer tok;
        if (build_tokenizer_from_memory(&tok, data + section.offset, section.bytes, c.vocab_size, "section") == 0)
            free_tokenizer(&tok);
    }

    // One forward step and one sample, with the context cut to 4 positions: the
    // weights do not depend on seq_len (legacy's freq_cis are skipped already).
    if (t.config.seq_len > 4) t.config.seq_len = 4;
    if (build_run_state(&t.state, &t.config) == 0) {
        int token = c.vocab_size > TOKEN_BOS ? TOKEN_BOS : 0;
        float *logits = forward(&t, token, 0);
        Sampler sampler;
        if (build_sampler(&sampler, c.vocab_size, 1.0f, 0.9f, 42) == 0) {
            // NaN logits (from NaN weights) are refused by the programs before
            // sampling (check_logits); sample must stay in range on them anyway
            int next = sample(&sampler, logits);
            CHECK(next >= 0 && next < c.vocab_size);
            if (logits_finite(logits, c.vocab_size) && c.vocab_size > 1) {
                sampler.temperature = 0.0f; // greedy: the argmax
                int best = sample(&sampler, logits);
                for (int i = 0; i < c.vocab_size; i++) CHECK(logits[i] <= logits[best]);
            }
            free_sampler(&sampler);
        }
        free_run_state(&t.state);
    }
    free(copy);
    return 0;
}
