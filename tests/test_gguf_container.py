"""Tests of export.py's GGUF container reader (read_gguf_file, docs/gguf.md "The format").

- tests/data/gguf/tiny.gguf, written by llama.cpp's own gguf-py writer (README.md there): the
  reader gets its values, and tests/gguf_writer.py (written from docs/gguf.md) writes the same
  bytes for the same content, so the files the other tests write are GGUF as llama.cpp writes it;
- every value type, in a round trip through the tests' writer;
- each class of bad input, through the command line: exit code 1, one "export.py: error:" line
  naming the file and the key or tensor, no traceback, no output file;
- a seeded mutation fuzz of small files, in-process, with truncation at every byte of the header
  area and every field position set near its limit: the reader either reads a file or raises
  ExportError with a one-line message, never another exception, never a big allocation (traced);
  a handful of the mutants through the command line.

Run with: /usr/bin/python3 -m pytest tests/test_gguf_container.py
"""
import math
import random
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import gguf_writer as gw
from conftest import ROOT, load_export

EXPORT = ROOT / "export.py"
TINY = ROOT / "tests" / "data" / "gguf" / "tiny.gguf"
BIG = 2**64 - 1

ex = load_export()


def run_export(*args):
    return subprocess.run([sys.executable, str(EXPORT), *map(str, args)], capture_output=True, text=True,
                          timeout=60)


# ----------------------------------------------------------------------------
# llama.cpp's file, and the tests' writer against it

# tiny.gguf's content, in its order (make_tiny.py), as the tests' writer takes it
TINY_METADATA = [
    gw.string("general.architecture", "llama"), gw.u32("general.alignment", 64), gw.u8("test.uint8", 200),
    gw.i8("test.int8", -100), gw.u16("test.uint16", 60000), gw.i16("test.int16", -30000),
    gw.u32("test.uint32", 4000000000), gw.i32("test.int32", -2000000000), gw.f32("test.float32", 0.15625),
    gw.boolean("test.bool", True), gw.string("test.string", "héllo, GGUF"), gw.u64("test.uint64", 2**64 - 1),
    gw.i64("test.int64", -2**63), gw.f64("test.float64", -2.5e-300),
    gw.array("test.array.string", gw.STRING, ["a", "", "▁the", "<0x0A>"]),
    gw.array("test.array.int32", gw.INT32, [1, -2, 3]), gw.array("test.array.float32", gw.FLOAT32, [0.5, -1.25]),
    gw.array("test.array.bool", gw.BOOL, [True, False, True]), gw.array("test.array.uint8", gw.UINT8, [0, 127, 255]),
]


def tiny_q8_0():
    blocks = bytearray()
    for row in range(2):
        blocks += np.float16(0.25 * (row + 1)).tobytes() + (np.arange(32, dtype=np.int8) - 16 * row).tobytes()
    return bytes(blocks)


TINY_TENSORS = [
    gw.float_tensor("t.f32", np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5),
    gw.float_tensor("t.f16", [1.0, -0.5, 65504.0, 2.0**-24], gw.F16),
    ("t.q8_0", gw.Q8_0, (32, 2), tiny_q8_0()),
]


def test_reads_llama_cpps_tiny_file_values():
    g = ex.read_gguf_file(str(TINY))
    assert (g.version, g.alignment) == (3, 64)
    for key, value_type, value in TINY_METADATA:
        got = g.metadata[key]
        assert g.value_types[key] == value_type, key
        if isinstance(value_type, tuple) and value_type[1] != gw.STRING:
            assert isinstance(got, np.ndarray) and got.dtype.byteorder in "<|=" and not got.flags.writeable
            assert got.tolist() == list(value), key
        else:
            assert got == value and type(got) is type(value), key
    assert g.data_start % 64 == 0 and g.data_start - 64 < g.size
    assert list(g.tensors) == ["t.f32", "t.f16", "t.q8_0"]
    f32, f16, q8 = (g.tensors[n] for n in g.tensors)
    assert (f32.type_name, f32.ggml_type, f32.ne, f32.shape, f32.nbytes) == ("F32", 0, (3, 2), (2, 3), 24)
    assert (f16.type_name, f16.ne, f16.shape, f16.nbytes) == ("F16", (4,), (4,), 8)
    assert (q8.type_name, q8.ggml_type, q8.ne, q8.shape, q8.nbytes) == ("Q8_0", 8, (32, 2), (2, 32), 68)
    # the data section starts at the first multiple of the alignment after the infos; each tensor
    # is padded to the alignment
    assert (f32.offset, f16.offset, q8.offset) == (g.data_start, g.data_start + 64, g.data_start + 128)
    assert g.float_tensor("t.f32").tolist() == [[-2.5, -1.5, -0.5], [0.5, 1.5, 2.5]]
    assert g.float_tensor("t.f16").tolist() == [1.0, -0.5, 65504.0, 2.0**-24]
    data = g.tensor_data("t.q8_0")
    assert data.dtype == np.uint8 and not data.flags.writeable and bytes(data) == tiny_q8_0()
    assert np.array_equal(ex.dequantize_q8_0(data).reshape(q8.shape)[1, :3], [-8.0, -7.5, -7.0])  # d 0.5, q -16..
    with pytest.raises(ex.ExportError, match="tensor t.q8_0 is Q8_0; only F32, F16 and BF16"):
        g.float_tensor("t.q8_0")


def test_the_tests_writer_writes_llama_cpps_bytes():
    assert gw.gguf_bytes(TINY_METADATA, TINY_TENSORS, alignment=64) == TINY.read_bytes()


def test_every_value_type_round_trips(tmp_path):
    metadata = [
        gw.u8("a.u8", 255), gw.i8("a.i8", -128), gw.u16("a.u16", 65535), gw.i16("a.i16", -32768),
        gw.u32("a.u32", 2**32 - 1), gw.i32("a.i32", -2**31), gw.f32("a.f32", -0.0), gw.boolean("a.bool", False),
        gw.string("a.str", ""), gw.u64("a.u64", 2**64 - 1), gw.i64("a.i64", 2**63 - 1), gw.f64("a.f64", math.inf),
        gw.string("a.not_utf8", b"\xff\xfe"),
    ] + [gw.array(f"arr.{t}", t, [1, 0]) for t in (gw.UINT8, gw.INT8, gw.UINT16, gw.INT16, gw.UINT32, gw.INT32,
                                                    gw.UINT64, gw.INT64, gw.BOOL)] + [
        gw.array("arr.f32", gw.FLOAT32, [1.5, -2.0]), gw.array("arr.f64", gw.FLOAT64, [1e300]),
        gw.array("arr.empty", gw.INT32, []), gw.array("arr.str", gw.STRING, ["x", "", "ü"]),
    ]
    path = gw.write_gguf(tmp_path / "all.gguf", metadata, [gw.float_tensor("w", np.ones((2, 2)), gw.BF16)])
    g = ex.read_gguf_file(str(path))
    assert g.alignment == 32 and g.version == 3
    for key, value_type, value in metadata:
        assert g.value_types[key] == value_type
    assert g.metadata["a.u64"] == 2**64 - 1 and g.metadata["a.i8"] == -128 and g.metadata["a.bool"] is False
    assert g.metadata["a.f64"] == math.inf and math.copysign(1, g.metadata["a.f32"]) == -1
    # a string value that is not UTF-8 keeps its bytes (as surrogates)
    assert g.metadata["a.not_utf8"].encode("utf-8", "surrogateescape") == b"\xff\xfe"
    assert g.metadata["arr.10"].dtype == np.dtype("<u8") and g.metadata["arr.10"].tolist() == [1, 0]
    assert g.metadata["arr.7"].dtype == np.bool_ and g.metadata["arr.7"].tolist() == [True, False]
    assert g.metadata["arr.f64"].tolist() == [1e300] and g.metadata["arr.empty"].size == 0
    assert g.metadata["arr.str"] == ["x", "", "ü"]
    assert g.float_tensor("w").dtype == np.uint16 and (g.float_tensor("w") == 0x3F80).all()


def test_version_2_reads_as_3(tmp_path):
    path = gw.write_gguf(tmp_path / "v2.gguf", TINY_METADATA[:1], TINY_TENSORS[:1], version=2)
    assert ex.read_gguf_file(str(path)).version == 2


def test_gaps_between_tensors_are_allowed_and_offsets_need_not_follow_file_order(tmp_path):
    tensors = [gw.float_tensor("a", np.ones(8)), gw.float_tensor("b", np.zeros(8))]
    path = tmp_path / "gaps.gguf"
    path.write_bytes(gw.gguf_bytes([], tensors, offsets=[64, 0]) + bytes(64))  # the writer puts a's data at 0
    g = ex.read_gguf_file(str(path))
    assert g.tensors["a"].offset == g.data_start + 64 and g.tensors["b"].offset == g.data_start
    assert g.float_tensor("b").tolist() == [1.0] * 8 and g.float_tensor("a").tolist() == [0.0] * 8


def test_every_ggml_type_of_docs_gguf_md_has_its_block_size():
    # docs/gguf.md's table of types run reads, and the names the others are refused by
    assert ex.GGML_BLOCK_SIZES["F32"] == (1, 4) and ex.GGML_BLOCK_SIZES["BF16"] == (1, 2)
    assert ex.GGML_BLOCK_SIZES["Q8_0"] == (32, 34) and ex.GGML_BLOCK_SIZES["Q4_0"] == (32, 18)
    assert ex.GGML_BLOCK_SIZES["Q4_K"] == (256, 144) and ex.GGML_BLOCK_SIZES["Q6_K"] == (256, 210)
    assert ex.GGML_BLOCK_SIZES["Q5_K"] == (256, 176) and ex.GGML_BLOCK_SIZES["Q5_1"] == (32, 24)
    known = set(ex.GGML_TYPES) | set(ex.GGML_REMOVED_TYPES)
    assert known == set(range(43)), "ids 0..42 each a type or a removed one"
    for type_id in (9, 10, 11, 15, 24, 28, 29, 34, 35, 39):  # docs/gguf.md's "other ids"
        assert type_id in ex.GGML_TYPES


@pytest.mark.parametrize("name, ggml_type, ne", [("q4k", gw.Q4_K, (256, 3)), ("q6k", gw.Q6_K, (512,)),
                                                 ("q4_0", gw.Q4_0, (64, 2, 2))])
def test_quantized_tensor_sizes(tmp_path, name, ggml_type, ne):
    data = bytes(gw.tensor_nbytes(ggml_type, ne))
    g = ex.read_gguf_file(str(gw.write_gguf(tmp_path / "q.gguf", [], [(name, ggml_type, ne, data)])))
    assert g.tensors[name].nbytes == len(data) and g.tensors[name].shape == tuple(reversed(ne))


# ----------------------------------------------------------------------------
# Bad input, through the command line


def good_tensors():
    return [gw.float_tensor("blk.0.attn_q.weight", np.ones((2, 4))), ("q", gw.Q8_0, (32,), bytes(34))]


def header(version=3, n_tensors=0, n_kv=1):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def key_bytes(key):
    return struct.pack("<Q", len(key)) + key


def with_metadata(*items, **kw):
    return lambda: gw.gguf_bytes(list(items), **kw)


def with_tensors(*tensors, metadata=(), **kw):
    return lambda: gw.gguf_bytes(list(metadata), list(tensors), **kw)


def truncated(build, size):
    return lambda: build()[:size]


def kv_end(*items):
    """Where the key-value pairs end (the writer pads after them to the alignment)."""
    return 24 + sum(len(gw.encode_string(k) + gw.encode_type(t) + gw.encode_value(t, v)) for k, t, v in items)


def cut_in_metadata(*items, before_end):
    return lambda: gw.gguf_bytes(list(items))[:kv_end(*items) - before_end]


ARCH = gw.string("general.architecture", "llama")
TENSOR_INFO_AT = 24 + 8 + len("general.architecture") + 4 + 8 + len("llama")  # after ARCH


def edit(build, at, fmt, value):
    def edited():
        data = bytearray(build())
        struct.pack_into(fmt, data, at, value)
        return bytes(data)
    return edited


BAD = [
    # header
    ("version-1", lambda: header(version=1), "GGUF version 1 (32-bit counts) is not supported"),
    ("version-4", lambda: header(version=4), "GGUF version 4 is not supported (only 2 and 3)"),
    ("big-endian", lambda: b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "a big-endian GGUF file"),
    ("truncated-in-the-version", lambda: b"GGUF\x03\x00", "the version (4 bytes at byte 4) runs past the end"),
    ("truncated-in-the-counts", lambda: header()[:20], "the key-value count (8 bytes at byte 16) runs past the end"),
    ("kv-count-near-2-64", lambda: header(n_kv=BIG), f"{BIG} key-value pairs cannot fit in the 0 bytes left"),
    ("tensor-count-near-2-64", with_metadata(ARCH, n_tensors=BIG), f"{BIG} tensor infos cannot fit"),
    ("kv-count-one-too-many", lambda: header(n_kv=2) + key_bytes(b"a.b") + struct.pack("<IB", gw.UINT8, 7),
     "key 1's length (8 bytes at byte 40) runs past the end of the file (40 bytes)"),
    # keys
    ("key-length-near-2-64", lambda: header() + struct.pack("<Q", BIG) + b"x" * 64,
     f"key 0 has {BIG} bytes; at most 65535"),
    ("key-past-the-end", lambda: header() + key_bytes(b"general.name")[:-3], "key 0 (12 bytes at byte 32) runs past"),
    ("key-empty", lambda: header() + key_bytes(b"") + bytes(20), "key 0 is empty"),
    ("key-not-utf8", lambda: header() + key_bytes(b"general.\xffname") + bytes(20), "key 0 is not valid UTF-8"),
    ("key-too-long", with_metadata(gw.u8("k" * 65536, 1)), "key 0 has 65536 bytes; at most 65535"),
    ("key-twice", with_metadata(ARCH, gw.u32("a.b", 1), gw.u8("a.b", 2)), "key a.b appears twice"),
    # values
    ("value-type-unknown", with_metadata(ARCH, ("a.b", 13, b"\0" * 8), raw_metadata=True),
     "key a.b: unknown value type 13"),
    ("value-truncated", cut_in_metadata(ARCH, gw.u64("a.b", 1), before_end=3),
     "key a.b: the UINT64 value (8 bytes at byte 84) runs past the end of the file (89 bytes)"),
    ("value-type-truncated", cut_in_metadata(ARCH, gw.u64("a.b", 1), before_end=9), "key a.b: the value type"),
    ("string-length-near-2-64", with_metadata(ARCH, ("general.name", gw.STRING, struct.pack("<Q", BIG) + b"ab"),
                                              raw_metadata=True),
     f"key general.name: the string ({BIG} bytes at byte"),
    ("string-past-the-end", cut_in_metadata(ARCH, gw.string("general.name", "a model"), before_end=1),
     "key general.name: the string (7 bytes at byte"),
    ("bool-not-0-or-1", with_metadata(ARCH, ("a.flag", gw.BOOL, 2)), "key a.flag: the BOOL value is 2, not 0 or 1"),
    ("array-element-type-unknown", with_metadata(ARCH, ("a.arr", (gw.ARRAY, 13), b"\x0d\0\0\0" + bytes(8)),
                                                 raw_metadata=True),
     "key a.arr: unknown array element type 13"),
    ("array-of-arrays", with_metadata(ARCH, ("a.arr", (gw.ARRAY, gw.ARRAY), b"\x09\0\0\0" + bytes(8)),
                                      raw_metadata=True),
     "key a.arr: an array of arrays (nested arrays are not read"),
    ("array-count-near-2-64", with_metadata(ARCH, ("a.arr", (gw.ARRAY, gw.UINT32),
                                                   struct.pack("<IQ", gw.UINT32, BIG) + bytes(8)), raw_metadata=True),
     f"key a.arr: an array of {BIG} UINT32"),
    ("array-count-half-2-64", with_metadata(ARCH, ("a.arr", (gw.ARRAY, gw.UINT64),
                                                   struct.pack("<IQ", gw.UINT64, 2**61) + bytes(8)),
                                            raw_metadata=True),
     f"key a.arr: an array of {2**61} UINT64 ({2**64} bytes"),
    ("string-array-count-near-2-64", with_metadata(ARCH, ("tokenizer.ggml.tokens", (gw.ARRAY, gw.STRING),
                                                          struct.pack("<IQ", gw.STRING, BIG) + bytes(8)),
                                                   raw_metadata=True),
     f"key tokenizer.ggml.tokens: {BIG} strings cannot fit"),
    ("string-array-element-past-the-end", cut_in_metadata(ARCH, gw.array("tokenizer.ggml.tokens", gw.STRING,
                                                                         ["a", "bcd"]), before_end=1),
     "key tokenizer.ggml.tokens[1]: the string (3 bytes"),
    ("bool-array-element-2", with_metadata(ARCH, ("a.flags", (gw.ARRAY, gw.BOOL), [1, 0, 2])),
     "key a.flags[2]: the BOOL value is 2"),
    # general.alignment
    ("alignment-an-int32", with_metadata(ARCH, gw.i32("general.alignment", 32)),
     "key general.alignment is a INT32; GGUF stores it as a UINT32"),
    ("alignment-an-array", with_metadata(ARCH, gw.array("general.alignment", gw.UINT32, [32])),
     "key general.alignment is an ARRAY"),
    ("alignment-zero", with_metadata(ARCH, gw.u32("general.alignment", 0)),
     "key general.alignment is 0; it must be a power of two"),
    ("alignment-48", with_metadata(ARCH, gw.u32("general.alignment", 48)),
     "key general.alignment is 48; it must be a power of two"),
    # tensor infos
    ("tensor-name-empty", with_tensors(gw.float_tensor("", [1.0]), metadata=[ARCH]), "tensor 0's name is empty"),
    ("tensor-name-64-bytes", with_tensors(gw.float_tensor("t" * 64, [1.0]), metadata=[ARCH]),
     "tensor 0's name has 64 bytes; at most 63"),
    ("tensor-name-not-utf8", edit(with_tensors(gw.float_tensor("tok", [1.0]), metadata=[ARCH]),
                                  TENSOR_INFO_AT + 8, "<B", 0xC3), "tensor 0's name is not valid UTF-8"),
    ("tensor-name-length-near-2-64", edit(with_tensors(gw.float_tensor("tok", [1.0]), metadata=[ARCH]),
                                          TENSOR_INFO_AT, "<Q", BIG), f"tensor 0's name has {BIG} bytes"),
    ("tensor-twice", with_tensors(gw.float_tensor("w", [1.0]), gw.float_tensor("w", [2.0]), metadata=[ARCH]),
     "tensor w appears twice"),
    ("n-dims-0", with_tensors(("s", gw.F32, (), bytes(4)), metadata=[ARCH]),
     "tensor s: n_dims is 0; it must be in [1, 4]"),
    ("n-dims-5", with_tensors(("s", gw.F32, (1, 1, 1, 1, 1), bytes(4)), metadata=[ARCH]),
     "tensor s: n_dims is 5; it must be in [1, 4]"),
    ("dim-0", with_tensors(("s", gw.F32, (4, 0), b""), metadata=[ARCH]), "tensor s: ne [4, 0] has a dimension <= 0"),
    ("dim-negative", with_tensors(("s", gw.F32, (4, 2**64 - 2), b""), metadata=[ARCH]),
     "tensor s: ne [4, -2] has a dimension <= 0"),
    ("elements-overflow-int64", with_tensors(("s", gw.F32, (2**32, 2**31), b""), metadata=[ARCH]),
     f"tensor s: ne [{2**32}, {2**31}] holds {2**63} elements, more than 2**63 - 1"),
    ("bytes-far-past-the-end", with_tensors(("blk.0.attn_q.weight", gw.F32, (2**31, 2**31), b""), metadata=[ARCH]),
     f"tensor blk.0.attn_q.weight: data [128, {128 + 2**64}) is past the end of the file (128 bytes)"),
    ("ggml-type-unknown", with_tensors(("w", 99, (4,), bytes(16)), metadata=[ARCH]), "tensor w: unknown ggml type 99"),
    ("ggml-type-removed", with_tensors(("w", 4, (32,), bytes(32)), metadata=[ARCH]),
     "tensor w: ggml type 4 (Q4_2) was removed from ggml"),
    ("row-not-whole-blocks", with_tensors(("w", gw.Q8_0, (33, 2), bytes(68)), metadata=[ARCH]),
     "tensor w: its rows of 33 elements are not whole Q8_0 blocks of 32"),
    ("q4k-row-not-whole-blocks", with_tensors(("w", gw.Q4_K, (64,), bytes(144)), metadata=[ARCH]),
     "tensor w: its rows of 64 elements are not whole Q4_K blocks of 256"),
    ("offset-misaligned", with_tensors(*good_tensors(), metadata=[ARCH], offsets=[0, 48]),
     "tensor q: offset 48 is not a multiple of the alignment 32"),
    ("offset-misaligned-for-general-alignment", with_tensors(*good_tensors(), metadata=[
        ARCH, gw.u32("general.alignment", 64)], offsets=[0, 32], alignment=64),
     "tensor q: offset 32 is not a multiple of the alignment 64"),
    ("offset-near-2-64", with_tensors(*good_tensors(), metadata=[ARCH], offsets=[0, 2**64 - 32]),
     "tensor q: data ["),
    ("tensors-overlap", with_tensors(*good_tensors(), metadata=[ARCH], offsets=[0, 0]),
     "tensors blk.0.attn_q.weight and q overlap"),
    ("data-truncated", truncated(with_tensors(*good_tensors(), metadata=[ARCH]), -31),
     "tensor q: data [224, 258) is past the end of the file (257 bytes)"),
    ("tensor-info-truncated", truncated(with_tensors(*good_tensors(), metadata=[ARCH]), TENSOR_INFO_AT + 49),
     "tensor blk.0.attn_q.weight: the ggml type (4 bytes at byte"),
    ("tensor-dim-truncated", truncated(with_tensors(*good_tensors(), metadata=[ARCH]), TENSOR_INFO_AT + 43),
     "tensor blk.0.attn_q.weight: ne[1] (8 bytes at byte"),
]


@pytest.mark.parametrize("name, build, message", BAD, ids=[row[0] for row in BAD])
def test_bad_gguf_is_one_error_line(tmp_path, name, build, message):
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(build())
    out = tmp_path / "out.bin"
    r = run_export(path, out)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"export.py: error: {path}: "), r.stderr
    assert message in lines[0], (message, lines[0])
    assert not out.exists() and r.stdout == ""


def test_a_good_container_without_a_model_is_read_then_refused_for_the_model_it_lacks(tmp_path):
    """tiny.gguf is a valid container (read whole) whose llama metadata is not a model's: the
    refusal is the model mapping's, naming what is missing."""
    out = tmp_path / "out.bin"
    r = run_export(TINY, out)
    assert r.returncode == 1 and not out.exists()
    assert r.stderr == f"export.py: error: {TINY}: tensor token_embd.weight is missing\n"


def test_a_key_with_a_newline_stays_on_one_line(tmp_path):
    path = gw.write_gguf(tmp_path / "nl.gguf", [gw.u8("a\nb", 1), gw.u8("a\nb", 2)])
    with pytest.raises(ex.ExportError) as e:
        ex.read_gguf_file(str(path))
    assert "\n" not in str(e.value) and "key a\\nb appears twice" in str(e.value)


# ----------------------------------------------------------------------------
# Mutation fuzz: whatever the bytes, ExportError of one line or a file read


def fuzz_bases():
    """Small files with every part a mutant can break: keys of several types, string and number
    arrays, general.alignment, and tensors of 1 to 3 dims in F32, F16, BF16, Q8_0 and Q4_K."""
    tensors = [gw.float_tensor("token_embd.weight", np.arange(12).reshape(3, 4) / 8),
               gw.float_tensor("blk.0.attn_norm.weight", [1.0, 2.0], gw.F16),
               gw.float_tensor("blk.0.ffn_up.weight", np.ones((2, 1, 2)), gw.BF16),
               ("blk.0.attn_q.weight", gw.Q8_0, (32, 2), bytes(68)), ("output.weight", gw.Q4_K, (256,), bytes(144))]
    metadata = [ARCH, gw.u32("llama.block_count", 1), gw.f32("llama.rope.freq_base", 1e4),
                gw.boolean("tokenizer.ggml.add_bos_token", True),
                gw.array("tokenizer.ggml.tokens", gw.STRING, ["<unk>", "a", "bc"]),
                gw.array("tokenizer.ggml.scores", gw.FLOAT32, [0.0, -1.0, -2.0]),
                gw.array("tokenizer.ggml.token_type", gw.INT32, [2, 1, 1]), gw.i64("x.i64", -5)]
    return [gw.gguf_bytes(metadata, tensors),
            gw.gguf_bytes(metadata[:2] + [gw.u32("general.alignment", 64)], tensors[:2], alignment=64),
            gw.gguf_bytes([ARCH], tensors[3:], version=2)]


SPECIAL_U64 = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 32, 33, 63, 64, 255, 256, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
               2**61, 2**62, 2**63 - 1, 2**63, 2**64 - 32, 2**64 - 2, 2**64 - 1]
SPECIAL_U32 = [0, 1, 2, 4, 5, 8, 9, 12, 13, 30, 31, 39, 40, 99, 2**31, 2**32 - 1]


def mutants(seed, count):
    """count mutants of fuzz_bases(), deterministic for a seed: an 8-byte or 4-byte field anywhere
    in the header area set to a value near a limit, random bytes flipped, a cut, a byte inserted
    or removed."""
    rng = random.Random(seed)
    bases = fuzz_bases()
    ends = [data_start_of(b) for b in bases]
    for _ in range(count):
        i = rng.randrange(len(bases))
        data, end = bytearray(bases[i]), ends[i]
        kind = rng.randrange(6)
        at = rng.randrange(4, end)
        if kind == 0 and at + 8 <= len(data):
            struct.pack_into("<Q", data, at, rng.choice(SPECIAL_U64))
        elif kind == 1 and at + 4 <= len(data):
            struct.pack_into("<I", data, at, rng.choice(SPECIAL_U32))
        elif kind == 2:
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(4, end)] = rng.randrange(256)
        elif kind == 3:
            del data[rng.randrange(len(data)):]
        elif kind == 4:
            data.insert(at, rng.randrange(256))
        else:
            del data[at]
        yield bytes(data)


def data_start_of(data):
    """Where a good file's data section starts (its header, keys and tensor infos end before)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "base.gguf"
        path.write_bytes(data)
        return ex.read_gguf_file(str(path)).data_start


def read_mutant(path):
    """Read a mutant as the conversion would: metadata, and every tensor's bytes."""
    g = ex.read_gguf_file(str(path))
    for name, t in g.tensors.items():
        assert len(g.tensor_data(name)) == t.nbytes
        if t.type_name in ("F32", "F16", "BF16"):
            assert g.float_tensor(name).shape == t.shape
    return g


def check_mutant(path):
    """None if the reader read the file, else the ExportError's message; any other exception fails."""
    start = time.monotonic()
    tracemalloc.reset_peak()
    try:
        read_mutant(path)
        message = None
    except ex.ExportError as e:
        message = str(e)
        assert "\n" not in message and message.startswith(f"{path}: "), message
    assert tracemalloc.get_traced_memory()[1] < 20 * 2**20, "a big allocation"
    assert time.monotonic() - start < 2.0, "slow"
    return message


def test_every_base_reads():
    for data in fuzz_bases():
        assert data_start_of(data) > 0


def test_truncation_at_every_byte_of_the_header_area(tmp_path):
    path = tmp_path / "cut.gguf"
    for data in fuzz_bases():
        for size in range(4, data_start_of(data) + 1):
            path.write_bytes(data[:size])
            message = check_mutant_untraced(path)
            if size < data_start_of(data):
                assert message is not None, size
                assert "past the end of the file" in message or "cannot fit in the" in message, (size, message)


def check_mutant_untraced(path):
    try:
        read_mutant(path)
    except ex.ExportError as e:
        assert "\n" not in str(e)
        return str(e)
    return None


def test_seeded_mutants_are_read_or_refused_in_one_line(tmp_path):
    path = tmp_path / "mutant.gguf"
    refused = 0
    tracemalloc.start()
    try:
        for data in mutants(seed=52, count=600):
            path.write_bytes(data)
            refused += check_mutant(path) is not None
    finally:
        tracemalloc.stop()
    assert refused > 300, "most mutants break something"


def test_a_handful_of_mutants_through_the_command_line(tmp_path):
    seen = 0
    for n, data in enumerate(mutants(seed=53, count=40)):
        path = tmp_path / f"m{n}.gguf"
        path.write_bytes(data)
        if check_mutant_untraced(path) is None:
            continue
        r = run_export(path, tmp_path / "out.bin")
        assert r.returncode == 1 and "Traceback" not in r.stderr
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"export.py: error: {path}: "), r.stderr
        seen += 1
        if seen == 6:
            break
    assert seen == 6 and not (tmp_path / "out.bin").exists()


@pytest.mark.parametrize("fmt, value", [("<Q", 2**64 - 1), ("<Q", 2**63), ("<I", 2**32 - 1)])
def test_every_field_position_of_the_header_area_set_near_its_limit(tmp_path, fmt, value):
    # each count, length, type, n_dims, dim and offset of the bases meets the value at its own
    # position (and half-overlapping ones at the others)
    path = tmp_path / "field.gguf"
    for data in fuzz_bases():
        for at in range(4, data_start_of(data) - struct.calcsize(fmt) + 1):
            mutant = bytearray(data)
            struct.pack_into(fmt, mutant, at, value)
            path.write_bytes(mutant)
            check_mutant_untraced(path)
