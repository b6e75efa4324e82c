"""GGUF's 4-bit, 5-bit and K-quant blocks (type codes 5 q4_0, 6 q4_1, 7 q5_0, 8 q5_1, 9 q4_k,
10 q5_k, 11 q6_k): a file of each kind must compute, byte for byte in every mode, what the float32
file of its dequantized weights computes.

The reference is tests/block_reference.py, a NumPy dequantization written from llama.cpp's block
structs and dequantize_row_* (not from export.py or run.c). It is first checked against llama.cpp's
own dequantization (llama-quantize ... F32, whose float32 bytes are recorded as sha256 digests in
tests/data/gguf/block_reference_sha256.json and dequantized_sha256.json): every block tensor of the GGUF
fixtures (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), and blocks of every kind drawn from SHAKE-256 with
every kind of f16 scale.

Then run: random blocks of each kind in every matrix piece and the embedding, written by export.py's
write_rope (as Blocks, never requantized), against the float32 file of the reference's dequantized
weights written by tests/ropefile.py from the format's description; in every mode (generate greedy
and seeded, ppl and its CSV, inspect's CSV, chat), in the build under test, an AVX2 and a plain C
build, at 1 and 2 threads. Files mixing the kinds piece by piece (the type table), likewise and
under every forced decode reading order; RUN_PLAIN=1 against the kernels; the layouts; the llama256
GGUFs converted by export.py against the float32 GGUF of the reference's dequantization; and the
files run must refuse in one line (a d, m or dmin that is not finite, named; a size one block short
or long; type codes 4, 12 and 255; K-quant rows that are not whole 256-weight blocks).

What the comparisons can see: every printed digit of every mode (ppl's and inspect's CSVs carry 9),
so a wrong formula, bit, scale or block is seen, but one weight off by one ulp is not (checked: no
mode changes); the weights' exact bits are the reference's check against llama.cpp above.
"""
import hashlib
import io
import json
import math
import struct

import numpy as np
import pytest

import block_reference as R
import gguf_writer as W
import ropefile
from conftest import ROOT, TOK512, assert_run_refused, export, load_export, run
from test_weight_types import build_or_skip, stored_as

DATA = ROOT / "tests" / "data" / "gguf"
DIGESTS = json.loads((DATA / "block_reference_sha256.json").read_text())
GGUF_DIGESTS = json.loads((DATA / "dequantized_sha256.json").read_text())  # every block fixture's
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


@pytest.mark.parametrize("name", sorted(GGUF_DIGESTS))
def test_reference_dequantizes_every_block_fixture_as_llama_cpp_does(name):
    """dequantized_sha256.json (the digests of llama-quantize's F32 output of every GGUF fixture with
    blocks, recorded with export.py's GGUF tests): each tensor that is not F32."""
    g = EXPORT.read_gguf_file(str(DATA / name))
    recorded = GGUF_DIGESTS[name]
    assert sorted(recorded) == sorted(n for n, t in g.tensors.items() if t.type_name != "F32")
    for tensor_name, digest in recorded.items():
        t = g.tensors[tensor_name]
        values = R.dequantize_gguf(t.type_name, g.tensor_data(tensor_name), math.prod(t.shape))
        assert sha256(values.astype("<f4")) == digest, (tensor_name, t.type_name)


def test_the_block_fixtures_hold_every_kind():
    """So that the digests check the reference on blocks of llama.cpp's quantizers of every kind."""
    types = {t.type_name for name in GGUF_DIGESTS for t in EXPORT.read_gguf_file(str(DATA / name)).tensors.values()}
    assert types >= set(R.GGML_NAMES.values()), types


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


# ----------------------------------------------------------------------------
# run: a file of blocks computes what the float32 file of its dequantized weights computes.
# Every row is whole 256-weight blocks: dim 256 (four heads of 64, two key/value heads), hidden 512.

DIMS = dict(dim=256, hidden_dim=512, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, seq_len=128)
ORDER = ["token_embedding", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3", "rms_final", "wcls"]
SHARED = {"q4_1", "q5_1", "q5_k"}  # these kinds' files share the classifier with the embedding
PROMPT = "Once upon a time, a little fox found a shiny stone by the river"
TEXT = ("The girl ran to the park. She saw a big dog and a small cat. They played all day, and at night "
        "they went home happy. The next morning the sun was warm and the birds sang.")
MODES = ["generate-greedy", "generate-seeded", "ppl", "inspect", "chat"]
OTHER_KINDS = ["q8_0", "bf16", "f16", "f32"]


def outputs(binary, model, threads, mode, tmp_path, env=None):
    """stdout, the CSV and stderr (less the start-up and timing lines) of one mode, with tok512."""
    csv = tmp_path / f"{mode}.csv"
    args, stdin = {
        "generate-greedy": (["-t", 0, "-n", 48, "-v", "-p", PROMPT], None),
        "generate-seeded": (["-t", 1, "-s", 42, "-n", 48, "-v", "-p", PROMPT], None),
        "ppl": (["-m", "ppl", "-p", TEXT, "--csv", csv], None),
        "inspect": (["-m", "inspect", "-p", PROMPT, "--csv", csv], None),
        "chat": (["-m", "chat", "--template", "llama2", "-t", 0, "-n", 12, "-v", "-y", "Be brief.",
                  "-p", "Hello there"], "And then?\n"),
    }[mode]
    if csv.exists():
        csv.unlink()
    r = run(model, "-z", TOK512, "-T", threads, *args, input=stdin, binary=binary, timeout=300, env=env)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    stderr = [line for line in r.stderr.splitlines() if not line.startswith((b"run: ", b"timing:"))]
    return r.stdout, csv.read_bytes() if csv.exists() else b"", stderr


def assert_every_mode_equals(binary, blocks_file, wide, threads, tmp_path, label):
    """Every mode's output of the file of blocks equals the float32 file's, byte for byte."""
    for mode in MODES:
        reference = outputs(binary, wide, threads, mode, tmp_path)
        assert reference[0] or reference[1], f"{mode}: no output to compare"
        assert outputs(binary, blocks_file, threads, mode, tmp_path) == reference, \
            f"{label} {mode}: output differs from the float32 file's"


def source_model(d, shared, seed, dims=DIMS):
    """(export's Config, the float32 tensors) of a random Llama model of dims, through a float32 ROPE
    file written by ropefile.py (the pieces' shapes then come from export.matrix_piece_shapes)."""
    tensors = ropefile.random_weights(**{k: v for k, v in dims.items() if k != "seq_len"},
                                      shared_classifier=shared, seed=seed)
    src = ropefile.write_checkpoint(d / f"src-{seed}.bin", tensors, dict(dims, shared_classifier=shared))
    c, tensors, weight_type, _ = EXPORT.read_flat_checkpoint(str(src))
    assert weight_type == "f32"
    return c, tensors


def typed_model(c, tensors, choose, rng):
    """(tensors with each matrix piece a Blocks of the kind choose(name, piece index, shape) gives,
    the same tensors as the float32 weights they stand for). A block kind's piece is random blocks
    (block_reference.random_blocks, whole blocks along its rows) and its weights the reference's
    dequantization; q8_0, bf16, f16 and f32 pieces are the source's weights stored as that type by
    ropefile.py (test_weight_types.stored_as). A layered matrix is one Blocks per layer."""
    typed, wide = dict(tensors), dict(tensors)
    for name, shapes in EXPORT.matrix_piece_shapes(c).items():
        flat, at, pieces, parts = np.asarray(tensors[name], np.float32).reshape(-1), 0, [], []
        for i, shape in enumerate(shapes):
            n = math.prod(shape)
            kind = choose(name, i, shape) if n else "f32"
            if kind in R.KINDS:
                assert shape[-1] % R.BLOCK[kind][0] == 0, (name, shape, kind)
                data = R.random_blocks(kind, n // R.BLOCK[kind][0], rng)
                values = R.dequantize(kind, data, n)
            else:
                data, values = stored_as(kind, flat[at:at + n])
            pieces.append(EXPORT.Blocks(kind, shape, data, f"{name} {i}"))
            parts.append(values)
            at += n
        typed[name] = pieces[0] if name in EXPORT.WHOLE_MATRICES else pieces
        wide[name] = np.concatenate(parts).reshape(np.shape(tensors[name]))
    return typed, wide


def write_with(path, c, tensors, weight_type=None):
    with open(path, "wb") as f:
        EXPORT.write_rope(f, c, tensors, str(path), weight_type)
    return path


def write_wide(path, wide, shared):
    """The float32 version 1 file of the weights, by ropefile.py (the format's description)."""
    names = [n for n in ORDER if n != "wcls" or not shared]
    return ropefile.write_checkpoint(path, [(n, wide[n]) for n in names], dict(DIMS, shared_classifier=shared))


def cycling(kinds):
    """Each piece the next of kinds in turn."""
    counter = iter(range(10 ** 6))
    return lambda name, i, shape: kinds[next(counter) % len(kinds)]


@pytest.fixture(scope="module")
def kind_files(tmp_path_factory):
    """{kind: (file of that kind's blocks in every matrix piece and the embedding, written by
    write_rope with each piece's own type: a file of one type; the float32 file of the same weights)}."""
    d = tmp_path_factory.mktemp("block_kinds")
    out = {}
    for n, kind in enumerate(R.KINDS):
        shared = kind in SHARED
        c, tensors = source_model(d, shared, seed=30 + n)
        typed, wide = typed_model(c, tensors, lambda name, i, shape: kind, np.random.default_rng(40 + n))
        out[kind] = (write_with(d / f"{kind}.bin", c, typed), write_wide(d / f"{kind}-f32.bin", wide, shared))
    return out


@pytest.fixture(scope="module")
def mixed_files(tmp_path_factory):
    """{name: (file of pieces of every kind by turns, with its type table; the float32 file)}: "new"
    cycles through the seven block kinds, "all" through them (from q6_k) and q8_0, bf16, f16 and f32.
    (Their classifiers are their own: a mix's embedding as the classifier made a model that repeats
    one token.)"""
    d = tmp_path_factory.mktemp("block_mixed")
    out = {}
    for name, kinds, seed in (("new", R.KINDS, 50), ("all", R.KINDS[::-1] + OTHER_KINDS, 51)):
        shared = False
        c, tensors = source_model(d, shared, seed)
        typed, wide = typed_model(c, tensors, cycling(kinds), np.random.default_rng(seed))
        out[name] = (write_with(d / f"{name}.bin", c, typed), write_wide(d / f"{name}-f32.bin", wide, shared))
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("build", ["under-test", "avx2", "plain"])
@pytest.mark.parametrize("kind", R.KINDS)
def test_block_file_equals_float32_file_of_dequantized_weights_bitwise(kind_files, builds, kind, build, threads,
                                                                      tmp_path):
    binary = build_or_skip(builds, build)
    blocks_file, wide = kind_files[kind]
    assert_every_mode_equals(binary, blocks_file, wide, threads, tmp_path, f"{kind} {build} -T {threads}")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("build", ["under-test", "avx2", "plain"])
@pytest.mark.parametrize("name", ["new", "all"])
def test_mixed_block_file_equals_float32_file_of_dequantized_weights_bitwise(mixed_files, builds, name, build,
                                                                            threads, tmp_path):
    binary = build_or_skip(builds, build)
    blocks_file, wide = mixed_files[name]
    assert_every_mode_equals(binary, blocks_file, wide, threads, tmp_path, f"mixed {name} {build} -T {threads}")


@pytest.mark.parametrize("kind", R.KINDS)
def test_block_file_plain_loops_equal_the_fast_kernels(kind_files, kind, tmp_path):
    """RUN_PLAIN=1 (the plain loops only) against the build under test's kernels: ppl's CSV, greedy tokens."""
    blocks_file, _ = kind_files[kind]
    for mode in ("ppl", "generate-greedy"):
        assert outputs(None, blocks_file, 2, mode, tmp_path, env={"RUN_PLAIN": "1"}) == \
            outputs(None, blocks_file, 2, mode, tmp_path), (kind, mode)


@pytest.mark.parametrize("order", ["quarters-prefetch", "quarters", "adjacent", "rows"])
@pytest.mark.parametrize("name", ["new", "all"])
def test_every_decode_reading_order_of_a_mixed_file_equals_the_float32_file(mixed_files, name, order, tmp_path):
    """Each decode reading order forced (RUN_READ_ORDER; the float32 file read in its default order):
    generation greedy and seeded and ppl's CSV, at 1 and 2 threads (run.c's "Making it fast")."""
    blocks_file, wide = mixed_files[name]
    for threads in (1, 2):
        for mode in ("generate-greedy", "generate-seeded", "ppl"):
            assert outputs(None, blocks_file, threads, mode, tmp_path, env={"RUN_READ_ORDER": order}) == \
                outputs(None, wide, threads, mode, tmp_path), (name, order, threads, mode)


def test_the_models_generate_varied_text(kind_files, mixed_files, tmp_path):
    """The random blocks make models whose greedy tokens vary (the comparisons compare something)."""
    for name, (_, wide) in list(kind_files.items()) + list(mixed_files.items()):
        r = run(wide, "-z", TOK512, "-t", 0, "-n", 48, "-v", "-p", PROMPT)
        assert r.returncode == 0, r.stderr
        ids = [int(x) for x in [x for x in r.stderr.splitlines() if x.startswith(b"generated:")][0].split()[1:]]
        assert len(set(ids)) >= 5, (name, ids)


# ----------------------------------------------------------------------------
# The files' layout: header weight_type 5..11 for one kind, the type table's codes for a mix


def piece_bytes(code, n):
    """The bytes of n weights of a type code (docs/format.md)."""
    if code in (0,):
        return 4 * n
    if code in (1, 2):
        return 2 * n
    if code == 3:
        return n // 32 * 34
    weights, nbytes = R.BLOCK[R.KINDS[code - 5]]
    return n // weights * nbytes


def llama_pieces(shared):
    """[("m" or "n", weights)] of a DIMS Llama file in file order: matrix pieces and norms."""
    L, dim, hidden, vocab = DIMS["n_layers"], DIMS["dim"], DIMS["hidden_dim"], DIMS["vocab_size"]
    kv = DIMS["n_kv_heads"] * dim // DIMS["n_heads"]
    return ([("m", vocab * dim), ("n", L * dim)] + [("m", dim * dim)] * L + [("m", kv * dim)] * 2 * L +
            [("m", dim * dim)] * L + [("n", L * dim)] + [("m", hidden * dim)] * 3 * L + [("n", dim)] +
            ([] if shared else [("m", vocab * dim)]))


@pytest.mark.parametrize("kind", R.KINDS)
def test_file_of_one_kind_has_its_weight_type_and_is_its_blocks(kind_files, kind):
    """Header weight_type 5..11; every tensor at a multiple of 64 after the 256-byte header, each
    matrix (a layered one: its layers' pieces back to back) its whole blocks."""
    data = kind_files[kind][0].read_bytes()
    version, weight_type = struct.unpack_from("<i", data, 4)[0], struct.unpack_from("<i", data, 88)[0]
    assert (version, weight_type) == (2, R.TYPE_CODES[kind])
    L, dim, hidden, vocab = DIMS["n_layers"], DIMS["dim"], DIMS["hidden_dim"], DIMS["vocab_size"]
    kv = DIMS["n_kv_heads"] * dim // DIMS["n_heads"]
    tensors = ([("m", vocab * dim), ("n", L * dim), ("m", L * dim * dim), ("m", L * kv * dim), ("m", L * kv * dim),
                ("m", L * dim * dim), ("n", L * dim)] + [("m", L * hidden * dim)] * 3 + [("n", dim)] +
               ([] if kind in SHARED else [("m", vocab * dim)]))
    at = 256
    for what, n in tensors:
        at += -at % 64
        at += piece_bytes(R.TYPE_CODES[kind], n) if what == "m" else 4 * n
    assert len(data) == at
    r = run(kind_files[kind][0], "-z", TOK512, "-m", "rope")
    assert r.returncode == 0 and f"(ROPE v2 {kind})".encode() in r.stderr.splitlines()[0], r.stderr


def test_mixed_files_type_tables_name_each_kind(mixed_files):
    """weight_type 4 and the table after the tensors: its codes are the kinds by turns (5..11, and 3, 1,
    2, 0); the file is each piece at its multiple of 64 in its code's bytes."""
    for name, shared, kinds in (("new", False, R.KINDS), ("all", False, R.KINDS[::-1] + OTHER_KINDS)):
        data = mixed_files[name][0].read_bytes()
        assert struct.unpack_from("<i", data, 88)[0] == 4
        table_at, table_bytes = struct.unpack_from("<2Q", data, 216)
        codes = list(data[table_at:table_at + table_bytes])
        all_codes = {**R.TYPE_CODES, "q8_0": 3, "bf16": 1, "f16": 2, "f32": 0}
        assert codes == [all_codes[kinds[i % len(kinds)]] for i in range(len(codes))], codes
        assert set(codes) >= set(R.TYPE_CODES.values())
        at, code = 256, iter(codes)
        for what, n in llama_pieces(shared):
            at += -at % 64
            at += piece_bytes(next(code), n) if what == "m" else 4 * n
        assert next(code, None) is None
        assert table_at == at + -at % 64 and len(data) == table_at + table_bytes


# ----------------------------------------------------------------------------
# GGUF files of Q4_0, Q4_K and Q6_K tensors converted by export.py: the converted file computes what
# the conversion of the float32 GGUF of the reference's dequantization (same metadata) computes


def write_dequantized_gguf(src, out):
    """src's float32 GGUF: the same metadata, every tensor the reference's float32 weights."""
    g = EXPORT.read_gguf_file(str(src))
    tensors = [(t.name, W.F32, t.ne, R.dequantize_gguf(t.type_name, g.tensor_data(t.name),
                                                      math.prod(t.shape)).astype("<f4").tobytes())
               for t in g.tensors.values()]
    W.write_gguf(out, W.metadata_entries(g), tensors)
    return out


@pytest.mark.parametrize("name", ["llama256-Q4_0.gguf", "llama256-Q4_K_M.gguf"])
def test_converted_gguf_of_blocks_equals_its_dequantized_float32_gguf(name, tmp_path):
    narrow, wide = tmp_path / "narrow.bin", tmp_path / "wide.bin"
    export(DATA / name, narrow)
    export(write_dequantized_gguf(DATA / name, tmp_path / "wide.gguf"), wide)
    g = EXPORT.read_gguf_file(str(DATA / name))
    blocks = bytes(g.tensor_data("blk.1.ffn_up.weight"))  # not permuted: copied as it is, never requantized
    assert blocks in narrow.read_bytes()
    for threads in (1, 2):
        for mode in MODES:
            assert outputs(None, narrow, threads, mode, tmp_path) == outputs(None, wide, threads, mode, tmp_path), \
                f"{name} -T {threads} {mode}"


# ----------------------------------------------------------------------------
# Files run must refuse: one line, exit 1

EMBEDDING_AT = 256  # the first tensor, at the first multiple of 64 after the header


def edited(path, tmp_path, edit):
    data = bytearray(path.read_bytes())
    edit(data)
    out = tmp_path / "bad.bin"
    out.write_bytes(bytes(data))
    return out


def assert_refused(path, *words):
    return assert_run_refused(run(path, "-z", TOK512, "-n", 4, "-p", "hi"), *words)


SCALE_CASES = [(kind, name) for kind in R.KINDS for _, name in R.scale_fields(kind)]


@pytest.mark.parametrize("bits, words", [(0x7C00, "inf"), (0x7E00, "nan"), (0xFC00, "-inf")])
@pytest.mark.parametrize("kind, field", SCALE_CASES)
def test_scale_that_is_not_finite_is_refused_naming_it(kind_files, tmp_path, kind, field, bits, words):
    """The embedding's block 7: its d (or m, dmin) set to f16 inf or NaN."""
    offset = dict((name, at) for at, name in R.scale_fields(kind))[field]
    at = EMBEDDING_AT + 7 * R.BLOCK[kind][1] + offset
    line = assert_refused(edited(kind_files[kind][0], tmp_path, lambda d: struct.pack_into("<H", d, at, bits)),
                          "token_embedding", f"{kind} block 7", f"is {words}")
    if field == "d":  # which of the block's scales: d, or the min m (dmin)
        assert " m " not in line and "dmin" not in line, line
    else:
        assert f" {field} " in line, line


@pytest.mark.parametrize("kind", [k for k in R.KINDS if k not in SHARED])
def test_scale_in_the_last_block_of_the_file_is_checked(kind_files, tmp_path, kind):
    """The classifier ends these files: its last block's d."""
    path = kind_files[kind][0]
    at = path.stat().st_size - R.BLOCK[kind][1] + dict((n, a) for a, n in R.scale_fields(kind))["d"]
    assert_refused(edited(path, tmp_path, lambda d: struct.pack_into("<H", d, at, 0x7E00)), "wcls")


@pytest.mark.parametrize("change", ["one block short", "one block more", "one byte more"])
@pytest.mark.parametrize("kind", R.KINDS)
def test_size_that_disagrees_with_the_blocks_is_refused(kind_files, tmp_path, kind, change):
    def edit(d):
        if change == "one block short":
            del d[-R.BLOCK[kind][1]:]
        else:
            d.extend(bytes(R.BLOCK[kind][1] if change == "one block more" else 1))
    assert_refused(edited(kind_files[kind][0], tmp_path, edit), "implies")


@pytest.mark.parametrize("code", [4, 12, 255])
def test_type_table_entry_that_is_not_a_type_is_refused(mixed_files, tmp_path, code):
    def edit(d):
        at, _ = struct.unpack_from("<2Q", d, 216)
        d[at + 5] = code
    assert_refused(edited(mixed_files["new"][0], tmp_path, edit), f"type table entry 5 is {code}")


@pytest.mark.parametrize("code, words", [(12, "weight_type 12 is not a type"), (4, "needs a type table")])
def test_header_weight_type_that_is_not_a_type_is_refused(kind_files, tmp_path, code, words):
    assert_refused(edited(kind_files["q4_k"][0], tmp_path, lambda d: struct.pack_into("<i", d, 88, code)), words)


@pytest.mark.parametrize("small, large", [("q4_0", "q4_k"), ("q5_0", "q5_k")])
def test_k_quant_rows_that_are_not_whole_256_weight_blocks_are_refused(tmp_path, small, large):
    """hidden_dim 288: w2's rows are 9 blocks of 32, not whole blocks of 256. q4_0 and q4_k (q5_0 and
    q5_k) take the same bytes a weight, so declaring layer 0's w2 piece the K-quant in the type table
    leaves every size right: only the rows are wrong. run refuses the file, write_rope the piece."""
    c, tensors = source_model(tmp_path, True, 60, dict(DIMS, hidden_dim=288))
    typed, _ = typed_model(c, tensors, lambda name, i, shape: "f16" if (name, i) == ("wq", 1) else small,
                           np.random.default_rng(60))
    path = write_with(tmp_path / "rows.bin", c, typed)
    data = bytearray(path.read_bytes())
    table_at, n = struct.unpack_from("<2Q", data, 216)
    w2_layer0 = 1 + 5 * c.n_layers  # after the embedding and wq wk wv wo w1
    assert data[table_at + w2_layer0] == R.TYPE_CODES[small]
    data[table_at + w2_layer0] = R.TYPE_CODES[large]
    path.write_bytes(bytes(data))
    assert_refused(path, "w2", large, "288")
    piece = typed["w2"][0]
    with pytest.raises(EXPORT.ExportError, match="288"):
        typed["w2"][0] = EXPORT.Blocks(large, piece.shape, piece.data, "w2 0")
        EXPORT.write_rope(io.BytesIO(), c, typed, "x.bin", None)
