#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora into fuzz/corpus/{header,tokenizer,encode,tokn}/.

Headers: the first 256 bytes of the shared models (headers only, not the models),
tiny complete models in all three formats (a few hundred bytes, so the header
fuzzer reaches map_weights and the forward pass), and crafted bad headers.
Tokenizers: small tokenizer.bin files built here (two bytes of vocab size first,
as fuzz_tokenizer.c reads them). TOKN sections: small ones of each kind and
pre-tokenizer, written here from docs/format.md's table (two bytes of vocab size
first, as fuzz_tokn.c reads them), and a ROPE v2 model holding one. Texts: short
strings. Run from the repo:
    /usr/bin/python3 fuzz/make_corpus.py [MODELS_DIR]
"""
import math
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = Path(sys.argv[1] if len(sys.argv) > 1 else HERE.parent / "models")
OUT = HERE / "corpus"


def write(kind, name, data):
    d = OUT / kind
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(bytes(data))


def floats(n, seed):
    """n deterministic float32 values in [-1, 1] (no numpy needed)."""
    return struct.pack(f"<{n}f", *[math.sin(seed * 7.1 + i * 1.3) for i in range(n)])


def weight_count(dim, hidden, layers, heads, kv_heads, vocab, shared):
    hd = dim // heads
    kv = kv_heads * hd
    per_layer = 2 * dim + dim * dim + 2 * kv * dim + dim * dim + 3 * hidden * dim
    return vocab * dim + layers * per_layer + dim + (0 if shared else vocab * dim)


def legacy_model(dim, hidden, layers, heads, kv_heads, vocab, seq, shared=True, seed=1):
    hd = dim // heads
    n = weight_count(dim, hidden, layers, heads, kv_heads, vocab, True) + seq * hd
    n += 0 if shared else vocab * dim
    return struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq) + floats(n, seed)


def v1_model(dim, hidden, layers, heads, kv_heads, vocab, seq, shared=True, seed=2):
    head = struct.pack("<Ii7iB", 0x616B3432, 1, dim, hidden, layers, heads, kv_heads, vocab, seq, int(shared))
    head += b"\0" * (256 - len(head))
    return head + floats(weight_count(dim, hidden, layers, heads, kv_heads, vocab, shared), seed)


def rope_header(dim, hidden, layers, heads, kv_heads, vocab, seq, shared=1, eps=1e-5, theta=10000.0,
                fraction=1.0, scale=1.0):
    head = struct.pack("<Ii7ii4f", 0x45504F52, 1, dim, hidden, layers, heads, kv_heads, vocab, seq, shared, eps,
                       theta, fraction, scale)
    return head + b"\0" * (256 - len(head))


def rope_model(dim, hidden, layers, heads, kv_heads, vocab, seq, shared=1, seed=3, **floats_kw):
    return rope_header(dim, hidden, layers, heads, kv_heads, vocab, seq, shared, **floats_kw) + floats(
        weight_count(dim, hidden, layers, heads, kv_heads, vocab, shared), seed)


def halves(n, seed, weight_type):
    """n deterministic 16-bit weights in [-1, 1]: bf16 (the float32's top half) or f16."""
    if weight_type == 1:
        return struct.pack(f"<{n}H", *[u >> 16 for u in struct.unpack(f"<{n}I", floats(n, seed))])
    return struct.pack(f"<{n}e", *[math.sin(seed * 7.1 + i * 1.3) for i in range(n)])


def q8_0_blocks(n, seed):
    """n deterministic weights as Q8_0 blocks (n a multiple of 32): an f16 scale of 1/127, then 32
    int8 values from a sine."""
    out = b""
    for b in range(n // 32):
        out += struct.pack("<e", 1 / 127) + struct.pack("<32b", *[round(127 * math.sin(seed * 7.1 + (32 * b + j) * 1.3))
                                                               for j in range(32)])
    return out


# The 4-, 5- and 6-bit blocks (weight_type 5..11, docs/format.md): weights and bytes per block, and
# where their f16 scales lie (d; m or dmin)
BLOCKS = {5: (32, 18, (0,)), 6: (32, 20, (0, 2)), 7: (32, 22, (0,)), 8: (32, 24, (0, 2)), 9: (256, 144, (0, 2)),
          10: (256, 176, (0, 2)), 11: (256, 210, (208,))}


def small_blocks(n, seed, code):
    """n deterministic weights as blocks of type code 5..11: bytes from a sine, each scale an f16 of
    1/64 or -1/64 (finite, as run requires)."""
    weights, size, scales = BLOCKS[code]
    out = bytearray()
    for b in range(n // weights):
        block = bytearray(int(128 + 127 * math.sin(seed * 3.7 + (size * b + j) * 1.9)) for j in range(size))
        for at in scales:
            struct.pack_into("<e", block, at, (1 if (b + at) % 3 else -1) / 64)
        out += block
    return bytes(out)


def matrix_bytes(n, seed, code):
    """n weights of the type code (1 bf16, 2 f16, 3 q8_0, 5..11 the blocks)."""
    return q8_0_blocks(n, seed) if code == 3 else small_blocks(n, seed, code) if code in BLOCKS else halves(n, seed, code)


def rope_v2_model(dim, hidden, layers, heads, kv_heads, vocab, seq, shared=1, weight_type=1, seed=4, aligned=True):
    """ROPE version 2: weight_type at byte 88 (1 bf16, 2 f16, 3 q8_0) for the embedding and the matrices,
    float32 norms, every tensor at a multiple of 64 bytes (unless not aligned: a bad file)."""
    head = bytearray(rope_header(dim, hidden, layers, heads, kv_heads, vocab, seq, shared))
    struct.pack_into("<i", head, 4, 2)
    struct.pack_into("<i", head, 88, weight_type)
    hd = dim // heads
    kv = kv_heads * hd
    tensors = [(True, vocab * dim), (False, layers * dim), (True, layers * dim * dim), (True, layers * kv * dim),
               (True, layers * kv * dim), (True, layers * dim * dim), (False, layers * dim),
               (True, layers * hidden * dim), (True, layers * dim * hidden), (True, layers * hidden * dim),
               (False, dim)] + ([] if shared else [(True, vocab * dim)])
    out = bytes(head)
    for i, (matrix, n) in enumerate(tensors):
        if aligned:
            out += b"\0" * (-len(out) % 64)
        if not matrix:
            out += floats(n, seed + i)
        else:
            out += matrix_bytes(n, seed + i, weight_type)
    return out


def rope_v2_typed(dim=32, hidden=32, layers=1, heads=2, kv_heads=1, vocab=3, seq=4, seed=8, turns=(3, 1, 2, 0)):
    """ROPE version 2 with a type table (weight_type 4): each matrix piece (the embedding, then each
    layer's wq, wk, wv, wo, w1, w2, w3) of its own type, by turns (q8_0, bf16, f16, f32), each at a
    multiple of 64 bytes; float32 norms; the table at the first multiple of 64 after them."""
    head = bytearray(rope_header(dim, hidden, layers, heads, kv_heads, vocab, seq))
    struct.pack_into("<i", head, 4, 2)
    struct.pack_into("<i", head, 88, 4)
    kv = kv_heads * (dim // heads)
    pieces = ([("emb", vocab * dim), ("norm", layers * dim)] + [("wq", dim * dim)] * layers +
              [("wk", kv * dim)] * layers + [("wv", kv * dim)] * layers + [("wo", dim * dim)] * layers +
              [("norm", layers * dim)] + [("w", hidden * dim)] * 3 * layers + [("norm", dim)])
    out, codes = bytes(head), []
    for i, (kind, n) in enumerate(pieces):
        out += b"\0" * (-len(out) % 64)
        if kind == "norm":
            out += floats(n, seed + i)
            continue
        code = turns[len(codes) % len(turns)]
        codes.append(code)
        out += floats(n, seed + i) if code == 0 else matrix_bytes(n, seed + i, code)
    out += b"\0" * (-len(out) % 64)
    out = bytearray(out)
    struct.pack_into("<2Q", out, 216, len(out), len(codes))
    return bytes(out + bytes(codes))


def rope_v2_variant(dim=4, hidden=4, layers=2, heads=2, kv_heads=1, vocab=6, seq=16, head_size=4, seed=5):
    """ROPE version 2 with every block option (docs/format.md): head_size, all three flags (q/k/v
    biases, q/k norms, post norms), GeGLU, the multiplier, scale and soft-caps, a second RoPE
    setting, and a per-layer table (layer 0 NoPE with a window of 3, layer 1 the second setting)."""
    head = bytearray(rope_header(dim, hidden, layers, heads, kv_heads, vocab, seq))
    struct.pack_into("<i", head, 4, 2)
    struct.pack_into("<ii", head, 84, head_size, 0)
    struct.pack_into("<Ii4f", head, 112, 7, 1, 1.5, 0.25, 5.0, 20.0)
    struct.pack_into("<3f2i5f", head, 152, 500.0, 0.5, 1.0, 0, 0, 0, 0, 0, 0, 0)
    q, kv = heads * head_size, kv_heads * head_size
    tensors = [vocab * dim, layers * dim, layers * q * dim, layers * kv * dim, layers * kv * dim, layers * dim * q,
               layers * dim, layers * hidden * dim, layers * dim * hidden, layers * hidden * dim, dim,
               layers * q, layers * kv, layers * kv, layers * head_size, layers * head_size, layers * dim,
               layers * dim]
    out = bytes(head)
    for i, n in enumerate(tensors):
        out += b"\0" * (-len(out) % 64) + floats(n, seed + i)
    out += b"\0" * (-len(out) % 64)
    out = bytearray(out)
    struct.pack_into("<2Q", out, 136, len(out), 8 * layers)
    return bytes(out) + struct.pack("<4i", 0, 3, 2, 0)


def with_wide_records(head, tensors, records, seed):
    """A ROPE version 2 file: head, the tensors of these sizes (each at a multiple of 64 bytes,
    deterministic values), then the per-layer table of eight-int32 records the header points at."""
    out = bytes(head)
    for i, n in enumerate(tensors):
        out += b"\0" * (-len(out) % 64) + floats(n, seed + i)
    out += b"\0" * (-len(out) % 64)
    out = bytearray(out)
    struct.pack_into("<2Q", out, 136, len(out), 32 * len(records))
    return bytes(out) + b"".join(struct.pack("<8i", *r) for r in records)


def rope_v2_gemma4(dim=4, hidden=4, heads=2, vocab=6, seq=16, P=2, seed=6):
    """ROPE version 2 with Gemma 4's records of eight int32 (docs/format.md): layer 0 sliding (the
    second setting, heads of 2, window 3), layer 1 full (heads of 4, p = 0.5, its values the keys),
    layer 2 sliding and sharing layer 0's cache with a double-wide feed-forward; q/k norms, post
    norms, the v norm, layer scalars and per-layer inputs of P."""
    layers = 3
    records = [(2, 3, 2, 1, 0, 0, 0, 0), (1, 0, 4, 1, 0, 0, 1, 0), (2, 3, 2, 1, 2 * hidden, 1, 0, 0)]
    head = bytearray(rope_header(dim, hidden, layers, heads, 1, vocab, seq, fraction=0.5))
    struct.pack_into("<i", head, 4, 2)
    struct.pack_into("<ii", head, 84, 4, 0)
    struct.pack_into("<Ii4f", head, 112, 2 | 4 | 8 | 16 | 32, 1, 2.0, 1.0, 0.0, 30.0)
    struct.pack_into("<3f2i5f", head, 152, 10000.0, 1.0, 1.0, 0, 0, 0, 0, 0, 0, 0)
    struct.pack_into("<if", head, 192, P, math.sqrt(P))
    q = [heads * r[2] for r in records]
    own = [r for r in records if r[5] == 0]
    kv = sum(r[3] * r[2] for r in own)
    v = sum(r[3] * r[2] for r in own if not r[6])
    hid = sum(r[4] or hidden for r in records)
    tensors = [vocab * dim, layers * dim, sum(q) * dim, kv * dim, v * dim, dim * sum(q), layers * dim,
               hid * dim, dim * hid, hid * dim, dim, sum(r[2] for r in records), sum(r[2] for r in own),
               layers * dim, layers * dim, layers, vocab * layers * P, layers * P * dim, P, layers * P * dim,
               layers * dim * P, layers * dim]
    return with_wide_records(head, tensors, records, seed)


def rope_v2_experts(dim=4, hidden=4, heads=2, vocab=6, seq=16, experts=3, used=2, expert_hidden=4, seed=7):
    """ROPE version 2 with a mixture of experts (block flag 64, docs/format.md): layer 0 a
    feed-forward, layer 1 the experts (records of eight int32), routing 1 (renormalized), q/k norms."""
    layers = 2
    records = [(1, 0, 0, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0, 0, 1)]
    head = bytearray(rope_header(dim, hidden, layers, heads, 1, vocab, seq))
    struct.pack_into("<i", head, 4, 2)
    struct.pack_into("<I", head, 112, 2 | 64)
    struct.pack_into("<4i", head, 200, experts, used, expert_hidden, 1)
    hd = dim // heads
    q, kv = heads * hd, hd
    tensors = [vocab * dim, layers * dim, layers * q * dim, layers * kv * dim, layers * kv * dim, layers * dim * q,
               layers * dim, hidden * dim, dim * hidden, hidden * dim, dim, layers * hd, layers * hd,
               experts * dim, experts * expert_hidden * dim, experts * dim * expert_hidden,
               experts * expert_hidden * dim]
    return with_wide_records(head, tensors, records, seed)


def headers():
    for name in ("stories260K.bin", "stories260K_v1.bin"):
        path = MODELS / name
        if path.exists():
            with open(path, "rb") as f:
                write("header", "head256-" + name, f.read(256))
    write("header", "rope-stories-dims", rope_header(64, 172, 5, 8, 4, 512, 512))
    # tiny complete models: the fuzzer mutates these into other valid shapes
    write("header", "tiny-legacy", legacy_model(4, 3, 1, 2, 1, 5, 3))
    write("header", "tiny-legacy-unshared", legacy_model(2, 1, 1, 1, 1, 3, 2, shared=False))
    write("header", "tiny-v1", v1_model(4, 2, 1, 2, 2, 4, 8))
    write("header", "tiny-v1-unshared", v1_model(2, 1, 2, 1, 1, 3, 4, shared=False))
    write("header", "tiny-rope", rope_model(4, 4, 1, 2, 1, 6, 16))
    write("header", "tiny-rope-prope", rope_model(8, 4, 1, 2, 1, 4, 4, fraction=0.5, theta=500.0, scale=8.0))
    write("header", "tiny-rope-unshared", rope_model(2, 1, 1, 1, 1, 3, 1, shared=0))
    write("header", "tiny-rope-vocab1", rope_model(2, 1, 1, 1, 1, 1, 2))
    write("header", "tiny-rope-v2-bf16", rope_v2_model(4, 4, 1, 2, 1, 6, 16, weight_type=1))
    write("header", "tiny-rope-v2-f16-unshared", rope_v2_model(2, 3, 2, 1, 1, 5, 4, shared=0, weight_type=2))
    # q8_0: rows of 32 (dim 32, two heads of 16, one kv head, hidden 32, three tokens)
    write("header", "tiny-rope-v2-q8_0", rope_v2_model(32, 32, 1, 2, 1, 3, 4, weight_type=3))
    write("header", "tiny-rope-v2-variant", rope_v2_variant())
    write("header", "tiny-rope-v2-gemma4", rope_v2_gemma4())
    write("header", "tiny-rope-v2-experts", rope_v2_experts())
    write("header", "tiny-rope-v2-per-piece", rope_v2_typed())
    # crafted bad ones
    write("header", "bad-empty", b"")
    write("header", "bad-27-bytes", struct.pack("<7i", 64, 172, 5, 8, 4, 512, 512)[:27])
    write("header", "bad-v1-version2", struct.pack("<Ii", 0x616B3432, 2) + b"\0" * 248)
    write("header", "bad-rope-nan-theta", rope_header(64, 172, 5, 8, 4, 512, 512, theta=float("nan")))
    write("header", "bad-rope-inf-eps", rope_header(64, 172, 5, 8, 4, 512, 512, eps=float("inf")))
    write("header", "bad-overflow", struct.pack("<7i", 65536, 1 << 20, 1024, 2, 2, 1 << 22, 1))
    write("header", "bad-int-min-vocab", struct.pack("<7i", 64, 172, 5, 8, 4, -2**31, 512))
    write("header", "bad-kv-cache", rope_header(64, 172, 1024, 8, 8, 512, 1 << 20))
    unknown_type = bytearray(rope_v2_model(4, 4, 1, 2, 1, 6, 16))
    struct.pack_into("<i", unknown_type, 88, 5)
    write("header", "bad-rope-v2-weight-type-5", unknown_type)
    no_table = bytearray(rope_v2_model(4, 4, 1, 2, 1, 6, 16))  # weight_type 4 without its table
    struct.pack_into("<i", no_table, 88, 4)
    write("header", "bad-rope-v2-per-piece-without-table", no_table)
    unknown_code = bytearray(rope_v2_typed())
    unknown_code[-1] = 9
    write("header", "bad-rope-v2-type-table-code-9", unknown_code)
    q8_rows = bytearray(rope_v2_model(4, 4, 1, 2, 1, 6, 16))  # q8_0 with rows of 4 weights
    struct.pack_into("<i", q8_rows, 88, 3)
    write("header", "bad-rope-v2-q8_0-rows-of-4", q8_rows)
    inf_scale = bytearray(rope_v2_model(32, 32, 1, 2, 1, 3, 4, weight_type=3))
    struct.pack_into("<H", inf_scale, 256 + 34, 0x7C00)  # the embedding's second block
    write("header", "bad-rope-v2-q8_0-inf-scale", inf_scale)
    # the blocks: one type a file with rows of 32 (dim 32) for q4_0 .. q5_1; the K-quants need rows
    # of 256, and one file (every type by turns, the embedding q4_k) holds them all
    for code, name in zip(range(5, 9), ["q4_0", "q4_1", "q5_0", "q5_1"]):
        write("header", f"tiny-rope-v2-{name}", rope_v2_model(32, 32, 1, 2, 1, 3, 4, weight_type=code))
    typed = rope_v2_typed(dim=256, hidden=256, heads=4, turns=(9, 11, 10, 5, 6, 7, 8, 3))
    write("header", "tiny-rope-v2-typed-blocks", typed)
    inf_dmin = bytearray(typed)
    struct.pack_into("<H", inf_dmin, 256 + 2, 0x7C00)  # the embedding's first q4_k block's dmin
    write("header", "bad-rope-v2-q4_k-inf-dmin", inf_dmin)
    write("header", "bad-rope-v2-unaligned", rope_v2_model(4, 4, 1, 2, 1, 6, 16, weight_type=2, aligned=False))


def tokenizer_bytes(pieces, max_len=None, scores=None):
    max_len = max_len if max_len is not None else max(1, max(len(p) for p in pieces))
    out = struct.pack("<i", max_len)
    for i, p in enumerate(pieces):
        score = scores[i] if scores else -float(i)
        out += struct.pack("<fi", score, len(p)) + p
    return out


def tok_input(vocab, data):
    """fuzz_tokenizer's input: u16 with (u16 % 4096) + 1 == vocab, then the file."""
    return struct.pack("<H", vocab - 1) + data


def llama_like(n_merges):
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % b for b in range(256)]
    merges = [b" ", b"e", b"t", b"a", b"o", b" t", b"he", b" a", b"in", b" the", b"er", b"on", b" s", b"an",
              b"Once", b" upon", b" time", b"\xc3\xa9", b"\xe6\x97\xa5", b"  "]
    merges += [b"w%d" % i for i in range(max(0, n_merges - len(merges)))]
    return pieces + merges[:n_merges]


def tokenizers():
    small = [b"<unk>", b"<s>", b"</s>", b"a", b"b", b"ab", b" ", b" a"]
    write("tokenizer", "small8", tok_input(8, tokenizer_bytes(small)))
    write("tokenizer", "small3-empty-pieces", tok_input(3, tokenizer_bytes([b"", b"", b""], max_len=1)))
    write("tokenizer", "nul-in-piece", tok_input(4, tokenizer_bytes([b"<unk>", b"<s>", b"</s>", b"a\0b"])))
    write("tokenizer", "llama-like-279", tok_input(279, tokenizer_bytes(llama_like(20))))
    write("tokenizer", "llama-like-300", tok_input(300, tokenizer_bytes(llama_like(41), max_len=16)))
    write("tokenizer", "bad-truncated", tok_input(8, tokenizer_bytes(small)[:-3]))
    write("tokenizer", "bad-negative-length", tok_input(2, struct.pack("<ifi", 4, 0.0, -1)))
    write("tokenizer", "bad-max-len-zero", tok_input(1, struct.pack("<ifi", 0, 0.0, 0)))
    write("tokenizer", "bad-nan-score", tok_input(1, struct.pack("<ifi", 4, float("nan"), 1) + b"x"))
    write("tokenizer", "bad-trailing", tok_input(3, tokenizer_bytes(small[:3]) + b"\0\0"))


# --- TOKN sections (docs/format.md, "Tokenizer section") -----------------------------------

def tokn_section(kind, pieces, merges=(), bos=-1, add_bos=0, eot=-1, eos=(0,), pretokenizer=0, flags=0,
                 template=0, classes=(), decompositions=(), compositions=(), ccc=()):
    """pieces: [(bytes, type, score)]; merges: [(left id, right id)]; tables: rows of three ints."""
    max_len = max([len(p) for p, _, _ in pieces] + [1])
    head = struct.pack("<IiiiiiiiI", 0x4E4B4F54, 1, kind, len(pieces), max_len, bos, add_bos, eot, len(eos))
    head += struct.pack("<8i", *(list(eos) + [-1] * (8 - len(eos))))
    head += struct.pack("<iIiiiiii", pretokenizer, flags, template, len(merges), len(classes), len(decompositions),
                        len(compositions), len(ccc))
    out = bytearray(head + b"\0" * (128 - len(head)))
    for piece, ptype, score in pieces:
        out += struct.pack("<fii", score, ptype, len(piece)) + piece + b"\0" * (-len(piece) % 4)
    for left, right in merges:
        out += struct.pack("<ii", left, right)
    for table in (classes, decompositions, compositions, ccc):
        for row in table:
            out += struct.pack("<III", *row)
    return bytes(out)


def tokn_input(vocab, data):
    """fuzz_tokn's input: u16 with u16 + 1 == vocab, then the section."""
    return struct.pack("<H", vocab - 1) + data


# A tiny Unicode: A-Z Lu, a-z Ll, Latin-1 letters, combining acute and dot below (M),
# Hangul (Lo), digits and circled digits (N), White_Space.
CLASSES = [(0x09, 0x0D, 32), (0x20, 0x20, 32), (0x30, 0x39, 16), (0x41, 0x5A, 1), (0x61, 0x7A, 2),
           (0xC0, 0xD6, 1), (0xDF, 0xF6, 2), (0x300, 0x36F, 8), (0x1100, 0x11FF, 4), (0x2460, 0x2473, 16),
           (0x3000, 0x3000, 32), (0xAC00, 0xD7A3, 4)]
DECOMPOSITIONS = [(0xC1, 0x41, 0x301), (0xE1, 0x61, 0x301), (0xE9, 0x65, 0x301), (0x1E05, 0x62, 0x323),
                  (0x212B, 0xC5, 0), (0xC5, 0x41, 0x30A)]
COMPOSITIONS = [(0x41, 0x301, 0xC1), (0x41, 0x30A, 0xC5), (0x61, 0x301, 0xE1), (0x62, 0x323, 0x1E05),
                (0x65, 0x301, 0xE9)]
CCC = [(0x300, 0x314, 230), (0x323, 0x323, 220)]
CCC.sort()
DECOMPOSITIONS.sort()


def byte_level(pretokenizer, flags=0, nfc=False):
    """256 byte pieces, a few merges (t h -> th, th e -> the, ' ' the -> ' the', ...), two controls."""
    pieces = [(bytes([b]), 0, 0.0) for b in range(256)]
    merged = []
    def add(left, right):
        pieces.append((pieces[left][0] + pieces[right][0], 0, 0.0))
        merged.append((left, right))
        return len(pieces) - 1
    th = add(ord("t"), ord("h"))
    the = add(th, ord("e"))
    add(ord(" "), the)
    add(ord("i"), ord("n"))
    add(ord("1"), ord("2"))
    add(ord(" "), ord(" "))
    add(ord("'"), ord("s"))
    pieces.append((b"<|endoftext|>", 1, 0.0))
    pieces.append((b"<b>", 2, 0.0))
    end = len(pieces) - 2
    flags |= 16 if nfc else 0
    return tokn_section(2, pieces, merged, eos=(end,), eot=end, pretokenizer=pretokenizer, flags=flags,
                        template=3, classes=CLASSES, decompositions=DECOMPOSITIONS if nfc else (),
                        compositions=COMPOSITIONS if nfc else (), ccc=CCC if nfc else ())


def sentencepiece_like(kind, flags):
    """<unk> <s> </s>, 256 byte pieces, ' ' and a-z; kind 3: merges by rank, kind 1: scores."""
    pieces = [(b"<unk>", 1, 0.0), (b"<s>", 1, 0.0), (b"</s>", 1, 0.0)]
    pieces += [(b"<0x%02X>" % b, 3, 0.0) for b in range(256)]
    pieces += [(bytes([c]), 0, -float(i)) for i, c in enumerate(b" abcdefghijklmnopqrstuvwxyz")]
    ids = {p: i for i, (p, _, _) in enumerate(pieces)}
    merges = []
    for left, right in [(b" ", b"a"), (b"i", b"n"), (b" a", b"b"), (b"t", b"h")]:
        pieces.append((left + right, 0, -100.0 - len(merges)))
        merges.append((ids[left], ids[right]))
        ids[left + right] = len(pieces) - 1
    pieces.append((b"<b>", 2, 0.0))
    return tokn_section(kind, pieces, merges if kind == 3 else (), bos=1, add_bos=1, eos=(2,), flags=flags,
                        template=1)


def tokn():
    for pretok, name in enumerate(["none", "gpt2", "llama3", "qwen2", "o200k"]):
        write("tokn", f"byte-level-{name}", tokn_input(300, byte_level(pretok, flags=4 if pretok == 2 else 0)))
    write("tokn", "byte-level-smollm2-digits", tokn_input(300, byte_level(1, flags=8)))
    write("tokn", "byte-level-qwen2-nfc", tokn_input(270, byte_level(3, nfc=True)))
    write("tokn", "sp-json-gemma", tokn_input(300, sentencepiece_like(3, 2)))
    write("tokn", "sp-json-mistral", tokn_input(300, sentencepiece_like(3, 1 | 2 | 32)))
    write("tokn", "sentencepiece", tokn_input(320, sentencepiece_like(1, 1 | 2)))
    good = byte_level(2)
    write("tokn", "bad-truncated", tokn_input(300, good[:-5]))
    write("tokn", "bad-vocab-too-small", tokn_input(100, good))
    bad_merge = bytearray(byte_level(1))
    at = len(bad_merge) - 12 * len(CLASSES) - 8  # the last merge's left id
    bad_merge[at:at + 4] = struct.pack("<i", ord("z"))
    write("tokn", "bad-merge-result", tokn_input(300, bytes(bad_merge)))
    # a ROPE v2 checkpoint with its tokenizer inside, for the header harness
    dim, hidden, layers, heads, kv_heads, vocab, seq = 8, 16, 1, 2, 1, 270, 4
    head = bytearray(rope_header(dim, hidden, layers, heads, kv_heads, vocab, seq))
    head[4:8] = struct.pack("<i", 2)
    hd = dim // heads
    sizes = [vocab * dim, layers * dim, layers * dim * dim, layers * kv_heads * hd * dim, layers * kv_heads * hd * dim,
             layers * dim * dim, layers * dim, layers * hidden * dim, layers * dim * hidden, layers * hidden * dim, dim]
    body, offset = bytearray(), 256
    for i, n in enumerate(sizes):
        pad = -offset % 64
        body += b"\0" * pad + floats(n, i)
        offset += pad + 4 * n
    section = byte_level(3, nfc=True)
    pad = -offset % 64
    head[96:112] = struct.pack("<QQ", offset + pad, len(section))
    write("header", "tiny-rope-v2-with-tokenizer", bytes(head) + body + b"\0" * pad + section)


def texts():
    samples = {
        "empty": b"",
        "once": b"Once upon a time",
        "story": b"Once upon a time, there was a little girl named Lily. She loved to play outside.\n",
        "spaces": b"  leading and   inner spaces  ",
        "unicode": "caf\u00e9 \u65e5\u672c\u8a9e \U0001F600 \u00fc\u00df".encode(),
        "malformed": b"a\x80b\xe6\x97 \xff\xfe \xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf",
        "controls": b"\x01\x02\x1b[31mred\x1b[0m\t\r\n\x7f",
        "special": b"<s> </s> <unk> <0x0A> [INST] <<SYS>>",
        "digits": b"3.14159 2718 0x1F 1e-5",
    }
    for name, data in samples.items():
        write("encode", name, data)


if __name__ == "__main__":
    headers()
    tokenizers()
    tokn()
    texts()
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"corpus: {sum(1 for p in OUT.rglob('*') if p.is_file())} files, {total} bytes in {OUT}")
