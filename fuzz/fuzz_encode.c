// libFuzzer harness: encode and decode arbitrary text with a real tokenizer.
//
// The tokenizer is built once, from $FUZZ_TOKENIZER if set, else tok512.bin found
// in ../shared/models relative to the executable's directory's parent (the repo)
// or to the current directory. Every input (cut at its first NUL, as a C string
// from argv or a text file would be) is encoded with BOS and EOS; every id must be
// in range, and decoding the ids back must give the text exactly (SentencePiece's
// dummy-prefix space is dropped after BOS; byte-fallback pieces become their byte),
// so nothing of the prompt is lost or invented. safe_print runs on every piece with
// stdout sent to /dev/null.
#include "fuzz_common.h"

#include <libgen.h>

static Tokenizer tokenizer;

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return NULL;
    }
    *size = (size_t)st.st_size;
    unsigned char *data = malloc(*size ? *size : 1);
    if (data && fread(data, 1, *size, f) != *size) {
        free(data);
        data = NULL;
    }
    fclose(f);
    return data;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    char candidates[4][PATH_MAX];
    int n = 0;
    const char *env = getenv("FUZZ_TOKENIZER");
    if (env && env[0]) snprintf(candidates[n++], PATH_MAX, "%s", env);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len <= 0 && argv && *argv && (*argv)[0]) { // no /proc: fall back to argv[0]
        snprintf(exe, sizeof(exe), "%s", (*argv)[0]);
        len = (ssize_t)strlen(exe);
    }
    if (len > 0) {
        exe[len] = '\0';
        char *dir = dirname(exe); // .../repo/fuzz
        snprintf(candidates[n++], PATH_MAX, "%s/../../shared/models/tok512.bin", dir);
    }
    snprintf(candidates[n++], PATH_MAX, "../shared/models/tok512.bin");    // cwd = the repo
    snprintf(candidates[n++], PATH_MAX, "../../shared/models/tok512.bin"); // cwd = fuzz/
    for (int i = 0; i < n; i++) {
        size_t size = 0;
        unsigned char *data = read_file(candidates[i], &size);
        if (!data) continue;
        int vocab = size >= 4 ? (int)count_legacy_pieces(data, size) : -1; // run.c's
        int ok = vocab > 0 && build_tokenizer_from_memory(&tokenizer, data, size, vocab, candidates[i]) == 0;
        free(data);
        if (ok) {
            fprintf(stderr, "fuzz_encode: tokenizer %s (%d tokens)\n", candidates[i], vocab);
            if (!freopen("/dev/null", "w", stdout)) return 0;
            return 0;
        }
        fprintf(stderr, "fuzz_encode: cannot use %s: %s\n", candidates[i], error_message);
    }
    fprintf(stderr, "fuzz_encode: no tokenizer; set FUZZ_TOKENIZER=path/to/tok512.bin\n");
    exit(1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    size_t text_len = strlen(text);
    int *tokens = malloc((text_len + 3) * sizeof(int)), n = 0;
    char *decoded = malloc(text_len + 2);
    if (!tokens || !decoded) {
        free(text);
        free(tokens);
        free(decoded);
        return 0;
    }
    CHECK(encode(&tokenizer, text, 1, 1, tokens, &n) == 0);
    CHECK(n >= 2 && (size_t)n <= text_len + 3);
    CHECK(tokens[0] == TOKEN_BOS && tokens[n - 1] == TOKEN_EOS);
    size_t out = 0;
    for (int i = 1; i < n; i++) {
        CHECK(tokens[i] >= 0 && tokens[i] < tokenizer.vocab_size);
        if (i == n - 1) break; // EOS
        CHECK(tokens[i] != TOKEN_BOS && tokens[i] != TOKEN_EOS && tokens[i] != TOKEN_UNK);
        const char *piece = decode(&tokenizer, tokens[i - 1], tokens[i]);
        safe_print(piece);
        size_t piece_len = strlen(piece);
        if (byte_piece_value(tokenizer.vocab[tokens[i]], tokenizer.vocab_length[tokens[i]]) >= 0)
            piece_len = 1; // the byte itself (never NUL here: the text has none)
        CHECK(out + piece_len <= text_len);
        memcpy(decoded + out, piece, piece_len);
        out += piece_len;
    }
    // decode(encode(text)) == text, but for a typed U+2581 ("\xe2\x96\x81" as a whole
    // character, split as encode splits text: a lead byte and at most three continuation
    // bytes): SentencePiece stores a space as that very character, so it reads one as a
    // space, and decodes a space
    size_t expected_len = 0;
    for (size_t i = 0; i < text_len;) {
        size_t end = i + 1;
        while (end < text_len && end - i < 4 && (text[end] & 0xC0) == 0x80) end++;
        if (end - i == 3 && memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
            text[expected_len++] = ' ';
        } else {
            memmove(text + expected_len, text + i, end - i);
            expected_len += end - i;
        }
        i = end;
    }
    CHECK(out == expected_len && memcmp(decoded, text, expected_len) == 0);
    free(decoded);
    free(tokens);
    free(text);
    return 0;
}
