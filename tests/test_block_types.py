"""GGUF's 4-bit, 5-bit and K-quant blocks (type codes 5 q4_0, 6 q4_1, 7 q5_0, 8 q5_1, 9 q4_k,
10 q5_k, 11 q6_k): a file of each kind must compute, byte for byte in every mode, what the float32
file of its dequantized weights computes.

The reference is tests/block_reference.py, a NumPy dequantization written from llama.cpp's block
structs and dequantize_row_* (not from export.py or run.c). It is first checked against llama.cpp's
own dequantization (llama-quantize ... F32, whose float32 bytes are recorded as sha256 digests in
tests/data/gguf/dequantized_sha256.json): the Q4_0, Q4_K and Q6_K tensors of the two llama256 GGUF
fixtures, and blocks of every kind drawn from SHAKE-256 with every kind of f16 scale.

Then run: random blocks of each kind in every matrix piece and the embedding, written by export.py's
write_rope (as Blocks, never requantized), against the float32 file of the reference's dequantized
weights written by tests/ropefile.py from the format's description; in every mode (generate greedy
and seeded, ppl and its CSV, inspect's CSV, chat), in the build under test, an AVX2 and a plain C
build, at 1 and 2 threads. Files mixing the kinds piece by piece (the type table); the llama256
GGUFs converted by export.py against the float32 GGUF of the reference's dequantization; and the
files run must refuse (a scale that is not finite, a size one block short, an unknown type code).
"""
import hashlib
import json
import math
import os
import struct
import subprocess

import numpy as np
import pytest

import block_reference as R
import gguf_writer as W
import ropefile
from conftest import ROOT, RUN_BIN, RUN_PREFIX, TOK512, export, load_export, run
from test_weight_types import build_or_skip, builds, stored_as  # noqa: F401  (builds: a fixture)

DATA = ROOT / "tests" / "data" / "gguf"
DIGESTS = json.loads((DATA / "dequantized_sha256.json").read_text())
EXPORT = load_export()


def sha256(array_or_bytes):
    return hashlib.sha256(np.ascontiguousarray(array_or_bytes).tobytes()
                          if isinstance(array_or_bytes, np.ndarray) else bytes(array_or_bytes)).hexdigest()


# ----------------------------------------------------------------------------
# The reference against llama.cpp's dequantization


@pytest.mark.parametrize("name", ["llama256-Q4_0.gguf", "llama256-Q4_K_M.gguf"])
def test_reference_dequantizes_the_gguf_fixtures_as_llama_cpp_does(name):
    """Every tensor that is not F32 (Q4_0 or Q4_K, and Q6_K): the reference's float32 bytes have the
    digest of llama-quantize's F32 output."""
    g = EXPORT.read_gguf_file(str(DATA / name))
    recorded = DIGESTS[name]
    quantized = sorted(n for n, t in g.tensors.items() if t.type_name != "F32")
    assert quantized == sorted(recorded), "the tensors and the recorded digests differ"
    for tensor_name in quantized:
        t = g.tensors[tensor_name]
        assert t.type_name == recorded[tensor_name]["type"], tensor_name
        values = R.dequantize_gguf(t.type_name, g.tensor_data(tensor_name), math.prod(t.shape))
        assert values.dtype == np.float32 and values.size == math.prod(t.shape)
        assert sha256(values.astype("<f4")) == recorded[tensor_name]["f32_sha256"], (tensor_name, t.type_name)
    assert {recorded[n]["type"] for n in quantized} == ({"Q4_0", "Q6_K"} if "Q4_0" in name else {"Q4_K", "Q6_K"})


@pytest.mark.parametrize("kind", R.KINDS)
def test_reference_dequantizes_blocks_of_every_scale_as_llama_cpp_does(kind):
    """SHAKE-256 blocks (every f16 scale: zero, -0, subnormal, 65504, both signs) of each kind."""
    blocks = R.shake_blocks(kind)
    assert sha256(blocks) == DIGESTS["shake"][kind]["blocks_sha256"], "the blocks are not the ones recorded"
    count = R.SHAKE_BLOCKS[kind] * R.BLOCK[kind][0]
    values = R.dequantize(kind, blocks, count)
    assert sha256(values.astype("<f4")) == DIGESTS["shake"][kind]["f32_sha256"]
    d = blocks.view(R.LAYOUT[kind])["d"]
    assert R.is_subnormal_f16(d).sum() >= 4 and (d == 0).sum() >= 2 and np.signbit(d).sum() > len(d) // 4


def one_block(kind, **fields):
    """A block of kind with the given fields (the rest zero), as bytes."""
    b = np.zeros(1, R.LAYOUT[kind])
    for name, value in fields.items():
        b[name] = value
    return b.view(np.uint8)


def test_reference_reads_each_layout_as_the_structs_define_it():
    """Hand-made blocks whose weights follow from the definition (exact small numbers)."""
    qs = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)  # low j, high 15 - j
    lows, highs = np.arange(16), np.arange(16)[::-1]
    w = R.dequantize("q4_0", one_block("q4_0", d=0.5, qs=qs), 32)
    assert w.tolist() == list((np.concatenate([lows, highs]) - 8) * 0.5)
    w = R.dequantize("q4_1", one_block("q4_1", d=2.0, m=-1.0, qs=qs), 32)
    assert w.tolist() == list(np.concatenate([lows, highs]) * 2.0 - 1.0)
    qh = (1 << 0) | (1 << 17) | (1 << 31)  # fifth bits of weights 0, 17 and 31
    w = R.dequantize("q5_0", one_block("q5_0", d=1.0, qh=qh, qs=qs), 32)
    want = np.concatenate([lows, highs]) - 16
    want[[0, 17, 31]] += 16
    assert w.tolist() == list(want)
    w = R.dequantize("q5_1", one_block("q5_1", d=1.0, m=0.25, qh=qh, qs=qs), 32)
    assert w.tolist() == list(want + 16 + 0.25)
    # K-quants: sub-block j's 6-bit scale and min; j >= 4 takes its top two bits from bytes j - 4 and j
    scales = np.zeros(12, np.uint8)
    scales[0] = 0x80 | 3  # sc0 = 3, and bits 6-7 (2) are sc4's top bits
    scales[4] = 0x40 | 5  # m0 = 5, bits 6-7 (1) are m4's top bits
    scales[8] = 0x21  # sc4 low nibble 1, m4 low nibble 2
    sc, m = R.scale_min_k4(scales[None])
    assert sc[0].tolist() == [3, 0, 0, 0, 2 << 4 | 1, 0, 0, 0] and m[0].tolist() == [5, 0, 0, 0, 1 << 4 | 2, 0, 0, 0]
    qs128 = np.zeros(128, np.uint8)
    qs128[0] = 0x21  # chunk 0: weight 0 (sub-block 0) 1, weight 32 (sub-block 1) 2
    qs128[64] = 0x07  # chunk 2: weight 128 (sub-block 4) 7
    w = R.dequantize("q4_k", one_block("q4_k", d=1.0, dmin=0.5, scales=scales, qs=qs128), 256)
    assert w[0] == 3 * 1 - 2.5 and w[1] == -2.5 and w[32] == 0 * 2 - 0 and w[128] == 33 * 7 - 0.5 * 18
    qh32 = np.zeros(32, np.uint8)
    qh32[0] = 0b10001  # weight 0 (chunk 0 low: bit 0) and weight 128 (chunk 2 low: bit 4) get + 16
    w = R.dequantize("q5_k", one_block("q5_k", d=1.0, dmin=0.5, scales=scales, qh=qh32, qs=qs128), 256)
    assert w[0] == 3 * 17 - 2.5 and w[128] == 33 * 23 - 0.5 * 18 and w[32] == 0
    ql, qh64, sc6 = np.zeros(128, np.uint8), np.zeros(64, np.uint8), np.arange(1, 17, dtype=np.int8)
    # weights 0, 32, 64, 96: 1 | 0 << 4, 3 | 1 << 4, 2 | 2 << 4, 4 | 3 << 4 (ql's nibbles, qh[0]'s bit pairs)
    ql[0], ql[32], qh64[0] = 0x21, 0x43, 0b11100100
    sc6[0] = -3
    w = R.dequantize("q6_k", one_block("q6_k", d=2.0, ql=ql, qh=qh64, scales=sc6), 256)
    assert w[[0, 32, 64, 96]].tolist() == [2.0 * -3 * (1 - 32), 2.0 * 3 * (19 - 32), 2.0 * 5 * (34 - 32),
                                         2.0 * 7 * (52 - 32)]
    assert w[16] == 2.0 * 2 * -32 and w[128] == 2.0 * 9 * -32  # weight 16: scales[1]; weight 128: scales[8]


@pytest.mark.parametrize("kind", R.KINDS)
def test_random_blocks_are_finite_of_a_sane_size_with_zero_negative_and_subnormal_scales(kind):
    rng = np.random.default_rng(1)
    n = 4096 // R.BLOCK[kind][0] * 8
    blocks = R.random_blocks(kind, n, rng)
    assert blocks.dtype == np.uint8 and blocks.size == n * R.BLOCK[kind][1]
    w = R.dequantize(kind, blocks, n * R.BLOCK[kind][0])
    assert np.isfinite(w).all() and np.abs(w).max() < 0.6 and 0.02 < np.sqrt(np.mean(w * w)) < 0.2, \
        (np.abs(w).max(), np.sqrt(np.mean(w * w)))
    for _, name in R.scale_fields(kind):
        s = blocks.view(R.LAYOUT[kind])[name]
        assert np.isfinite(s).all()
        assert (s == 0).any() and (s < 0).sum() > n // 8 and R.is_subnormal_f16(s).sum() >= 2, name
