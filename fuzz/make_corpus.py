#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora into fuzz/corpus/{header,tokenizer,encode}/.

Headers: the first 256 bytes of the shared models (headers only, not the models),
tiny complete models in all three formats (a few hundred bytes, so the header
fuzzer reaches map_weights and the forward pass), and crafted bad headers.
Tokenizers: small tokenizer.bin files built here (two bytes of vocab size first,
as fuzz_tokenizer.c reads them). Texts: short strings. Run from the repo:
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


def rope_v2_model(dim, hidden, layers, heads, kv_heads, vocab, seq, shared=1, weight_type=1, seed=4, aligned=True):
    """ROPE version 2: weight_type at byte 88 (1 bf16, 2 f16) for the embedding and the matrices,
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
        out += halves(n, seed + i, weight_type) if matrix else floats(n, seed + i)
    return out


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
    write("header", "tiny-rope-v2-variant", rope_v2_variant())
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
    struct.pack_into("<i", unknown_type, 88, 3)
    write("header", "bad-rope-v2-weight-type-3", unknown_type)
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
    texts()
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"corpus: {sum(1 for p in OUT.rglob('*') if p.is_file())} files, {total} bytes in {OUT}")
