"""export.py and GGUF's 4-bit, 5-bit and K-quant blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).

Compared against llama.cpp's own tools, whose outputs are stored (CI has no llama.cpp):

  * tests/data/gguf/'s block fixtures (made by llama-quantize from the llama2-f32 and llama256
    sources, README there) convert with every tensor's blocks copied byte for byte, and the
    type table (weight_type 4) gives each piece the code of its GGUF type;
  * what export.py widens the converted file to (--dtype f32) is, tensor by tensor, the float32
    that llama-quantize's F32 "requantization" (its dequantize_row_*) wrote: the sha256 per tensor
    in tests/data/gguf/dequantized_sha256.json (gguf_fixtures.py --dequantized remakes it);
  * --dtype q4_0 from the llama256 Hugging Face directory gives, for every tensor llama-quantize
    made Q4_0 in llama256-Q4_0.gguf (from the same float32 weights), the same bytes;
  * quantize_row_q4_0_ref's rounding corners, against a line-by-line transcription of the C here.

Then the refusals (a block tensor whose size disagrees with its shape, rows that are not whole
blocks, a non-finite d / dmin / m), each one line and exit 1, and write_rope's Blocks of the new
kinds (the API tests/test_block_types.py builds run-level files with). Nothing here runs run: run.c
reads these types in another change (tests/test_block_types.py).
"""
import hashlib
import json
import math
import struct

import numpy as np
import pytest

import conftest
import gguf_fixtures as GF
import gguf_writer as W
from conftest import ROOT

DATA = ROOT / "tests" / "data" / "gguf"
DIGESTS = json.loads((DATA / "dequantized_sha256.json").read_text())
# the ROPE weight_type codes (docs/format.md) of the GGUF types
CODES = {"F32": 0, "BF16": 1, "F16": 2, "Q8_0": 3, "Q4_0": 5, "Q4_1": 6, "Q5_0": 7, "Q5_1": 8, "Q4_K": 9,
         "Q5_K": 10, "Q6_K": 11}
# ROPE code: (weights, bytes) per block (docs/format.md; 1 weight for the float types)
SIZES = {0: (1, 4), 1: (1, 2), 2: (1, 2), 3: (32, 34), 5: (32, 18), 6: (32, 20), 7: (32, 22), 8: (32, 24),
         9: (256, 144), 10: (256, 176), 11: (256, 210)}
# ROPE tensor -> GGUF tensor name, for these Llama files ({i}: the layer)
GGUF_NAMES = {"token_embedding": "token_embd.weight", "wq": "blk.{i}.attn_q.weight", "wk": "blk.{i}.attn_k.weight",
              "wv": "blk.{i}.attn_v.weight", "wo": "blk.{i}.attn_output.weight", "w1": "blk.{i}.ffn_gate.weight",
              "w2": "blk.{i}.ffn_down.weight", "w3": "blk.{i}.ffn_up.weight", "wcls": "output.weight"}
MATRICES = set(GGUF_NAMES)


def ex():
    return conftest.load_export()


def convert(src, out, *flags, check=True):
    return conftest.export(src, out, *flags, check=check)


def llama_layout(path):
    """(header fields, [(ROPE name, layer or None, shape, code, offset)]) of a Llama ROPE file, read
    by docs/format.md: the tensors in order, float32 back to back (version 1) or each at a multiple
    of 64 bytes, the matrices in weight_type or (weight_type 4) each layer's piece at its own
    multiple of 64 with its type table entry (version 2)."""
    data = path.read_bytes()
    version, dim, hidden, layers, heads, kv_heads, vocab, seq, shared = struct.unpack_from("<9i", data, 4)
    assert version in (1, 2)
    weight_type = struct.unpack_from("<i", data, 88)[0] if version == 2 else 0
    table_at, table_bytes = struct.unpack_from("<2Q", data, 216)
    table = list(data[table_at:table_at + table_bytes]) if weight_type == 4 else None
    hd = dim // heads
    shapes = [("token_embedding", (vocab, dim)), ("rms_att", (layers, dim)), ("wq", (layers, dim, dim)),
              ("wk", (layers, kv_heads * hd, dim)), ("wv", (layers, kv_heads * hd, dim)), ("wo", (layers, dim, dim)),
              ("rms_ffn", (layers, dim)), ("w1", (layers, hidden, dim)), ("w2", (layers, dim, hidden)),
              ("w3", (layers, hidden, dim)), ("rms_final", (dim,))] + ([] if shared else [("wcls", (vocab, dim))])
    out, at = [], 256
    for name, shape in shapes:
        pieces = [(None, shape)]
        if table is not None and name in MATRICES and len(shape) == 3:
            pieces = [(l, shape[1:]) for l in range(layers)]
        for layer, piece_shape in pieces:
            code = (table.pop(0) if table is not None else weight_type) if name in MATRICES else 0
            at += -at % 64 if version == 2 else 0
            out.append((name, layer, piece_shape, code, at))
            weights, nbytes = SIZES[code]
            at += math.prod(piece_shape) // weights * nbytes
    assert table is None or not table
    return dict(weight_type=weight_type, layers=layers, data=data), out


def f32_tensors(path):
    """{GGUF name: float32 array} of the matrices of a float32 Llama ROPE file."""
    header, layout = llama_layout(path)
    assert header["weight_type"] == 0
    out = {}
    for name, layer, shape, code, at in layout:
        if name in MATRICES:
            a = np.frombuffer(header["data"], "<f4", math.prod(shape), at).reshape(shape)
            for l in range(shape[0]) if len(shape) == 3 else [None]:
                out[GGUF_NAMES[name].format(i=l)] = a[l] if l is not None else a
    return out


# ---------------------------------------------------------------------------------------------
# The fixtures: blocks copied, and widened as llama.cpp widens them


@pytest.mark.parametrize("name", GF.DEQUANTIZED)
def test_block_gguf_converts_with_each_tensors_blocks_copied_and_typed_in_the_type_table(name, tmp_path):
    out = tmp_path / "out.bin"
    convert(DATA / name, out)
    g = ex().read_gguf_file(str(DATA / name))
    header, layout = llama_layout(out)
    assert header["weight_type"] == 4  # every fixture mixes types (Q6_K or Q8_0 beside the rest)
    seen = set()
    for rope_name, layer, shape, code, at in layout:
        if rope_name not in MATRICES:
            continue
        gguf_name = GGUF_NAMES[rope_name].format(i=layer)
        t = g.tensors[gguf_name]
        assert code == CODES[t.type_name], (gguf_name, code, t.type_name)
        stored = bytes(g.tensor_data(gguf_name))
        assert header["data"][at:at + len(stored)] == stored, gguf_name  # byte for byte, never requantized
        seen.add(t.type_name)
    assert seen - {"Q8_0", "Q6_K"}, seen  # the fixture's own block type is among them


@pytest.mark.parametrize("name", GF.DEQUANTIZED)
def test_block_gguf_widens_to_llama_cpps_own_dequantization_bit_for_bit(name, tmp_path):
    """export.py GGUF -> ROPE with a type table -> --dtype f32: every block tensor's float32 values
    are the ones llama-quantize's F32 output holds (their sha256)."""
    out, wide = tmp_path / "out.bin", tmp_path / "wide.bin"
    convert(DATA / name, out)
    convert(out, wide, "--dtype", "f32")
    tensors = f32_tensors(wide)
    expected = DIGESTS[name]
    assert expected
    assert sorted(expected) == sorted(tensors)  # every matrix is of a block type in these files
    for gguf_name, digest in expected.items():
        got = hashlib.sha256(np.ascontiguousarray(tensors[gguf_name], "<f4").tobytes()).hexdigest()
        assert got == digest, (name, gguf_name)


def test_a_block_gguf_converted_again_from_its_rope_file_is_the_same_file(tmp_path):
    """A ROPE file with Q4_K and Q6_K pieces read back and written again (no --dtype): each piece's
    blocks are kept, never widened or requantized."""
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    convert(DATA / "llama256-Q4_K_M.gguf", a)
    convert(a, b)
    assert a.read_bytes() == b.read_bytes()


# ---------------------------------------------------------------------------------------------
# --dtype q4_0: llama.cpp's quantize_row_q4_0_ref


def test_dtype_q4_0_from_hugging_face_is_llama_quantizes_q4_0_byte_for_byte(tmp_path):
    """llama256-Q4_0.gguf is llama-quantize's Q4_0 of the float32 GGUF of the llama256 directory
    (no imatrix: quantize_row_q4_0_ref); its q/k rows are in adjacent pairs, as export.py writes
    them. Every tensor it made Q4_0 is, byte for byte, what --dtype q4_0 writes (its token_embd is
    Q6_K, llama-quantize's choice for a tied output, and is not compared)."""
    hf = GF.hf_dir("llama256", tmp_path / "hf")
    out = tmp_path / "q4.bin"
    r = convert(hf, out, "--dtype", "q4_0")
    assert "q4_0" in r.stderr and "quantize_row_q4_0_ref" in r.stderr, r.stderr
    header, layout = llama_layout(out)
    assert header["weight_type"] == 5
    g = ex().read_gguf_file(str(DATA / "llama256-Q4_0.gguf"))
    compared = 0
    for rope_name, _, shape, code, at in layout:
        if rope_name not in MATRICES:
            continue
        assert code == 5
        for l in range(shape[0]) if len(shape) == 3 else [None]:
            gguf_name = GGUF_NAMES[rope_name].format(i=l)
            t = g.tensors[gguf_name]
            if t.type_name != "Q4_0":
                continue
            stored = bytes(g.tensor_data(gguf_name))
            start = at + (l or 0) * len(stored)
            assert header["data"][start:start + len(stored)] == stored, gguf_name
            compared += 1
    assert compared == 14


def test_dtype_q4_0_of_a_qwen2_gguf_is_what_its_hugging_face_directory_quantizes_to(tmp_path):
    """qwen2-Q4_0.gguf keeps attn_q / attn_k rows in Hugging Face's halves: export.py permutes them
    into adjacent pairs by whole rows of blocks (rows are independent), which is what quantizing the
    directory's permuted rows gives, byte for byte. Its token_embd is Q8_0 (llama-quantize's
    fallback), widened and quantized here, so it is left out."""
    hf = GF.hf_dir("qwen2", tmp_path / "hf")
    a, b = tmp_path / "gguf.bin", tmp_path / "hf.bin"
    convert(DATA / "qwen2-Q4_0.gguf", a, "--dtype", "q4_0")
    convert(hf, b, "--dtype", "q4_0")
    _, from_gguf, weight_type, _ = ex().read_flat_checkpoint(str(a))
    _, from_hf, _, _ = ex().read_flat_checkpoint(str(b))
    assert weight_type == "q4_0"
    for name in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
        assert from_gguf[name].kind == "q4_0"
        assert bytes(from_gguf[name].data) == bytes(from_hf[name].data), name
    assert bytes(from_gguf["token_embedding"].data) != bytes(from_hf["token_embedding"].data)
    # without --dtype: a type table, the Q8_0 embedding and the Q4_0 pieces as stored
    plain = tmp_path / "plain.bin"
    convert(DATA / "qwen2-Q4_0.gguf", plain)
    _, kept, weight_type, _ = ex().read_flat_checkpoint(str(plain))
    assert weight_type is None and kept["token_embedding"].kind == "q8_0"
    assert b"".join(bytes(p.data) for p in kept["wk"]) == bytes(from_hf["wk"].data)


def quantize_row_q4_0_ref(x):
    """ggml-quants.c's quantize_row_q4_0_ref, line by line, for one block: float32 arithmetic as
    the C does it (numpy float32 scalars), (int8_t) as truncation toward zero."""
    x = [np.float32(v) for v in x]
    amax, mx = np.float32(0), np.float32(0)
    for v in x:
        if amax < abs(v):
            amax, mx = abs(v), v
    d = np.float32(mx / np.float32(-8))
    idd = np.float32(np.float32(1) / d) if d else np.float32(0)
    qs = bytearray(16)
    for j in range(16):
        x0 = np.float32(x[j] * idd)
        x1 = np.float32(x[16 + j] * idd)
        xi0 = min(15, int(np.trunc(np.float32(x0 + np.float32(8.5)))))
        xi1 = min(15, int(np.trunc(np.float32(x1 + np.float32(8.5)))))
        qs[j] = xi0 | (xi1 << 4)
    return np.float16(d).tobytes() + bytes(qs)


def q4_0_to_f32(block):
    """dequantize_row_q4_0 of one 18-byte block: (nibble - 8) * d."""
    d = np.frombuffer(block[:2], "<f2")[0].astype(np.float32)
    qs = np.frombuffer(block[2:], np.uint8)
    return np.concatenate([(qs & 0xF).astype(np.float32) - 8, (qs >> 4).astype(np.float32) - 8]) * d


def test_quantize_row_q4_0_ref_transcription_rounds_as_the_c_does():
    """The cases the C's arithmetic decides: a block of zeros (max 0.0, d = 0.0 / -8 = -0.0, id 0),
    x * id + 8.5f exactly on a whole number (truncation, not rounding), the MIN(15, ...) clamp (the
    largest magnitude's opposite), the first of two equal magnitudes giving the sign, and a d that
    f16 rounds (id is from the unrounded d)."""
    quantize = ex().quantize_q4_0
    zeros = quantize(np.zeros(32, np.float32)).tobytes()
    assert zeros == quantize_row_q4_0_ref(np.zeros(32)) == b"\x00\x80" + b"\x88" * 16  # d = -0.0
    ramp = np.zeros(32, np.float32)
    ramp[:6] = [-8.0, 8.0, 0.5, -0.5, 1.5, -1.5]  # max -8: d 1, id 1; 8 -> 16.5 -> 16 -> 15
    b = quantize(ramp).tobytes()
    assert b == quantize_row_q4_0_ref(ramp)
    assert np.frombuffer(b[:2], "<f2")[0] == 1.0
    assert [v & 0xF for v in b[2:8]] == [0, 15, 9, 8, 10, 7]
    flipped = -ramp  # max +8 first: d -1; -8 -> 16.5 -> 15
    assert quantize(flipped).tobytes() == quantize_row_q4_0_ref(flipped)
    assert [v & 0xF for v in quantize(flipped).tobytes()[2:4]] == [0, 15]
    third = np.full(32, 1 / 3, np.float32)  # d = -1/24: not an f16; id = -24 from the float32 d
    b = quantize(third).tobytes()
    d = np.float32(np.float32(1 / 3) / np.float32(-8))
    assert b == quantize_row_q4_0_ref(third) and np.frombuffer(b[:2], "<f2")[0] == np.float16(d) != d
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((200, 32)) * rng.uniform(1e-4, 10, (200, 1))).astype(np.float32)
    x[::7, 3] = 0
    x[::5, 9] = -np.abs(x[::5]).max(axis=1)  # a tie of magnitudes with another weight of the block
    x[::5, 11] = -x[::5, 9]
    ours = quantize(x.reshape(-1)).tobytes()
    assert ours == b"".join(quantize_row_q4_0_ref(row) for row in x)
    blocks = ex().BLOCK_KINDS["q4_0"].storage
    assert np.array_equal(ex().dequantize("q4_0", np.frombuffer(ours, blocks)),
                          np.concatenate([q4_0_to_f32(ours[18 * i:18 * i + 18]) for i in range(200)]))


def test_dtype_q4_0_round_trips_through_its_dequantized_float32(tmp_path):
    """q4_0 -> f32 holds (q - 8) * d; a q4_0 file exported again keeps its blocks, and its float32
    quantized again to q4_0 gives the same blocks."""
    hf = GF.hf_dir("llama2-f32", tmp_path / "hf")
    q4, wide, kept, again = (tmp_path / n for n in ("q4.bin", "wide.bin", "kept.bin", "again.bin"))
    convert(hf, q4, "--dtype", "q4_0")
    convert(q4, wide, "--dtype", "f32")
    convert(q4, kept)
    convert(wide, again, "--dtype", "q4_0")
    assert kept.read_bytes() == q4.read_bytes()
    assert again.read_bytes() == q4.read_bytes()
    header, layout = llama_layout(q4)
    wide_tensors = f32_tensors(wide)
    for name, _, shape, code, at in layout:
        if name == "w2":
            blocks = header["data"][at:at + math.prod(shape) // 32 * 18]
            values = np.concatenate([q4_0_to_f32(blocks[i:i + 18]) for i in range(0, len(blocks), 18)])
            got = np.concatenate([wide_tensors[f"blk.{l}.ffn_down.weight"].reshape(-1) for l in range(shape[0])])
            assert np.array_equal(values, got)


def test_dtype_q4_0_refuses_rows_that_are_not_whole_blocks(tmp_path):
    import hf_fixture
    hf_fixture.make_hf_checkpoint(tmp_path / "m", dtype="F32", hidden_dim=100, vocab_size=512, seed=5)
    r = convert(tmp_path / "m", tmp_path / "out.bin", "--dtype", "q4_0", check=False)
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("export.py: error:"), lines
    assert "--dtype q4_0" in lines[0] and "multiple of 32" in lines[0] and "hidden_dim is 100" in lines[0], lines
    assert not (tmp_path / "out.bin").exists()


# ---------------------------------------------------------------------------------------------
# Bad block tensors: one line, exit 1, no file


def rewritten(tmp_path, src, edit):
    """DATA/src with its tensors passed through edit([(name, type, ne, bytes)])."""
    g = ex().read_gguf_file(str(DATA / src))
    metadata = W.metadata_entries(g)
    tensors = [(t.name, t.ggml_type, t.ne, bytes(g.tensor_data(t.name))) for t in g.tensors.values()]
    return W.write_gguf(tmp_path / "bad.gguf", metadata, edit(tensors))


def poke(name, at, value):
    """An edit: the f16 `value` written at byte `at` of tensor `name`."""
    def edit(tensors):
        out = []
        for n, ty, ne, data in tensors:
            if n == name:
                data = bytearray(data)
                data[at:at + 2] = np.float16(value).tobytes()
                data = bytes(data)
            out.append((n, ty, ne, data))
        return out
    return edit


def reshaped(name, ne):
    return lambda tensors: [(n, ty, ne if n == name else e, d) for n, ty, e, d in tensors]


BAD = [
    ("a Q4_K block's d is infinite", "llama256-Q4_K_M.gguf", poke("blk.0.attn_q.weight", 144 * 5, np.inf),
     ["blk.0.attn_q.weight", "scale of Q4_K block 5", "finite"]),
    ("a Q4_K block's dmin is NaN", "llama256-Q4_K_M.gguf", poke("blk.1.ffn_up.weight", 144 * 2 + 2, np.nan),
     ["blk.1.ffn_up.weight", "dmin scale of Q4_K block 2", "finite"]),
    ("a Q6_K block's d (its last 2 bytes) is NaN", "llama256-Q4_K_M.gguf", poke("token_embd.weight", 210 * 3 + 208, np.nan),
     ["token_embd.weight", "scale of Q6_K block 3"]),
    ("a Q4_1 block's m is infinite", "llama2-Q4_1.gguf", poke("blk.0.ffn_gate.weight", 20 * 7 + 2, -np.inf),
     ["blk.0.ffn_gate.weight", "m scale of Q4_1 block 7"]),
    ("a Q5_1 block's d is NaN", "llama2-Q5_1.gguf", poke("blk.1.attn_v.weight", 0, np.nan),
     ["blk.1.attn_v.weight", "scale of Q5_1 block 0"]),
    ("a Q5_0 block's d is infinite", "llama2-Q5_0.gguf", poke("blk.1.ffn_down.weight", 22, np.inf),
     ["blk.1.ffn_down.weight", "scale of Q5_0 block 1"]),
    ("a Q5_K block's dmin is NaN", "llama256-Q5_K_S.gguf", poke("blk.0.attn_k.weight", 176 + 2, np.nan),
     ["blk.0.attn_k.weight", "dmin scale of Q5_K block 1"]),
    ("a Q4_K tensor's shape wants more bytes than it has", "llama256-Q4_K_M.gguf",
     reshaped("blk.1.ffn_up.weight", (256, 512)), ["blk.1.ffn_up.weight"]),
    ("a Q4_0 tensor's shape wants more bytes than the next tensor leaves", "llama256-Q4_0.gguf",
     reshaped("blk.0.attn_k.weight", (256, 256)), ["blk.0.attn_k.weight", "overlap"]),
    ("a Q4_K tensor's rows are not whole blocks", "llama256-Q4_K_M.gguf",
     reshaped("blk.0.attn_q.weight", (128, 512)), ["blk.0.attn_q.weight", "Q4_K", "256"]),
    ("a Q5_0 tensor's rows are not whole blocks", "llama2-Q5_0.gguf",
     reshaped("blk.0.attn_q.weight", (48, 64)), ["blk.0.attn_q.weight", "Q5_0", "32"]),
    ("a type this format does not hold", "llama2-Q4_1.gguf",
     lambda ts: [(n, 20 if n == "blk.0.attn_q.weight" else ty, e, d[:len(d) * 18 // 20] if n == "blk.0.attn_q.weight"
                  else d) for n, ty, e, d in ts], ["blk.0.attn_q.weight", "IQ4_NL"]),
]


@pytest.mark.parametrize("what, src, edit, words", BAD, ids=[b[0] for b in BAD])
def test_bad_block_tensors_are_refused_in_one_line(what, src, edit, words, tmp_path):
    bad = rewritten(tmp_path, src, edit)
    out = tmp_path / "out.bin"
    conftest.assert_export_refused(convert(bad, out, check=False), out, *words)


def test_an_unedited_rewrite_of_each_block_fixture_converts_to_the_same_file(tmp_path):
    """The rewriting above changes nothing by itself: each refusal is its edit's."""
    for src in ("llama256-Q4_K_M.gguf", "llama2-Q4_1.gguf"):
        a, b = tmp_path / "a.bin", tmp_path / "b.bin"
        convert(DATA / src, a)
        convert(rewritten(tmp_path, src, lambda ts: ts), b)
        assert a.read_bytes() == b.read_bytes(), src


# ---------------------------------------------------------------------------------------------
# write_rope's Blocks of the new kinds


KINDS = ["q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]


def random_blocks(kind, n_blocks, rng):
    """n_blocks random blocks of kind with finite f16 scales (at the offsets docs/format.md gives)."""
    storage = ex().BLOCK_KINDS[kind].storage
    data = rng.integers(0, 256, n_blocks * storage.itemsize, dtype=np.uint8)
    scales = {"q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q4_k": [0, 2], "q5_k": [0, 2],
              "q6_k": [208]}[kind]
    blocks = data.reshape(n_blocks, storage.itemsize)
    for at in scales:
        blocks[:, at:at + 2] = np.frombuffer(rng.uniform(-0.1, 0.1, n_blocks).astype("<f2").tobytes(),
                                             np.uint8).reshape(n_blocks, 2)
    return data


def llama_config(dim=256, hidden=256):
    e = ex()
    return e.Config(dim, hidden, 2, 4, 2, 512, 64, False, 1e-5, 10000.0, 1.0, 1.0, 0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_write_rope_keeps_blocks_of_each_kind_and_reads_them_back(kind, tmp_path):
    """Blocks(kind, shape, data) pieces, weight_type None: with float32 norms only the matrices are
    blocks, all of one kind: the file is of that weight_type (its code), the blocks as given; read
    back (export.py a.bin b.bin) nothing changes; --dtype f32 holds export.py's dequantization.
    With one matrix in f32 instead, the file has a type table giving each piece its code."""
    e = ex()
    rng = np.random.default_rng(KINDS.index(kind))
    c = llama_config()
    per_block = e.BLOCK_KINDS[kind].weights
    tensors, given = {}, {}
    for name, shape in e.tensor_shapes(c):
        if name in MATRICES:
            rows = shape if len(shape) == 2 else shape[1:]
            pieces = [e.Blocks(kind, rows, random_blocks(kind, math.prod(rows) // per_block, rng), name)
                      for _ in range(1 if len(shape) == 2 else shape[0])]
            tensors[name] = pieces[0] if len(shape) == 2 else pieces
            given[name] = pieces
        else:
            tensors[name] = rng.standard_normal(shape).astype(np.float32)
    path = tmp_path / "a.bin"
    with open(path, "wb") as f:
        e.write_rope(f, c, tensors, str(path), weight_type=None)
    header, layout = llama_layout(path)
    assert header["weight_type"] == CODES[kind.upper()]
    for name, _, shape, code, at in layout:
        if name in MATRICES:
            data = b"".join(p.data.tobytes() for p in given[name])
            assert header["data"][at:at + len(data)] == data, name
    again, wide = tmp_path / "b.bin", tmp_path / "wide.bin"
    convert(path, again)
    assert again.read_bytes() == path.read_bytes()
    convert(path, wide, "--dtype", "f32")
    w = f32_tensors(wide)
    assert np.array_equal(w["blk.1.ffn_down.weight"], given["w2"][1].widened())
    # mixed: wo in float32, the rest blocks: a type table
    tensors["wo"] = [p.widened() for p in given["wo"]]
    mixed = tmp_path / "mixed.bin"
    with open(mixed, "wb") as f:
        e.write_rope(f, c, tensors, str(mixed), weight_type=None)
    header, layout = llama_layout(mixed)
    assert header["weight_type"] == 4
    assert {(name, code) for name, _, _, code, _ in layout if name in MATRICES} == {
        (name, 0 if name == "wo" else CODES[kind.upper()]) for name in MATRICES}
    c2, read, weight_type, _ = e.read_flat_checkpoint(str(mixed))
    assert weight_type is None
    assert read["w2"][1].kind == kind and bytes(read["w2"][1].data) == bytes(given["w2"][1].data)


@pytest.mark.parametrize("kind", ["q4_k", "q5_k", "q6_k"])
def test_k_quant_pieces_whose_rows_are_not_whole_256_weight_blocks_are_refused(kind):
    e = ex()
    with pytest.raises(e.ExportError, match=f"{kind} rows of 128 weights are not whole 256-weight blocks"):
        e.Blocks(kind, (2, 128), np.zeros(e.BLOCK_KINDS[kind].storage.itemsize, np.uint8), "t")
    c = llama_config(dim=128, hidden=256)  # dim 128: wq's rows are half a block
    tensors = {name: np.zeros(shape, np.float32) for name, shape in e.tensor_shapes(c)}
    tensors["w2"] = [e.Blocks(kind, (128, 256), np.zeros(128 * e.BLOCK_KINDS[kind].storage.itemsize, np.uint8),
                              "w2") for _ in range(2)]
    # wq given flat (whole blocks as given), but the file's pieces are rows of 128: run's rule per piece
    tensors["wq"] = e.Blocks(kind, (2 * 128 * 128,), np.zeros(128 * e.BLOCK_KINDS[kind].storage.itemsize, np.uint8),
                             "wq")
    with pytest.raises(e.ExportError, match=f"wq: piece 0 is {kind}, but its rows of 128 weights are not whole "
                                            "256-weight blocks"):
        import io
        e.write_rope(io.BytesIO(), c, tensors, "-", weight_type=None)


@pytest.mark.parametrize("kind", KINDS)
def test_a_non_finite_scale_of_a_block_piece_is_refused(kind):
    e = ex()
    rng = np.random.default_rng(3)
    data = random_blocks(kind, 2, rng)
    at = {"q6_k": 208}.get(kind, 0) + e.BLOCK_KINDS[kind].storage.itemsize
    data[at:at + 2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    piece = e.Blocks(kind, (e.BLOCK_KINDS[kind].weights * 2,), data, "w")
    with pytest.raises(e.ExportError, match=f"a {kind} scale is not finite"):
        e.check_piece_finite(piece, "w")
