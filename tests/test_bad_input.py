"""Bad input: every malformed file or command line ends with one clear error line.

The contract (README / issue): for bad input the runner prints exactly one line on
stderr starting with "run: error:" (what was wrong, naming the file or the flag)
and exits 1 for a bad input file or runtime error, 2 for a bad command line; never
a signal, a hang, a sanitizer report or garbage. The only other stderr line allowed
is the start-up line "run: <path> (<format>): dim ..." printed once the model loaded.

Each row of the table below is one crafted file (made in tmp_path from the shared
models by truncating or patching bytes, or from scratch with struct) or one command
line, with the exit code and a substring of the error line. RUN_BIN=run-asan runs
the same table under AddressSanitizer + UndefinedBehaviorSanitizer.

Some rows guard fixed bugs: FIFOs that blocked open(), an encoder that took
seconds on long text, byte-fallback ids beyond a small vocabulary, vocabularies
without BOS/EOS, and temperatures so small that logits / T overflowed.
"""
import os
import re
import resource
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import (LLAMA_TOKENIZER, MODELS, RUN_BIN, RUN_PREFIX, SANITIZED, STORIES, STORIES_V1, TOK512,
                      run)
from ropefile import header_bytes, write_random_checkpoint

STARTUP = re.compile(r"^run: .+ \((llama2\.c legacy|llama2\.c v1|ROPE v1|ROPE v2 (f32|bf16|f16))\): dim \d+")
HANG_TIMEOUT = 1.0  # seconds (x3 under sanitizers) for the rows that used to hang
HANG_ROWS = {"checkpoint-is-fifo", "tokenizer-is-fifo", "text-file-is-fifo",
             "prompt-3000-english-words-rejected-quickly"}


# ----------------------------------------------------------------------------
# Building blocks: the shared models' bytes, patched copies, tokenizer offsets

_BYTES = {}


def model_bytes(path):
    if path not in _BYTES:
        _BYTES[path] = Path(path).read_bytes()
    return _BYTES[path]


FIELDS = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"]


def stories_dims():
    return dict(zip(FIELDS, struct.unpack_from("<7i", model_bytes(STORIES), 0)))


def rope_body():
    """stories260K's weights in ROPE order: the legacy body without its freq_cis tables."""
    d, data = stories_dims(), model_bytes(STORIES)
    freq_cis = d["seq_len"] * (d["dim"] // d["n_heads"]) * 4
    return data[28:len(data) - freq_cis]


def put(tmp, name, data):
    path = Path(tmp) / name
    path.write_bytes(bytes(data))
    return path


def gen(path, *extra, tokenizer=TOK512):
    """A short greedy generation: fast, and deterministic."""
    return [path, "-z", tokenizer, "-t", "0", "-n", "4", "-p", "Once", *extra]


def legacy(**fields):
    """stories260K (legacy) with header fields replaced."""
    def build(tmp):
        data = bytearray(model_bytes(STORIES))
        values = list(struct.unpack_from("<7i", data, 0))
        for k, v in fields.items():
            values[FIELDS.index(k)] = v
        struct.pack_into("<7i", data, 0, *values)
        return gen(put(tmp, "legacy.bin", data))
    return build


def v1(edits=(), size=None):
    """stories260K_v1 with (offset, struct format, value) edits, optionally cut to size bytes."""
    def build(tmp):
        data = bytearray(model_bytes(STORIES_V1))
        for offset, fmt, value in edits:
            struct.pack_into(fmt, data, offset, value)
        return gen(put(tmp, "v1.bin", data[:size] if size is not None else data))
    return build


def rope(edits=(), size=None, append=b"", **header):
    """stories260K converted to the ROPE format, with header overrides and byte edits."""
    def build(tmp):
        d = stories_dims()
        d.update({k: v for k, v in header.items() if k in FIELDS})
        rest = {k: v for k, v in header.items() if k not in FIELDS}
        data = bytearray(header_bytes(**d, **rest) + rope_body() + append)
        for offset, fmt, value in edits:
            struct.pack_into(fmt, data, offset, value)
        return gen(put(tmp, "rope.bin", data[:size] if size is not None else data))
    return build


def rope_v2_table(records, offset_delta=0, n_bytes=None, edits=()):
    """stories260K as ROPE version 2 (float32: its tensors are all multiples of 64 bytes, so
    the layout is version 1's) with a per-layer table of (rope, window) records after the
    last tensor, the header's offset/bytes pointing at it (shifted by offset_delta, or
    n_bytes instead of 8 per record), and (offset, format, value) edits."""
    def build(tmp):
        data = bytearray(header_bytes(**stories_dims()) + rope_body())
        struct.pack_into("<i", data, 4, 2)
        end = len(data)
        data += bytes(-end % 64)
        offset = len(data)
        data += b"".join(struct.pack(f"<{len(r)}i", *r) for r in records)  # (rope, window) or Gemma 4's eight fields
        struct.pack_into("<2Q", data, 136, offset + offset_delta,
                         4 * len(records[0]) * len(records) if n_bytes is None else n_bytes)
        for at, fmt, value in edits:
            struct.pack_into(fmt, data, at, value)
        return gen(put(tmp, "table.bin", data))
    return build


STORIES_PIECES = 1 + 7 * 5  # stories260K's matrix pieces: the embedding, 7 per layer (its classifier is shared)


def rope_v2_types(codes, offset_delta=0, n_bytes=None, weight_type=4, append=b"", size=None):
    """stories260K as ROPE version 2 with a type table (weight_type 4, docs/format.md): its float32
    body (every piece a multiple of 64 bytes, so each already starts where the format puts it), the
    table of `codes` (one per piece) at the first multiple of 64 after it, the header's bytes
    216..231 pointing at it (shifted by offset_delta, or n_bytes instead of len(codes)); then
    `append`, and the whole cut to size bytes."""
    def build(tmp):
        data = bytearray(header_bytes(**stories_dims()) + rope_body())
        struct.pack_into("<i", data, 4, 2)
        struct.pack_into("<i", data, 88, weight_type)
        data += bytes(-len(data) % 64)
        offset = len(data)
        data += bytes(codes)
        struct.pack_into("<2Q", data, 216, offset + offset_delta, len(codes) if n_bytes is None else n_bytes)
        data += append
        return gen(put(tmp, "types.bin", data[:size] if size is not None else data))
    return build


def cut(src, size=None, append=b""):
    """A copy of a shared model cut to size bytes (negative: from the end) and/or extended."""
    def build(tmp):
        data = model_bytes(src)
        data = data[:size] if size is not None else data
        return gen(put(tmp, "cut.bin", data + append))
    return build


def raw(data):
    """A checkpoint file with exactly these bytes."""
    return lambda tmp: gen(put(tmp, "raw.bin", data))


def tok_offsets(data):
    """Byte offset of each token record (score, length, bytes) in a tokenizer.bin."""
    offsets, off = [], 4
    while off < len(data):
        offsets.append(off)
        off += 8 + struct.unpack_from("<i", data, off + 4)[0]
    return offsets


def tok(max_len=None, token=None, length=None, score=None, size=None, append=b"", src=TOK512):
    """tok512 (or src) with one token's length/score or max_token_length patched."""
    def build(tmp):
        data = bytearray(model_bytes(src))
        if max_len is not None:
            struct.pack_into("<i", data, 0, max_len)
        if token is not None:
            off = tok_offsets(data)[token]
            if score is not None:
                struct.pack_into("<f", data, off, score)
            if length is not None:
                struct.pack_into("<i", data, off + 4, length)
        data = data[:size] if size is not None else data
        return gen(STORIES, tokenizer=put(tmp, "tok.bin", data + append))
    return build


def args(*a):
    """A command line with the real models (bad flags are rejected before loading)."""
    return lambda tmp: list(a)


def story(*a):
    return args(STORIES, "-z", TOK512, *a)


def text_file(data, *extra):
    def build(tmp):
        return [STORIES, "-z", TOK512, "-m", "ppl", "-f", put(tmp, "text.txt", data), *extra]
    return build


def fifo(role):
    """A named pipe where a file is expected; opening it for reading blocks without O_NONBLOCK."""
    def build(tmp):
        path = Path(tmp) / "pipe"
        os.mkfifo(path)
        if role == "checkpoint":
            return gen(path)
        if role == "tokenizer":
            return gen(STORIES, tokenizer=path)
        return [STORIES, "-z", TOK512, "-m", "ppl", "-f", path]
    return build


def tiny_model(vocab_size, seq_len=16):
    def build(tmp):
        return write_random_checkpoint(Path(tmp) / f"tiny{vocab_size}.bin", dim=8, hidden_dim=8, n_layers=1,
                                       n_heads=1, n_kv_heads=1, vocab_size=vocab_size, seq_len=seq_len)
    return build


def deep_model(*extra):
    """1024 layers of one 32-dimension head, seq_len 2^20: 256 KiB of KV cache a position."""
    def build(tmp):
        model = write_random_checkpoint(Path(tmp) / "deep.bin", dim=32, hidden_dim=8, n_layers=1024, n_heads=1,
                                        n_kv_heads=1, vocab_size=512, seq_len=2**20)
        return gen(model, *extra)
    return build


def tiny_tokenizer(pieces, max_len=8):
    out = struct.pack("<i", max_len)
    for i, p in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(p)) + p
    return out


def small_vocab(vocab_size, prompt, *extra):
    """A random model with a tiny vocabulary and a matching tokenizer (no byte pieces)."""
    def build(tmp):
        model = tiny_model(vocab_size)(tmp)
        pieces = [b"<unk>", b"<s>", b"</s>", b"a", b"b", b"ab", b" ", b" a"][:vocab_size]
        pieces += [b"x%d" % i for i in range(len(pieces), vocab_size)]
        return [model, "-z", put(tmp, "tok.bin", tiny_tokenizer(pieces)), "-p", prompt, *extra]
    return build


def vocab_1000_with_tok512(tmp):
    return gen(tiny_model(1000)(tmp))


CJK_170 = "\u65e5" * 170  # BOS + byte-fallback space + 170 x 3 byte tokens = exactly 512 tokens
LONG_NONMERGING = " ".join(["\u65e5\u672c"] * 3000)  # 3000 words of byte-fallback tokens: ~21000 tokens
LONG_ENGLISH = " ".join(["Once upon a time"] * 750)   # 3000 English words, ~3800 tokens after merges
MALFORMED_UTF8 = b"Once \xff\xfe upon \xc3\x28 a \xe2\x82 time \x80\x80 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf end"

# ----------------------------------------------------------------------------
# The table: (id, build(tmp) -> argv, exit code, substring of the error line)

F32 = "<f"
ROWS = [
    # --- command line: exit 2, before any file is read -------------------------------
    ("no-arguments", args(), 2, "no checkpoint given"),
    ("flags-but-no-checkpoint", args("-t", "0.5", "-n", "3"), 2, "no checkpoint given"),
    ("two-checkpoints", story(STORIES), 2, "unexpected argument"),
    ("unknown-long-flag", story("--bogus"), 2, "unknown option '--bogus'"),
    ("unknown-short-flag", story("-x", "1"), 2, "unknown option '-x'"),
    ("t-missing-value", story("-t"), 2, "option -t needs a value"),
    ("t-not-a-number", story("-t", "abc"), 2, "-t expects a number, got 'abc'"),
    ("t-trailing-garbage", story("-t", "0.5x"), 2, "-t expects a number"),
    ("t-empty", story("-t", ""), 2, "-t expects a number"),
    ("t-negative", story("-t", "-1"), 2, "-t must be >= 0"),
    ("t-nan", story("-t", "nan"), 2, "-t expects a number"),
    ("t-inf", story("-t", "inf"), 2, "-t expects a number"),
    ("t-overflow", story("-t", "1e39"), 2, "-t expects a number"),
    ("top-p-missing-value", story("--top-p"), 2, "option --top-p needs a value"),
    ("top-p-zero", story("--top-p", "0"), 2, "--top-p must be in (0, 1]"),
    ("top-p-above-one", story("--top-p", "1.5"), 2, "--top-p must be in (0, 1]"),
    ("top-p-negative", story("--top-p", "-0.5"), 2, "--top-p must be in (0, 1]"),
    ("top-p-not-a-number", story("--top-p", "x"), 2, "--top-p expects a number"),
    ("top-p-nan", story("--top-p", "nan"), 2, "--top-p expects a number"),
    ("s-missing-value", story("-s"), 2, "option -s needs a value"),
    ("s-negative", story("-s", "-1"), 2, "-s must be in [0, 4294967295]"),
    ("s-too-large", story("-s", "4294967296"), 2, "-s must be in [0, 4294967295]"),
    ("s-overflows-long", story("-s", "99999999999999999999999"), 2, "-s expects an integer"),
    ("s-not-an-integer", story("-s", "1.5"), 2, "-s expects an integer"),
    ("s-letters", story("-s", "abc"), 2, "-s expects an integer, got 'abc'"),
    ("n-missing-value", story("-n"), 2, "option -n needs a value"),
    ("n-negative", story("-n", "-1"), 2, "-n must be in [0, 2147483647]"),
    ("n-too-large", story("-n", "2147483648"), 2, "-n must be in [0, 2147483647]"),
    ("n-not-an-integer", story("-n", "ten"), 2, "-n expects an integer"),
    ("T-missing-value", story("-T"), 2, "option -T needs a value"),
    ("T-zero", story("-T", "0"), 2, "-T must be in [1, 1024]"),
    ("T-too-many", story("-T", "1025"), 2, "-T must be in [1, 1024]"),
    ("T-not-an-integer", story("-T", "two"), 2, "-T expects an integer"),
    ("rope-theta-missing-value", story("--rope-theta"), 2, "option --rope-theta needs a value"),
    ("rope-theta-zero", story("--rope-theta", "0"), 2, "--rope-theta must be > 0"),
    ("rope-theta-negative", story("--rope-theta", "-10000"), 2, "--rope-theta must be > 0"),
    ("rope-theta-nan", story("--rope-theta", "nan"), 2, "--rope-theta expects a number"),
    ("rope-theta-inf", story("--rope-theta", "inf"), 2, "--rope-theta expects a number"),
    ("rope-theta-not-a-number", story("--rope-theta", "1e4x"), 2, "--rope-theta expects a number"),
    ("rope-fraction-missing-value", story("--rope-fraction"), 2, "option --rope-fraction needs a value"),
    ("rope-fraction-above-one", story("--rope-fraction", "1.5"), 2, "--rope-fraction must be in [0, 1]"),
    ("rope-fraction-negative", story("--rope-fraction", "-0.1"), 2, "--rope-fraction must be in [0, 1]"),
    ("rope-fraction-nan", story("--rope-fraction", "nan"), 2, "--rope-fraction expects a number"),
    ("rope-fraction-not-a-number", story("--rope-fraction", "half"), 2, "--rope-fraction expects a number"),
    ("m-missing-value", story("-m"), 2, "option -m needs a value"),
    ("m-unknown-mode", story("-m", "train"), 2, "unknown mode 'train'"),
    ("z-missing-value", args(STORIES, "-z"), 2, "option -z needs a value"),
    ("p-missing-value", story("-p"), 2, "option -p needs a value"),
    ("f-missing-value", story("-m", "ppl", "-f"), 2, "option -f needs a value"),
    ("ppl-without-text", story("-m", "ppl"), 2, "-m ppl needs exactly one of -f FILE or -p TEXT"),
    ("ppl-with-file-and-prompt", story("-m", "ppl", "-f", "x.txt", "-p", "hi"), 2, "needs exactly one"),
    ("f-outside-ppl", story("-f", "x.txt"), 2, "-f is for -m ppl"),
    ("inspect-without-prompt", story("-m", "inspect"), 2, "-m inspect needs a prompt"),
    ("csv-outside-inspect", story("--csv", "out.csv"), 2, "--csv is for -m inspect"),
    ("system-prompt-outside-chat", story("-y", "be nice"), 2, "-y, --no-cache and --shift are for -m chat"),
    ("shift-outside-chat", story("--shift", "rotate"), 2, "-y, --no-cache and --shift are for -m chat"),
    ("shift-missing-value", story("-m", "chat", "--shift"), 2, "option --shift needs a value"),
    ("shift-unknown", story("-m", "chat", "--shift", "slide"), 2, "unknown --shift 'slide' (recompute, rotate)"),
    ("shift-rotate-without-cache", story("-m", "chat", "--shift", "rotate", "--no-cache"), 2,
     "--shift rotate moves the cache, and --no-cache keeps none"),

    # --- checkpoint path: exit 1 -----------------------------------------------------
    ("checkpoint-missing", lambda tmp: gen(Path(tmp) / "nope.bin"), 1, "cannot open checkpoint"),
    ("checkpoint-is-directory", lambda tmp: gen(tmp), 1, "is not a regular file"),
    ("checkpoint-under-a-file", lambda tmp: gen(STORIES / "x.bin"), 1, "cannot open checkpoint"),
    ("checkpoint-symlink-loop", lambda tmp: (os.symlink("loop", Path(tmp) / "loop"), gen(Path(tmp) / "loop"))[1],
     1, "cannot open checkpoint"),
    ("checkpoint-is-char-device", lambda tmp: gen("/dev/null"), 1, "is not a regular file"),
    pytest.param("checkpoint-unreadable",
                 lambda tmp: (put(tmp, "secret.bin", b"x"), os.chmod(Path(tmp) / "secret.bin", 0),
                              gen(Path(tmp) / "secret.bin"))[2], 1, "cannot open checkpoint",
                 marks=pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file"),
                 id="checkpoint-unreadable"),
    pytest.param("checkpoint-is-fifo", fifo("checkpoint"), 1, "is not a regular file",
                 id="checkpoint-is-fifo"),

    # --- checkpoint size: empty, truncated, over-long ------------------------------------
    ("checkpoint-empty", raw(b""), 1, "is empty"),
    ("checkpoint-10-bytes", raw(b"\x01" * 10), 1, "too small (10 bytes)"),
    ("checkpoint-27-bytes", cut(STORIES, 27), 1, "too small (27 bytes)"),
    ("legacy-header-only", cut(STORIES, 28), 1, "has 28 bytes but its header implies 1056540"),
    ("legacy-truncated-half", cut(STORIES, 500000), 1, "has 500000 bytes but its header implies"),
    ("legacy-truncated-one-byte", cut(STORIES, -1), 1, "has 1056539 bytes but its header implies 1056540"),
    ("legacy-one-byte-too-long", cut(STORIES, append=b"\0"), 1, "has 1056541 bytes but its header implies"),
    ("legacy-one-float-too-long", cut(STORIES, append=b"\0" * 4), 1, "has 1056544 bytes but its header implies 1056540"),
    ("v1-shorter-than-its-header", cut(STORIES_V1, 100), 1, "too small (100 bytes) for its 256-byte header"),
    ("v1-truncated", cut(STORIES_V1, -4), 1, "but its header implies"),
    ("v1-over-long", cut(STORIES_V1, append=b"\0" * 64), 1, "but its header implies"),
    ("rope-shorter-than-its-header", rope(size=255), 1, "too small (255 bytes) for its 256-byte header"),
    ("rope-truncated", rope(size=300000), 1, "has 300000 bytes but its header implies"),
    ("rope-over-long", rope(append=b"\0" * 4), 1, "but its header implies"),
    ("rope-unshared-classifier-missing", rope(shared_classifier=False), 1, "but its header implies"),

    # --- magic and version --------------------------------------------------------------
    # a GGUF file: run reads its own format only, and says how to convert one (export.py)
    ("gguf-file-says-how-to-convert", raw(b"GGUF" + struct.pack("<I", 3) + b"\xff" * 300), 1,
     "raw.bin is a GGUF file; convert it first: python3 export.py "),
    ("gguf-magic-alone-says-how-to-convert", raw(b"GGUF"), 1, "raw.bin is a GGUF file; convert it first"),
    ("wrong-magic-text-file", raw(b"Once upon a time there was a checkpoint that was not one.\n"), 1,
     "out of range"),
    ("v1-version-2", v1([(4, "<i", 2)]), 1, "llama2.c checkpoint version 2 is not supported"),
    ("v1-version-0", v1([(4, "<i", 0)]), 1, "version 0 is not supported"),
    ("rope-version-3", rope([(4, "<i", 3)]), 1, "ROPE checkpoint version 3 is not supported (only 1 and 2)"),
    ("rope-version-negative", rope([(4, "<i", -1)]), 1, "ROPE checkpoint version -1 is not supported"),
    # version 2: weight_type (byte 88) and head_size (84); stories260K's float32 body
    ("rope-v2-weight-type-unknown", rope([(4, "<i", 2), (88, "<i", 12)]), 1,
     "weight_type 12 is not a type this program knows"),
    # weight_type 4: a type per matrix piece, from the type table (bytes 216..231); stories260K's 36 pieces
    ("rope-v2-type-table-all-f32-runs", rope_v2_types([0] * STORIES_PIECES), 0, ""),
    ("rope-v2-per-piece-without-a-table", rope([(4, "<i", 2), (88, "<i", 4)]), 1,
     "weight_type 4 (per piece) needs a type table: type_table_offset 0 and type_table_bytes 0"),
    ("rope-v2-type-table-with-weight-type-0", rope_v2_types([0] * STORIES_PIECES, weight_type=0), 1,
     "type_table_offset 1040384 and type_table_bytes 36 must be 0 with weight_type 0"),
    ("rope-v2-type-table-bytes-wrong", rope_v2_types([0] * STORIES_PIECES, n_bytes=35), 1,
     "type_table_bytes 35 is not 36, one per matrix piece"),
    ("rope-v2-type-table-misplaced", rope_v2_types([0] * STORIES_PIECES, offset_delta=64, append=bytes(64)), 1,
     "type_table_offset 1040448 is not 1040384 (the first multiple of 64 after the tensors"),
    ("rope-v2-type-table-past-the-end", rope_v2_types([0] * STORIES_PIECES, offset_delta=64), 1,
     "the type table (36 bytes at 1040448) is not inside the file's 1040420 bytes"),
    ("rope-v2-type-table-truncated", rope_v2_types([0] * STORIES_PIECES, size=1040384 + 30), 1,
     "the type table (36 bytes at 1040384) is not inside the file's 1040414 bytes (truncated?)"),
    ("rope-v2-type-table-code-unknown", rope_v2_types([0] * 3 + [12] + [0] * 32), 1,
     "type table entry 3 is 12, not a type this program knows"),
    ("rope-v2-type-table-code-4", rope_v2_types([0] * 3 + [4] + [0] * 32), 1,
     "type table entry 3 is 4, not a type this program knows"),
    ("rope-v2-type-table-q4_k-rows-not-whole-blocks", rope_v2_types([0] * 26 + [9] + [0] * 9), 1,
     "w2 of layer 0 is q4_k with rows of 172 weights, not a multiple of 256"),
    ("rope-v2-type-table-q8_0-rows-not-whole-blocks", rope_v2_types([0] * 26 + [3] + [0] * 9), 1,
     "w2 of layer 0 is q8_0 with rows of 172 weights, not a multiple of 32"),
    # a bf16 piece over float32 data: the pieces end earlier, so the table is not where the format puts it
    ("rope-v2-type-table-disagrees-with-the-data", rope_v2_types([0, 1] + [0] * 34), 1,
     "type_table_offset 1040384 is not 1032192"),
    ("rope-v2-type-table-file-over-long", rope_v2_types([0] * STORIES_PIECES, append=bytes(8)), 1,
     "has 1040428 bytes but its header (weight_type per piece) implies 1040420"),
    ("rope-v2-type-table-tensors-truncated", rope_v2_types([0] * STORIES_PIECES, size=300000), 1,
     "the type table (36 bytes at 1040384) is not inside the file's 300000 bytes (truncated?)"),
    # q8_0 (3) over stories260K: its feed-forward rows (hidden 172) are not whole 32-weight blocks
    ("rope-v2-q8_0-rows-not-whole-blocks", rope([(4, "<i", 2), (88, "<i", 3)]), 1,
     "q8_0 weights need rows of a multiple of 32; layer 0 has q_dim 64 and hidden_dim 172"),
    ("rope-v2-weight-type-disagrees-with-size", rope([(4, "<i", 2), (88, "<i", 1)]), 1,
     "its header (weight_type bf16) implies"),
    ("rope-v2-head-size-odd", rope([(4, "<i", 2), (84, "<i", 7)]), 1, "head_size 7 must be 0"),
    ("rope-v1-with-a-weight-type", rope([(88, "<i", 1)]), 1, "reserved header byte 88 is not zero"),
    ("rope-v2-head-size-above-max", rope([(4, "<i", 2), (84, "<i", 65538)]), 1, "head_size 65538 must be 0"),
    ("rope-v2-heads-times-head-size-above-max", rope([(4, "<i", 2), (84, "<i", 65536)]), 1,
     "n_heads 8 x head_size 65536 is above"),
    ("rope-v2-head-size-disagrees-with-size", rope([(4, "<i", 2), (84, "<i", 16)]), 1, "but its header"),
    # version 2's block options (bytes 112..135)
    ("rope-v2-block-flags-unknown-bit", rope([(4, "<i", 2), (112, "<I", 128)]), 1, "block_flags 0x80 has bits"),
    ("rope-v2-biases-missing-from-the-file", rope([(4, "<i", 2), (112, "<I", 1)]), 1, "but its header"),
    ("rope-v2-activation-unknown", rope([(4, "<i", 2), (116, "<i", 2)]), 1, "activation 2 is not one"),
    ("rope-v2-activation-negative", rope([(4, "<i", 2), (116, "<i", -1)]), 1, "activation -1 is not one"),
    ("rope-v2-embedding-multiplier-negative", rope([(4, "<i", 2), (120, "<f", -1.0)]), 1,
     "embedding_multiplier -1 must be finite"),
    ("rope-v2-attention-scale-nan", rope([(4, "<i", 2), (124, "<f", float("nan"))]), 1,
     "attention_scale nan must be finite"),
    ("rope-v2-attention-softcap-inf", rope([(4, "<i", 2), (128, "<f", float("inf"))]), 1,
     "attention_softcap inf must be finite"),
    ("rope-v2-final-softcap-negative", rope([(4, "<i", 2), (132, "<f", -2.0)]), 1, "final_softcap -2 must be"),
    # the second RoPE setting (bytes 152..191)
    ("rope-v2-second-setting-field-without-theta", rope([(4, "<i", 2), (160, "<f", 2.0)]), 1,
     "is not zero, but rope2_theta is 0"),
    ("rope-v2-second-theta-negative", rope([(4, "<i", 2), (152, "<f", -1.0), (160, "<f", 1.0)]), 1,
     "rope2_theta -1 must be finite"),
    ("rope-v2-second-fraction-above-one", rope([(4, "<i", 2), (152, "<f", 1e4), (156, "<f", 2.0), (160, "<f", 1.0)]),
     1, "rope2_fraction 2 must be in [0, 1]"),
    ("rope-v2-second-rule-unknown", rope([(4, "<i", 2), (152, "<f", 1e4), (156, "<f", 1.0), (160, "<f", 2.0),
                                          (164, "<i", 9)]), 1, "second RoPE setting: rope_scaling 9"),
    ("rope-v2-second-factor-without-rule", rope([(4, "<i", 2), (152, "<f", 1e4), (156, "<f", 1.0)]), 1,
     "rope2_factor 0 with rope2_scaling 0"),
    ("rope-v2-second-original-len-negative", rope([(4, "<i", 2), (152, "<f", 1e4), (156, "<f", 1.0),
                                                   (160, "<f", 1.0), (168, "<i", -3)]), 1,
     "rope2_original_len -3 must be >= 0"),
    ("rope-v1-longrope", rope([(56, "<i", 5)]), 1, "rope_scaling 5 (longrope) needs version 2"),
    ("rope-v2-second-setting-longrope", rope([(4, "<i", 2), (152, "<f", 1e4), (156, "<f", 1.0), (160, "<f", 1.0),
                                              (164, "<i", 5)]), 1, "rope2_scaling 5 (longrope) is for the first"),
    ("rope-v2-longrope-factors-missing", rope([(4, "<i", 2), (56, "<i", 5), (52, "<f", 4.0)]), 1, "but its header"),
    ("rope-v2-longrope-factor-nan", rope([(4, "<i", 2), (56, "<i", 5), (52, "<f", 4.0)],
                                         append=struct.pack("<8f", 1, 1, 1, 1, 2, float("nan"), 2, 2)), 1,
     "longrope factor 5 is nan; it must be finite and > 0"),
    ("rope-v2-longrope-factor-zero", rope([(4, "<i", 2), (56, "<i", 5), (52, "<f", 4.0)],
                                          append=struct.pack("<8f", 1, 0, 1, 1, 2, 2, 2, 2)), 1,
     "longrope factor 1 is 0"),
    ("rope-v2-longrope-runs", rope([(4, "<i", 2), (56, "<i", 5), (52, "<f", 4.0)],
                                   append=struct.pack("<8f", 1, 1, 1, 1, 2, 3, 4, 5)), 0, ""),
    ("rope-v2-rope-scaling-6", rope([(4, "<i", 2), (56, "<i", 6)]), 1, "rope_scaling 6 is not a rule"),
    ("rope-v2-reserved-byte-232", rope([(4, "<i", 2), (232, "<B", 1)]), 1, "reserved header byte 232 is not zero"),
    # a mixture of experts' fields: header bytes 200..215 with block flag 64, the records' last field
    ("rope-v2-experts-without-flag", rope([(4, "<i", 2), (200, "<i", 8)]), 1,
     "n_experts 8, n_experts_used 0, expert_hidden 0 and routing 0 must be 0 without block flag 64"),
    ("rope-v2-experts-flag-without-count", rope([(4, "<i", 2), (112, "<I", 64)]), 1,
     "n_experts 0 must be in [1, 1024] with block flag 64"),
    ("rope-v2-experts-used-above-experts", rope([(4, "<i", 2), (112, "<I", 64), (200, "<i", 4), (204, "<i", 5),
                                                 (208, "<i", 16), (212, "<i", 1)]), 1,
     "n_experts_used 5 must be in [1, n_experts 4] and at most 64"),
    ("rope-v2-experts-used-zero", rope([(4, "<i", 2), (112, "<I", 64), (200, "<i", 4), (208, "<i", 16),
                                        (212, "<i", 1)]), 1, "n_experts_used 0 must be in [1, n_experts 4]"),
    ("rope-v2-experts-hidden-zero", rope([(4, "<i", 2), (112, "<I", 64), (200, "<i", 4), (204, "<i", 2),
                                          (212, "<i", 1)]), 1, "expert_hidden 0 must be in [1, 1048576]"),
    ("rope-v2-experts-routing-unknown", rope([(4, "<i", 2), (112, "<I", 64), (200, "<i", 4), (204, "<i", 2),
                                              (208, "<i", 16), (212, "<i", 4)]), 1,
     "routing 4 is not a rule this program knows"),
    ("rope-v2-experts-tensors-missing", rope([(4, "<i", 2), (112, "<I", 64), (200, "<i", 4), (204, "<i", 2),
                                              (208, "<i", 16), (212, "<i", 1)]), 1,
     "but its header (weight_type f32) implies"),
    # Gemma 4's fields: the per-layer inputs' header bytes 192..199, the records of eight int32
    ("rope-v2-per-layer-dim-without-flag", rope([(4, "<i", 2), (192, "<i", 256)]), 1,
     "per_layer_input_dim 256 and per_layer_embedding_multiplier 0 must be 0 without block flag 32"),
    ("rope-v2-per-layer-flag-without-dim", rope([(4, "<i", 2), (112, "<I", 32), (196, "<f", 16.0)]), 1,
     "per_layer_input_dim 0 must be in [1, 65536] with block flag 32"),
    ("rope-v2-per-layer-multiplier-nan", rope([(4, "<i", 2), (112, "<I", 32), (192, "<i", 4), (196, "<f", float("nan"))]),
     1, "per_layer_embedding_multiplier nan must be finite and > 0"),
    ("rope-v2-records-all-header-values-run", rope_v2_table([(1, 0, 0, 0, 0, 0, 0, 0)] * 5), 0, ""),
    ("rope-v2-record-head-size-odd", rope_v2_table([(1, 0, 0, 0, 0, 0, 0, 0)] + [(0, 0, 7, 0, 0, 0, 0, 0)] * 4), 1,
     "layer 1: head_size 7 must be 0 (the header's) or even"),
    ("rope-v2-record-kv-heads-not-dividing", rope_v2_table([(1, 0, 0, 3, 0, 0, 0, 0)] * 5), 1,
     "layer 0: n_kv_heads 3 must be 0 (the header's) or divide n_heads 8"),
    ("rope-v2-record-hidden-negative", rope_v2_table([(1, 0, 0, 0, -2, 0, 0, 0)] * 5), 1,
     "layer 0: hidden_dim -2 must be 0 (the header's) or in [1, 1048576]"),
    ("rope-v2-record-kv-source-later", rope_v2_table([(1, 0, 0, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 4, 0, 0)] +
                                                     [(1, 0, 0, 0, 0, 0, 0, 0)] * 3), 1,
     "layer 1: kv_source 4 must be 0 (its own cache) or an earlier layer + 1"),
    ("rope-v2-record-kv-source-shares-itself", rope_v2_table([(1, 0, 0, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 1, 0, 0),
                                                             (1, 0, 0, 0, 0, 2, 0, 0)] + [(1, 0, 0, 0, 0, 0, 0, 0)] * 2), 1,
     "layer 2: kv_source layer 1 shares another layer's cache itself"),
    ("rope-v2-record-kv-source-other-window", rope_v2_table([(1, 0, 0, 0, 0, 0, 0, 0), (1, 4, 0, 0, 0, 1, 0, 0)] +
                                                            [(1, 0, 0, 0, 0, 0, 0, 0)] * 3), 1,
     "layer 1: kv_source layer 0 differs in rope, window, head_size or n_kv_heads"),
    ("rope-v2-record-values-on-a-shared-layer", rope_v2_table([(1, 0, 0, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 1, 1, 0)] +
                                                              [(1, 0, 0, 0, 0, 0, 0, 0)] * 3), 1,
     "layer 1: values 1 on a layer that shares layer 0's cache"),
    ("rope-v2-record-values-unknown", rope_v2_table([(1, 0, 0, 0, 0, 0, 2, 0)] * 5), 1,
     "layer 0: values 2 must be 0 (wv) or 1 (the keys)"),
    ("rope-v2-record-experts-without-flag", rope_v2_table([(1, 0, 0, 0, 0, 0, 0, 1)] * 5), 1,
     "layer 0: experts 1 must be 0 (a feed-forward) without block flag 64"),
    ("rope-v2-record-first-setting-other-head-size", rope_v2_table([(1, 0, 16, 0, 0, 0, 0, 0)] * 5), 1,
     "layer 0: head_size 16, but the first RoPE setting's layers have the header's 8"),
    # the per-layer table (header bytes 136..151; 8 bytes per layer after the last tensor)
    ("rope-v2-layer-table-nope-and-windows-run", rope_v2_table([(0, 0), (1, 3), (0, 2), (1, 0), (1, 1)]), 0, ""),
    ("rope-v2-layer-table-offset-wrong", rope_v2_table([(1, 0)] * 5, offset_delta=64), 1,
     "layer_table_offset 1040448 is not 1040384"),
    ("rope-v2-layer-table-bytes-wrong", rope_v2_table([(1, 0)] * 5, n_bytes=32), 1,
     "layer_table_bytes 32 is not 8 x n_layers = 40"),
    ("rope-v2-layer-table-bytes-without-offset", rope([(4, "<i", 2), (144, "<Q", 40)]), 1,
     "layer_table_offset 0 is not"),
    ("rope-v2-layer-table-truncated", rope_v2_table([(1, 0)] * 4, n_bytes=40), 1, "but its header (weight_type f32) implies"),
    ("rope-v2-layer-rope-unknown", rope_v2_table([(1, 0), (3, 0), (1, 0), (1, 0), (1, 0)]), 1,
     "layer 1: rope 3 is not 0 (NoPE), 1"),
    ("rope-v2-layer-second-setting-missing", rope_v2_table([(2, 0)] * 5), 1,
     "layer 0 uses the second RoPE setting, but rope2_theta is 0"),
    ("rope-v2-layer-window-negative", rope_v2_table([(1, 0), (1, 0), (1, -4), (1, 0), (1, 0)]), 1,
     "layer 2: window -4 must be >= 0"),

    # --- header fields: zero, negative, absurdly large, inconsistent -----------------------
    ("dim-zero", legacy(dim=0), 1, "dim = 0 is out of range"),
    ("dim-negative", legacy(dim=-64), 1, "dim = -64 is out of range"),
    ("dim-int-max", legacy(dim=2**31 - 1), 1, "dim = 2147483647 is out of range"),
    ("hidden-dim-zero", legacy(hidden_dim=0), 1, "hidden_dim = 0 is out of range"),
    ("hidden-dim-huge", legacy(hidden_dim=2**30), 1, "hidden_dim = 1073741824 is out of range"),
    ("n-layers-zero", legacy(n_layers=0), 1, "n_layers = 0 is out of range"),
    ("n-layers-negative", legacy(n_layers=-5), 1, "n_layers = -5 is out of range"),
    ("n-heads-zero", legacy(n_heads=0), 1, "n_heads = 0 is out of range"),
    ("n-heads-above-dim", legacy(n_heads=128), 1, "n_heads = 128 is out of range"),
    ("n-kv-heads-zero", legacy(n_kv_heads=0), 1, "n_kv_heads = 0 is out of range"),
    ("n-kv-heads-above-n-heads", legacy(n_kv_heads=16), 1, "n_kv_heads = 16 is out of range"),
    ("dim-not-divisible-by-heads", legacy(n_heads=7, n_kv_heads=7), 1, "dim 64 is not divisible by n_heads 7"),
    ("heads-not-divisible-by-kv-heads", legacy(n_kv_heads=3), 1, "n_heads 8 is not divisible by n_kv_heads 3"),
    ("odd-head-size", legacy(n_heads=64, n_kv_heads=4), 1, "head size 1 is odd"),
    ("vocab-zero", legacy(vocab_size=0), 1, "vocab_size = 0 is out of range"),
    ("vocab-int-min", legacy(vocab_size=-2**31), 1, "vocab_size = -2147483648 is out of range"),
    ("vocab-huge", legacy(vocab_size=2**30), 1, "vocab_size = 1073741824 is out of range"),
    ("vocab-negative-means-unshared-classifier", legacy(vocab_size=-512), 1, "but its header implies"),
    ("seq-len-zero", legacy(seq_len=0), 1, "seq_len = 0 is out of range"),
    ("seq-len-negative", legacy(seq_len=-1), 1, "seq_len = -1 is out of range"),
    ("seq-len-int-max", legacy(seq_len=2**31 - 1), 1, "seq_len = 2147483647 is out of range"),
    # the KV cache is sized by the context in use, after loading: a header claiming 1024 layers is
    # refused on the file size it implies (tests/test_memory.py checks the cache's bound)
    ("kv-cache-absurd", legacy(n_layers=1024, seq_len=2**20), 1, "but its header implies"),
    # every size at its maximum: the products overflow 32 bits (and legacy's freq_cis too)
    ("sizes-whose-products-overflow", legacy(dim=65536, hidden_dim=2**20, n_layers=1024, n_heads=2, n_kv_heads=2,
                                             vocab_size=2**22, seq_len=1), 1, "but its header implies"),
    ("dim-squared-overflows-int32", legacy(dim=46342, n_heads=1, n_kv_heads=1, seq_len=16), 1,
     "but its header implies"),
    ("v1-shared-flag-2", v1([(36, "<B", 2)]), 1, "shared-classifier flag is 2"),
    ("v1-padding-not-zero", v1([(200, "<B", 7)]), 1, "header padding byte 200 is not zero"),
    ("v1-dim-zero", v1([(8, "<i", 0)]), 1, "dim = 0 is out of range"),
    ("v1-seq-len-huge", v1([(32, "<i", 2**24)]), 1, "seq_len = 16777216 is out of range"),
    ("rope-shared-classifier-2", rope(shared_classifier=2), 1, "shared_classifier is 2"),
    ("rope-shared-classifier-negative", rope(shared_classifier=-1), 1, "shared_classifier is -1"),
    ("rope-reserved-not-zero", rope([(255, "<B", 1)]), 1, "reserved header byte 255 is not zero"),
    ("rope-n-layers-zero", rope(n_layers=0), 1, "n_layers = 0 is out of range"),

    # --- ROPE floats: NaN, infinite, out of range ----------------------------------------
    ("rope-theta-nan-in-header", rope(rope_theta=float("nan")), 1, "rope_theta nan must be finite and > 0"),
    ("rope-theta-inf-in-header", rope(rope_theta=float("inf")), 1, "rope_theta inf must be finite and > 0"),
    ("rope-theta-minus-inf", rope(rope_theta=float("-inf")), 1, "rope_theta -inf must be finite"),
    ("rope-theta-zero-in-header", rope(rope_theta=0.0), 1, "rope_theta 0 must be finite and > 0"),
    ("rope-theta-negative-in-header", rope(rope_theta=-1e4), 1, "rope_theta -10000 must be finite and > 0"),
    ("rope-fraction-nan-in-header", rope(rope_fraction=float("nan")), 1, "rope_fraction nan must be in [0, 1]"),
    ("rope-fraction-inf-in-header", rope(rope_fraction=float("inf")), 1, "rope_fraction inf must be in [0, 1]"),
    ("rope-fraction-above-one-in-header", rope(rope_fraction=1.5), 1, "rope_fraction 1.5 must be in [0, 1]"),
    ("rope-fraction-negative-in-header", rope(rope_fraction=-0.25), 1, "rope_fraction -0.25 must be in [0, 1]"),
    ("norm-eps-nan", rope(norm_eps=float("nan")), 1, "norm_eps nan must be finite and > 0"),
    ("norm-eps-inf", rope(norm_eps=float("inf")), 1, "norm_eps inf must be finite and > 0"),
    ("norm-eps-zero", rope(norm_eps=0.0), 1, "norm_eps 0 must be finite and > 0"),
    ("norm-eps-negative", rope(norm_eps=-1e-5), 1, "norm_eps -1e-05 must be finite and > 0"),
    ("rope-factor-nan", rope(rope_scale=float("nan")), 1, "rope_factor nan must be finite"),
    ("rope-factor-zero", rope(rope_scale=0.0), 1, "rope_factor 0 must be finite"),
    # docs/format.md: rope_factor >= 1 (1e-40 made every frequency infinite: NaN logits)
    ("rope-factor-below-one", rope(rope_scale=0.5), 1, "rope_factor 0.5 must be"),
    ("rope-factor-denormal", rope(rope_scale=1e-40), 1, "rope_factor"),
    ("rope-factor-negative", rope(rope_scale=-2.0), 1, "rope_factor -2 must be"),
    ("rope-factor-inf", rope(rope_scale=float("inf")), 1, "rope_factor inf must be"),

    ("checkpoint-is-a-tokenizer", lambda tmp: gen(TOK512), 1, "hidden_dim = 0 is out of range"),

    # --- tokenizer: missing, truncated, bad lengths, wrong size --------------------------
    ("tokenizer-missing", lambda tmp: gen(STORIES, tokenizer=Path(tmp) / "nope.bin"), 1, "cannot open tokenizer"),
    ("tokenizer-is-directory", lambda tmp: gen(STORIES, tokenizer=MODELS), 1, "is not a regular file"),
    ("tokenizer-is-char-device", lambda tmp: gen(STORIES, tokenizer="/dev/null"), 1, "is not a regular file"),
    pytest.param("tokenizer-is-fifo", fifo("tokenizer"), 1, "is not a regular file",
                 id="tokenizer-is-fifo"),
    ("tokenizer-empty", tok(size=0), 1, "is too small (0 bytes)"),
    ("tokenizer-3-bytes", tok(size=3), 1, "is too small (3 bytes)"),
    ("tokenizer-header-only", tok(size=4), 1, "ends at token 0, but the model has 512 tokens"),
    ("tokenizer-truncated-half", tok(size=3000), 1, "but the model has 512 tokens"),
    ("tokenizer-truncated-in-a-piece", tok(size=6226), 1, "has a bad length"),
    ("tokenizer-max-len-zero", tok(max_len=0), 1, "max_token_length 0 is out of range"),
    ("tokenizer-max-len-negative", tok(max_len=-7), 1, "max_token_length -7 is out of range"),
    ("tokenizer-max-len-huge", tok(max_len=2**31 - 1), 1, "max_token_length 2147483647 is out of range"),
    ("tokenizer-negative-piece-length", tok(token=5, length=-1), 1, "token 5 has a bad length -1"),
    ("tokenizer-int-min-piece-length", tok(token=300, length=-2**31), 1, "token 300 has a bad length -2147483648"),
    ("tokenizer-piece-longer-than-max", tok(token=7, length=100), 1, "token 7 has a bad length 100"),
    ("tokenizer-piece-past-end-of-file", tok(max_len=1024, token=511, length=1000), 1, "token 511 has a bad length"),
    ("tokenizer-nan-score", tok(token=9, score=float("nan")), 1, "token 9 has a non-finite score"),
    ("tokenizer-inf-score", tok(token=9, score=float("-inf")), 1, "token 9 has a non-finite score"),
    ("tokenizer-trailing-bytes", tok(append=b"\0" * 3), 1, "more than the model's 512 tokens"),
    ("tokenizer-too-many-tokens", lambda tmp: gen(STORIES, tokenizer=LLAMA_TOKENIZER), 1,
     "has more than the model's 512 tokens"),
    ("tokenizer-too-few-tokens", vocab_1000_with_tok512, 1, "ends at token 512, but the model has 1000 tokens"),
    # a tokenizer of another size names the one beside the model that fits (tok<vocab_size>.bin)
    ("tokenizer-of-another-size-names-the-one-that-fits", lambda tmp: gen(STORIES, tokenizer=LLAMA_TOKENIZER), 1,
     f"has more than the model's 512 tokens (433869 bytes, where 512 tokens of at most 27 bytes take at most "
     f"17924); this model's tokenizer: -z {MODELS / 'tok512.bin'}"),
    # Hugging Face and SentencePiece files are converted by export.py first
    ("tokenizer-json-says-convert-it", lambda tmp: gen(STORIES, tokenizer=put(tmp, "tokenizer.json", b'{"model": {}}')),
     1, "convert it first: python3 export.py --tokenizer"),
    ("tokenizer-model-says-convert-it", lambda tmp: gen(STORIES, tokenizer=MODELS / "tokenizer.model"), 1,
     "convert it first: python3 export.py --tokenizer"),
    ("tokenizer-is-a-checkpoint", lambda tmp: gen(STORIES, tokenizer=STORIES), 1, "has more than the model's 512 tokens"),

    # --- -f text file --------------------------------------------------------------------
    ("text-file-missing", lambda tmp: [STORIES, "-z", TOK512, "-m", "ppl", "-f", Path(tmp) / "nope.txt"], 1,
     "cannot open"),
    ("text-file-is-directory", lambda tmp: [STORIES, "-z", TOK512, "-m", "ppl", "-f", tmp], 1,
     "is not a regular file"),
    ("text-file-with-nul-byte", text_file(b"Once upon\0 a time"), 1, "contains a NUL byte at offset 9"),
    ("text-file-empty", text_file(b""), 1, "the text is empty"),
    ("ppl-empty-prompt", story("-m", "ppl", "-p", ""), 1, "the text is empty"),
    ("csv-path-is-a-directory", lambda tmp: [STORIES, "-z", TOK512, "-m", "inspect", "-p", "Once", "--csv", tmp],
     1, "cannot write"),
    pytest.param("text-file-is-fifo", fifo("text"), 1, "is not a regular file", id="text-file-is-fifo"),

    # --- prompts longer than the context (stories260K: seq_len 512) ----------------------
    ("prompt-3000-words-longer-than-context", story("-t", "0", "-p", LONG_NONMERGING), 1,
     "more than the context of 512"),
    ("inspect-prompt-longer-than-context", story("-m", "inspect", "-p", LONG_NONMERGING), 1,
     "more than the context of 512"),
    ("chat-turn-longer-than-context", story("-m", "chat", "-t", "0", "-p", LONG_NONMERGING), 1,
     "of the context's 512 remain"),
    # the boundary: -n below the prompt length prints the prompt without running it, after the context check
    ("prompt-one-token-over-the-context", story("-t", "0", "-n", "1", "-p", CJK_170 + "x"), 1,
     "the prompt has 513 tokens, more than the context of 512"),
    ("prompt-exactly-the-context", story("-t", "0", "-n", "4", "-p", CJK_170), 0, None),
    pytest.param("prompt-3000-english-words-rejected-quickly", story("-t", "0", "-p", LONG_ENGLISH), 1,
                 "more than the context of 512",
                 id="prompt-3000-english-words-rejected-quickly"),

    # --- contexts that do not fit: 2^20 positions x 256 KiB is beyond the machine's memory (or, on a
    # machine with more, run's 64 GiB bound): -c asked for it, a bad command line (exit 2)
    ("context-beyond-memory", deep_model("-c", str(2**20)), 2, "-c 1048576: a context of 1048576 positions"),
    ("context-beyond-memory-ppl", deep_model("-m", "ppl", "-c", str(2**20 - 1)), 2, "a context of 1048575 positions"),
    ("context-cut-with-c", deep_model("-c", "64"), 0, None),

    # --- tiny vocabularies: token ids the model does not have --------------------------------
    # a character outside a vocabulary without byte pieces is <unk>, as in SentencePiece
    pytest.param("byte-fallback-beyond-small-vocab", small_vocab(8, "abx", "-m", "tokenize"), 0, None,
                 id="byte-fallback-beyond-small-vocab"),
    pytest.param("byte-fallback-beyond-small-vocab-generate", small_vocab(8, "x b", "-t", "0", "-n", "6"), 0, None,
                 id="byte-fallback-beyond-small-vocab-generate"),
    pytest.param("vocab-without-bos", small_vocab(1, "", "-t", "0.9"), 1, "vocab_size",
                 id="vocab-without-bos"),

    # --- must succeed: exit 0, no error line -----------------------------------------------
    ("control-legacy", lambda tmp: gen(STORIES), 0, None),
    ("control-v1", lambda tmp: gen(STORIES_V1), 0, None),
    ("control-rope-conversion", rope(), 0, None),
    ("malformed-utf8-prompt-generate", story("-t", "0", "-n", "40", "-p", MALFORMED_UTF8), 0, None),
    ("malformed-utf8-prompt-tokenize", story("-m", "tokenize", "-p", MALFORMED_UTF8), 0, None),
    ("malformed-utf8-prompt-sampled", story("-t", "1", "-s", "7", "-n", "40", "-p", MALFORMED_UTF8), 0, None),
    ("malformed-utf8-text-file", text_file(MALFORMED_UTF8 * 3), 0, None),
    ("lone-continuation-bytes-only", story("-m", "tokenize", "-p", b"\x80\x81\xbf"), 0, None),
    # a flat distribution and a tiny top-p: no token passes the cutoff (llama2.c read probindex[-1])
    ("uniform-probabilities-top-p", story("-t", "1e30", "--top-p", "0.001", "-s", "1", "-n", "8"), 0, None),
]


# ----------------------------------------------------------------------------
# Seams between the parts (issue 32): values run accepted and then overflowed,
# modes that printed NaN, lines split by what they echoed.

def wide_head(*extra, **header):
    """A random ROPE model with one 64-wide head (32 pairs: theta^(-62/64) overflows for a tiny theta)."""
    def build(tmp):
        model = write_random_checkpoint(Path(tmp) / "wide.bin", dim=64, hidden_dim=16, n_layers=1, n_heads=1,
                                        n_kv_heads=1, vocab_size=512, seq_len=header.pop("seq_len", 64), **header)
        return [model, "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once", *extra]
    return build


def rope_float_at(tensor_offset, value, *extra):
    """stories260K as ROPE with one weight replaced (tensor_offset: floats after the header)."""
    def build(tmp):
        argv = rope()(tmp)
        data = bytearray(Path(argv[0]).read_bytes())
        struct.pack_into("<f", data, 256 + 4 * tensor_offset, value)
        Path(argv[0]).write_bytes(data)
        return [argv[0], "-z", TOK512, *extra]
    return build


def sparse_file(name, size, start=b""):
    """A file of `size` bytes that takes no disk: `start`, then a hole (zeros)."""
    def make(tmp):
        path = Path(tmp) / name
        with open(path, "wb") as f:
            f.write(start)
            f.truncate(size)
        return path
    return make


def sparse_tokenizer(size, start):
    return lambda tmp: gen(STORIES, tokenizer=sparse_file("huge.tok", size, start)(tmp))


def sparse_text(size, start):
    return lambda tmp: [STORIES, "-z", TOK512, "-m", "ppl", "-f", sparse_file("huge.txt", size, start)(tmp)]


STORIES_WQ = 512 * 64 + 5 * 64  # float offset of stories260K's wq in ROPE order (after the embedding, rms_att)
STORIES_RMS_FINAL = 198112      # ... of rms_final (the last tensor: the file has 198176 floats)
YARN = dict(rope_scaling=3, rope_scale=4.0)
SEAM_ROWS = [
    # seam 2: theta so small that the RoPE angles overflow float32, named where it comes from
    ("rope-theta-subnormal-in-header", wide_head(rope_theta=1e-40), 1, "rope_theta 9.99995e-41 is too small: pair"),
    ("rope-theta-smallest-subnormal-in-header", wide_head(rope_theta=1.4e-45), 1, "is too small: pair"),
    ("rope-theta-normal-but-angle-overflows", wide_head(rope_theta=1e-37, seq_len=2**20), 1,
     "at position 1048575 the angle is not finite"),
    ("rope-theta-subnormal-in-header-rope-mode", wide_head("-m", "rope", rope_theta=1e-40), 1, "is too small"),
    ("rope-theta-subnormal-flag", wide_head("--rope-theta", "1e-40"), 2, "--rope-theta: rope_theta 9.99995e-41 is too"),
    ("rope-theta-subnormal-flag-rope-mode", wide_head("-m", "rope", "--rope-theta", "1e-41"), 2, "--rope-theta: "),
    ("rope-fraction-flag-rotates-a-subnormal-theta", wide_head("--rope-fraction", "1", rope_theta=1e-40,
                                                               rope_fraction=0.0), 2, "--rope-fraction: rope_theta"),
    ("context-flag-overflows-the-angles", wide_head("-c", str(2**20), rope_theta=1e-37), 2, "-c 1048576: rope_theta"),
    ("rope-attention-factor-huge", rope(**YARN, rope_attention_factor=1e30), 1,
     "rope_attention_factor 1e+30 must be at most 100"),
    ("rope-attention-factor-above-bound-linear", rope(rope_scaling=1, rope_scale=2.0, rope_attention_factor=101.0), 1,
     "rope_attention_factor 101 must be at most 100"),
    ("rope-attention-factor-huge-ppl", lambda tmp: [rope(**YARN, rope_attention_factor=3e38)(tmp)[0], "-z", TOK512,
                                                     "-m", "ppl", "-p", "Once upon a time"], 1, "rope_attention_factor"),
    # seam 3: NaN weights stop inspect (exit 1) as they stop generate and ppl
    ("inspect-nan-in-wq", rope_float_at(STORIES_WQ + 7, float("nan"), "-m", "inspect", "-p", "Once upon"), 1,
     "non-finite queries or keys in layer 0"),
    ("inspect-inf-in-rms-final", rope_float_at(STORIES_RMS_FINAL + 3, float("inf"), "-m", "inspect", "-p", "Once"), 1,
     "non-finite logits at position"),
    ("generate-nan-in-wq", rope_float_at(STORIES_WQ, float("nan"), "-t", "0", "-n", "4", "-p", "Once"), 1,
     "non-finite logits at position"),
    ("ppl-inf-in-rms-final", rope_float_at(STORIES_RMS_FINAL, float("-inf"), "-m", "ppl", "-p", "Once upon"), 1,
     "or the forward pass overflowed float32"),
    # seam 4 (--csv): a file that cannot take the rows
    ("ppl-csv-on-a-full-disk", story("-m", "ppl", "-p", "Once upon a time", "--csv", "/dev/full"), 1,
     "cannot write /dev/full"),
    ("inspect-csv-on-a-full-disk", story("-m", "inspect", "-p", "Once upon a time", "--csv", "/dev/full"), 1,
     "cannot write /dev/full"),
    # seam 6: yarn with beta_fast below beta_slow
    ("yarn-beta-fast-below-beta-slow", rope(**YARN, yarn_beta_fast=1.0, yarn_beta_slow=2.0), 1,
     "yarn_beta_fast 1 must not be below yarn_beta_slow 2"),
    ("yarn-default-beta-fast-below-beta-slow", rope(**YARN, yarn_beta_slow=40.0), 1,
     "yarn_beta_fast 32 must not be below yarn_beta_slow 40"),
    ("yarn-beta-slow-above-default-fast-rope-mode", lambda tmp: [rope(**YARN, yarn_beta_slow=33.0)(tmp)[0], "-m", "rope"],
     1, "must not be below yarn_beta_slow 33"),
    ("yarn-equal-betas-allowed", rope(**YARN, yarn_beta_fast=4.0, yarn_beta_slow=4.0), 0, None),
    # seam 8: a huge file of the wrong kind as -z or -f is refused from its first bytes
    ("tokenizer-huge-checkpoint-magic", sparse_tokenizer(64 << 30, b"ROPE"), 1,
     "max_token_length 1162891090 is out of range"),
    ("tokenizer-huge-with-plausible-start", sparse_tokenizer(64 << 30, struct.pack("<i", 16)), 1,
     "has more than the model's 512 tokens (68719476736 bytes"),
    ("text-file-huge-binary", sparse_text(64 << 30, b""), 1, "contains a NUL byte at offset 0"),
    ("text-file-huge-with-text-start", sparse_text(64 << 30, b"Once upon a time" * 100), 1,
     "contains a NUL byte at offset 1600"),
    # seam 12: control characters echoed in an error stay escaped in its one line
    ("unknown-flag-with-newline", story("-x\nrun: error: forged"), 2, "unknown option '-x\\nrun: error: forged'"),
    ("unknown-mode-with-escape", story("-m", "gen\x1b[31mred"), 2, "unknown mode 'gen\\x1b[31mred'"),
    ("checkpoint-path-with-newline", lambda tmp: gen(Path(tmp) / "a\nb.bin"), 1, "a\\nb.bin"),
    ("rope-scaling-with-tab", story("--rope-scaling", "ya\trn"), 2, "unknown --rope-scaling 'ya\\trn'"),
    # seam 12: a subnormal number is a number
    ("subnormal-rope-theta-flag-on-a-small-head", story("-m", "rope", "--rope-theta", "1e-40"), 0, None),
    ("subnormal-temperature", story("-t", "1e-40", "-n", "4", "-p", "Once"), 0, None),
    ("subnormal-top-p", story("--top-p", "1e-44", "-s", "3", "-n", "4", "-p", "Once"), 0, None),
    ("underflow-to-zero-rope-theta", story("--rope-theta", "1e-50"), 2, "--rope-theta must be > 0, got 1e-50"),
]
ROWS += SEAM_ROWS


def output_over_input(mode, target, link=None):
    """--csv naming one of the run's own inputs (copies in tmp: a broken check must not destroy the
    repository's models): target 'checkpoint', 'tokenizer' or 'text', spelled as a symbolic link
    ('symlink'), a hard link ('hardlink') or another path ('dotted') when link says so."""
    def build(tmp):
        tmp = Path(tmp)
        model, tok = tmp / "model.bin", tmp / "tok.bin"
        shutil.copyfile(STORIES, model)
        shutil.copyfile(TOK512, tok)
        text = put(tmp, "story.txt", b"Once upon a time, there was a girl.")
        path = {"checkpoint": model, "tokenizer": tok, "text": text}[target]
        if link == "symlink":
            (tmp / "alias").symlink_to(path.name)
            path = tmp / "alias"
        elif link == "hardlink":
            os.link(path, tmp / "alias")
            path = tmp / "alias"
        elif link == "dotted":
            path = tmp / "." / ".." / tmp.name / path.name
        source = ["-f", text] if mode == "ppl" else ["-p", "Once upon a time"]
        return [model, "-z", tok, "-m", mode, *source, "--csv", path]
    return build


# stories260K in version 2 with a second RoPE setting whose theta (the smallest subnormal) gives
# finite angles over the file's 512 positions and overflows float32 at 2^20 (head size 8: the
# slowest pair turns 1.4e-45^(-3/4), about 4e33 radians a token)
SECOND_SETTING_TINY_THETA = rope([(4, "<i", 2), (152, "<f", 1.4e-45), (156, "<f", 1.0), (160, "<f", 1.0)])


# hard to crash, part 3: an output over an input; the second setting's angles under -c
OUTPUT_ROWS = [
    (f"csv-{mode}-over-{target}" + (f"-{link}" if link else ""), output_over_input(mode, target, link), 2,
     f"is the {target if target != 'text' else 'text file (-f)'}: writing it would destroy an input of this run")
    for mode, target, link in [("ppl", "checkpoint", None), ("ppl", "checkpoint", "symlink"),
                               ("ppl", "checkpoint", "hardlink"), ("ppl", "checkpoint", "dotted"),
                               ("ppl", "tokenizer", None), ("ppl", "text", None), ("inspect", "checkpoint", None),
                               ("inspect", "tokenizer", "symlink")]
] + [
    ("c-beyond-the-second-settings-finite-angles",
     lambda tmp: [*SECOND_SETTING_TINY_THETA(tmp), "-z", TOK512, "-c", str(1 << 20), "-n", "2"], 2,
     "-c 1048576: second RoPE setting: rope_theta"),
    ("second-setting-finite-within-the-file", lambda tmp: [*SECOND_SETTING_TINY_THETA(tmp), "-z", TOK512,
                                                           "-t", "0", "-n", "4", "-p", "Once"], 0, None),
]
ROWS += OUTPUT_ROWS

PARAMS = [row if hasattr(row, "marks") else pytest.param(*row, id=row[0]) for row in ROWS]


def check(r, code, message, argv):
    """The contract: exit code, one 'run: error:' line with the message, nothing else."""
    out = r.stdout.decode("utf-8", "replace")
    err = r.stderr.decode("utf-8", "replace")
    context = f"\nargv: {[str(a)[:80] for a in argv]}\nexit: {r.returncode}\nstderr:\n{err[-3000:]}"
    assert r.returncode >= 0, f"killed by signal {-r.returncode}" + context
    assert "Sanitizer" not in err and "runtime error:" not in err, "sanitizer report" + context
    assert "Traceback" not in err
    assert r.returncode == code, context
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("run: error:")]
    others = [line for line in lines if not line.startswith("run: error:")]
    if code == 0:
        assert errors == [], context
        assert out.strip() != "", "no output" + context
        return
    assert len(errors) == 1, "expected exactly one error line" + context
    assert message in errors[0], f"expected {message!r} in the error line" + context
    if code == 2:
        assert others == [], "a usage error must be the only stderr line" + context
    else:
        assert all(STARTUP.match(line) for line in others), "unexpected stderr line" + context
        assert len(others) <= 1, context
        return
    assert r.stdout == b"", "a usage error must not print output" + context


@pytest.mark.parametrize("name,build,code,message", PARAMS)
def test_bad_input(tmp_path, name, build, code, message):
    argv = build(tmp_path)
    timeout = HANG_TIMEOUT * (3 if SANITIZED else 1) if name in HANG_ROWS else 120
    try:
        r = run(*argv, timeout=timeout)
    except subprocess.TimeoutExpired:
        r = None
    if r is None:
        pytest.fail(f"{name}: hang (no answer in {timeout} s)")
    check(r, code, message, argv)


def test_table_has_enough_rows():
    assert len(ROWS) >= 40


# ----------------------------------------------------------------------------
# Properties that are not one row each


@pytest.mark.parametrize("build", [legacy(dim=0), rope(rope_theta=float("nan")), v1([(4, "<i", 2)]),
                                   legacy(n_kv_heads=3)], ids=["legacy-dim", "rope-theta", "v1-version",
                                                               "kv-heads"])
def test_header_errors_name_the_checkpoint(tmp_path, build):
    argv = build(tmp_path)
    r = run(*argv)
    assert r.returncode == 1
    assert Path(argv[0]).name in r.stderr.decode()


@pytest.mark.skipif(SANITIZED, reason="sanitizers reserve terabytes of address space")
@pytest.mark.parametrize("build", [legacy(n_layers=1024, seq_len=2**19, dim=64, hidden_dim=2**20),
                                   legacy(dim=65536, hidden_dim=2**20, n_layers=1024, n_heads=2, n_kv_heads=2,
                                          vocab_size=2**22, seq_len=1),
                                   rope(vocab_size=2**22, dim=2**16, n_heads=2, n_kv_heads=2, hidden_dim=2**20),
                                   rope(seq_len=2**20, n_layers=1024, dim=8, n_heads=1, n_kv_heads=1)],
                         ids=["legacy-kv", "legacy-max", "rope-max", "rope-long-context"])
def test_no_allocation_before_the_size_check(tmp_path, build):
    """Headers claiming gigabytes fail on the file size under a 256 MiB address-space limit."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (256 << 20, 256 << 20))
    argv = [str(a) for a in build(tmp_path)]
    r = subprocess.run([RUN_BIN] + argv, capture_output=True, timeout=30, preexec_fn=limit,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    check(r, 1, "", argv)
    err = r.stderr.decode()
    assert "out of memory" not in err and ("header implies" in err or "KV cache" in err), err


def test_tiny_temperature_is_greedy_not_garbage():
    greedy = run(STORIES, "-z", TOK512, "-t", "0", "-n", "12", "-p", "Once")
    tiny = run(STORIES, "-z", TOK512, "-t", "2e-38", "--top-p", "1", "-n", "12", "-s", "3", "-p", "Once")
    assert greedy.returncode == 0
    assert tiny.returncode in (0, 2)
    if tiny.returncode == 0:
        assert tiny.stdout == greedy.stdout


# ----------------------------------------------------------------------------
# Seams that need more than a command line: stdout, the environment, stdin


FULL_DISK_MODES = {
    "generate": story("-t", "0", "-n", "8", "-p", "Once"),
    "tokenize": story("-m", "tokenize", "-p", "Once upon a time"),
    "ppl": story("-m", "ppl", "-p", "Once upon a time"),
    "inspect": story("-m", "inspect", "-p", "Once upon a time"),
    "chat": story("-m", "chat", "-t", "0", "-n", "4", "-p", "Hello"),
    "rope": args(STORIES, "-m", "rope"),
    "help": args("-h"),
}


@pytest.mark.parametrize("mode", sorted(FULL_DISK_MODES))
def test_every_mode_fails_when_stdout_is_a_full_disk(tmp_path, mode):
    """/dev/full takes no byte: each mode says so in one line and exits 1, not 0 with an empty file."""
    argv = [str(a) for a in FULL_DISK_MODES[mode](tmp_path)]
    with open("/dev/full", "wb") as full:
        r = subprocess.run(RUN_PREFIX + [RUN_BIN] + argv, stdout=full, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, timeout=120)
    r.stdout = b""
    # the modes' timing lines come before the end, where stdout is checked
    r.stderr = b"".join(line for line in r.stderr.splitlines(keepends=True) if not line.startswith(b"timing: "))
    check(r, 1, "cannot write to standard output", argv)


STACK_MIN_K = os.sysconf("SC_THREAD_STACK_MIN") // 1024  # glibc's PTHREAD_STACK_MIN, libgomp's minimum


def run_with_threads(value, *argv):
    return run(*argv, timeout=60, env={"OMP_NUM_THREADS": value}), [str(a) for a in argv]


@pytest.mark.parametrize("value, message", [("1025", "OMP_NUM_THREADS must be in [1, 1024], got 1025"),
                                            ("100000", "OMP_NUM_THREADS must be in [1, 1024], got 100000"),
                                            ("2000,1", "OMP_NUM_THREADS must be in [1, 1024], got 2000")])
def test_omp_num_threads_is_capped_as_t_is(value, message):
    """A huge OMP_NUM_THREADS crashed inside the OpenMP runtime; now it meets -T's bound and message."""
    r, argv = run_with_threads(value, STORIES, "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once")
    check(r, 2, message, argv)
    t = run(STORIES, "-z", TOK512, "-T", value.split(",")[0], "-p", "Once")
    assert t.returncode == 2 and b"-T must be in [1, 1024]" in t.stderr


def assert_our_line_comes_last(r, name):
    """libgomp reads its variables before main and may print its own line then: run's one error line
    (exit 2) is the last, after anything of libgomp's, and says what to set."""
    assert r.returncode == 2, r.stderr
    lines = r.stderr.decode().splitlines()
    assert lines[-1].startswith("run: error: ") and name in lines[-1] and "or unset it" in lines[-1], r.stderr
    assert all(line == "" or line.startswith("libgomp: ") for line in lines[:-1]), r.stderr
    assert r.stdout == b""
    return lines[-1]


@pytest.mark.parametrize("value", ["0", "-3", "two", "abc", "", "2,", "1,0", "2,,1"])
def test_omp_num_threads_that_the_runtime_refuses_too(value):
    """Values libgomp itself calls invalid (it prints its own line first, before main runs): exit 2 and our line."""
    r, argv = run_with_threads(value, STORIES, "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once")
    assert_our_line_comes_last(r, "OMP_NUM_THREADS")


@pytest.mark.parametrize("name, value, message", [
    ("OMP_THREAD_LIMIT", "0", "OMP_THREAD_LIMIT expects a positive integer, got '0'"),
    ("OMP_THREAD_LIMIT", "many", "OMP_THREAD_LIMIT expects a positive integer, got 'many'"),
    ("OMP_STACKSIZE", "1T", "OMP_STACKSIZE expects a size such as 512K or 4M (B, K, M or G), got '1T'"),
    ("OMP_STACKSIZE", "-4M", "OMP_STACKSIZE expects a size such as 512K or 4M (B, K, M or G), got '-4M'"),
    ("OMP_STACKSIZE", "100000G", "OMP_STACKSIZE 100000G asks each thread for a stack larger than the"),
    ("OMP_STACKSIZE", "99999999999999999G", "OMP_STACKSIZE 99999999999999999G is larger than any memory"),
    # below the runtime's minimum thread stack (glibc's PTHREAD_STACK_MIN): libgomp warns and goes on
    ("OMP_STACKSIZE", "1", f"OMP_STACKSIZE 1 is below the OpenMP runtime's minimum thread stack of {STACK_MIN_K}K"),
    ("OMP_STACKSIZE", "4k", f"OMP_STACKSIZE 4k is below the OpenMP runtime's minimum thread stack of {STACK_MIN_K}K"),
    ("OMP_STACKSIZE", f"{STACK_MIN_K * 1024 - 1}B", "is below the OpenMP runtime's minimum thread stack")])
def test_openmp_settings_the_runtime_refuses_or_cannot_start_get_our_line(name, value, message):
    """libgomp prints "Invalid value" and goes on, warns of a stack below its minimum and goes on,
    or stops at the first parallel region with "Thread creation failed" and exit 1: run refuses
    such a value first, exit 2 with its own line."""
    r = run(STORIES, "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once", "-T", "2", timeout=60, env={name: value})
    assert message in assert_our_line_comes_last(r, name), r.stderr


def openmp_rows_of_the_testing_doc():
    """docs/testing.md's table of OpenMP settings: (variable, value, libgomp prints a line too)."""
    text = (Path(__file__).parent.parent / "docs" / "testing.md").read_text()
    rows = re.findall(r"^\| `(OMP_\w+)=([^`]*)` \| (yes|no) \|", text, re.M)
    assert len(rows) >= 8, "docs/testing.md: the table of OpenMP settings run refuses"
    return rows


@pytest.mark.skipif(b"libgomp.so" not in Path(RUN_BIN).read_bytes(), reason="libgomp's lines: a build with OpenMP")
def test_the_testing_docs_table_says_which_refused_openmp_values_libgomp_also_prints_for():
    for name, value, libgomp in openmp_rows_of_the_testing_doc():
        r = run(STORIES, "-z", TOK512, "-n", "2", "-T", "2", timeout=60, env={name: value})
        assert_our_line_comes_last(r, name)
        assert (b"libgomp: " in r.stderr) == (libgomp == "yes"), (name, value, r.stderr)


@pytest.mark.parametrize("name, value", [("OMP_STACKSIZE", "4M"), ("OMP_STACKSIZE", " 2 g "),
                                         ("OMP_STACKSIZE", f"{STACK_MIN_K}K"),
                                         ("OMP_THREAD_LIMIT", "1"), ("OMP_NUM_THREADS", "2,1")])
def test_openmp_settings_the_runtime_accepts_still_run(name, value):
    r = run(STORIES, "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once", timeout=60, env={name: value})
    assert r.returncode == 0 and r.stdout.startswith(b"Once"), r.stderr


@pytest.mark.parametrize("mode, target, link", [("ppl", "checkpoint", None), ("ppl", "checkpoint", "hardlink"),
                                               ("ppl", "text", None), ("inspect", "tokenizer", "symlink")])
def test_an_output_over_an_input_leaves_the_input_as_it_was(tmp_path, mode, target, link):
    """The checkpoint used to be truncated under its own mapping (SIGBUS, the file left at 0 bytes),
    the tokenizer or the text overwritten: now nothing is opened for writing, and every input keeps
    its bytes."""
    argv = output_over_input(mode, target, link)(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    r = run(*argv)
    assert r.returncode == 2, r.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_more_threads_than_cores_runs_and_says_so():
    cores = len(os.sched_getaffinity(0))
    plain = run(STORIES, "-z", TOK512, "-t", "0", "-n", "12", "-p", "Once")
    r, _ = run_with_threads(str(cores + 1), STORIES, "-z", TOK512, "-t", "0", "-n", "12", "-p", "Once")
    assert r.returncode == 0 and r.stdout == plain.stdout
    if "asan" not in Path(RUN_BIN).name:  # the sanitizer builds have no OpenMP: no threads to warn about
        assert f"asks for {cores + 1} threads, but this process may use {cores} cores".encode() in r.stderr


@pytest.mark.parametrize("stdin", [b"hello\0there\n", b"\0\0\0\n", b"Hi\nonce\0more\n", b"\0"],
                         ids=["nul-inside", "line-of-nuls", "second-line", "nul-without-newline"])
def test_chat_refuses_nul_bytes_as_f_does(stdin):
    """Chat cut a line at a NUL byte and skipped a line of NULs; -f refuses NUL bytes, and so does chat."""
    argv = [STORIES, "-z", TOK512, "-m", "chat", "-t", "0", "-n", "4"]
    r = run(*argv, input=stdin)
    check(r, 1, "a line of standard input contains a NUL byte at offset", argv)


def test_inspect_refuses_an_unwritable_csv_before_the_run(tmp_path):
    """The --csv path is opened first: nothing is computed or printed for a run that cannot be saved."""
    argv = [STORIES, "-z", TOK512, "-m", "inspect", "-p", "Once upon a time", "--csv", tmp_path / "no" / "x.csv"]
    r = run(*argv)
    check(r, 1, "cannot write", argv)
    assert r.stdout == b""


@pytest.mark.skipif(SANITIZED, reason="sanitizers reserve terabytes of address space")
def test_text_too_large_for_memory_says_out_of_memory(tmp_path):
    """A text file that passes its first-bytes check but does not fit: "out of memory", not "cannot read"."""
    path = sparse_file("big.txt", 1 << 30, b"Once upon a time " * 4096)(tmp_path)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
    argv = [str(a) for a in (STORIES, "-z", TOK512, "-m", "ppl", "-f", path)]
    r = subprocess.run([RUN_BIN] + argv, capture_output=True, timeout=30, preexec_fn=limit,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    check(r, 1, f"out of memory reading {path} (1073741824 bytes)", argv)


@pytest.mark.parametrize("seed", range(3))
def test_error_lines_stay_one_line_whatever_is_echoed(tmp_path, seed):
    """Random control characters in a flag, a mode and a path: every error is one line, the bytes escaped."""
    import random
    rng = random.Random(seed)
    junk = "".join(chr(rng.choice([*range(1, 32), 127, ord("x")])) for _ in range(12))
    for argv, code in [([STORIES, "--" + junk], 2), ([STORIES, "-m", junk], 2),
                       ([tmp_path / junk, "-z", TOK512], 1), ([STORIES, "-z", tmp_path / junk, "-p", "x"], 1)]:
        r = run(*argv)
        check(r, code, "", argv)
        line = [x for x in r.stderr.decode().split("\n") if x.startswith("run: error:")][0]
        assert not any(ord(ch) < 32 or ord(ch) == 127 for ch in line), line


def test_where_to_get_models_is_said_only_for_a_file_that_does_not_exist(tmp_path):
    """The "models/ has ..." hint answers a missing checkpoint or tokenizer, and no other error:
    a file whose tokenizer section is refused (its chat_template out of range) once carried it,
    from an errno an earlier call had left."""
    import hf_fixture
    from conftest import export
    hint = "models/ has stories260K.bin"
    for argv in ([tmp_path / "nope.bin"], [STORIES, "-z", tmp_path / "nope.bin"]):
        r = run(*argv, "-n", "2")
        assert r.returncode == 1 and hint in r.stderr.decode(), r.stderr
    hf_fixture.make_hf_checkpoint(tmp_path / "hf", dim=8, hidden_dim=16, n_layers=1, n_heads=1, n_kv_heads=1,
                                  vocab_size=32000, seq_len=64)
    (tmp_path / "hf" / "tokenizer.model").symlink_to(MODELS / "tokenizer.model")
    export(tmp_path / "hf", tmp_path / "model.bin")
    data = bytearray((tmp_path / "model.bin").read_bytes())
    at = data.rindex(b"TOKN")
    assert struct.unpack_from("<i", data, at + 76)[0] == 0  # the chat_template field (docs/format.md)
    struct.pack_into("<i", data, at + 76, 11)
    bad = put(tmp_path, "bad.bin", data)
    for argv in ([bad, "-n", "2"], [bad, "-m", "chat", "-p", "hi"]):
        r = run(*argv, input="")
        check(r, 1, "chat_template 11 is out of range", argv)
        assert hint not in r.stderr.decode(), r.stderr
