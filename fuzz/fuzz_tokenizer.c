// libFuzzer harness: tokenizer.bin files.
//
// Input: two bytes (little-endian) choose the model's vocab_size, 1 + (u16 % 4096);
// the rest is the tokenizer file. build_tokenizer_from_memory must either fail with
// a message or build exactly vocab_size pieces that respect max_token_length and a
// sorted lookup table of valid ids. A built tokenizer then encodes a few fixed texts
// (words, byte fallback, malformed UTF-8) and every produced id must be a token of
// the vocabulary, as the forward pass indexes the embedding with it; decode and
// safe_print (stdout goes to /dev/null) run on each.
//
// Encoding is left out for vocab_size < 3, which validate_config refuses for a
// model (a vocabulary holds <unk>, <s> and </s>). This harness found encode's byte
// fallback emitting ids byte + 3 beyond small vocabularies (now <unk>, byte_token).
#include "fuzz_common.h"


static const char *const TEXTS[] = {
    "", "a", "Once upon a time", "  two  spaces ", "<s></s><0x41>", "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac",
    "\xff\xfe\x80 \xc3\x28 \xe2\x82", "\x01\x02\x1b[31m\x7f",
};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!freopen("/dev/null", "w", stdout)) return 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int vocab_size = 1 + ((data[0] | data[1] << 8) % 4096);
    Tokenizer t;
    error_message[0] = '\0';
    if (build_tokenizer_from_memory(&t, data + 2, size - 2, vocab_size, "fuzz") != 0) {
        CHECK(error_message[0] != '\0');
        CHECK(t.vocab == NULL && t.sorted_vocab == NULL); // freed on failure
        return 0;
    }
    CHECK(t.vocab_size == vocab_size);
    CHECK(t.max_token_length >= 1 && t.max_token_length <= 1024);
    CHECK(t.n_sorted >= 0 && t.n_sorted <= vocab_size);
    for (int i = 0; i < vocab_size; i++) {
        CHECK(t.vocab[i] != NULL);
        CHECK(t.vocab_length[i] >= 0 && t.vocab_length[i] <= t.max_token_length);
        CHECK(t.vocab[i][t.vocab_length[i]] == '\0');
        CHECK(isfinite(t.vocab_scores[i]));
    }
    for (int i = 0; i < t.n_sorted; i++) {
        CHECK(t.sorted_vocab[i].id >= 0 && t.sorted_vocab[i].id < vocab_size);
        if (i > 0) CHECK(strcmp(t.sorted_vocab[i - 1].str, t.sorted_vocab[i].str) <= 0);
    }

    // a model's vocabulary holds at least <unk>, <s> and </s> (validate_config)
    int encode_ok = vocab_size > TOKEN_EOS;
    for (size_t k = 0; encode_ok && k < sizeof(TEXTS) / sizeof(TEXTS[0]); k++) {
        const char *text = TEXTS[k];
        int *tokens = malloc((strlen(text) + 3) * sizeof(int)), n = 0;
        if (!tokens) break;
        CHECK(encode(&t, text, 1, 1, tokens, &n) == 0);
        CHECK(n >= 2 && (size_t)n <= strlen(text) + 3);
        CHECK(tokens[0] == TOKEN_BOS && tokens[n - 1] == TOKEN_EOS);
        for (int i = 0; i < n; i++) {
            CHECK(tokens[i] >= 0 && tokens[i] < vocab_size);
            if (i > 0) safe_print(decode(&t, tokens[i - 1], tokens[i]));
        }
        free(tokens);
    }
    free_tokenizer(&t);
    return 0;
}
