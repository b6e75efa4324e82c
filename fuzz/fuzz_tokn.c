// libFuzzer harness: TOKN tokenizer sections (standalone tokenizer files and the
// section inside a ROPE version 2 checkpoint).
//
// Input: two bytes (little-endian) give the model's vocab_size, 1 + u16; the rest
// is the section. build_tokenizer_from_memory must either fail with a message (and
// free everything) or build a tokenizer whose tables are in range and sorted. A
// built tokenizer then encodes a few fixed texts (words in several scripts, digits,
// whitespace runs, decomposed accents, Hangul, special-token text, malformed UTF-8):
// every id must be a stored piece (< n_tokens <= vocab_size), never a control
// piece from the text, within encode_capacity; decode and safe_print (stdout goes
// to /dev/null) run on each.
#include "fuzz_common.h"

static const char *const TEXTS[] = {
    "", "a", "Hello world! It's 2024: 1234567 apples.", "  two  spaces \t\r\n\n end  ",
    "caf\xc3\xa9 cafe\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac \xed\x95\x9c\xea\xb8\x80 \xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab",
    "<|endoftext|><s></s><0x41><b>", "\xff\xfe\x80 \xc3\x28 \xe2\x82", "\x01\x02\x1b[31m\x7f",
    "DON'T you'LL I'M x\xe2\x96\x81y \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd a\xcc\x81\xcc\xa3\xcc\x81",
};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!freopen("/dev/null", "w", stdout)) return 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 6 || read_u32(data + 2) != MAGIC_TOKN) return 0; // tokenizer.bin is fuzz_tokenizer's
    int vocab_size = 1 + (data[0] | data[1] << 8);
    Tokenizer t;
    error_message[0] = '\0';
    if (build_tokenizer_from_memory(&t, data + 2, size - 2, vocab_size, "fuzz") != 0) {
        CHECK(error_message[0] != '\0');
        CHECK(t.vocab == NULL && t.sorted_vocab == NULL && t.merges == NULL); // freed on failure
        return 0;
    }
    CHECK(t.vocab_size == vocab_size && t.n_tokens >= 1 && t.n_tokens <= vocab_size);
    CHECK(t.bos_id >= -1 && t.bos_id < t.n_tokens && t.eot_id >= -1 && t.eot_id < t.n_tokens);
    CHECK(t.n_eos >= 1 && t.n_eos <= MAX_END_TOKENS);
    for (int k = 0; k < t.n_eos; k++) CHECK(t.eos_ids[k] >= 0 && t.eos_ids[k] < t.n_tokens);
    for (int i = 0; i < vocab_size; i++) {
        CHECK(t.vocab[i] != NULL);
        CHECK(t.vocab_length[i] >= 0 && t.vocab_length[i] <= t.max_token_length);
        CHECK(t.vocab[i][t.vocab_length[i]] == '\0');
        CHECK(i < t.n_tokens || t.vocab_length[i] == 0);
    }
    for (int i = 0; i < t.n_sorted; i++) {
        CHECK(t.sorted_vocab[i].id >= 0 && t.sorted_vocab[i].id < t.n_tokens);
        if (i > 0) CHECK(compare_tokens(&t.sorted_vocab[i - 1], &t.sorted_vocab[i]) < 0);
    }
    for (int b = 0; b < 256; b++) CHECK(t.byte_ids[b] >= -1 && t.byte_ids[b] < t.n_tokens);

    for (size_t k = 0; k < sizeof(TEXTS) / sizeof(TEXTS[0]); k++) {
        const char *text = TEXTS[k];
        size_t capacity = encode_capacity(&t, strlen(text));
        int *tokens = malloc(capacity * sizeof(int)), n = 0;
        if (!tokens) break;
        CHECK(encode(&t, text, 1, 1, tokens, &n) == 0);
        CHECK(n >= 1 && (size_t)n <= capacity);
        int first = t.bos_id >= 0 ? 1 : 0;
        if (first) CHECK(tokens[0] == t.bos_id);
        CHECK(tokens[n - 1] == t.eos_ids[0]);
        for (int i = 0; i < n; i++) {
            CHECK(tokens[i] >= 0 && tokens[i] < t.n_tokens);
            if (i >= first && i < n - 1) CHECK(t.vocab_type[tokens[i]] != PIECE_CONTROL || tokens[i] == t.unk_id);
            safe_print(decode(&t, i > 0 ? tokens[i - 1] : -1, tokens[i]));
        }
        free(tokens);
    }
    CHECK(special_token(&t, "<|endoftext|>") >= -1);
    free_tokenizer(&t);
    return 0;
}
