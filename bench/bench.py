#!/usr/bin/env python3
"""Speed figures for ./run: prefill and decode tokens/s, decode's weight traffic
against this machine's read bandwidth, and prefill's arithmetic against its peak.

    make bench                     (builds ./run, bench/stream, bench/peak and bench/in_cache, then runs this)
    python3 bench/bench.py [--quick] [--models 15M,110M] [--threads 1,2] [--runs N]
                           [--dtypes bf16,f16,q8_0,q4_0,q4_k_m|none]

Models are random-weight checkpoints in the ROPE format, written into bench/ on
first use (bench/*.bin is gitignored): the shapes of llama2.c's stories15M and
stories110M, with a shared classifier as those have. The tokenizer is the 32000-
token llama2.c tokenizer, read from $MODELS/tokenizer.bin (default models/).

For each model and thread count (OMP_NUM_THREADS and run's -T):
  prefill  a prompt of 256 tokens (250 for 15M, whose context is 256), -n equal to
           the prompt length, so that nothing is decoded;
  decode   a short prompt, then 256 new tokens (as many as fit in 15M's context);
run -t 0 (greedy, deterministic) prints "timing: prefill N tokens X tok/s, decode
M tokens Y tok/s" on stderr; we take the median of several rounds.

Decode streams every weight once per token: all float32 matrices and norms and
the classifier, but not the token embedding (one row per token is read) unless the
classifier shares it, in which case it is streamed once, as the classifier. Its
attention also reads the KV cache, keys and values of positions 0..pos in every
layer (on average over the decode run's positions). Those bytes times decode tok/s
are the achieved traffic, printed next to the read bandwidth that bench/stream
measures with the same number of threads.

Prefill is bound by arithmetic instead: its floating-point operations (counted
by prefill_flops from the model's shape) times prefill tok/s over the prompt's
tokens is its GFLOP/s, printed next to the peak that bench/peak measures with the
same number of threads (independent fused multiply-add chains in registers).
llama.cpp's pp tok/s, with LLAMA_BENCH, gets the same fraction of the same reading.

This machine's figures drift by 10-30% within minutes, so each model and thread
count runs in rounds: a bandwidth reading, a decode run, another bandwidth
reading, a peak GFLOP/s reading, a prefill run. A round's bandwidth is the mean of
its two readings. The fractions of the bandwidth and of the peak and the prefill
speed-up are the medians of each round's own ratios. A one-thread round runs
every program in it, and all of its readings, on one CPU, the CPUs taking turns
from round to round: one vCPU of these shared machines is at times 20-30% slower
than the other for minutes, and programs left to the scheduler need not land on
the same one.

Side by side with the programs users would otherwise run, on the same weights:
  PEER=/path/to/run          a llama2.c-compatible CLI (karpathy/llama2.c's run,
                             built as its Makefile's `runomp` builds it). Each
                             round also runs it on the same checkpoint written in
                             llama2.c's format, same prompt, -n and threads: our
                             decode and the peer's twice each, in a balanced order
                             (run, peer, peer, run, or the reverse, alternating by
                             round), so that a drift within the round weighs on both
                             alike; the ratio is of whole-process wall times, each
                             program's two runs together (the decode rate and its
                             share of the bandwidth too).
  LLAMA_BENCH=/path/to/llama-bench   llama.cpp's benchmark on the same weights as
                             F32 GGUF (bench/model*.gguf; when missing, made with
                             llama-convert-llama2c-to-ggml found beside llama-bench
                             or at $LLAMA_CONVERT). Each round runs its pp test
                             (the prefill prompt's length) and tg test (decode
                             tokens) next to ours; the ratios are of tok/s.
Each ratio printed is the median over rounds of that round's own ratio.

16-bit weights (--dtypes, default bf16,q8_0,q4_0,q4_k_m; "none" leaves them out): the same random
weights rounded to bf16 (export.py --dtype bf16, round to nearest even) in a ROPE
version 2 file, against the float32 file of the same widened weights (export.py
--dtype f32 of that file: the outputs are the same, bit for bit, which each model's
first use checks). Each round: a bandwidth reading, four decodes in a balanced order
(16-bit, float32, float32, 16-bit, or the reverse, alternating by round, so that a
drift of the machine's speed within the round weighs on both alike; each file's rate
is that of its two runs together), a bandwidth reading, the two prefills, and with
LLAMA_BENCH llama-bench on a BF16 GGUF made from the F32 one by llama.cpp's
llama-quantize (beside llama-bench, or $LLAMA_QUANTIZE), which rounds to nearest even
too: the same weights again. Decode's traffic is counted in the bytes actually read
per token: 2 a weight for the streamed matrices and the classifier, 4 for the norms
and the KV cache.

Q8_0 weights (--dtypes q8_0, in the default): the same random weights
quantized by export.py --dtype q8_0 (llama.cpp's quantize_row_q8_0_ref), against the
float32 file of its dequantized weights and against the bf16 file of the same source
weights: each round decodes the three in a balanced order (q8_0, float32, bf16, bf16,
float32, q8_0, or the reverse). Decode's bytes: 34 a block of 32 weights. llama-bench
runs on the F32 GGUF quantized by llama-quantize ... Q8_0 (the same blocks, byte for
byte: llama.cpp's quantizer is the one export.py transcribes).

Q4_0 and Q4_K_M weights (--dtypes q4_0,q4_k_m, in the default; they need llama.cpp's
converter and llama-quantize: LLAMA_BENCH, beside which they are found, or LLAMA_CONVERT
and LLAMA_QUANTIZE; without them the rows are left out with a log line): llama.cpp's own
4-bit files of the same random weights. The F32 GGUF above (llama.context_length set to
the checkpoint's seq_len: the converter writes 128 whatever the file says, and export.py
would carry 128 into the ROPE file, where decode stops at the context's end) quantized by
llama-quantize ... Q4_0 (or Q4_K_M), converted by export.py (bench/model*_gguf_q4_0.bin:
the blocks copied as they are, and a type per matrix piece, weight_type 4, since
llama-quantize mixes types: the classifier in q6_k, or q8_0 where a row is not whole
256-weight blocks; Q4_K_M's wv and w2 in q6_k in some layers, and q5_0 where a row is not
whole 256-weight blocks), against the float32 file of its dequantized weights (export.py
--dtype f32 of that file; the same output, checked) and against the Q8_0 and bf16 files
of the same GGUF route: the F32 GGUF quantized by llama-quantize ... Q8_0 and ... BF16,
each converted by export.py. Why that route rather than the q8_0 and bf16 rows' files
(export.py's, of bench/model*.bin): the converter writes the classifier apart from the
embedding (output.weight, a copy of it), so a GGUF-derived file holds a separate
classifier where bench/model*.bin shares the embedding. Decode streams the same weights a
token either way (a shared classifier is streamed once, as the classifier), but the
files differ in size (24.6M weights more for the 110M shape, not read a token), in the
tensors they hold and in the program that made their blocks; through one route, every
file in a Q4 row has the same tensors, made by llama.cpp's tools. Each round
decodes the four in a balanced order (q4, float32, q8_0, bf16, bf16, q8_0, float32, q4,
or the reverse), and llama-bench runs on the Q4_0 or Q4_K_M GGUF itself. Decode's bytes
are those the file holds: each streamed matrix piece (every layer's wq..w3 and the
classifier) at its own type's block size, read from the header and the type table
(streamed_by_type; the layout so computed must end where the file's next section
starts), the norms and KV cache float32.

Each 16-bit, Q8_0 and Q4 round also reads bench/in_cache for its weight type and thread
count: run.c's decode kernel on matrices small enough to stay in cache, the rate at
which the arithmetic alone can use weights. Decode's weights a second over that rate
says which bound a decode runs into: near 100%, the widening of the weights (a Q8_0
weight costs three vector operations before its multiply-add), not memory. A file whose
matrices mix types (every Q4 file here) has each type's rate read, and its rate is the
weights read per token over the time each type's weights would take at its own rate,
sum(w) / sum(w_t / rate_t): the harmonic mean of the types' rates weighted by their
shares of the weights read per token (in_cache_mix).

Only numpy and the standard library.
"""
import argparse
import csv
import datetime
import io
import json
import os
import platform
import re
import resource
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import ropefile  # noqa: E402  (tests/ropefile.py: the ROPE checkpoint writer)

# name: (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len)
SHAPES = {
    "15M": (288, 768, 6, 6, 6, 32000, 256),
    "110M": (768, 2048, 12, 12, 12, 32000, 1024),
}
PROMPT_TOKENS = {"15M": 250, "110M": 256}  # counting BOS, as run's timing line does
DECODE_TOKENS = 256
RUNS = {"15M": 5, "110M": 5}
STREAM_REPS = 20    # passes over 1 GiB per bandwidth reading: about a second
PEAK_REPS = 10      # passes of about 50 ms per peak GFLOP/s reading
SENTENCE = ("Once upon a time, there was a little girl named Lily who loved to play in the park "
            "with her friends. ")
SHORT_PROMPT = "Once upon a time"
TIMING = re.compile(r"timing: prefill (\d+) tokens ([\d.]+) tok/s, decode (\d+) tokens ([\d.]+) tok/s")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# Checkpoints

def read_header(path):
    """(dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared) of a ROPE checkpoint."""
    with open(path, "rb") as f:
        head = f.read(40)
    magic, version, *sizes, shared = struct.unpack("<Ii7ii", head)
    if magic != ropefile.MAGIC or version not in (1, 2):
        raise SystemExit(f"bench: {path} is not a ROPE checkpoint of version 1 or 2")
    return (*sizes, shared)


def file_floats(dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared):
    """Floats in a float32 file of this shape: the embedding, the layers, rms_final and, when not
    shared, the classifier."""
    head_size = dim // heads
    q_dim, kv_dim = heads * head_size, kv_heads * head_size
    per_layer = 2 * dim + q_dim * dim + 2 * kv_dim * dim + dim * q_dim + 3 * hidden * dim
    body = layers * per_layer + dim  # the layers and rms_final
    return vocab * dim + body + (0 if shared else vocab * dim)


def streamed_bytes(dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared, weight_type="f32"):
    """Bytes decode reads per token: the layers' matrices and the classifier (the embedding,
    streamed once as the classifier when shared) at weight_type's size, the norms float32."""
    head_size = dim // heads
    q_dim, kv_dim = heads * head_size, kv_heads * head_size
    matrices = layers * (q_dim * dim + 2 * kv_dim * dim + dim * q_dim + 3 * hidden * dim) + vocab * dim
    norms = 2 * layers * dim + dim
    per_weight = {"f32": 4, "bf16": 2, "f16": 2, "q8_0": 34 / 32}[weight_type]  # q8_0: 34 bytes a block of 32
    return matrices * per_weight + 4 * norms


def matrix_weights(dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared):
    """Weights of the matrices decode multiplies per token: the layers' and the classifier."""
    head_size = dim // heads
    q_dim, kv_dim = heads * head_size, kv_heads * head_size
    return layers * (q_dim * dim + 2 * kv_dim * dim + dim * q_dim + 3 * hidden * dim) + vocab * dim


def kv_cache_bytes(dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared, positions):
    """Bytes of the KV cache that decode reads per token, on average over the decode run's positions:
    attention at position p reads the keys and values of positions 0..p in every layer, float32
    whatever the weights' type. The weights streamed since the last token have pushed them out of
    the caches, so they come from memory as the weights do."""
    kv_dim = kv_heads * (dim // heads)
    return statistics.mean(2 * layers * (p + 1) * kv_dim * 4 for p in positions) if positions else 0


def prefill_flops(dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared, n):
    """Floating-point operations of a prefill of n tokens at positions 0..n-1, as run.c
    computes it. Counted, as 2 flops per multiply-add: the matrix products, 2 x (the
    layers' matrix weights: wq, wk, wv, wo, w1, w2, w3) per token, and the classifier
    once (a prefill computes the logits of its last token only); attention, where the
    token at position p takes, in each layer and each query head, p + 1 scores q . k and
    a weighted sum of p + 1 values, 2 x head_size flops each. Not counted: norms, RoPE,
    softmax, SwiGLU's activation and the residual adds (a few flops per activation, under
    1% of the total for the 15M and 110M shapes), nor the products past a token's own
    position that a block's attention tile computes and drops."""
    head_size = dim // heads
    q_dim, kv_dim = heads * head_size, kv_heads * head_size
    matmul_weights = layers * (q_dim * dim + 2 * kv_dim * dim + dim * q_dim + 3 * hidden * dim)
    attention = layers * heads * 4 * head_size * (n * (n + 1) // 2)
    return 2 * matmul_weights * n + 2 * vocab * dim + attention


def drop_from_page_cache(path):
    """Has the kernel forget its cached pages of path (a file of ours), so that the warm-up
    runs read it back from disk as any model file on disk is read. How a file got into the
    page cache matters on the machines this was measured on (Linux 6.18, ext4, KVM-hosted
    AMD Zen 5): read from disk, it is cached in 2 MB pages that map whole; just written,
    as bench/ writes its checkpoints, in small pages, mapped 4 KB at a time, and decoding
    the 110M shape from such a file ran 20-25% slower (59 against 74 tok/s, one thread,
    the same bytes), for any program that maps it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # written pages must reach the disk before they can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def ensure_checkpoint(name):
    shape = SHAPES[name]
    path = os.path.join(BENCH, f"model{name}.bin")
    expected = ropefile.HEADER_BYTES + 4 * file_floats(*shape, True)
    if os.path.exists(path) and os.path.getsize(path) == expected:
        return path
    log(f"bench: writing the random {name} checkpoint {os.path.relpath(path, ROOT)} "
        f"({expected / 1e6:.0f} MB) ...")
    t0 = time.time()
    tmp = path[:-len(".bin")] + ".tmp.bin"  # gitignored too, should a write be interrupted
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = shape
    ropefile.write_random_checkpoint(tmp, dim=dim, hidden_dim=hidden, n_layers=layers, n_heads=heads,
                                     n_kv_heads=kv_heads, vocab_size=vocab, seq_len=seq_len,
                                     shared_classifier=True, seed=1)
    if os.path.getsize(tmp) != expected:
        raise SystemExit(f"bench: {tmp} has {os.path.getsize(tmp)} bytes, expected {expected}")
    os.replace(tmp, path)
    log(f"bench: ... written in {time.time() - t0:.1f} s")
    return path


def ensure_llama2c_checkpoint(path):
    """The same weights in llama2.c's legacy format (export.py --legacy), for PEER."""
    out = path[:-len(".bin")] + "_llama2c.bin"
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(path):
        log(f"bench: writing {os.path.relpath(out, ROOT)} for the peer (export.py --legacy) ...")
        subprocess.run([sys.executable, os.path.join(ROOT, "export.py"), path, out, "--legacy"], check=True,
                       stdout=subprocess.DEVNULL)
    return out


def ensure_16bit_checkpoints(path, weight_type):
    """(the weights of path rounded to weight_type, ROPE version 2; the float32 file of the
    same widened weights), written with export.py on first use."""
    narrow = path[:-len(".bin")] + f"_{weight_type}.bin"
    wide = path[:-len(".bin")] + f"_{weight_type}_f32.bin"
    for src, out, dtype in ((path, narrow, weight_type), (narrow, wide, "f32")):
        if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(src):
            log(f"bench: writing {os.path.relpath(out, ROOT)} (export.py --dtype {dtype}) ...")
            subprocess.run([sys.executable, os.path.join(ROOT, "export.py"), src, out, "--dtype", dtype],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return narrow, wide


def llama_tool(name, env_var, llama_bench):
    """The path of one of llama.cpp's programs: $env_var, else beside llama-bench; None when neither."""
    if os.environ.get(env_var):
        return os.environ[env_var]
    return os.path.join(os.path.dirname(llama_bench), name) if llama_bench else None


# GGUF's metadata value types (gguf.md): the sizes of the scalar ones; 8 a string, 9 an array
GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_uint32_field(path, key):
    """(offset, value) of the uint32 metadata value `key` in a GGUF file, or (None, None)."""
    with open(path, "rb") as f:
        magic, _, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF":
            raise SystemExit(f"bench: {path} is not a GGUF file")

        def skip(value_type):
            if value_type in GGUF_SCALAR_BYTES:
                f.seek(GGUF_SCALAR_BYTES[value_type], 1)
            elif value_type == 8:
                f.seek(struct.unpack("<Q", f.read(8))[0], 1)
            elif value_type == 9:
                item_type, n = struct.unpack("<IQ", f.read(12))
                if item_type in GGUF_SCALAR_BYTES:
                    f.seek(GGUF_SCALAR_BYTES[item_type] * n, 1)
                else:
                    for _ in range(n):
                        skip(item_type)
            else:
                raise SystemExit(f"bench: {path}: unknown GGUF value type {value_type}")

        for _ in range(n_kv):
            name = f.read(struct.unpack("<Q", f.read(8))[0]).decode("utf-8", "replace")
            value_type = struct.unpack("<I", f.read(4))[0]
            if name == key:
                return (f.tell(), struct.unpack("<I", f.read(4))[0]) if value_type == 4 else (None, None)
            skip(value_type)
    return None, None


def ensure_gguf(llama2c_path, tokenizer, llama_bench):
    """The same weights as an F32 GGUF for llama.cpp, converted from the llama2.c file by
    llama-convert-llama2c-to-ggml (beside llama-bench, or $LLAMA_CONVERT). The converter
    writes llama.context_length 128 whatever the llama2.c file's seq_len (its n_ctx is fixed
    in its source); this puts the file's seq_len there, so that a ROPE file export.py makes
    from the GGUF (or from one quantized from it) has the context of the bench's own file and
    decodes as many tokens. llama-bench sets its own context and does not read it."""
    out = llama2c_path[:-len("_llama2c.bin")] + ".gguf"
    with open(llama2c_path, "rb") as f:
        seq_len = struct.unpack("<7i", f.read(28))[6]
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(llama2c_path):
        convert = llama_tool("llama-convert-llama2c-to-ggml", "LLAMA_CONVERT", llama_bench)
        if not convert or not os.path.exists(convert):
            raise SystemExit(f"bench: no {os.path.relpath(out, ROOT)} and no converter at {convert} "
                             "(set LLAMA_CONVERT to llama.cpp's llama-convert-llama2c-to-ggml)")
        log(f"bench: writing {os.path.relpath(out, ROOT)} for llama.cpp ({os.path.basename(convert)}) ...")
        subprocess.run([convert, "--copy-vocab-from-model", tokenizer, "--llama2c-model", llama2c_path,
                        "--llama2c-output-model", out], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    offset, context = gguf_uint32_field(out, "llama.context_length")
    if offset is None:
        raise SystemExit(f"bench: {out} has no uint32 llama.context_length")
    if context != seq_len:
        log(f"bench: {os.path.relpath(out, ROOT)}: llama.context_length {context} -> {seq_len} (the llama2.c "
            "file's seq_len; the converter writes 128)")
        with open(out, "r+b") as f:
            f.seek(offset)
            f.write(struct.pack("<I", seq_len))
    return out


def ensure_gguf_quantized(gguf, weight_type, llama_bench):
    """The F32 GGUF converted by llama.cpp's llama-quantize (beside llama-bench, or $LLAMA_QUANTIZE)
    to weight_type: bf16, f16, q8_0, q4_0 or q4_k_m (its BF16, F16, Q8_0, Q4_0, Q4_K_M)."""
    out = gguf[:-len(".gguf")] + f"-{weight_type}.gguf"
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(gguf):
        return out
    quantize = llama_tool("llama-quantize", "LLAMA_QUANTIZE", llama_bench)
    if not quantize or not os.path.exists(quantize):
        raise SystemExit(f"bench: no {os.path.relpath(out, ROOT)} and no llama-quantize at {quantize} "
                         "(set LLAMA_QUANTIZE)")
    log(f"bench: writing {os.path.relpath(out, ROOT)} (llama-quantize ... {weight_type.upper()}) ...")
    tmp = out[:-len(".gguf")] + ".tmp.gguf"  # an interrupted write must not look finished
    subprocess.run([quantize, gguf, tmp, weight_type.upper()], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    os.replace(tmp, out)
    return out


def ensure_gguf_checkpoints(gguf, weight_type, llama_bench, wide=True):
    """(the ROPE file export.py makes of the F32 GGUF quantized by llama-quantize to weight_type,
    its blocks copied as they are; with wide, the float32 file of its dequantized weights
    (export.py --dtype f32 of it), else None; the quantized GGUF), written on first use."""
    quantized = ensure_gguf_quantized(gguf, weight_type, llama_bench)
    narrow = gguf[:-len(".gguf")] + f"_gguf_{weight_type}.bin"
    wide_path = narrow[:-len(".bin")] + "_f32.bin" if wide else None
    for src, out, args in ((quantized, narrow, []), (narrow, wide_path, ["--dtype", "f32"])):
        if out is None:
            continue
        if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(src):
            log(f"bench: writing {os.path.relpath(out, ROOT)} (export.py {os.path.basename(src)}"
                f"{' ' + ' '.join(args) if args else ''}) ...")
            subprocess.run([sys.executable, os.path.join(ROOT, "export.py"), src, out, *args],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return narrow, wide_path, quantized


# ROPE weight_type codes (docs/format.md; 4 is a type per piece) and each type's block:
# (weights, bytes)
TYPE_NAMES = {0: "f32", 1: "bf16", 2: "f16", 3: "q8_0", 5: "q4_0", 6: "q4_1", 7: "q5_0", 8: "q5_1", 9: "q4_k",
              10: "q5_k", 11: "q6_k"}
BLOCKS = {"f32": (1, 4), "bf16": (1, 2), "f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20),
          "q5_0": (32, 22), "q5_1": (32, 24), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}


def streamed_by_type(path):
    """({type: [weights, bytes]} of the matrix pieces decode streams per token, the norms' bytes):
    a Llama-block ROPE file of any weight type, a type per piece (weight_type 4) included, read
    from its header and its type table. Streamed: every layer's wq, wk, wv, wo, w1, w2, w3 and the
    classifier (the embedding when shared); not the embedding otherwise (one row a token). The
    layout walked through (docs/format.md: each tensor, and under a type table each matrix piece,
    at the next multiple of 64 bytes) must end where the file's next section or the file does."""
    with open(path, "rb") as f:
        head = f.read(256)
        magic, version, dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared = struct.unpack_from("<Ii7ii", head)
        code, head_size, flags, layer_table = 0, 0, 0, 0
        tok_offset = table_offset = table_bytes = 0
        if version == 2:
            head_size, code = struct.unpack_from("<ii", head, 84)
            tok_offset, = struct.unpack_from("<Q", head, 96)
            flags, = struct.unpack_from("<I", head, 112)
            layer_table, = struct.unpack_from("<Q", head, 144)
            table_offset, table_bytes = struct.unpack_from("<QQ", head, 216)
        if magic != ropefile.MAGIC or version not in (1, 2) or flags or layer_table:
            raise SystemExit(f"bench: {path}: not a plain Llama-block ROPE file (version 1 or 2, no block flags, "
                             "no per-layer table)")
        head_size = head_size or dim // heads
        q_dim, kv_dim = heads * head_size, kv_heads * head_size
        # the matrix pieces in file order (docs/format.md's type table)
        sizes = ([vocab * dim] + [q_dim * dim] * layers + [kv_dim * dim] * (2 * layers) + [dim * q_dim] * layers
                 + [hidden * dim] * (3 * layers) + ([] if shared else [vocab * dim]))
        if code == 4:
            f.seek(table_offset)
            types = [TYPE_NAMES.get(c) for c in f.read(table_bytes)]
            if len(types) != len(sizes) or None in types:
                raise SystemExit(f"bench: {path}: a type table of {table_bytes} entries, expected {len(sizes)} types")
        else:
            types = [TYPE_NAMES[code]] * len(sizes)
    piece_bytes = [w // BLOCKS[t][0] * BLOCKS[t][1] for w, t in zip(sizes, types)]
    # walk the layout: embedding, rms_att, wq..wo, rms_ffn, w1..w3, rms_final, wcls
    pos, k = ropefile.HEADER_BYTES, 0

    def place(n):
        nonlocal pos
        pos = -(-pos // 64) * 64 + n

    place(piece_bytes[0])
    place(4 * layers * dim)
    for k in range(1, 1 + 4 * layers):
        place(piece_bytes[k])
    place(4 * layers * dim)
    for k in range(1 + 4 * layers, 1 + 7 * layers):
        place(piece_bytes[k])
    place(4 * dim)
    if not shared:
        place(piece_bytes[-1])
    end = table_offset or tok_offset or os.path.getsize(path)
    if -(-pos // 64) * 64 != end and pos != end:
        raise SystemExit(f"bench: {path}: its tensors end at byte {pos} by its header, but the next section "
                         f"(or the file) is at {end}")
    streamed = list(range(1, 1 + 7 * layers)) + [len(sizes) - 1 if not shared else 0]
    by_type = {}
    for k in streamed:
        entry = by_type.setdefault(types[k], [0, 0])
        entry[0] += sizes[k]
        entry[1] += piece_bytes[k]
    return by_type, 4 * (2 * layers * dim + dim)


# ----------------------------------------------------------------------------
# Other work on the machine
#
# Other processes (tests, fuzzers, builds) may share these cores. With OpenMP's
# barriers a thread that loses its core holds up the others, so a 2-thread run on
# a machine where one core is taken runs many times slower. Before each timed run
# we wait (within a budget) until the cores it needs are free; during it we watch
# the CPU time others take, stop it if they take its cores, and run it again.

NCPU = os.cpu_count() or 1
SPARE = 0.2          # cores that others may use beyond those our run leaves free
WAIT_PER_RUN = 30.0  # seconds to wait for free cores before one run
WAIT_BUDGET = 150.0  # seconds of such waiting in all; then runs go ahead regardless
STOP_AFTER = 1.0     # seconds of others on our cores before a run is stopped


def cpu_busy_seconds():
    """CPU seconds that all CPUs spent busy (not idle or iowait; steal counts) since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid):
    """CPU seconds (user + system, all threads) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def others_cores(seconds=0.3):
    """Cores' worth of CPU that other processes use, over a short sample (nothing of ours runs)."""
    b0, t0 = cpu_busy_seconds(), time.time()
    time.sleep(seconds)
    return (cpu_busy_seconds() - b0) / (time.time() - t0)


def pin_to(cpu):
    """preexec_fn for a child that must run on that CPU only (None, as Popen takes it, for no CPU)."""
    return (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None


class Contention:
    def __init__(self, budget=WAIT_BUDGET):
        self.waited = 0.0
        self.budget = budget

    def patient(self):
        """Whether runs wait for free cores and are redone when disturbed: not with no budget
        (--quick, a smoke test that keeps no figure)."""
        return self.budget > 0

    def allowed(self, threads):
        """Cores others may use while a run with this many threads goes on undisturbed."""
        return max(0, NCPU - threads) + SPARE

    def wait_for_cores(self, threads):
        """Waits until others leave our run its cores, within WAIT_PER_RUN and WAIT_BUDGET."""
        if not self.patient():  # (no sampling either)
            return
        t0, said = time.time(), False
        while True:
            busy = others_cores()
            waited = time.time() - t0
            if busy <= self.allowed(threads):
                break
            if waited > WAIT_PER_RUN or self.waited + waited > self.budget:
                log(f"bench: other processes keep {busy:.1f} core(s) busy; going ahead anyway")
                break
            if not said:
                log(f"bench: other processes use {busy:.1f} core(s); waiting for {threads} free ...")
                said = True
            time.sleep(1.0)
        self.waited += time.time() - t0


# ----------------------------------------------------------------------------
# Running ./run

class Runner:
    def __init__(self, run_bin, tokenizer, wait_budget):
        self.run_bin = run_bin
        self.tokenizer = tokenizer
        self.contention = Contention(wait_budget)
        self.cpu = None  # the one CPU every program runs on, or None: wherever the scheduler puts it

    def cmd(self, model, *args):
        return [self.run_bin, model, "-z", self.tokenizer, *args]

    def count_tokens(self, model, text):
        out = subprocess.run(self.cmd(model, "-m", "tokenize", "-p", text), capture_output=True, text=True,
                             check=True).stdout
        return len(out.splitlines())

    def timed(self, model, threads, prompt, steps, stoppable=True):
        """One run: (prompt tokens, prefill tok/s, decoded tokens, decode tok/s, others' cores, wall
        seconds), or None when it was stopped because other processes took its cores."""
        cmd = self.cmd(model, "-t", "0", "-s", "1", "-T", str(threads), "-n", str(steps), "-p", prompt)
        r = self.timed_command(cmd, threads, stoppable)
        if r is None:
            return None
        stderr, others, wall = r
        m = TIMING.search(stderr)
        if not m:
            raise SystemExit(f"bench: no timing line from {' '.join(cmd[:8])} ...\n{stderr}")
        return int(m[1]), float(m[2]), int(m[3]), float(m[4]), others, wall

    def timed_command(self, cmd, threads, stoppable=True, capture_stdout=False):
        """Runs cmd with OMP_NUM_THREADS=threads, watching the cores: (stderr, or stdout with
        capture_stdout, others' cores, wall seconds), or None when it was stopped because other
        processes took its cores."""
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        allowed = self.contention.allowed(threads)
        with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
            busy0, ours0, t0 = cpu_busy_seconds(), children_cpu_seconds(), time.time()
            p = subprocess.Popen(cmd, stdout=out if capture_stdout else subprocess.DEVNULL, stderr=err, env=env,
                                 preexec_fn=pin_to(self.cpu))
            last = (busy0, 0.0, t0)
            disturbed = 0.0
            exited = exit_watch(p)
            while True:
                if exited(0.25):
                    break
                now = (cpu_busy_seconds(), process_cpu_seconds(p.pid), time.time())
                if now[1] is None:
                    continue
                others = max(0.0, (now[0] - last[0]) - (now[1] - last[1])) / max(1e-9, now[2] - last[2])
                disturbed = disturbed + (now[2] - last[2]) if others > allowed else 0.0
                last = now
                if stoppable and disturbed >= STOP_AFTER:
                    p.kill()  # our own child, by its handle
                    p.wait()
                    exited(None)
                    return None
                if now[2] - t0 > 900:
                    p.kill()
                    p.wait()
                    exited(None)
                    raise SystemExit("bench: a run took more than 15 minutes; stopped it")
            t1 = time.time()  # the moment it exited, give or take a millisecond (exit_watch)
            busy1, ours1 = cpu_busy_seconds(), children_cpu_seconds()
            err.seek(0)
            stderr = err.read().decode("utf-8", "replace")
            out.seek(0)
            stdout = out.read().decode("utf-8", "replace")
        if p.returncode != 0:
            raise SystemExit(f"bench: run failed (exit {p.returncode}): {' '.join(cmd[:8])} ...\n{stderr}")
        others = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / max(1e-9, t1 - t0)
        return stdout if capture_stdout else stderr, others, t1 - t0

    def timed_quiet(self, model, threads, prompt, steps, retries, run=None):
        """timed() (or run(stoppable), of the same shape) on free cores: waits for them, and runs
        again (up to retries[0] times in all, per figure) a run that others disturbed. Returns the
        result and whether it was disturbed."""
        if run is None:
            def run(stoppable):
                return self.timed(model, threads, prompt, steps, stoppable)
        while True:
            self.contention.wait_for_cores(threads)
            last_try = retries[0] <= 0 or not self.contention.patient()
            r = run(not last_try)
            if r is None:
                log(f"bench: other processes took the cores of a {threads}-thread run; stopped it, will run it again")
                retries[0] -= 1
                continue
            disturbed = r[-2] > self.contention.allowed(threads)
            if not disturbed or last_try:
                return r, disturbed
            retries[0] -= 1
            log(f"bench: other processes used {r[-2]:.1f} core(s) during a {threads}-thread run; running it again")


def exit_watch(p):
    """A function exited(timeout) that waits up to timeout seconds for the child p to exit and
    says whether it has (reaped); exited(None) releases what it holds. Whole-process wall times
    end where it returns, so it must return when the child exits: Popen.wait(timeout) polls at
    intervals growing to 50 ms, which added 15-32 ms to runs of 0.5-4 s (30 ms, 6%, to a
    0.47 s run). A pidfd (Linux 5.3) becomes readable the moment the process exits."""
    try:
        fd = os.pidfd_open(p.pid)
    except (AttributeError, OSError):  # no pidfd: polling, as coarse as above
        def polled(timeout):
            if timeout is None:
                return True
            try:
                p.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        return polled

    def exited(timeout):
        if timeout is None:
            os.close(fd)
            return True
        if not select.select([fd], [], [], timeout)[0]:
            return False
        p.wait()
        os.close(fd)
        return True
    return exited


def peer_decode(runner, peer, model, threads, prompt, steps, stoppable):
    """llama2.c's run (or a CLI like it) on the same checkpoint: (others' cores, wall seconds)."""
    cmd = [peer, model, "-z", runner.tokenizer, "-t", "0", "-n", str(steps), "-i", prompt]
    r = runner.timed_command(cmd, threads, stoppable)
    return None if r is None else (r[1], r[2])


def llama_bench(runner, exe, gguf, threads, n_prompt, n_gen, stoppable):
    """llama.cpp's llama-bench, one repetition of pp n_prompt and tg n_gen: (pp tok/s, tg tok/s,
    others' cores, wall seconds)."""
    cmd = [exe, "-m", gguf, "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads), "-r", "1", "-o", "csv"]
    r = runner.timed_command(cmd, threads, stoppable, capture_stdout=True)
    if r is None:
        return None
    stdout, others, wall = r
    rows = list(csv.DictReader(io.StringIO(stdout)))
    pp = [float(x["avg_ts"]) for x in rows if int(x["n_prompt"]) > 0 and int(x["n_gen"]) == 0]
    tg = [float(x["avg_ts"]) for x in rows if int(x["n_gen"]) > 0 and int(x["n_prompt"]) == 0]
    if not pp or not tg:
        raise SystemExit(f"bench: cannot read llama-bench's CSV:\n{stdout}")
    return pp[0], tg[0], others, wall


def make_prompt(runner, model, target):
    """The longest run of words of SENTENCE repeated that tokenizes to <= target tokens (with BOS)."""
    words = (SENTENCE * (target // 10 + 2)).split()
    lo, hi = 1, len(words)  # invariant: count(lo words) <= target
    if runner.count_tokens(model, " ".join(words)) <= target:
        return " ".join(words), runner.count_tokens(model, " ".join(words))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if runner.count_tokens(model, " ".join(words[:mid])) <= target:
            lo = mid
        else:
            hi = mid
    text = " ".join(words[:lo])
    return text, runner.count_tokens(model, text)


# ----------------------------------------------------------------------------
# The machine

# The microarchitecture of a (vendor, family, model) from /proc/cpuinfo, for the CPU
# kinds this project runs on and their neighbours. Under KVM the model name can be
# just "AMD EPYC", which does not say which generation the figures come from.
def cpu_generation(vendor, family, model):
    if vendor == "AuthenticAMD":
        if family == 0x1A:
            return "Zen 5"
        if family == 0x19:
            zen4 = 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF
            return "Zen 4" if zen4 else "Zen 3"
        if family == 0x17:
            return "Zen 2" if model >= 0x30 else "Zen 1"
    if vendor == "GenuineIntel" and family == 6:
        return {0x8F: "Sapphire Rapids", 0xCF: "Emerald Rapids", 0xAD: "Granite Rapids", 0x6A: "Ice Lake",
                0x55: "Skylake or Cascade Lake"}.get(model, "")
    return ""


def machine_line():
    cpu, fields = "unknown CPU", {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if not line.strip():
                    break  # the first processor's block is enough
                fields.setdefault(key, value.strip())
        cpu = fields.get("model name", cpu)
        family, model = int(fields["cpu family"]), int(fields["model"])
        generation = cpu_generation(fields.get("vendor_id", ""), family, model)
        cpu += f" (family {family} model {model}" + (f": {generation})" if generation else ")")
    except (OSError, KeyError, ValueError):
        pass
    cores = os.cpu_count()
    l3 = ""
    try:
        for idx in sorted(os.listdir("/sys/devices/system/cpu/cpu0/cache")):
            d = f"/sys/devices/system/cpu/cpu0/cache/{idx}"
            if not idx.startswith("index"):
                continue
            with open(f"{d}/level") as f:
                level = f.read().strip()
            with open(f"{d}/size") as f:
                size = f.read().strip()
            if level == "3":
                l3 = f", L3 {size}"
    except OSError:
        pass
    cc = os.environ.get("CC", "gcc")
    try:
        gcc = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        gcc = f"{cc}: not found"
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {cores} cores{l3}{mem}; {gcc}; {platform.system()} {platform.release()}"


def source_line(run_bin):
    """Which run.c the figures are for: the commit, whether run.c differs from it, its hash."""
    import hashlib
    src = os.path.join(ROOT, "run.c")
    try:
        with open(src, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
    except OSError:
        return "run.c: not found"
    git = ["git", "-C", ROOT]
    try:
        commit = subprocess.run(git + ["log", "-1", "--format=%h %s"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(git + ["diff", "--quiet", "HEAD", "--", "run.c"]).returncode != 0
    except OSError:
        commit, dirty = "", False
    stale = os.path.getmtime(run_bin) < os.path.getmtime(src)
    return (f"run.c sha256 {digest}" + (f", commit {commit}" if commit else "")
            + (" + uncommitted changes to run.c" if dirty else "")
            + (" (./run is OLDER than run.c: rebuild with make)" if stale else ""))


# The probes beside this script, each a program that prints one line per thread count,
# "threads N <what> X mean Y ...": X the best pass, Y all passes' work over their time.
STREAM = os.path.join(BENCH, "stream")  # read GB/s, the way decode reads its weights
PEAK = os.path.join(BENCH, "peak")      # single-precision GFLOP/s, the ceiling of prefill
IN_CACHE = os.path.join(BENCH, "in_cache")  # run.c's decode kernel on matrices held in cache: weights/s


def run_probe(probe, args, what, cpu=None, check=True):
    """((best pass, mean over all passes), or None if they cannot be read; the output): one
    run of a probe (STREAM or PEAK) with args, whose line says `what` before its figures, on
    the given CPU only if one is given."""
    out = subprocess.run([probe, *args], capture_output=True, text=True, check=check,
                         preexec_fn=pin_to(cpu)).stdout
    m = re.search(r"threads \d+ " + re.escape(what) + r" ([\d.]+) mean ([\d.]+)", out)
    return ((float(m[1]), float(m[2])) if m else None), out


STREAM_MIB = 1024  # what bench/stream reads; --quick reads 256 MiB


def run_stream(threads, reps, cpu=None, check=True):
    """run_probe's answer for bench/stream over STREAM_MIB with this many threads: read GB/s."""
    return run_probe(STREAM, ["-m", str(STREAM_MIB), "-r", str(reps), str(threads)], "read GB/s", cpu, check)


def run_peak(threads, reps, cpu=None, check=True):
    """run_probe's answer for bench/peak with this many threads: GFLOP/s."""
    return run_probe(PEAK, ["-r", str(reps), str(threads)], "peak GFLOP/s", cpu, check)


def run_in_cache(threads, weight_type, cpu=None, check=True):
    """run_probe's answer for bench/in_cache with this many threads and weight type: decode's
    arithmetic ceiling in 1e9 weights a second (run.c's kernel on matrices held in cache)."""
    return run_probe(IN_CACHE, ["-r", "5", "-t", "20", "-w", weight_type, str(threads)],
                     f"{weight_type} Gweights/s", cpu, check)


def in_cache_rate(contention, threads, weight_type, cpu=None):
    """(best pass Gweights/s, mean, disturbed): one reading of bench/in_cache (probe_reading)."""
    return probe_reading(contention, threads, lambda c: run_in_cache(threads, weight_type, c), "bench/in_cache", cpu)


def probe_reading(contention, threads, run, name, cpu=None):
    """(best pass, mean over all passes, disturbed): one reading of a probe, run(cpu) (run_stream
    or run_peak with the other arguments bound), on free cores (tried again, up to three times,
    when others took them), on the given CPU only if one is given."""
    for attempt in range(3):
        contention.wait_for_cores(threads)
        busy0, ours0, t0 = cpu_busy_seconds(), children_cpu_seconds(), time.time()
        reading, out = run(cpu)
        others = max(0.0, (cpu_busy_seconds() - busy0) - (children_cpu_seconds() - ours0)) / (time.time() - t0)
        if not reading:
            raise SystemExit(f"bench: cannot read {name}'s output:\n{out}")
        disturbed = others > contention.allowed(threads)
        if not disturbed or not contention.patient():
            break
        log(f"bench: other processes used {others:.1f} core(s) while {name} ran; again")
    return reading[0], reading[1], disturbed


def stream_bandwidth(contention, threads, reps, cpu=None):
    """(best pass GB/s, mean GB/s over all passes, disturbed): one reading of bench/stream with
    this many threads (probe_reading)."""
    return probe_reading(contention, threads, lambda c: run_stream(threads, reps, c), "bench/stream", cpu)


def peak_gflops(contention, threads, reps, cpu=None):
    """(best pass GFLOP/s, mean GFLOP/s over all passes, disturbed): one reading of bench/peak
    with this many threads (probe_reading)."""
    return probe_reading(contention, threads, lambda c: run_peak(threads, reps, c), "bench/peak", cpu)


def peak_kind():
    """What bench/peak was built for, from its line: "avx512, 16 lanes, 24 chains per thread, ..."."""
    _, out = run_peak(1, 1)
    m = re.search(r"isa (\S+) lanes (\d+) accumulators (\d+) fma (\d)", out)
    if not m:
        return "?"
    return (f"{m[1]}, {m[2]} lanes, {m[3]} chains per thread, "
            + ("fused multiply-adds" if m[4] == "1" else "a multiply and an add"))


def usable_cpus():
    """The CPUs this process may run on, in order ([] where that cannot be read)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def read_by_cpu(reps=5):
    """One thread's best-pass read GB/s on each CPU this process may use, each CPU twice by
    turns: on the shared machines measured here one vCPU is at times 20-25% slower than the
    other for minutes on end (the host's doing), which is why run.c splits decode rows by
    each thread's measured speed. Empty where CPUs cannot be chosen."""
    cpus = usable_cpus()
    if len(cpus) < 2 or not os.path.exists(STREAM):
        return ""
    got = {c: [] for c in cpus}
    for _ in range(2):
        for c in cpus:
            reading, _ = run_stream(1, reps, cpu=c, check=False)
            if reading:
                got[c].append(f"{reading[0]:.2f}")
    return "; ".join(f"cpu{c} {', '.join(v)}" for c, v in got.items() if v)


# ----------------------------------------------------------------------------
# 16-bit weights against float32 on the same weights

def check_same_output(runner, narrow, wide):
    """The 16-bit file and the float32 file of its widened weights print the same text."""
    outs = [subprocess.run(runner.cmd(f, "-t", "0", "-n", "40", "-p", SHORT_PROMPT), capture_output=True,
                           check=True).stdout for f in (narrow, wide)]
    if outs[0] != outs[1]:
        raise SystemExit(f"bench: {narrow} and {wide} (the same weights widened) print different text")


def balanced_order(k, a, b, *more):
    """Round k's order of programs run twice each: a, b, b, a (a, b, c, c, b, a for three), or the
    reverse in odd rounds, so that a drift of the machine's speed within the round weighs on all alike."""
    files = (a, b, *more) if k % 2 == 0 else (a, b, *more)[::-1]
    return files + files[::-1]


def rates_and_runs(rates, runs):
    """Each round's rate, followed, where the round ran a program twice, by its two runs' rates."""
    return ", ".join(f"{v:.1f}" + (f" ({', '.join(f'{x:.1f}' for x in each)})" if len(each) > 1 else "")
                     for v, each in zip(rates, runs))


GGUF_ROUTE = ("q4_0", "q4_k_m")  # the types whose files are llama-quantize's GGUF, converted by export.py


def ensure_gguf_checkpoints_for(gguf, weight_type, llama_bench):
    """ensure_gguf_checkpoints without the float32 file, for the files a row compares with."""
    return ensure_gguf_checkpoints(gguf, weight_type, llama_bench, wide=False)[0]


def in_cache_mix(by_type, rates):
    """The in-cache rate of a file whose matrices mix types: the weights streamed per token over the
    time each type's weights take at that type's in-cache rate, sum(w_t) / sum(w_t / rate_t) (the
    harmonic mean of the types' rates weighted by their shares of the weights read per token)."""
    return sum(w for w, _ in by_type.values()) / sum(by_type[t][0] / rates[t] for t in by_type)


def bench_16bit(runner, name, path, weight_type, threads, runs, stream_reps, cpus, prompt, n_prompt,
                decode_steps, decode_positions, lbench, gguf):
    """Rounds of (bandwidth, the narrow, float32 and reference decodes twice each in a balanced order,
    bandwidth, in-cache rates, the two prefills, llama-bench on the same-type GGUF) for each thread
    count: (table rows, raw lines, any run disturbed). The narrow file is export.py's (bf16, f16,
    q8_0 from the bench's file) or, for GGUF_ROUTE, llama-quantize's GGUF converted by export.py;
    the references: bf16 for q8_0; the Q8_0 and BF16 GGUFs of the same route for GGUF_ROUTE."""
    if weight_type in GGUF_ROUTE:
        narrow, wide, gguf_narrow = ensure_gguf_checkpoints(gguf, weight_type, lbench)
        refs = {t: ensure_gguf_checkpoints_for(gguf, t, lbench) for t in ("q8_0", "bf16")}
        if not lbench:
            gguf_narrow = None
    else:
        narrow, wide = ensure_16bit_checkpoints(path, weight_type)
        refs = {"bf16": ensure_16bit_checkpoints(path, "bf16")[0]} if weight_type == "q8_0" else {}
        gguf_narrow = ensure_gguf_quantized(gguf, weight_type, lbench) if lbench else None
    check_same_output(runner, narrow, wide)
    for f in (narrow, wide, *refs.values()):
        if read_header(f)[6] < decode_steps:
            raise SystemExit(f"bench: {f} has a context of {read_header(f)[6]}, under the {decode_steps} "
                             "positions decode runs to")
    kv = kv_cache_bytes(*read_header(narrow), decode_positions)

    def bytes_read(f):  # per decoded token: the streamed matrices, the norms and the KV cache
        by, norms = streamed_by_type(f)
        return sum(b for _, b in by.values()) + norms + kv

    by_type, _ = streamed_by_type(narrow)
    weights = sum(w for w, _ in by_type.values())
    bytes16, bytes32 = bytes_read(narrow), bytes_read(wide)
    ref_bytes = {t: bytes_read(f) for t, f in refs.items()}
    types = sorted(by_type, key=lambda t: -by_type[t][0])  # the types the matrices use, most weights first
    label = f"{weight_type} (GGUF)" if weight_type in GGUF_ROUTE else weight_type
    if len(types) > 1 or types[0] != weight_type:
        label += ": " + ", ".join(f"{t} {100 * by_type[t][0] / weights:.0f}%" for t in types)
    for f in (narrow, wide, *refs.values(), gguf_narrow):
        if f:
            drop_from_page_cache(f)
    for f in (narrow, wide, *refs.values()):
        runner.timed(f, threads[0], SHORT_PROMPT, decode_steps // 8)  # faults the files in
    files = {narrow: "narrow", wide: "f32", **{f: t for t, f in refs.items()}}
    rows, raw, any_disturbed = [], [], False
    for t in threads:
        log(f"bench: {name} {weight_type}, {t} thread(s): {runs} round(s) of bandwidth, prefill and decode ...")
        r = {k: [] for k in ("pre16", "pre32", "peak", "pp", "tg", "cache")}
        runs_of = {k: [] for k in files.values()}  # each round's two decode rates of each file
        cache_of = {k: [] for k in types}
        retries, disturbed = [runs], 0
        for k in range(runs):
            runner.cpu = cpus[k % len(cpus)] if t == 1 and len(cpus) > 1 else None
            peak1, _, d1 = stream_bandwidth(runner.contention, t, stream_reps, runner.cpu)
            rates, decoded = {f: [] for f in files}, set()
            for f in balanced_order(k, narrow, wide, *refs.values()):
                (_, _, m, rate, _, _), d = runner.timed_quiet(f, t, SHORT_PROMPT, decode_steps, retries)
                rates[f].append(rate)
                decoded.add(m)
                disturbed += d
            if len(decoded) > 1:
                raise SystemExit(f"bench: {name} {weight_type}: the files decoded different numbers of tokens "
                                 f"({sorted(decoded)})")
            for f, key in files.items():
                runs_of[key].append(rates[f])
            peak2, _, d2 = stream_bandwidth(runner.contention, t, stream_reps, runner.cpu)
            r["peak"].append((peak1 + peak2) / 2)
            disturbed += d1 + d2
            for wt in types:
                cache, _, d3 = in_cache_rate(runner.contention, t, wt, runner.cpu)
                cache_of[wt].append(cache)
                disturbed += d3
            r["cache"].append(in_cache_mix(by_type, {wt: cache_of[wt][-1] for wt in types}))
            for f in (narrow, wide):
                (_, rate, _, _, _, _), d = runner.timed_quiet(f, t, prompt, n_prompt, retries)
                r["pre16" if f == narrow else "pre32"].append(rate)
                disturbed += d
            if gguf_narrow:
                (pp, tg, _, _), d = runner.timed_quiet(
                    None, t, None, None, retries,
                    run=lambda stoppable: llama_bench(runner, lbench, gguf_narrow, t, n_prompt, DECODE_TOKENS,
                                                      stoppable))
                r["pp"].append(pp)
                r["tg"].append(tg)
                disturbed += d
        runner.cpu = None
        # each round's rate of a file: its two runs together (the same tokens in each: the harmonic mean)
        for key, pairs in runs_of.items():
            r["dec_" + key] = [statistics.harmonic_mean(pair) for pair in pairs]

        def med(key, scale=1.0):
            return statistics.median(scale * v for v in r[key])

        def ratio(a, b, scale_a=1.0):
            return statistics.median(scale_a * x / y for x, y in zip(r[a], r[b])) if r.get(a) and r.get(b) else None

        def ref_cells(ref):
            return ([f"{med('dec_' + ref):.1f}", f"**{ratio('dec_narrow', 'dec_' + ref):.2f}x**"] if ref in refs
                    else ["-", "-"])

        mark = " (!)" if disturbed else ""
        of_peak = statistics.median(bytes16 * d / 1e9 / p for d, p in zip(r["dec_narrow"], r["peak"]))
        of_cache = statistics.median(weights * d / 1e9 / c for d, c in zip(r["dec_narrow"], r["cache"]))
        vs_pp, vs_tg = ratio("pre16", "pp"), ratio("dec_narrow", "tg")
        cache_cell = f"{med('cache'):.1f}"
        if len(types) > 1:
            cache_cell = (", ".join(f"{wt} {statistics.median(cache_of[wt]):.1f}" for wt in types)
                          + f"; mix {cache_cell}")
        mb_cell = (f"{bytes16 / 1e6:.1f} (f32 {bytes32 / 1e6:.1f}"
                   + "".join(f", {ref} {b / 1e6:.1f}" for ref, b in ref_bytes.items()) + ")")
        rows.append([name, str(t), label, mb_cell,
                     f"{med('pre16'):.1f}{mark}", f"{med('dec_narrow'):.1f}{mark}",
                     f"{bytes16 * med('dec_narrow') / 1e9:.2f}",
                     f"{med('peak'):.2f}", f"{100 * of_peak:.0f}%", cache_cell, f"{100 * of_cache:.0f}%",
                     f"{med('pre32'):.1f}", f"{med('dec_f32'):.1f}",
                     f"**{ratio('dec_narrow', 'dec_f32'):.2f}x**", f"{ratio('pre16', 'pre32'):.2f}x",
                     *ref_cells("bf16"), *ref_cells("q8_0"),
                     f"{med('pp'):.1f}" if r["pp"] else "-", f"{med('tg'):.1f}" if r["tg"] else "-",
                     f"{vs_pp:.2f}x" if vs_pp else "-", f"{vs_tg:.2f}x" if vs_tg else "-"])
        raw.append(f"{name} {weight_type}, {t} thread(s), by round: decode (both runs, then each) {weight_type} "
                   f"{rates_and_runs(r['dec_narrow'], runs_of['narrow'])}, f32 "
                   f"{rates_and_runs(r['dec_f32'], runs_of['f32'])}; "
                   + "".join(f"{ref} {rates_and_runs(r['dec_' + ref], runs_of[ref])} "
                             f"({ref_bytes[ref] / 1e6:.1f} MB a token); " for ref in refs)
                   + f"prefill {weight_type} {', '.join(f'{v:.1f}' for v in r['pre16'])}, f32 "
                   f"{', '.join(f'{v:.1f}' for v in r['pre32'])} tok/s; read bandwidth (best pass) "
                   f"{', '.join(f'{v:.2f}' for v in r['peak'])} GB/s; in cache "
                   + "; ".join(f"{wt} {', '.join(f'{v:.2f}' for v in cache_of[wt])}" for wt in types)
                   + (f" (mix {', '.join(f'{v:.2f}' for v in r['cache'])})" if len(types) > 1 else "")
                   + " Gweights/s"
                   + (f"; llama-bench {weight_type.upper()} pp {', '.join(f'{v:.1f}' for v in r['pp'])}, tg "
                      f"{', '.join(f'{v:.1f}' for v in r['tg'])} tok/s" if r["pp"] else "")
                   + f"; files: {', '.join(os.path.relpath(f, ROOT) for f in files)}"
                   + (f", llama-bench on {os.path.relpath(gguf_narrow, ROOT)}" if gguf_narrow else "")
                   + (f"; **{disturbed} run(s) or reading(s) disturbed**" if disturbed else ""))
        any_disturbed = any_disturbed or disturbed > 0
    return rows, raw, any_disturbed


def bench_tokenizer(run_bin):
    """Tokenizer speed, the largest vocabulary the tests use: Gemma 3's 262,144 tokens (its own
    tokenizer.json, converted by export.py), loaded alone, then with 1 MB of multilingual text
    (tests/data/tokenizer_corpus.json repeated) tokenized as one text (-m tokenize -f). Best of
    three of each, in wall-clock seconds. Returns a line, or why there is none."""
    npm = os.environ.get("RUNC_NPM_DIR", os.path.join(os.path.expanduser("~"), ".cache", "runc-npm"))
    source = os.path.join(npm, "node_modules", "@lenml", "tokenizer-gemma3", "models", "tokenizer.json")
    if not os.path.exists(source):
        return f"tokenizer: no line ({source} is missing: tests/install_npm_refs.sh installs it)"
    tok = os.path.join(BENCH, "gemma3_tok.bin")
    if not os.path.exists(tok):
        subprocess.run([sys.executable, os.path.join(ROOT, "export.py"), "--tokenizer", source, "-o", tok],
                       check=True, capture_output=True)
    model = os.path.join(BENCH, "vocab262145.bin")  # one row per piece (its last is a control token)
    if not os.path.exists(model):
        ropefile.write_random_checkpoint(model, dim=8, hidden_dim=8, n_layers=1, n_heads=1, n_kv_heads=1,
                                         vocab_size=262145, seq_len=64)
    with open(os.path.join(ROOT, "tests", "data", "tokenizer_corpus.json"), encoding="utf-8") as f:
        corpus = "\n".join(t for t in json.load(f) if "\0" not in t).encode()
    text = (corpus * (2**20 // len(corpus) + 1))[:2**20]
    while text and (text[-1] & 0xC0) == 0x80:  # end on a whole UTF-8 character
        text = text[:-1]
    text_path = os.path.join(BENCH, "tokenizer_1mb.txt")
    with open(text_path, "wb") as f:
        f.write(text)

    def best_of_three(*args):  # (wall seconds, CPU seconds, stdout), the best of three runs
        best = None
        for _ in range(3):
            with tempfile.TemporaryFile() as out:
                t0 = time.perf_counter()
                p = subprocess.Popen([run_bin, model, "-z", tok, "-m", "tokenize", *args], stdout=out,
                                     stderr=subprocess.PIPE)
                _, status, usage = os.wait4(p.pid, 0)
                wall = time.perf_counter() - t0
                if os.waitstatus_to_exitcode(status) != 0:
                    raise SystemExit(f"bench: tokenizer run failed: {p.stderr.read().decode(errors='replace')}")
                out.seek(0)
                reading = (wall, usage.ru_utime + usage.ru_stime, out.read())
            best = reading if best is None or reading[0] < best[0] else best
        return best

    load, load_cpu, _ = best_of_three("-p", "")
    both, both_cpu, out = best_of_three("-f", text_path)
    n_tokens = out.count(b"\n") - 1  # an id per line, then the empty line that closes the text
    return (f"tokenizer: Gemma 3's 262,144-token vocabulary loads in {load:.2f} s ({load_cpu:.2f} s of CPU); "
            f"1 MB of multilingual text ({n_tokens} tokens) tokenizes in {both - load:.2f} s more "
            f"({both_cpu - load_cpu:.2f} s of CPU; best of 3)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 15M only, one run each, no waiting for free cores or runs redone")
    ap.add_argument("--models", default=None, help="comma-separated, from 15M,110M (default: both)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--runs", type=int, default=None, help="runs per figure (default 5 for 15M, 3 for 110M)")
    ap.add_argument("--dtypes", default="bf16,q8_0,q4_0,q4_k_m",
                    help="weight types to compare with float32 on the same weights: bf16, f16, q8_0 (also against "
                         "bf16), q4_0, q4_k_m (llama-quantize's GGUF; also against Q8_0 and BF16 GGUFs of the same "
                         "weights; they need LLAMA_BENCH, or LLAMA_QUANTIZE and LLAMA_CONVERT), comma-separated, "
                         "or none (default bf16,q8_0,q4_0,q4_k_m)")
    args = ap.parse_args()
    dtypes = [] if args.dtypes == "none" else args.dtypes.split(",")
    if any(d not in ("bf16", "f16", "q8_0", *GGUF_ROUTE) for d in dtypes):
        ap.error(f"--dtypes: bf16, f16, q8_0, {', '.join(GGUF_ROUTE)}, comma-separated, or none")

    models = (args.models or ("15M" if args.quick else "15M,110M")).split(",")
    for m in models:
        if m not in SHAPES:
            ap.error(f"unknown model {m!r} (choose from {', '.join(SHAPES)})")
    threads = [int(t) for t in args.threads.split(",")]
    if any(t < 1 for t in threads):
        ap.error("thread counts must be >= 1")
    if args.runs is not None and args.runs < 1:
        ap.error("--runs must be >= 1")

    run_bin = os.environ.get("RUN_BIN", os.path.join(ROOT, "run"))
    if not os.path.exists(run_bin):
        raise SystemExit(f"bench: {run_bin} is missing: run `make bench` (it builds it)")
    models_dir = os.environ.get("MODELS", os.path.join(ROOT, "models"))
    if not os.path.isabs(models_dir):
        models_dir = os.path.join(ROOT, models_dir)
    tokenizer = os.path.normpath(os.path.join(models_dir, "tokenizer.bin"))
    if not os.path.exists(tokenizer):
        raise SystemExit(f"bench: no tokenizer at {tokenizer} (set MODELS to the folder holding tokenizer.bin)")
    runner = Runner(run_bin, tokenizer, 0.0 if args.quick else WAIT_BUDGET)  # 0: Contention.patient()
    peer = os.environ.get("PEER") or None
    lbench = os.environ.get("LLAMA_BENCH") or None
    for what, exe in (("PEER", peer), ("LLAMA_BENCH", lbench)):
        if exe and not os.access(exe, os.X_OK):
            raise SystemExit(f"bench: {what}={exe} is not an executable file")

    gguf_route = [d for d in dtypes if d in GGUF_ROUTE]
    if gguf_route and not (lbench or (os.environ.get("LLAMA_QUANTIZE") and os.environ.get("LLAMA_CONVERT"))):
        log(f"bench: no {', '.join(gguf_route)} rows: their files are GGUFs made by llama.cpp's converter and "
            "llama-quantize; set LLAMA_BENCH (they are found beside it), or LLAMA_QUANTIZE and LLAMA_CONVERT")
        dtypes = [d for d in dtypes if d not in GGUF_ROUTE]
        gguf_route = []

    for probe in (STREAM, PEAK):
        if not os.path.exists(probe):
            raise SystemExit(f"bench: {os.path.relpath(probe, ROOT)} is missing: run `make bench` (it builds it)")

    start = time.time()
    source = source_line(run_bin)
    busy = others_cores(1.0)
    log(f"bench: other processes use {busy:.1f} of {NCPU} cores"
        + (" -- runs will wait for free cores, or be redone, within limits" if busy > SPARE else ""))
    if args.quick:
        global STREAM_MIB
        STREAM_MIB = 256
    stream_reps = 4 if args.quick else STREAM_REPS
    peak_reps = 4 if args.quick else PEAK_REPS
    peak_by_threads = {}  # thread count: every round's peak reading (best pass), all models
    by_cpu_start = "" if args.quick else read_by_cpu()
    cpus = usable_cpus()

    rows, side, notes, raw, any_disturbed = [], [], [], [], False
    rows16 = []
    for name in models:
        path = ensure_checkpoint(name)
        header = read_header(path)
        dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared = header
        runs = 1 if args.quick else (args.runs or RUNS[name])

        target = min(PROMPT_TOKENS[name], seq_len)
        prompt, n_prompt = make_prompt(runner, path, target)
        flops_per_token = prefill_flops(*header, n_prompt) / n_prompt  # of the prefill, on average
        n_short = runner.count_tokens(path, SHORT_PROMPT)
        decode_steps = min(seq_len, n_short - 1 + DECODE_TOKENS)
        # decode reads the weights and, in attention, the KV cache: keys and values of positions 0..pos
        positions = range(n_short, decode_steps)
        weight_bytes, kv_bytes = streamed_bytes(*header), kv_cache_bytes(*header, positions)
        bytes_per_token = weight_bytes + kv_bytes
        notes.append(f"{name}: dim {dim}, hidden {hidden}, {layers} layers, {heads}/{kv_heads} heads, vocab {vocab}, "
                     f"seq {seq_len}; {weight_bytes / 1e6:.1f} MB of float32 weights streamed per decoded token "
                     f"(classifier {'shared with the embedding' if shared else 'separate'}) and "
                     f"{kv_bytes / 1e6:.1f} MB of the KV cache on average over the decode run (counted: "
                     f"{100 * kv_bytes / bytes_per_token:.1f}% of the bytes read); prefill prompt {n_prompt} tokens"
                     + (f" (the context is {seq_len})" if n_prompt < 256 else "")
                     + f"; decode prompt {n_short} tokens, -n {decode_steps}; median of {runs} round(s)")

        runs16 = (path, prompt, n_prompt, decode_steps, positions)  # for the 16-bit rounds, after the float32 ones
        peer_path = ensure_llama2c_checkpoint(path) if peer or lbench or gguf_route else None
        gguf = ensure_gguf(peer_path, tokenizer, lbench) if lbench or gguf_route else None
        log(f"bench: {name}: warm-up run (page cache) ...")
        for f in (path, peer_path, gguf):
            if f:
                drop_from_page_cache(f)
        runner.timed(path, threads[0], SHORT_PROMPT, min(seq_len, n_short + 8))  # faults the file in
        if peer:
            peer_decode(runner, peer, peer_path, threads[0], SHORT_PROMPT, n_short + 8, False)
        for t in threads:
            # Rounds of (bandwidth reading, decode run, bandwidth reading, prefill run), so
            # that each decode is compared with the bandwidth read just before and just after
            # it (their mean), and each prefill with the decode of the same minute: this VM's
            # figures drift by 10-30% within minutes, all of them together.
            log(f"bench: {name}, {t} thread(s): {runs} round(s) of bandwidth, prefill and decode ...")
            pre, dec, dec_n, peaks, means, speedups, others = [], [], [], [], [], [], []
            dec_runs, peer_runs = [], []  # each round's runs, for the raw lines
            of_peak, of_mean = [], []
            flops_peaks, of_flops_peak = [], []
            disturbed = bw_disturbed = 0
            retries = [runs]  # runs redone for other work: at most this many per model and thread count
            vs_peer, vs_pp, vs_tg, peer_rates, pp_rates, tg_rates, ours_wall = [], [], [], [], [], [], []
            pp_of_flops_peak = []  # llama.cpp's prefill against the same peak reading as ours
            round_cpus = []
            for k in range(runs):
                # A one-thread round runs everything on one CPU, the CPUs by turns: on the shared
                # machines measured here one vCPU is at times 20-30% slower than the other for
                # minutes, and a decode and a bandwidth reading left to the scheduler need not
                # land on the same one, nor run and its peer.
                runner.cpu = cpus[k % len(cpus)] if t == 1 and len(cpus) > 1 else None
                round_cpus.append(runner.cpu)
                peak1, mean1, d1 = stream_bandwidth(runner.contention, t, stream_reps, runner.cpu)
                # with a peer, ours and the peer twice each in a balanced order; each program's
                # rate is that of its two runs together (the same tokens in each: the harmonic
                # mean, total tokens over total time)
                order = balanced_order(k, 0, 1) if peer else (0,)
                ours, ours_walls, peer_walls = [], [], []
                for turn in order:
                    if turn == 0:
                        (_, _, m, rate, o, wall), d = runner.timed_quiet(path, t, SHORT_PROMPT, decode_steps,
                                                                          retries)
                        ours.append(rate)
                        ours_walls.append(wall)
                    else:
                        (o, peer_wall), d = runner.timed_quiet(
                            None, t, None, None, retries,
                            run=lambda stoppable: peer_decode(runner, peer, peer_path, t, SHORT_PROMPT,
                                                              decode_steps, stoppable))
                        peer_walls.append(peer_wall)
                    others.append(o)
                    disturbed += d
                d_rate, wall = statistics.harmonic_mean(ours), statistics.mean(ours_walls)
                dec.append(d_rate)
                dec_runs.append(ours)
                dec_n.append(m)
                ours_wall.append((decode_steps - 1) / wall)
                if peer:
                    peer_wall = statistics.mean(peer_walls)
                    vs_peer.append(peer_wall / wall)
                    peer_rates.append((decode_steps - 1) / peer_wall)
                    peer_runs.append([(decode_steps - 1) / w for w in peer_walls])
                peak2, mean2, d2 = stream_bandwidth(runner.contention, t, stream_reps, runner.cpu)
                # the bandwidth while the decode ran, as near as we can tell
                peak, mean = (peak1 + peak2) / 2, (mean1 + mean2) / 2
                peaks.append(peak)
                means.append(mean)
                bw_disturbed += d1 + d2
                # the peak arithmetic just before the prefill, which it bounds
                flops_peak, _, d3 = peak_gflops(runner.contention, t, peak_reps, runner.cpu)
                flops_peaks.append(flops_peak)
                bw_disturbed += d3
                (n, p_rate, _, _, o, _), d = runner.timed_quiet(path, t, prompt, n_prompt, retries)
                if n != n_prompt:
                    raise SystemExit(f"bench: run reported a prompt of {n} tokens, expected {n_prompt}")
                pre.append(p_rate)
                of_flops_peak.append(flops_per_token * p_rate / 1e9 / flops_peak)
                others.append(o)
                disturbed += d
                if lbench:
                    (pp, tg, o, _), d = runner.timed_quiet(
                        None, t, None, None, retries,
                        run=lambda stoppable: llama_bench(runner, lbench, gguf, t, n_prompt, DECODE_TOKENS,
                                                          stoppable))
                    others.append(o)
                    disturbed += d
                    pp_rates.append(pp)
                    pp_of_flops_peak.append(100 * flops_per_token * pp / 1e9 / flops_peak)
                    tg_rates.append(tg)
                    vs_pp.append(p_rate / pp)
                    vs_tg.append(d_rate / tg)
                of_peak.append(bytes_per_token * d_rate / 1e9 / peak)
                of_mean.append(bytes_per_token * d_rate / 1e9 / mean)
                speedups.append(p_rate / d_rate if d_rate > 0 else float("nan"))
            runner.cpu = None
            redone = runs - retries[0]
            on_cpus = (f" on cpu {', '.join(str(c) for c in round_cpus)}" if round_cpus[0] is not None else "")
            peak_by_threads.setdefault(t, []).extend(flops_peaks)
            raw.append(f"{name}, {t} thread(s), by round{on_cpus}: read bandwidth (best pass / mean) "
                       f"{', '.join(f'{a:.2f}/{b:.2f}' for a, b in zip(peaks, means))} GB/s; "
                       f"peak {', '.join(f'{a:.1f}' for a in flops_peaks)} GFLOP/s; "
                       f"prefill {', '.join(f'{r:.1f}' for r in pre)} tok/s; "
                       f"decode{' (both runs, then each)' if peer else ''} {rates_and_runs(dec, dec_runs)} tok/s; "
                       f"other processes used up to {max(others):.2f} core(s) during a kept run"
                       + (f"; {redone} run(s) redone" if redone else "")
                       + (f"; **{disturbed} kept run(s) disturbed**" if disturbed else "")
                       + (f"; **{bw_disturbed} bandwidth or peak reading(s) disturbed**" if bw_disturbed else ""))
            p_med, d_med = statistics.median(pre), statistics.median(dec)
            gbs = bytes_per_token * d_med / 1e9
            mark = " (!)" if disturbed else ""
            rows.append([name, str(t), f"{p_med:.1f}{mark}",
                         f"{flops_per_token * p_med / 1e9:.1f}, {100 * statistics.median(of_flops_peak):.0f}%"
                         + (" (!)" if disturbed or bw_disturbed else ""),
                         f"{d_med:.1f}{mark}",
                         "/".join(map(str, sorted(set(dec_n)))), f"{gbs:.2f}",
                         f"{statistics.median(peaks):.2f}" + (" (!)" if bw_disturbed else ""),
                         f"{statistics.median(means):.2f}" + (" (!)" if bw_disturbed else ""),
                         f"{100 * statistics.median(of_peak):.0f}%", f"{100 * statistics.median(of_mean):.0f}%",
                         f"{statistics.median(speedups):.1f}x"])
            any_disturbed = any_disturbed or disturbed or bw_disturbed
            if peer or lbench:
                def cell(values, fmt="{:.1f}"):
                    return fmt.format(statistics.median(values)) if values else "-"
                side.append([name, str(t), cell(ours_wall), cell(peer_rates), cell(vs_peer, "**{:.2f}x**"),
                             f"{p_med:.1f}", f"{100 * statistics.median(of_flops_peak):.0f}%", cell(pp_rates),
                             cell(pp_of_flops_peak, "{:.0f}%"), cell(vs_pp, "**{:.2f}x**"),
                             f"{d_med:.1f}", cell(tg_rates), cell(vs_tg, "{:.2f}x")])
                raw.append(f"{name}, {t} thread(s), side by side by round: run decode, whole process "
                           f"{', '.join(f'{r:.1f}' for r in ours_wall)} tok/s"
                           + (f"; peer (both runs, then each) {rates_and_runs(peer_rates, peer_runs)} tok/s" if peer else "")
                           + (f"; llama-bench pp {', '.join(f'{r:.1f}' for r in pp_rates)}, tg "
                              f"{', '.join(f'{r:.1f}' for r in tg_rates)} tok/s" if lbench else ""))
        for weight_type in dtypes:
            path16, prompt16, n_prompt16, steps16, positions16 = runs16
            r16, raw16, d16 = bench_16bit(runner, name, path16, weight_type, threads, runs, stream_reps, cpus,
                                          prompt16, n_prompt16, steps16, positions16, lbench, gguf)
            rows16 += r16
            raw += raw16
            any_disturbed = any_disturbed or d16

    by_cpu_end = "" if args.quick else read_by_cpu()
    elapsed = time.time() - start
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    out = [f"## run.c benchmark, {now}", "", f"Machine: {machine_line()}", "", f"Source: {source}", ""]
    if by_cpu_start:
        out += [f"One thread's read GB/s (bench/stream, best pass) on each CPU, twice by turns: at the start "
                f"{by_cpu_start}; at the end {by_cpu_end}", ""]
    out.append(f"Peak single-precision GFLOP/s (bench/peak: {peak_kind()}; best pass, median over the rounds): "
               + ", ".join(f"{t} thread{'s' if t > 1 else ''} {statistics.median(v):.1f}"
                           for t, v in sorted(peak_by_threads.items())))
    out.append("")
    head = ["model", "threads", "prefill tok/s", "prefill GFLOP/s, % of peak", "decode tok/s", "decoded tokens",
            "decode GB/s",
            "read GB/s, best pass", "read GB/s, sustained", "% of best pass", "% of sustained",
            "prefill speed-up over decode"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|")
    out += ["| " + " | ".join(r) + " |" for r in rows]
    out.append("")
    if rows16:
        out.append("16-bit, Q8_0 and 4-bit weights against float32 on the same weights (the float32 file holds "
                   "the 16-bit values widened, or the blocks' weights dequantized; Q8_0 also against the bf16 file "
                   "of the same source weights, Q4_0 and Q4_K_M against Q8_0 and bf16; each ratio the median over "
                   "rounds of that round's own ratio):")
        out.append("")
        head3 = ["model", "threads", "weights", "MB read per decoded token", "prefill tok/s", "decode tok/s",
                 "decode GB/s (bytes read)", "read GB/s, best pass", "% of best pass",
                 "in-cache Gweights/s (bench/in_cache)", "decode, % of in-cache rate", "f32 prefill tok/s",
                 "f32 decode tok/s", "decode / f32", "prefill / f32", "bf16 decode tok/s", "decode / bf16",
                 "q8_0 decode tok/s", "decode / q8_0", "llama.cpp pp tok/s (same-type GGUF)", "llama.cpp tg tok/s (same-type GGUF)",
                 "run / llama.cpp prefill", "run / llama.cpp decode"]
        out.append("| " + " | ".join(head3) + " |")
        out.append("|" + "|".join("---" if i < 3 else "---:" for i in range(len(head3))) + "|")
        out += ["| " + " | ".join(r) + " |" for r in rows16]
        out.append("")
        out.append("In-cache Gweights/s: bench/in_cache, run.c's decode kernel with the same threads on matrices "
                   "held in cache (each thread 64 rows of 768), read in each round; decode, % of in-cache rate: "
                   "decode's weights a second (tok/s x the matrices' weights) over it. Near 100%, decode is bound "
                   "by the arithmetic of widening the weights, not by memory, and more bandwidth would not help. "
                   "A file whose matrices mix types (a Q4_K_M file: q4_k and q6_k; the weights column gives each "
                   "type's share of the weights read per token) has each type's rate read, and its own: the "
                   "weights over the time each type's weights take at its type's rate, sum(w) / sum(w_t / rate_t), "
                   "the harmonic mean weighted by the shares (mix).")
        if any(r[2].startswith(GGUF_ROUTE) for r in rows16):
            out.append("")
            out.append("q4_0 (GGUF) and q4_k_m (GGUF): the bench's F32 GGUF (llama-convert-llama2c-to-ggml of the "
                       "llama2.c copy of bench/model*.bin, llama.context_length set to its seq_len) quantized by "
                       "llama-quantize to Q4_0 or Q4_K_M and converted by export.py (the blocks copied as they are, "
                       "a type per piece: llama-quantize keeps the classifier in q6_k, q8_0 where rows are not whole "
                       "256-weight blocks, and Q4_K_M gives some wv and w2 q6_k); f32: export.py --dtype f32 of that "
                       "file (its dequantized weights, the same output); q8_0 and bf16: the same F32 GGUF quantized "
                       "by llama-quantize to Q8_0 and BF16 and converted by export.py. Every file in such a row has "
                       "the same tensors (the converter writes the classifier apart from the embedding, so these "
                       "files hold a separate classifier where bench/model*.bin shares the embedding: the same "
                       "weights are streamed a token, but they are not the q8_0 and bf16 rows' files); llama-bench runs on the Q4_0 or Q4_K_M GGUF itself. MB read: "
                       "each matrix piece at its own type's bytes (from the file's type table), the norms and the KV "
                       "cache float32.")
        out.append("")
    if side:
        out.append("Side by side on the same weights (each ratio: the median over rounds of that round's ratio; "
                   "above 1 means run is faster):")
        out.append("")
        head2 = ["model", "threads", "run decode tok/s, whole process", "llama2.c (PEER), whole process",
                 "run / llama2.c", "run prefill tok/s", "run prefill, % of peak", "llama.cpp pp tok/s",
                 "llama.cpp pp, % of peak", "run / llama.cpp prefill",
                 "run decode tok/s", "llama.cpp tg tok/s", "run / llama.cpp decode"]
        out.append("| " + " | ".join(head2) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(head2))) + "|")
        out += ["| " + " | ".join(r) + " |" for r in side]
        out.append("")
        out.append(f"- PEER: {peer or '-'}; LLAMA_BENCH: {lbench or '-'}. Whole process: (-n minus 1) tokens over the "
                   "wall time of the process, model loading and prompt included, for both programs alike; llama.cpp's "
                   "figures are llama-bench's own (pp: the prefill prompt's length; tg: "
                   f"{DECODE_TOKENS} tokens from an empty context), F32 weights converted from the same file; "
                   "% of peak: the same prefill flops per token and the same peak reading for both programs, "
                   "so that the two columns say how close each comes to the arithmetic limit")
    out += [f"- {n}" for n in notes]
    out.append(f"- decode GB/s = bytes read per token (the weights streamed and the KV cache, as in the notes "
               f"above) x decode tok/s (median); read GB/s = "
               f"bench/stream, a sum over 1 GiB of floats, {stream_reps} passes with the same thread count, read "
               f"just before and just after each round's decode run (median over rounds of the two readings' "
               f"mean): the best pass (the peak) and all passes' bytes over their time (what a reader sustains "
               f"over a span like the decode run's, shared-machine interruptions included)")
    out.append("- prefill GFLOP/s = the prefill's floating-point operations (bench.py's prefill_flops: 2 per "
               "multiply-add of the matrix products, the classifier once, and attention's q.k scores and weighted "
               "sums; not the norms, RoPE, softmax or activations) / prompt tokens x prefill tok/s (median); % of "
               "peak: of bench/peak's best pass with the same thread count, read right before the prefill run")
    out.append("- % of best pass, % of sustained, % of peak and prefill speed-up: the median over rounds of each "
               "round's own ratio (decode GB/s / read GB/s; prefill GFLOP/s / peak GFLOP/s; prefill tok/s / decode "
               "tok/s), so that the machine's drift "
               "between rounds cancels; a one-thread round runs everything in it (readings, run, peers) on one CPU, "
               "the CPUs by turns")
    out.append("- random weights, greedy (-t 0); prefill and decode tok/s as run prints them (median). Rounds: ")
    out += [f"  - {r}" for r in raw]
    out.append(f"- took {elapsed:.0f} s (of which {runner.contention.waited:.0f} s waiting for free cores); "
               f"other processes used {busy:.1f} of {NCPU} cores at the start"
               + ("; (!) marks figures measured while other processes took the cores they needed: "
                  "treat them with care" if any_disturbed else ""))
    out.append("- " + bench_tokenizer(run_bin))
    print("\n".join(out))


if __name__ == "__main__":
    main()
