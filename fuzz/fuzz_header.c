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


// [p, p + n elements of element_bytes) lies inside [lo, hi), p aligned to its
// element (version 2: to 64 bytes from the start of the file)
static void check_inside(const void *p, uint64_t n, size_t element_bytes, const char *lo, const char *hi,
                         size_t alignment) {
    CHECK(p != NULL);
    CHECK((const char *)p >= lo);
    CHECK(n <= (uint64_t)(hi - (const char *)p) / element_bytes);
    CHECK((uintptr_t)p % element_bytes == 0 && (uintptr_t)p % alignment == 0);
}

// a matrix of n weights of its type (a block type's: whole blocks, as Q8_0's n / 32 blocks of 34
// bytes) lies inside [lo, hi), on the tensors' alignment
static void matrix_inside(Matrix m, uint64_t n, const char *lo, const char *hi, size_t alignment) {
    CHECK(m.data != NULL);
    CHECK((const char *)m.data >= lo);
    CHECK(m.type >= 0 && m.type < N_WEIGHT_TYPES && m.type != WEIGHT_TYPE_PER_PIECE);
    CHECK(n % (uint64_t)block_shapes[m.type].weights == 0);
    CHECK(weight_bytes(m.type, n) <= (uint64_t)(hi - (const char *)m.data));
    CHECK((uintptr_t)m.data % alignment == 0 && (is_block_type(m.type) || (uintptr_t)m.data % weight_bytes(m.type, 1) == 0));
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
    CHECK(c.version == 2 || c.weight_type == WEIGHT_F32); // only version 2 has 16-bit and Q8_0 weights
    CHECK(c.weight_type >= 0 && c.weight_type < N_WEIGHT_TYPES && c.weight_type != WEIGHT_TYPE_PER_PIECE);
    CHECK(expected > offset);
    if (section.bytes == 0 && c.type_table_bytes == 0) // (a type table's bytes make any size)
        CHECK(section.offset == 0 && (expected - offset) % (c.weight_type == WEIGHT_F32 ? 4 : 2) == 0); // every block's bytes are even
    else if (section.bytes == 0) CHECK(section.offset == 0 && c.type_table_offset + c.type_table_bytes == expected);
    else CHECK(c.version == 2 && section.offset % 64 == 0 && section.offset + section.bytes == expected);
    // the bound that keeps the products from overflowing: far below 2^63
    CHECK(expected < (1ull << 62));
    CHECK(rope_angles_of(&c, LAYER_ROPE_FIRST) >= 0 && rope_angles_of(&c, LAYER_ROPE_FIRST) <= head_size_of(&c) / 2);
    if (expected != size) return 0;

    // An aligned private copy, as mmap would give (the formats keep floats 4-aligned,
    // version 2 every tensor 64-aligned from the start of the file).
    size_t alloc = (size + 63) & ~(size_t)63;
    char *copy = aligned_alloc(64, alloc);
    if (!copy) return 0;
    memcpy(copy, data, size);
    const char *lo = copy + offset, *hi = copy + size;
    size_t alignment = c.version == 2 ? ROPE_V2_ALIGNMENT : 1;

    Transformer t;
    memset(&t, 0, sizeof(t));
    t.config = c;
    t.format = format;
    uint64_t tensors_end = map_weights(&t.weights, &c, format, (uintptr_t)copy, offset);
    if (tensors_end == 0) { // as load_checkpoint: a Q8_0 scale not finite
        CHECK(error_message[0] != '\0');
        free(copy);
        return 0;
    }
    // what follows the tensors, at the next multiple of 64 (version 2): the per-layer table, the
    // type table or the tokenizer section; else nothing, the tensors end the file
    uint64_t after_tensors = c.layer_table_bytes  ? c.layer_table_offset
                             : c.type_table_bytes ? c.type_table_offset
                             : section.bytes      ? section.offset
                                                  : size;
    CHECK(after_tensors != size ? tensors_end <= after_tensors && after_tensors - tensors_end < ROPE_V2_ALIGNMENT
                                : tensors_end == size);
    const TransformerWeights *w = &t.weights;
    // the layered tensors' sizes, summed over the layers here (Gemma 4's differ per layer)
    uint64_t dim = c.dim, layers = c.n_layers, q_rows = 0, kv_rows = 0, v_rows = 0, heads = 0,
             k_heads = 0;
    for (int l = 0; l < c.n_layers; l++) {
        const LayerSpec *ls = &c.layer[l];
        uint64_t kv = (uint64_t)ls->n_kv_heads * ls->head_size;
        q_rows += (uint64_t)c.n_heads * ls->head_size, heads += ls->head_size;
        if (ls->kv_source == l) kv_rows += kv, v_rows += ls->values_are_keys ? 0 : kv, k_heads += ls->head_size;
        CHECK(ls->kv_source <= l && c.layer[ls->kv_source].kv_source == ls->kv_source);
    }
    matrix_inside(w->token_embedding, (uint64_t)c.vocab_size * dim, lo, hi, alignment);
    check_inside(w->rms_att, layers * dim, sizeof(float), lo, hi, alignment);
    check_inside(w->rms_ffn, layers * dim, sizeof(float), lo, hi, alignment);
    check_inside(w->rms_final, dim, sizeof(float), lo, hi, alignment);
    for (int l = 0; l < c.n_layers; l++) { // each layer's pieces (with a type table, each aligned)
        const LayerSpec *ls = &c.layer[l];
        const LayerWeights *lw = &w->layer[l];
        uint64_t q = (uint64_t)c.n_heads * ls->head_size, hidden = ls->hidden_dim, kv = 0, v = 0;
        if (ls->kv_source == l) kv = (uint64_t)ls->n_kv_heads * ls->head_size, v = ls->values_are_keys ? 0 : kv;
        size_t a = c.type_table_bytes ? alignment : 1;
        matrix_inside(lw->wq, q * dim, lo, hi, a);
        if (kv) matrix_inside(lw->wk, kv * dim, lo, hi, a);
        if (v) matrix_inside(lw->wv, v * dim, lo, hi, a);
        matrix_inside(lw->wo, dim * q, lo, hi, a);
        if (hidden) {
            matrix_inside(lw->w1, hidden * dim, lo, hi, a);
            matrix_inside(lw->w2, dim * hidden, lo, hi, a);
            matrix_inside(lw->w3, hidden * dim, lo, hi, a);
        }
        if (c.per_layer_dim) {
            matrix_inside(lw->per_layer_gate, (uint64_t)c.per_layer_dim * dim, lo, hi, a);
            matrix_inside(lw->per_layer_out, dim * c.per_layer_dim, lo, hi, a);
        }
        if (ls->experts) {
            uint64_t E = c.n_experts, eh = c.expert_hidden;
            matrix_inside(lw->router, E * dim, lo, hi, a);
            matrix_inside(lw->expert_w1, E * eh * dim, lo, hi, a);
            matrix_inside(lw->expert_w2, E * dim * eh, lo, hi, a);
            matrix_inside(lw->expert_w3, E * eh * dim, lo, hi, a);
        }
    }
    matrix_inside(w->wcls, (uint64_t)c.vocab_size * dim, lo, hi, alignment);
    // version 2's optional tensors, and the per-layer table (the file's last bytes)
    if (c.qkv_bias) {
        check_inside(w->bq, q_rows, sizeof(float), lo, hi, alignment);
        check_inside(w->bk, kv_rows, sizeof(float), lo, hi, alignment);
        check_inside(w->bv, v_rows, sizeof(float), lo, hi, alignment);
    }
    if (c.qk_norm) {
        check_inside(w->q_norm, heads, sizeof(float), lo, hi, alignment);
        check_inside(w->k_norm, k_heads, sizeof(float), lo, hi, alignment);
    }
    if (c.post_norms) {
        check_inside(w->rms_post_att, layers * dim, sizeof(float), lo, hi, alignment);
        check_inside(w->rms_post_ffn, layers * dim, sizeof(float), lo, hi, alignment);
    }
    if (c.layer_scalars) check_inside(w->layer_scalars, layers, sizeof(float), lo, hi, alignment);
    if (c.per_layer_dim) { // Gemma 4's per-layer inputs
        uint64_t P = c.per_layer_dim;
        matrix_inside(w->per_layer_embedding, (uint64_t)c.vocab_size * layers * P, lo, hi, alignment);
        matrix_inside(w->per_layer_in, layers * P * dim, lo, hi, alignment);
        check_inside(w->per_layer_in_norm, P, sizeof(float), lo, hi, alignment);
        check_inside(w->rms_per_layer, layers * dim, sizeof(float), lo, hi, alignment);
    }
    if (c.rope[LAYER_ROPE_FIRST].scaling == ROPE_SCALING_LONGROPE) { // its factors, as load_checkpoint points the config at them
        check_inside(w->rope_factors, 2ull * rope_angles_of(&c, LAYER_ROPE_FIRST), sizeof(float), lo, hi, alignment);
        t.config.rope[LAYER_ROPE_FIRST].longrope_factors = w->rope_factors;
    }
    if (c.layer_table_bytes == 8ull * c.n_layers) { // records of eight fields were read by parse_header
        CHECK(c.layer_table_offset % ROPE_V2_ALIGNMENT == 0 && c.layer_table_offset + c.layer_table_bytes <= size);
        if (parse_layer_table((const unsigned char *)copy + c.layer_table_offset, &t.config) != 0) {
            CHECK(error_message[0] != '\0');
            free(copy);
            return 0;
        }
    }
    if (section.bytes > 0) { // the tokenizer inside: after the tensors, and it loads or fails cleanly
        TransformerWeights layout;
        CHECK(map_weights(&layout, &c, format, 0, offset) <= section.offset);
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
